"""`envkit init DIR --kind repo`: a small environment that builds and validates as is."""

from __future__ import annotations

import re
from pathlib import Path

from envkit.errors import UserError
from envkit.refs import NAME_RE

__all__ = ["KINDS", "init_environment"]

KINDS = ("repo",)

_SPEC = '''# {name}: scaffolded by `envkit init`. Reference: docs/spec.md
spec_version = 1

[environment]
name = "{name}"
version = "0.1.0"
kind = "repo"
description = "A starter repo environment: fix a bug, add a function."

[image]
base = "envkit/base"
files = ["verify", "oracle"]   # hidden from the agent (owned by the verifier user)

[state]
repo = {{ path = "repo" }}      # the agent starts in /workspace with these files, committed

[tasks]
file = "tasks.jsonl"

[verifier]
# Runs verify/tests/<task id>.py against /workspace; reward = share of tests passed.
command = "python3 /opt/envkit/pytest_verifier.py --tests /env/verify/tests"
timeout_s = 60

[limits]
cpus = 1.0
memory_mb = 512
pids = 128
disk_mb = 128
command_timeout_s = 30
episode_timeout_s = 300
network = "none"
'''

_FILES = {
    "tasks.jsonl": (
        '{"id": "fix-clamp", "difficulty": "easy", "oracle": "oracle/fix-clamp.sh", '
        '"instruction": "`calc.clamp(x, lo, hi)` returns values above `hi` unchanged. Fix it. The project is in /workspace."}\n'
        '{"id": "add-mean", "difficulty": "easy", "oracle": "oracle/add-mean.sh", '
        '"instruction": "Add `calc.mean(values)` returning the arithmetic mean; raise ValueError for an empty list. '
        'The project is in /workspace."}\n'
    ),
    "repo/calc.py": '''"""A tiny calculator module."""


def clamp(x, lo, hi):
    """x limited to the range [lo, hi]."""
    if x < lo:
        return lo
    return x
''',
    "repo/README.md": "# calc\n\nA tiny calculator module. Run `python3 -c 'import calc'`.\n",
    "verify/tests/fix-clamp.py": '''from calc import clamp


def test_above_range():
    assert clamp(15, 0, 10) == 10


def test_far_above_range():
    assert clamp(1e9, -1, 1) == 1
''',
    "verify/tests/add-mean.py": '''import pytest

import calc


def test_mean():
    assert calc.mean([1, 2, 3, 4]) == 2.5


def test_empty():
    with pytest.raises(ValueError):
        calc.mean([])
''',
    "oracle/fix-clamp.sh": '''#!/bin/bash
# Reference solution for fix-clamp: runs as the agent, in /workspace.
set -euo pipefail
python3 - <<'PY'
import pathlib
p = pathlib.Path("calc.py")
p.write_text(p.read_text().replace("        return lo\\n    return x", "        return lo\\n    if x > hi:\\n        return hi\\n    return x"))
PY
''',
    "oracle/add-mean.sh": '''#!/bin/bash
# Reference solution for add-mean: runs as the agent, in /workspace.
set -euo pipefail
cat >> calc.py <<'PY'


def mean(values):
    """The arithmetic mean of a non-empty list."""
    if not values:
        raise ValueError("mean of an empty list")
    return sum(values) / len(values)
PY
''',
}


def _default_name(folder: Path) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", folder.resolve().name.lower()).strip("-") or "env"
    return f"local/{slug}"


def init_environment(folder: str | Path, *, kind: str = "repo", name: str | None = None) -> list[Path]:
    """Write a working environment into ``folder`` (which must be new or empty)."""
    root = Path(folder)
    if kind not in KINDS:
        raise UserError(f"`{kind}` is not a kind envkit can scaffold yet", f"use --kind {' | '.join(KINDS)}")
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise UserError(f"`{folder}` already exists and is not empty; nothing was written",
                        "choose a new folder, or empty this one first")
    name = name or _default_name(root)
    parts = name.split("/")
    if len(parts) != 2 or not all(NAME_RE.match(p) for p in parts) or len(parts[0]) < 2:
        raise UserError(f"`{name}` is not an environment name", "use namespace/name in lowercase, e.g. --name myteam/bugfix")
    written = []
    files = {"envkit.toml": _SPEC.format(name=name), **_FILES}
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if rel.endswith(".sh"):
            path.chmod(0o755)
        written.append(path)
    return written
