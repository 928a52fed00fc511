"""Content-addressed blob storage: the filesystem by default, S3-compatible behind the same
interface. Blobs are written atomically (temporary file, then rename) and never modified."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from envkit.extras import require

__all__ = ["BlobStore", "FilesystemStore", "S3Store", "make_store"]

CHUNK = 1 << 20


class BlobStore(Protocol):
    def put_file(self, digest: str, path: Path) -> None:
        """Store the file at ``path`` under ``digest`` (moved or copied; idempotent)."""
        ...

    def exists(self, digest: str) -> bool: ...

    def open(self, digest: str) -> Iterator[bytes]: ...

    def delete(self, digest: str) -> None: ...

    def list(self) -> Iterator[tuple[str, float]]:
        """(digest, modification time) of every stored blob."""
        ...


def _hex(digest: str) -> str:
    algo, _, hexpart = digest.partition(":")
    if algo != "sha256" or len(hexpart) != 64 or any(c not in "0123456789abcdef" for c in hexpart):
        raise ValueError(f"not a sha256 digest: {digest!r}")
    return hexpart


class FilesystemStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        (self.root / "sha256").mkdir(parents=True, exist_ok=True)
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)

    @property
    def tmp_dir(self) -> Path:
        return self.root / "tmp"

    def _path(self, digest: str) -> Path:
        h = _hex(digest)
        return self.root / "sha256" / h[:2] / h

    def put_file(self, digest: str, path: Path) -> None:
        dest = self._path(digest)
        if dest.exists():
            return
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging = self.tmp_dir / f"put-{os.getpid()}-{time.monotonic_ns()}"
        if Path(path).parent.resolve() == self.tmp_dir.resolve():
            os.replace(path, staging)
        else:
            shutil.copyfile(path, staging)
        with open(staging, "rb") as f:
            os.fsync(f.fileno())
        os.replace(staging, dest)

    def exists(self, digest: str) -> bool:
        return self._path(digest).is_file()

    def open(self, digest: str) -> Iterator[bytes]:
        with open(self._path(digest), "rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk

    def delete(self, digest: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(digest).unlink()

    def list(self) -> Iterator[tuple[str, float]]:
        for p in (self.root / "sha256").glob("*/*"):
            yield f"sha256:{p.name}", p.stat().st_mtime


class S3Store:
    """Blobs in an S3-compatible bucket (``s3://bucket/prefix``), keys ``prefix/sha256/<hex>``."""

    def __init__(self, url: str, *, endpoint_url: str | None = None, tmp_dir: Path | None = None) -> None:
        require("s3", "an s3:// blob store (ENVKIT_REGISTRY_STORAGE_DIR)")
        import boto3

        rest = url.removeprefix("s3://")
        self.bucket, _, self.prefix = rest.partition("/")
        self.client: Any = boto3.client("s3",
                                        endpoint_url=endpoint_url or os.environ.get("ENVKIT_REGISTRY_S3_ENDPOINT"))
        self.tmp_dir = Path(tmp_dir or "/tmp")
        self.tmp_dir.mkdir(parents=True, exist_ok=True)

    def _key(self, digest: str) -> str:
        return f"{self.prefix.rstrip('/')}/sha256/{_hex(digest)}".lstrip("/")

    def put_file(self, digest: str, path: Path) -> None:
        if not self.exists(digest):
            self.client.upload_file(str(path), self.bucket, self._key(digest))  # S3 PUTs are atomic
        with contextlib.suppress(FileNotFoundError):
            Path(path).unlink()

    def exists(self, digest: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(digest))
            return True
        except self.client.exceptions.ClientError:
            return False

    def open(self, digest: str) -> Iterator[bytes]:
        body = self.client.get_object(Bucket=self.bucket, Key=self._key(digest))["Body"]
        yield from body.iter_chunks(CHUNK)

    def delete(self, digest: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(digest))

    def list(self) -> Iterator[tuple[str, float]]:
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key("sha256:" + "0" * 64)[:-64]):
            for obj in page.get("Contents", []):
                yield "sha256:" + obj["Key"].rsplit("/", 1)[-1], obj["LastModified"].timestamp()


def make_store(location: str | Path, tmp_dir: Path | None = None) -> BlobStore:
    text = str(location)
    if text.startswith("s3://"):
        return S3Store(text, tmp_dir=tmp_dir)
    return FilesystemStore(Path(text))
