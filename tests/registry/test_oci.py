"""Image distribution through a real OCI distribution registry (Debian's docker-registry)
started on loopback: publish --oci pushes by digest; pull fetches and verifies it."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ..conftest import envkit
from .conftest import free_port
from .test_distribution import unique_pyfix

pytestmark = pytest.mark.docker


@pytest.fixture
def oci_registry(tmp_path: Path) -> Iterator[str]:
    binary = shutil.which("docker-registry")
    if binary is None:
        pytest.fail("Debian's docker-registry is not installed: run scripts/setup.sh")
    port = free_port()
    config = tmp_path / "oci.yml"
    config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'oci-data'}\n"
                      f"http:\n  addr: 127.0.0.1:{port}\nlog:\n  level: error\n")
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise AssertionError("docker-registry did not start")
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_publish_with_oci_and_pull_from_it(registry, cli_env, tmp_path, oci_registry):
    import docker

    folder = unique_pyfix(tmp_path, "oci-pyfix")
    pub = envkit("publish", str(folder), "--oci", oci_registry, "--json", env=cli_env)
    assert pub.returncode == 0, pub.stderr
    published = json.loads(pub.stdout)
    assert published["oci_ref"].startswith(f"{oci_registry}/envkit/oci-pyfix@sha256:")
    with registry.client() as anon:
        assert anon.get("/environments/envkit/oci-pyfix/versions/1.0.0").json()["oci_ref"] == published["oci_ref"]

    docker.from_env().images.remove(published["image_id"], force=True)
    pulled = envkit("pull", "envkit/oci-pyfix@1.0.0", "--json", env=cli_env)
    assert pulled.returncode == 0, pulled.stderr
    result = json.loads(pulled.stdout)
    assert result["source"] == "oci" and result["image_id"] == published["image_id"]
    run = envkit("run", "envkit/oci-pyfix@1.0.0", "--task", "add-percentile", "--json", cwd=tmp_path, env=cli_env)
    assert run.returncode == 0 and json.loads(run.stdout)["reward"] == 1.0
