"""Deterministic source bundles.

A bundle is a tar archive of the files an environment ships (``envkit.toml``, its task file,
the paths in ``[image] files`` and the repository), written so that the same files always
give the same bytes: entries sorted by path, every mtime fixed at 0, owner and group 0 with
no names, modes reduced to 0644 / 0755 (directories 0755), no device files. Its digest is
the sha256 of those bytes (``sha256:<hex>``). The image is built from the bundle alone, so
anyone holding the bundle can rebuild the image and compare its ID.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from envkit.errors import Problem, SpecError
from envkit.spec import LoadedEnvironment

__all__ = ["Bundle", "BundleEntry", "IGNORED_NAMES", "MAX_BUNDLE_BYTES", "make_bundle", "read_bundle", "sha256_digest"]

IGNORED_NAMES = frozenset({"__pycache__", ".git", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".DS_Store",
                           ".envkit"})
IGNORED_SUFFIXES = (".pyc", ".pyo")
MAX_BUNDLE_BYTES = 512 * 1024 * 1024


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class BundleEntry:
    path: str  # relative, POSIX
    kind: str  # "file" | "dir" | "symlink"
    mode: int
    data: bytes = b""
    target: str = ""


@dataclass(frozen=True)
class Bundle:
    data: bytes
    digest: str
    entries: tuple[BundleEntry, ...]

    @property
    def size(self) -> int:
        return len(self.data)

    def file(self, path: str) -> bytes:
        for e in self.entries:
            if e.path == path and e.kind == "file":
                return e.data
        raise KeyError(path)


def _ignored(name: str) -> bool:
    return name in IGNORED_NAMES or name.endswith(IGNORED_SUFFIXES)


def _walk(root: Path, rel: str, problems: list[Problem]) -> Iterator[BundleEntry]:
    path = root / rel
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(path)
        resolved = (path.parent / target).resolve()
        if os.path.isabs(target) or not resolved.is_relative_to(root.resolve()):
            problems.append(Problem(rel, f"symlink points outside the environment ({target})",
                                    "replace it with a copy of the file, or point it inside the folder"))
            return
        yield BundleEntry(rel, "symlink", 0o777, target=target)
    elif stat.S_ISDIR(st.st_mode):
        yield BundleEntry(rel, "dir", 0o755)
        for child in sorted(os.listdir(path)):
            if not _ignored(child):
                yield from _walk(root, f"{rel}/{child}", problems)
    elif stat.S_ISREG(st.st_mode):
        mode = 0o755 if st.st_mode & 0o111 else 0o644
        yield BundleEntry(rel, "file", mode, data=path.read_bytes())
    else:
        problems.append(Problem(rel, "is not a regular file, folder or symlink", "remove it from the environment"))


def _parents(rel: str) -> list[str]:
    parts = rel.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def make_bundle(env: LoadedEnvironment) -> Bundle:
    """Collect the environment's files into a deterministic tar and digest it."""
    problems: list[Problem] = []
    entries: dict[str, BundleEntry] = {}
    for rel in env.bundle_paths():
        for parent in _parents(rel):
            entries.setdefault(parent, BundleEntry(parent, "dir", 0o755))
        for entry in _walk(env.root, rel, problems):
            entries[entry.path] = entry
    if problems:
        raise SpecError(str(env.root), problems)
    ordered = tuple(entries[k] for k in sorted(entries))
    data = _write_tar(ordered)
    if len(data) > MAX_BUNDLE_BYTES:
        raise SpecError(str(env.root), [Problem("image.files", f"the bundle is {len(data) >> 20} MiB",
                                                 f"keep it under {MAX_BUNDLE_BYTES >> 20} MiB: "
                                                 "drop data the tasks do not need")])
    return Bundle(data=data, digest=sha256_digest(data), entries=ordered)


def tar_info(name: str, kind: str, mode: int, size: int = 0, target: str = "", uid: int = 0,
             gid: int = 0) -> tarfile.TarInfo:
    """A TarInfo with every varying field pinned (mtime 0, no owner names)."""
    ti = tarfile.TarInfo(name)
    ti.mtime = 0
    ti.uid, ti.gid = uid, gid
    ti.uname = ti.gname = ""
    ti.mode = mode
    if kind == "dir":
        ti.type = tarfile.DIRTYPE
    elif kind == "symlink":
        ti.type = tarfile.SYMTYPE
        ti.linkname = target
    else:
        ti.type = tarfile.REGTYPE
        ti.size = size
    return ti


def _write_tar(entries: tuple[BundleEntry, ...]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            ti = tar_info(e.path, e.kind, e.mode, len(e.data), e.target)
            tar.addfile(ti, io.BytesIO(e.data) if e.kind == "file" else None)
    return buf.getvalue()


def read_bundle(data: bytes) -> Bundle:
    """Parse bundle bytes (e.g. downloaded) back into entries; the digest is recomputed."""
    entries = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for ti in tar.getmembers():
            if ti.isdir():
                entries.append(BundleEntry(ti.name, "dir", ti.mode))
            elif ti.issym():
                entries.append(BundleEntry(ti.name, "symlink", ti.mode, target=ti.linkname))
            elif ti.isfile():
                f = tar.extractfile(ti)
                assert f is not None
                entries.append(BundleEntry(ti.name, "file", ti.mode, data=f.read()))
    return Bundle(data=data, digest=sha256_digest(data), entries=tuple(entries))
