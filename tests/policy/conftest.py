"""Policy fixtures: the tiny model (written by `envkit model tiny`) and a real vLLM server
serving it, shared by the module's tests (marker `vllm`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rl_runner.policy.server import VLLMServer

from ..conftest import envkit


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("models") / "tiny"
    proc = envkit("model", "tiny", str(folder), "--json", timeout=300)
    assert proc.returncode == 0, proc.stderr
    return folder


@pytest.fixture(scope="session")
def server(tiny: Path) -> Iterator[VLLMServer]:
    srv = VLLMServer(tiny)
    srv.start(timeout=600)
    yield srv
    srv.stop()


