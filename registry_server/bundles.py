"""Receiving a bundle upload safely: size limits while streaming, gzip bombs, tar entries
that escape the bundle, and the spec inside it. Nothing reaches the blob store until all
checks pass."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tarfile
import tomllib
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import ValidationError

from envkit.spec import SPEC_FILE, EnvSpec
from registry_server.errors import RegistryError

__all__ = ["ReceivedBundle", "receive_bundle"]

GZIP_MAGIC = b"\x1f\x8b"


@dataclass
class ReceivedBundle:
    path: Path  # the uncompressed tar, in the store's tmp folder
    digest: str
    size: int
    spec: dict[str, Any]
    task_count: int

    def discard(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def _too_large(what: str, limit: int) -> RegistryError:
    return RegistryError(413, f"the {what} is larger than this registry's limit of {limit} bytes",
                         "drop data the tasks do not need, or ask the operator to raise the limit")


async def receive_bundle(chunks: AsyncIterator[bytes], *, tmp_dir: Path, max_upload: int, max_bundle: int,
                         max_entries: int) -> ReceivedBundle:
    """Stream the request body to a temporary tar (gunzipping if needed), digest and check it."""
    tmp_dir.mkdir(parents=True, exist_ok=True)
    path = tmp_dir / f"upload-{os.getpid()}-{os.urandom(8).hex()}.tar"
    sha = hashlib.sha256()
    received = 0
    written = 0
    inflater: Any = None
    first = True
    try:
        with open(path, "wb") as out:
            async for chunk in chunks:
                if not chunk:
                    continue
                received += len(chunk)
                if received > max_upload:
                    raise _too_large("upload", max_upload)
                if first:
                    first = False
                    if chunk[:2] == GZIP_MAGIC:
                        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
                data = chunk
                while data:
                    if inflater is not None:
                        # Never inflate more than the limit allows: a gzip bomb stops here.
                        plain = inflater.decompress(data, max_bundle + 1 - written)
                        data = inflater.unconsumed_tail
                    else:
                        plain, data = data, b""
                    written += len(plain)
                    if written > max_bundle:
                        raise _too_large("bundle (uncompressed)", max_bundle)
                    sha.update(plain)
                    out.write(plain)
                    if inflater is not None and not plain and data:
                        break
            if inflater is not None:
                tail = inflater.flush()
                written += len(tail)
                if written > max_bundle:
                    raise _too_large("bundle (uncompressed)", max_bundle)
                sha.update(tail)
                out.write(tail)
        if received == 0:
            raise RegistryError(400, "the request body is empty",
                                "send the bundle (a tar made by `envkit build`) as the body")
        spec, task_count = _inspect(path, max_entries)
    except zlib.error:
        path.unlink(missing_ok=True)
        raise RegistryError(400, "the body claims gzip but does not decompress",
                            "send the bundle tar, gzipped or not") from None
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return ReceivedBundle(path=path, digest="sha256:" + sha.hexdigest(), size=written, spec=spec, task_count=task_count)


def _bad(message: str) -> RegistryError:
    return RegistryError(400, f"rejected bundle: {message}",
                         "publish bundles made by `envkit build`; nothing was stored")


def _inspect(path: Path, max_entries: int) -> tuple[dict[str, Any], int]:
    try:
        tar = tarfile.open(path, mode="r:")
    except tarfile.TarError:
        raise _bad("the body is not a tar archive") from None
    spec_bytes = b""
    files: dict[str, tarfile.TarInfo] = {}
    with tar:
        try:
            for n, member in enumerate(tar):
                if n >= max_entries:
                    raise _bad(f"more than {max_entries} entries")
                name = member.name
                parts = PurePosixPath(name).parts
                if name.startswith("/") or ".." in parts or not parts:
                    raise _bad(f"entry `{name}` points outside the bundle")
                if member.islnk():
                    raise _bad(f"entry `{name}` is a hard link")
                if member.issym():
                    target = PurePosixPath(member.linkname)
                    resolved = os.path.normpath(PurePosixPath(name).parent / target)
                    if target.is_absolute() or resolved.startswith(".."):
                        raise _bad(f"symlink `{name}` points outside the bundle ({member.linkname})")
                elif not (member.isfile() or member.isdir()):
                    raise _bad(f"entry `{name}` is not a file, folder or symlink")
                if member.isfile():
                    files[name] = member
                    if name == SPEC_FILE:
                        f = tar.extractfile(member)
                        spec_bytes = f.read(1 << 20) if f else b""
        except tarfile.TarError as e:
            raise _bad(f"the tar archive is damaged ({e})") from None
        if not spec_bytes:
            raise _bad(f"it has no {SPEC_FILE} at its top level")
        try:
            spec = EnvSpec.model_validate(tomllib.loads(spec_bytes.decode()))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise RegistryError(422, f"the bundle's {SPEC_FILE} is not valid TOML: {e}",
                                "fix it and build again") from None
        except ValidationError as e:
            problems = [{"field": ".".join(str(x) for x in err["loc"]), "message": err["msg"]} for err in e.errors()]
            raise RegistryError(422, f"the bundle's {SPEC_FILE} is invalid",
                                "run `envkit build` locally to see each problem", details=problems) from None
        task_count = 0
        tasks = files.get(spec.tasks.file)
        if tasks is not None:
            f = tar.extractfile(tasks)
            task_count = sum(1 for line in (f.read() if f else b"").splitlines() if line.strip())
    return json.loads(spec.model_dump_json()), task_count
