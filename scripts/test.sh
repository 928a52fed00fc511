#!/usr/bin/env bash
# Set up this machine, then run lint, types and the whole test suite (pytest args pass through).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check envkit registry_server rl_runner tests environments
# mypy (~50 s of one core from a clean clone) runs beside the tests, at a lower priority; its verdict
# counts as much as theirs
types_log=$(mktemp)
nice -n 10 .venv/bin/mypy >"$types_log" 2>&1 &
types_pid=$!
status=0
.venv/bin/python -m pytest --durations=25 "$@" || status=$?  # the 25 slowest close every run: the suite has a time budget (docs/development.md)
wait "$types_pid" || status=1
echo "mypy: $(tail -n 1 "$types_log")"
[ "$status" -eq 0 ] || cat "$types_log"
rm -f "$types_log"
exit "$status"
