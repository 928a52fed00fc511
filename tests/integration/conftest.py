"""Integration fixtures: the real Docker engine and envkit images; every container a test
creates carries a per-session label and is removed at the end."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import pytest

from envkit.base_image import find_base
from envkit.engine import connect
from envkit.runtime import EnvRuntime
from envkit.sandbox import SandboxLimits
from envkit.sandbox.docker_backend import DockerBackend, DockerSandbox
from envkit.spec import load_environment

from ..conftest import PYFIX

TEST_LABEL = {"org.envkit.test": str(os.getpid())}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.docker)


@pytest.fixture(scope="session")
def client() -> Iterator[Any]:
    c = connect()  # fails loudly (DockerUnavailableError) rather than skipping
    find_base(c)  # the base image must exist: scripts/setup.sh builds it
    yield c
    for container in c.containers.list(all=True, filters={"label": [f"{k}={v}" for k, v in TEST_LABEL.items()]}):
        with contextlib.suppress(Exception):
            container.remove(force=True)


@pytest.fixture(scope="session")
def pyfix_runtime(client: Any) -> EnvRuntime:
    runtime = EnvRuntime(load_environment(PYFIX), client=client)
    runtime.backend.labels.update(TEST_LABEL)
    return runtime


TIGHT = SandboxLimits(cpus=1.0, memory_mb=128, pids=64, disk_mb=32, command_timeout_s=5, output_limit_bytes=8192)


@pytest.fixture(scope="session")
def tight_backend(client: Any, pyfix_runtime: EnvRuntime) -> DockerBackend:
    """Sandboxes of the pyfix image with small limits, for adversarial tests."""
    return DockerBackend(pyfix_runtime.build.image_id, TIGHT, client=client, labels=TEST_LABEL)


def _fresh(backend: DockerBackend) -> Iterator[DockerSandbox]:
    sb = backend.create()
    sb.reset(0)
    yield sb
    sb.destroy()


@pytest.fixture
def sandbox(tight_backend: DockerBackend) -> Iterator[DockerSandbox]:
    yield from _fresh(tight_backend)


@pytest.fixture
def neighbour(tight_backend: DockerBackend) -> Iterator[DockerSandbox]:
    """A second sandbox, to show that an attack in the first does not reach it."""
    yield from _fresh(tight_backend)
