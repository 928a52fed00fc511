"""Reliability and security of publishing: hostile uploads, concurrent publishers,
interrupted publishes. Each runs on SQLite and PostgreSQL."""

from __future__ import annotations

import gzip
import io
import os
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from envkit.bundle import sha256_digest
from registry_server import admin

from .bundles import make_pyfix_bundle, put
from .conftest import free_port, make_settings


def tar_with(*members: tuple[tarfile.TarInfo, bytes | None], spec: bytes | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        if spec is not None:
            ti = tarfile.TarInfo("envkit.toml")
            ti.size = len(spec)
            tar.addfile(ti, io.BytesIO(spec))
        for ti, data in members:
            tar.addfile(ti, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"x",
           link: str = "") -> tuple[tarfile.TarInfo, bytes | None]:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.linkname = link
    if kind == tarfile.REGTYPE:
        ti.size = len(data)
        return ti, data
    return ti, None


SPEC = (Path(__file__).resolve().parents[2] / "environments" / "pyfix" / "envkit.toml").read_bytes()


def hostile_bodies() -> dict[str, tuple[bytes, int, str]]:
    bomb = gzip.compress(b"\0" * (40 * 1024 * 1024), compresslevel=9)  # 40 MiB of zeros in ~40 KiB
    return {
        "dotdot": (tar_with(member("../evil.txt"), spec=SPEC), 400, "points outside the bundle"),
        "absolute": (tar_with(member("/etc/cron.d/evil"), spec=SPEC), 400, "points outside the bundle"),
        "nested-dotdot": (tar_with(member("repo/../../evil"), spec=SPEC), 400, "points outside the bundle"),
        "symlink-out": (tar_with(member("repo/link", tarfile.SYMTYPE, link="../../../etc/passwd"), spec=SPEC), 400,
                        "points outside the bundle"),
        "symlink-abs": (tar_with(member("repo/link", tarfile.SYMTYPE, link="/etc/passwd"), spec=SPEC), 400,
                        "points outside the bundle"),
        "hardlink": (tar_with(member("repo/hard", tarfile.LNKTYPE, link="envkit.toml"), spec=SPEC), 400, "hard link"),
        "device": (tar_with(member("repo/dev", tarfile.CHRTYPE), spec=SPEC), 400, "not a file"),
        "gzip-bomb": (bomb, 413, "uncompressed"),
        "not-a-tar": (b"hello, this is not a tar archive" * 100, 400, "not a tar"),
        "no-spec": (tar_with(member("repo/x.py")), 400, "no envkit.toml"),
        "bad-spec": (tar_with(spec=b"spec_version = 1\n[environment]\nname = 'x'\n"), 422, "invalid"),
    }


@pytest.mark.parametrize("case", sorted(hostile_bodies()))
def test_hostile_upload_is_rejected_and_nothing_written(registry, case):
    body, status, fragment = hostile_bodies()[case]
    digest = sha256_digest(gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body)
    with registry.client(registry.token) as c:
        r = c.put("/environments/envkit/pyfix/versions/1.0.0", content=body,
                  params={"bundle_digest": digest, "image_id": "sha256:" + "1" * 64})
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert fragment in err["message"] and err["hint"]
        assert c.get("/environments/envkit/pyfix").status_code == 404
    assert registry.blob_files() == [] and registry.tmp_files() == []


def test_upload_over_the_size_limit(registry, tmp_path):
    bundle = make_pyfix_bundle(tmp_path)
    big = bundle.data + b"\0" * (registry.settings.max_upload_bytes + 1)
    with registry.client(registry.token) as c:
        r = put(c, bundle, content=big)
        assert r.status_code == 413 and "limit" in r.json()["error"]["message"]
    assert registry.blob_files() == [] and registry.tmp_files() == []


def test_gzipped_bundle_is_accepted(registry, tmp_path):
    bundle = make_pyfix_bundle(tmp_path)
    with registry.client(registry.token) as c:
        r = put(c, bundle, content=gzip.compress(bundle.data), headers={"Content-Type": "application/gzip"})
        assert r.status_code == 201, r.text
        assert r.json()["version"]["bundle_digest"] == bundle.digest


def _race(registry, bundles) -> list[int]:
    barrier = threading.Barrier(len(bundles))
    codes: list[int] = [0] * len(bundles)

    def go(i: int) -> None:
        with registry.client(registry.token) as c:
            barrier.wait()
            codes[i] = put(c, bundles[i]).status_code

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(bundles))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return codes


