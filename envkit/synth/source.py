"""Where a project comes from: ``pypi:NAME==VERSION`` (its sdist, by pip, sha256 recorded), a
local folder, or ``git:PATH@COMMIT`` (the files of that commit, never its history)."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from envkit.errors import UserError

__all__ = ["Source", "fetch", "parse_source"]

# Never copied into an environment: history, caches, build output, installed copies.
SKIP_NAMES = {".git", ".hg", ".svn", "__pycache__", ".tox", ".nox", ".venv", "venv", ".mypy_cache", ".pytest_cache",
              ".ruff_cache", "build", "dist", ".eggs", ".coverage", "htmlcov", ".github", ".gitlab"}
SKIP_SUFFIXES = (".pyc", ".pyo", ".so", ".egg-info", ".dist-info", ".whl", ".tar.gz", ".zip")
_PYPI = re.compile(r"^pypi:([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9._+!-]+)$")


@dataclass(frozen=True)
class Source:
    kind: str  # pypi | folder | git
    spec: str  # what the user gave
    digest: str  # sha256 of the sdist, the git commit, or of the folder's files
    origin: str  # file name, folder path or repository path


def parse_source(text: str) -> tuple[str, str, str]:
    """(kind, a, b): ("pypi", name, version), ("git", path, commit) or ("folder", path, "")."""
    m = _PYPI.match(text)
    if m:
        return "pypi", m.group(1), m.group(2)
    if text.startswith("pypi:"):
        raise UserError(f"`{text}` is not pypi:NAME==VERSION", "pin one version, e.g. pypi:isodate==0.7.2")
    if text.startswith("git:"):
        path, at, commit = text[4:].rpartition("@")
        if not at or not re.fullmatch(r"[0-9a-fA-F]{7,40}", commit):
            raise UserError(f"`{text}` is not git:PATH@COMMIT", "name the commit, e.g. git:../isodate@3f2c1b0")
        return "git", path, commit
    return "folder", text, ""


def _copy_tree(src: Path, dest: Path) -> None:
    def ignore(folder: str, names: list[str]) -> set[str]:
        return {n for n in names if n in SKIP_NAMES or n.endswith(SKIP_SUFFIXES)}
    shutil.copytree(src, dest, ignore=ignore, symlinks=False, ignore_dangling_symlinks=True)


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + hashlib.sha256(p.read_bytes()).digest())
    return "sha256:" + h.hexdigest()


def _unpack(archive: Path, dest: Path) -> Path:
    """Unpack an sdist safely (no absolute paths, links out or devices) and return its top folder."""
    unpacked = dest / "unpacked"
    unpacked.mkdir()
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            for name in z.namelist():
                if name.startswith("/") or ".." in Path(name).parts:
                    raise UserError(f"{archive.name} holds an unsafe path {name!r}", "use another version")
            z.extractall(unpacked)
    else:
        with tarfile.open(archive) as t:
            t.extractall(unpacked, filter="data")
    tops = [p for p in unpacked.iterdir() if p.is_dir()]
    return tops[0] if len(tops) == 1 else unpacked


def fetch(text: str, work: Path) -> tuple[Path, Source]:
    """The project's files in a fresh folder under ``work`` (no history, caches or build
    output), and where they came from."""
    kind, a, b = parse_source(text)
    dest = work / "project"
    if kind == "pypi":
        downloads = work / "sdist"
        downloads.mkdir()
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                               "--no-deps", "--no-binary", a, f"{a}=={b}", "-d", str(downloads)],
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            lines = [line for line in proc.stderr.splitlines()
                     if line.strip() and not line.startswith("WARNING: Location")]
            why = next((line for line in lines if "No matching distribution" in line or "ERROR" in line),
                       lines[-1] if lines else "no message")
            raise UserError(f"could not download the source distribution of {a}=={b}: {why[:300]}",
                            f"check the name and the version (`pip index versions {a}` lists them) "
                            "and that the package index is reachable")
        files = [p for p in downloads.iterdir() if p.is_file()]
        if len(files) != 1 or not files[0].name.endswith((".tar.gz", ".zip", ".tgz")):
            raise UserError(f"{a}=={b} has no source distribution (got {[p.name for p in files]})",
                            "pick a version that publishes an sdist, or give a local folder or a git checkout")
        digest = "sha256:" + hashlib.sha256(files[0].read_bytes()).hexdigest()
        _copy_tree(_unpack(files[0], work), dest)
        return dest, Source("pypi", text, digest, files[0].name)
    if kind == "git":
        repo = Path(a).expanduser()
        proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", f"{b}^{{commit}}"],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise UserError(f"{repo} has no commit {b}",
                            "give a git checkout and one of its commits (git log --oneline)")
        commit = proc.stdout.strip()
        tmp = work / "git-files"
        tmp.mkdir()
        with tempfile.TemporaryFile() as archive:
            subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", commit], stdout=archive, check=True)
            archive.seek(0)
            with tarfile.open(fileobj=archive) as t:
                t.extractall(tmp, filter="data")
        _copy_tree(tmp, dest)
        return dest, Source("git", text, commit, str(repo.resolve()))
    folder = Path(a).expanduser()
    if not folder.is_dir():
        raise UserError(f"`{text}` is neither pypi:NAME==VERSION, git:PATH@COMMIT nor a folder",
                        "give a package pinned on the index, a git checkout at a commit, or a project folder")
    _copy_tree(folder, dest)
    return dest, Source("folder", text, _tree_digest(dest), str(folder.resolve()))
