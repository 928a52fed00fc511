"""Both blob stores honour one interface: the filesystem and an S3-compatible server
(moto's, on loopback)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from registry_server.storage import BlobStore, FilesystemStore, S3Store

from .conftest import free_port


@pytest.fixture
def s3_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture(params=["filesystem", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    if request.param == "filesystem":
        return FilesystemStore(tmp_path / "blobs")
    endpoint = request.getfixturevalue("s3_endpoint")
    s3 = S3Store("s3://envkit-blobs/registry", endpoint_url=endpoint, tmp_dir=tmp_path / "tmp")
    s3.client.create_bucket(Bucket="envkit-blobs")
    return s3


def test_store_roundtrip(store: BlobStore, tmp_path: Path):
    data = os.urandom(3 * 1024 * 1024 + 17)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    src = tmp_path / "upload.tar"
    src.write_bytes(data)
    assert not store.exists(digest)
    store.put_file(digest, src)
    store.put_file(digest, src) if src.exists() else None  # idempotent
    assert store.exists(digest)
    assert b"".join(store.open(digest)) == data
    assert [d for d, _ in store.list()] == [digest]
    store.delete(digest)
    assert not store.exists(digest) and list(store.list()) == []


def test_store_rejects_non_digests(store: BlobStore):
    with pytest.raises(ValueError):
        store.exists("../../etc/passwd")