def test_eight_concurrent_publishers_of_different_content(registry, tmp_path):
    bundles = [make_pyfix_bundle(tmp_path, salt=f"client-{i}") for i in range(8)]
    codes = _race(registry, bundles)
    assert sorted(codes) == [201] + [409] * 7, codes
    with registry.client() as anon:
        versions = anon.get("/environments/envkit/pyfix").json()["versions"]
    assert len(versions) == 1
    winner = bundles[codes.index(201)]
    assert versions[0]["bundle_digest"] == winner.digest
    assert [p.name for p in registry.blob_files()] == [winner.digest.split(":")[1]]  # no orphan blobs
    assert registry.tmp_files() == []


def test_eight_concurrent_publishers_of_the_same_content(registry, tmp_path):
    bundle = make_pyfix_bundle(tmp_path)
    codes = _race(registry, [bundle] * 8)
    assert sorted(codes) == [200] * 7 + [201], codes
    assert len(registry.blob_files()) == 1


def test_client_disconnect_midway_leaves_nothing(registry, tmp_path):
    bundle = make_pyfix_bundle(tmp_path)
    host, port = registry.url.removeprefix("http://").split(":")
    path = f"/api/v1/environments/envkit/pyfix/versions/1.0.0?bundle_digest={bundle.digest}&image_id=sha256:{'2' * 64}"
    with socket.create_connection((host, int(port))) as s:
        s.sendall((f"PUT {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {registry.token}\r\n"
                   f"Content-Type: application/x-tar\r\nContent-Length: {len(bundle.data)}\r\n\r\n").encode())
        s.sendall(bundle.data[: len(bundle.data) // 2])
        time.sleep(0.3)
    deadline = time.monotonic() + 10
    while registry.tmp_files() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert registry.tmp_files() == [] and registry.blob_files() == []
    with registry.client(registry.token) as c:
        assert c.get("/environments/envkit/pyfix").status_code == 404
        assert put(c, bundle).status_code == 201  # the next publish succeeds


def test_server_killed_between_blob_write_and_commit(db_url, tmp_path):
    settings = make_settings(db_url, tmp_path)
    token = admin.create_user(settings, name="alice", namespaces=["envkit"])
    bundle = make_pyfix_bundle(tmp_path)
    port = free_port()
    env = {**os.environ, "ENVKIT_REGISTRY_FAULTS": "publish.after_blob_write:60"}
    cmd = [sys.executable, "-m", "envkit.cli.app", "registry", "serve", "--db", db_url,
           "--storage", str(settings.storage_dir), "--port", str(port)]
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    base = f"http://127.0.0.1:{port}/api/v1"
    try:
        _wait_up(base)
        client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=120)
        outcome: dict[str, object] = {}
        publisher = threading.Thread(target=lambda: outcome.setdefault("r", _try_put(client, bundle)), daemon=True)
        publisher.start()
        blobs = settings.storage_dir / "sha256"
        deadline = time.monotonic() + 30
        while not list(blobs.glob("*/*")) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert list(blobs.glob("*/*")), "the blob was never written"
        os.killpg(server.pid, signal.SIGKILL)  # between blob write and commit
        server.wait(timeout=10)
        publisher.join(timeout=10)
        assert isinstance(outcome.get("r"), Exception)  # the client saw the connection die
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
    # Restart without the fault: no visible version; the orphan blob is collected; publish works.
    server = subprocess.Popen(cmd[:], env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        _wait_up(base)
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=120) as c:
            assert c.get("/environments/envkit/pyfix").status_code == 404
            assert admin.gc(settings, grace_s=0) == [bundle.digest]
            assert put(c, bundle).status_code == 201
            assert c.get("/environments/envkit/pyfix/versions/1.0.0").json()["bundle_digest"] == bundle.digest
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=10)


def _wait_up(base: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError("the registry did not come up")


def _try_put(client: httpx.Client, bundle) -> object:
    try:
        return put(client, bundle)
    except httpx.HTTPError as e:
        return e
