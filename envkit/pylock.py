"""Python wheels for an environment's image: a lock with hashes, a cache by hash, a layer.

A lock is a text file of requirement lines pinned by hash, each naming its wheel::

    # envkit python lock: CPython 3.11, manylinux x86_64 (the base image's Python)
    pytest==8.4.2 --hash=sha256:<64 hex>  # file: pytest-8.4.2-py3-none-any.whl

:func:`resolve` makes one (pip resolves and downloads the wheels once); :func:`layer` turns
one into an image layer: every wheel installed (with ``installer``, pypa's reference wheel
installer: no byte-code, launcher scripts for ``/usr/bin/python3``) into the image's
site-packages, written as a tar with every varying field pinned. The same lock therefore
always gives the same layer, byte for byte, and the same image ID.

Wheels are kept in ``$XDG_CACHE_HOME/envkit/wheels/<sha256>/<file>`` (default
``~/.cache``; ``ENVKIT_WHEEL_CACHE`` names another folder): a build that finds every wheel there
needs no network. A missing one is downloaded (``pip download``) and checked against its hash.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from envkit.bundle import tar_info
from envkit.errors import UserError

__all__ = ["IMAGE_SITE", "LockEntry", "cache_dir", "cached_layer", "layer", "parse_lock", "resolve", "wheel_path",
           "write_lock"]

# The base image is Debian bookworm: its python3 is CPython 3.11, and this is the site folder
# it reads before Debian's own (so a locked pytest comes before python3-pytest).
IMAGE_PYTHON = "3.11"
IMAGE_SITE = "usr/local/lib/python3.11/dist-packages"
IMAGE_BIN = "usr/local/bin"
TARGET = ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--abi", "abi3", "--abi", "none",
          "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64", "--platform", "linux_x86_64",
          "--platform", "any", "--only-binary", ":all:"]
_LINE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)\s+--hash=sha256:(?P<sha>[0-9a-f]{64})"
                   r"\s+#\s*file:\s*(?P<file>\S+\.whl)\s*$")


@dataclass(frozen=True)
class LockEntry:
    name: str
    version: str
    sha256: str
    file: str

    def line(self) -> str:
        return f"{self.name}=={self.version} --hash=sha256:{self.sha256}  # file: {self.file}"


def cache_dir() -> Path:
    """Where wheels are kept by hash: ``$ENVKIT_WHEEL_CACHE``, else ``$XDG_CACHE_HOME/envkit/wheels``."""
    if os.environ.get("ENVKIT_WHEEL_CACHE"):
        return Path(os.environ["ENVKIT_WHEEL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "envkit" / "wheels"


def parse_lock(text: str, source: str = "python.lock") -> list[LockEntry]:
    entries = []
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            raise UserError(f"{source}:{n} is not a locked wheel: {line[:120]!r}",
                            "each line is `name==version --hash=sha256:<64 hex>  # file: <wheel>`; "
                            "envkit synth writes them")
        entries.append(LockEntry(m["name"], m["version"], m["sha"], m["file"]))
    return sorted(entries, key=lambda e: e.name.lower())


def write_lock(entries: list[LockEntry], requested: list[str]) -> str:
    head = [f"# envkit python lock: CPython {IMAGE_PYTHON}, manylinux x86_64 (the base image's Python)",
            f"# resolved from: {' '.join(sorted(requested))}"]
    return "\n".join(head + [e.line() for e in sorted(entries, key=lambda e: e.name.lower())]) + "\n"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _store(path: Path) -> tuple[str, Path]:
    sha = _sha256(path)
    dest = cache_dir() / sha / path.name
    if not dest.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_suffix(".part")
        shutil.copyfile(path, tmp)
        os.replace(tmp, dest)
    return sha, dest


def _pip(args: list[str], what: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        last = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("WARNING: Location")]
        raise UserError(f"pip could not download {what}: {(last[-1] if last else 'no message')[:300]}",
                        "check the name and version and that the package index is reachable; "
                        f"a build with every wheel in {cache_dir()} needs no network")


def resolve(requirements: list[str]) -> list[LockEntry]:
    """Resolve ``requirements`` for the image's Python into wheels (pip), store them in the
    cache by hash and return the lock."""
    with tempfile.TemporaryDirectory(prefix="envkit-wheels-") as tmp:
        _pip([*TARGET, "-d", tmp, *requirements], " ".join(requirements))
        entries = []
        for path in sorted(Path(tmp).glob("*.whl")):
            sha, _ = _store(path)
            name, version = path.name.split("-")[:2]
            entries.append(LockEntry(name.replace("_", "-").lower(), version, sha, path.name))
        if not entries:
            raise UserError(f"pip found no wheels for {' '.join(requirements)}", "list packages that publish wheels")
        return entries


def wheel_path(entry: LockEntry) -> Path:
    """The wheel of ``entry``, from the cache, or downloaded once and checked by hash."""
    path = cache_dir() / entry.sha256 / entry.file
    if path.is_file():
        return path
    with tempfile.TemporaryDirectory(prefix="envkit-wheels-") as tmp:
        try:
            _pip([*TARGET, "--no-deps", "-d", tmp, f"{entry.name}=={entry.version}"], f"{entry.name}=={entry.version}")
        except UserError as e:
            raise UserError(f"the wheel {entry.file} is not in envkit's cache ({cache_dir()}) and {e.message}",
                            "connect to the package index once (the wheel is then kept by its hash), or copy the cache "
                            "folder from a machine that has it") from None
        got = Path(tmp) / entry.file
        if not got.is_file():
            raise UserError(f"pip did not give {entry.file} for {entry.name}=={entry.version}",
                            "re-resolve the lock (envkit synth writes a new one)")
        sha, dest = _store(got)
        if sha != entry.sha256:
            raise UserError(f"{entry.file} has sha256 {sha}, the lock says {entry.sha256}",
                            "the index serves another file under that name: re-resolve the lock, "
                            "or restore the cached wheel")
        return dest


def layer(entries: list[LockEntry]) -> bytes:
    """The image layer holding every locked wheel installed (deterministic tar)."""
    from installer import install
    from installer.destinations import SchemeDictionaryDestination
    from installer.sources import WheelFile

    with tempfile.TemporaryDirectory(prefix="envkit-site-") as tmp:
        root = Path(tmp)
        scheme = {"purelib": root / IMAGE_SITE, "platlib": root / IMAGE_SITE, "scripts": root / IMAGE_BIN,
                  "data": root / "usr/local", "headers": root / "usr/local/include"}
        destination = SchemeDictionaryDestination({k: str(v) for k, v in scheme.items()},
                                                  interpreter="/usr/bin/python3",
                                                  script_kind="posix", bytecode_optimization_levels=())
        for entry in entries:
            with WheelFile.open(wheel_path(entry)) as source:
                install(source, destination, {"INSTALLER": b"envkit"})
        return _tar_tree(root)


def cached_layer(text: str, source: str = "python.lock") -> bytes:
    """:func:`layer` for a lock's text, kept beside the wheels by the text's hash (a build
    that finds it installs nothing)."""
    path = cache_dir() / "layers" / (hashlib.sha256(text.encode()).hexdigest() + ".tar")
    if path.is_file():
        return path.read_bytes()
    data = layer(parse_lock(text, source))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.part")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return data


def _tar_tree(root: Path) -> bytes:
    paths: set[str] = set()
    for path in root.rglob("*"):
        rel = path.relative_to(root).as_posix()
        paths.add(rel)
        for i in range(1, rel.count("/") + 1):
            paths.add(rel.rsplit("/", i)[0])
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in sorted(paths):
            path = root / rel
            if path.is_symlink():
                tar.addfile(tar_info(rel, "symlink", 0o777, target=os.readlink(path)))
            elif path.is_dir():
                tar.addfile(tar_info(rel, "dir", 0o755))
            else:
                data = path.read_bytes()
                mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
                tar.addfile(tar_info(rel, "file", mode, len(data)), io.BytesIO(data))
    return buf.getvalue()
