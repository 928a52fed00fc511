#!/usr/bin/env bash
# The main job on embedded defaults: set up, then build and validate the bundled environments.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/envkit build environments/pyfix
.venv/bin/envkit build environments/pyfix   # again: the same image ID, from cache
.venv/bin/envkit validate environments/pyfix
.venv/bin/envkit validate environments/supportdesk
.venv/bin/envkit validate environments/issuetracker
