import io
import os
import tarfile
from pathlib import Path

import pytest

from envkit.bundle import make_bundle, read_bundle
from envkit.errors import SpecError
from envkit.spec import load_environment


def _digest(path: Path) -> str:
    return make_bundle(load_environment(path)).digest


def test_same_files_same_digest_whatever_the_mtimes(pyfix_copy: Path):
    first = _digest(pyfix_copy)
    for p in pyfix_copy.rglob("*"):
        os.utime(p, (1, 1))
    assert _digest(pyfix_copy) == first


def test_one_byte_changes_the_digest(pyfix_copy: Path):
    first = _digest(pyfix_copy)
    f = pyfix_copy / "repo" / "kit" / "stats.py"
    f.write_bytes(f.read_bytes() + b" ")
    assert _digest(pyfix_copy) != first


def test_exec_bit_changes_the_digest(pyfix_copy: Path):
    first = _digest(pyfix_copy)
    (pyfix_copy / "repo" / "README.md").chmod(0o755)
    assert _digest(pyfix_copy) != first


def test_ignored_files_do_not_count(pyfix_copy: Path):
    first = _digest(pyfix_copy)
    (pyfix_copy / "repo" / "kit" / "__pycache__").mkdir()
    (pyfix_copy / "repo" / "kit" / "__pycache__" / "x.pyc").write_bytes(b"junk")
    (pyfix_copy / "envkit.lock").write_text("{}")
    (pyfix_copy / "notes.txt").write_text("not listed in [image] files")
    assert _digest(pyfix_copy) == first


def test_entries_are_sorted_and_normalised(pyfix_copy: Path):
    bundle = make_bundle(load_environment(pyfix_copy))
    with tarfile.open(fileobj=io.BytesIO(bundle.data)) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names)
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 and m.uname == "" for m in members)
    assert all(m.mode in (0o644, 0o755) for m in members)
    assert "envkit.toml" in names and "repo/kit/stats.py" in names and "oracle/fix-median.sh" in names
    assert read_bundle(bundle.data).digest == bundle.digest


def test_symlink_escaping_the_environment_is_refused(pyfix_copy: Path):
    (pyfix_copy / "repo" / "escape").symlink_to("/etc/passwd")
    with pytest.raises(SpecError, match="symlink points outside"):
        make_bundle(load_environment(pyfix_copy))
