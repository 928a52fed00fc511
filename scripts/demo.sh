#!/usr/bin/env bash
# The main job on embedded defaults: set up; build and validate the bundled environments; then
# the whole RL loop: publish the toy environment to an embedded registry (SQLite, loopback),
# train the tiny model on it for a few steps on CPU (vLLM + Docker), print the doctor table and
# write the plots (runs/demo/plots).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
E=.venv/bin/envkit
$E build environments/pyfix
$E build environments/pyfix   # again: the same image ID, from cache
$E validate environments/pyfix
$E validate environments/supportdesk
$E validate environments/issuetracker
$E validate environments/shellcmd

# An embedded registry on loopback; its data and the demo's credentials stay under runs/demo.
DEMO=runs/demo
rm -rf "$DEMO" && mkdir -p "$DEMO/config" "$DEMO/no-local-envs"
export XDG_CONFIG_HOME="$PWD/$DEMO/config"
PORT=$(.venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
TOKEN=$($E registry admin create-user demo --namespace envkit --db "sqlite:///$PWD/$DEMO/registry.db" --json \
        | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["token"])')
$E registry serve --db "sqlite:///$PWD/$DEMO/registry.db" --storage "$DEMO/blobs" --port "$PORT" > "$DEMO/registry.log" 2>&1 &
REGISTRY_PID=$!
trap 'kill $REGISTRY_PID 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$PORT/api/v1/health" > /dev/null 2>&1 && break
  sleep 0.2
done
echo "$TOKEN" | $E login "http://127.0.0.1:$PORT" --token -
$E publish environments/shellcmd

# The tiny model, warmed up to answer with a shell command (no download).
[ -f runs/models/tiny-shellcmd/config.json ] || $E model tiny runs/models/tiny-shellcmd --warmup-steps 300

# Train on the *published* environment: with no local folders on the search path, the ref
# envkit/shellcmd@1.0.0 is pulled from the registry (digest and image ID checked).
ENVKIT_PATH="$DEMO/no-local-envs" $E train rl_runner/recipes/shellcmd.yaml \
  'envs=[{ref: "envkit/shellcmd@1.0.0", tasks: [system-info]}]' run_dir="$DEMO/run" steps=8 eval.episodes=64
$E report "$DEMO/run" > /dev/null
echo "plots: $(ls "$DEMO"/run/plots/*.png | tr '\n' ' ')"
