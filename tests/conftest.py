"""Test layout and markers.

* ``tests/unit``: no Docker, no network; fakes only at declared seams (the warm pool's
  ``factory`` callable, the rate limiter's ``clock``).
* ``tests/integration``: marked ``docker``; they use the real Docker engine and the envkit
  base image that ``scripts/setup.sh`` provides, and remove every container they create.
  Markers: ``docker`` (needs the engine), ``slow`` (more than ~10 s).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
collect_ignore = ["fixtures"]  # projects envkit synth works on: their tests are theirs, not ours
PYFIX = ROOT / "environments" / "pyfix"


def envkit(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float = 600,
           stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The envkit CLI in a subprocess of this interpreter, as a user runs it: the test's
    environment plus ``env``, output captured as text."""
    return subprocess.run([sys.executable, "-m", "envkit.cli.app", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, timeout=timeout, input=stdin)


@pytest.fixture(scope="session")
def _wheel_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("wheels")


@pytest.fixture(autouse=True)
def _isolated_user_config(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
                          _wheel_cache: Path) -> None:
    """No test (nor the envkit processes it starts) sees the machine user's registry login. Wheels
    of locked environments (envkit synth's) are downloaded once per test session."""
    monkeypatch.setenv("ENVKIT_WHEEL_CACHE", str(_wheel_cache))
    home = tmp_path_factory.mktemp("user")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "cache"))
    monkeypatch.delenv("ENVKIT_REGISTRY_URL", raising=False)
    monkeypatch.delenv("ENVKIT_TOKEN", raising=False)
    monkeypatch.delenv("ENVKIT_PATH", raising=False)


@pytest.fixture
def pyfix_copy(tmp_path: Path) -> Path:
    """A private copy of the bundled pyfix environment, safe to modify."""
    dest = tmp_path / "pyfix"
    shutil.copytree(PYFIX, dest, ignore=shutil.ignore_patterns("envkit.lock", "__pycache__"))
    return dest
