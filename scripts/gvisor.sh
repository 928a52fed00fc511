#!/usr/bin/env bash
# gVisor for envkit's sandboxes, idempotently (Debian bookworm, as root; scripts/setup.sh runs it):
#   1. runsc from Debian trixie (bookworm's 2022 build counts the sentry's threads against the
#      container's pids limit and has no cgroupfs inside): fetched with `apt-get download`
#      through a private apt folder (its own sources list, lists and cache under $GVISOR_HOME/apt;
#      the system's apt sources are never changed), unpacked with `dpkg-deb -x`; nothing is
#      installed system-wide. The mirror is the one the system's own sources name.
#   2. registered with the Docker engine as the runtime `runsc` (no network: `--network=none`;
#      the guest's own cgroupfs: `--cgroupfs`) in /etc/docker/daemon.json (other keys kept),
#      then the engine is told to reload its configuration (SIGHUP), which adds a runtime
#      without restarting a container.
# `--runtime gvisor` (and the default for pulled environments) checks that the engine lists it.
set -euo pipefail
log() { printf '[gvisor] %s\n' "$*" >&2; }
[ "$(id -u)" = 0 ] || { log "run as root"; exit 1; }

GVISOR_HOME=${GVISOR_HOME:-/var/lib/envkit/gvisor}
SUITE=trixie
RUNSC=$GVISOR_HOME/root/usr/bin/runsc
APT=$GVISOR_HOME/apt
DAEMON_JSON=${DOCKER_DAEMON_JSON:-/etc/docker/daemon.json}

if [ ! -x "$RUNSC" ]; then
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' /etc/apt/sources.list 2>/dev/null || true)
  [ -n "$mirror" ] || { log "no Debian mirror in the system's apt sources"; exit 1; }
  keyring=/usr/share/keyrings/debian-archive-$SUITE-stable.gpg
  [ -r "$keyring" ] || keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  mkdir -p "$APT/etc/apt.conf.d" "$APT/etc/preferences.d" "$APT/lists/partial" "$APT/cache/archives/partial"
  echo "deb [signed-by=$keyring] $mirror $SUITE main" > "$APT/etc/sources.list"
  opts=(-o "Dir::Etc=$APT/etc" -o "Dir::Etc::SourceList=$APT/etc/sources.list" -o "Dir::Etc::SourceParts=-"
        -o "Dir::State::Lists=$APT/lists" -o "Dir::Cache=$APT/cache" -o "APT::Sandbox::User=root" -q)
  log "fetching runsc from Debian $SUITE (private apt folder $APT)"
  apt-get "${opts[@]}" update >/dev/null
  rm -f "$GVISOR_HOME"/runsc_*.deb
  (cd "$GVISOR_HOME" && apt-get "${opts[@]}" download runsc >/dev/null)
  rm -rf "$GVISOR_HOME/root.new"
  dpkg-deb -x "$GVISOR_HOME"/runsc_*.deb "$GVISOR_HOME/root.new"
  rm -rf "$GVISOR_HOME/root"
  mv "$GVISOR_HOME/root.new" "$GVISOR_HOME/root"
  log "$("$RUNSC" --version | head -1)"
fi

# Register it (an edit only when the entry differs), then have the engine reload.
mkdir -p "$(dirname "$DAEMON_JSON")"
changed=$(python3 - "$DAEMON_JSON" "$RUNSC" <<'PY'
import json, os, sys
path, runsc = sys.argv[1], sys.argv[2]
try:
    with open(path) as f:
        conf = json.load(f)
except FileNotFoundError:
    conf = {}
want = {"path": runsc, "runtimeArgs": ["--network=none", "--cgroupfs"]}
if conf.get("runtimes", {}).get("runsc") == want:
    print("no")
    sys.exit(0)
conf.setdefault("runtimes", {})["runsc"] = want
tmp = path + ".envkit-tmp"
with open(tmp, "w") as f:
    json.dump(conf, f, indent=2)
    f.write("\n")
os.replace(tmp, path)
print("yes")
PY
)
if [ "$changed" = yes ] && pid=$(pidof dockerd); then
  log "registered runsc in $DAEMON_JSON; reloading dockerd"
  kill -HUP $pid
  for _ in $(seq 1 40); do docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"' && break; sleep 0.25; done
fi
