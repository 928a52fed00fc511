"""Test layout and markers.

* ``tests/unit``: no Docker, no network; fakes only at declared seams (the warm pool's
  ``factory`` callable, the rate limiter's ``clock``).
* ``tests/integration``: marked ``docker``; they use the real Docker engine and the envkit
  base image that ``scripts/setup.sh`` provides, and remove every container they create.
  Markers: ``docker`` (needs the engine), ``slow`` (more than ~10 s).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
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


# Slow preparations that need nothing but CPU start once collection shows a test will use them, at
# nice 19: they take the cores the suite leaves idle (Docker and vLLM waits) instead of the time of
# the test that needs them (the lookup warm-up: 130 s of the learning test's 490 s in CI; the
# shellcmd one: ~30 s of the first train test's set-up). name -> (whether a collected test needs
# it, `envkit model tiny` options)
BACKGROUND_MODELS = {
    "tiny-lookup": (lambda item: item.originalname == "test_the_multi_turn_environment_learns",
                    ("--warmup", "lookup", "--warmup-steps", "1000", "--seed", "3")),  # as docs/train.md's seed 3
    # test_train_vllm.py's `warm` fixture (TinySpec(seed=0), the shellcmd warm-up)
    "tiny-shellcmd": (lambda item: item.module.__name__.endswith("test_train_vllm") and "warm" in item.fixturenames,
                      ("--warmup-steps", "300")),
}
_background: dict[str, tuple[subprocess.Popen[bytes], Path, float]] = {}


def pytest_collection_finish(session: pytest.Session) -> None:
    items = [item for item in session.items if isinstance(item, pytest.Function)]
    for name, (needed, args) in BACKGROUND_MODELS.items():
        if not any(needed(item) for item in items):
            continue
        work = Path(tempfile.mkdtemp(prefix="envkit-tests-"))
        with (work / "out.json").open("wb") as out, (work / "err.log").open("wb") as err:
            proc = subprocess.Popen(["nice", "-n", "19", sys.executable, "-m", "envkit.cli.app", "model", "tiny",
                                     str(work / name), *args, "--json"], stdout=out, stderr=err, cwd=ROOT,
                                    stdin=subprocess.DEVNULL)
        _background[name] = (proc, work, time.monotonic())


def pytest_sessionfinish(session: pytest.Session) -> None:
    for proc, work, _ in _background.values():
        proc.kill()
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def background_model(name: str, timeout: float = 1200) -> tuple[Path, dict, float] | None:
    """The model BACKGROUND_MODELS prepares under ``name``: its folder, `envkit model tiny --json`'s
    output and the seconds since it started; None when collection did not start it."""
    if name not in _background:
        return None
    proc, work, started = _background[name]
    proc.wait(timeout=timeout)
    assert proc.returncode == 0, (work / "err.log").read_text()[-3000:]
    info = json.loads((work / "out.json").read_text())
    return Path(info["folder"]), info, time.monotonic() - started


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
