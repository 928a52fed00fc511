#!/usr/bin/env bash
# Set up this machine, then run lint, types and the whole test suite (pytest args pass through).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check envkit registry_server rl_runner tests environments
.venv/bin/mypy
.venv/bin/python -m pytest --durations=25 "$@"  # the 25 slowest tests close every run: the suite has a time budget (docs/development.md)
