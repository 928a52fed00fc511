"""The reset's seed commit, written by helper.py without running git, against git itself (the
same version the base image carries): the same commit id, a repository git reads as clean,
and git itself for what only git reads right (ignore and attribute files)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ..conftest import ROOT

_INCONTAINER = ROOT / "envkit" / "sandbox" / "incontainer"
_spec = importlib.util.spec_from_file_location("envkit_helper_repo", _INCONTAINER / "helper_repo.py")
helper = importlib.util.module_from_spec(_spec)
sys.path.insert(0, str(_INCONTAINER))  # its sibling helper_users
try:
    _spec.loader.exec_module(helper)  # type: ignore[union-attr]
finally:
    sys.path.remove(str(_INCONTAINER))


def by_git(path: Path) -> str:
    """What resets did before: git init, add -A, commit, with the helper's environment."""
    for args in (("init", "-q", "-b", "main"), ("add", "-A"), ("commit", "-q", "--no-gpg-sign", "-m", "envkit seed")):
        helper.git(*args, cwd=str(path))
    return helper.git("rev-parse", "HEAD", cwd=str(path))


def git_out(path: Path, *args: str) -> str:
    return helper.git(*args, cwd=str(path))


def without_git(path: Path) -> str:
    """helper.seed_commit(path), failing if it ran git."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"seed_commit ran git {args}")

    real, helper.git = helper.git, refuse
    try:
        return helper.seed_commit(str(path))
    finally:
        helper.git = real


def make_tree(root: Path, files: dict[str, bytes | str]) -> None:
    """``files``: path -> bytes (a file), "->target" (a link), "x:..." (an executable file),
    "/" (an empty folder)."""
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if content == "/":
            p.mkdir(exist_ok=True)
        elif isinstance(content, str) and content.startswith("->"):
            os.symlink(content[2:], p)
        elif isinstance(content, str) and content.startswith("x:"):
            p.write_bytes(content[2:].encode())
            p.chmod(0o755)
        else:
            p.write_bytes(content if isinstance(content, bytes) else content.encode())


EDGES = {
    "ab": b"plain\n", "a.b": b"dot", "a-b": b"dash", "a/x": b"in a folder named like files", "a0": b"",
    "bin/run.sh": "x:#!/bin/sh\necho hi\n", "link": "->ab", "dirlink": "->a", "broken": "->nowhere",
    "empty/": "/", "nested/empty/deeper/": "/", "deep/er/est/file.txt": b"deep", "crlf.txt": b"one\r\ntwo\r\n",
    "bin.dat": bytes(range(256)) * 40, "ünï cödé.txt": b"utf-8 name", "sp ace/t\tab": b"odd names",
    "group-only-exec": b"mode 0o710", "big.bin": bytes(range(251)) * 12000,  # 3 MB: read in chunks
    ".github/workflows/ci.yml": b"on: push\n", ".gitkeep": b"", "x/.gitmodules": b"a plain file\n",
}


def test_the_seed_commit_is_gits_own_and_git_reads_it_clean(tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for root in (ours, theirs):
        make_tree(root, EDGES)
        (root / "group-only-exec").chmod(0o610)  # no owner exec bit: 100644 for git
    commit = without_git(ours)
    assert commit == by_git(theirs)
    assert git_out(ours, "rev-parse", "HEAD") == commit and git_out(ours, "symbolic-ref", "HEAD") == "refs/heads/main"
    assert git_out(ours, "status", "--porcelain", "--ignored") == ""  # the index matches the files
    assert git_out(ours, "ls-files", "-s") == git_out(theirs, "ls-files", "-s")
    git_out(ours, "fsck", "--strict", "--no-dangling")  # raises on a malformed object
    for log in ("logs/HEAD", "logs/refs/heads/main"):  # the branch's log as git writes it
        assert (ours / ".git" / log).read_bytes() == (theirs / ".git" / log).read_bytes()
    assert git_out(ours, "rev-parse", "HEAD@{0}") == commit
    (ours / "ab").write_bytes(b"changed\n")
    assert git_out(ours, "status", "--porcelain") == "M ab"


def test_ignore_and_attribute_files_are_left_to_git(tmp_path):
    for extra in ({".gitignore": b"*.log\n"}, {"sub/.gitattributes": b"*.txt text eol=lf\n"}):
        ours, theirs = tmp_path / f"ours{len(extra)}{id(extra)}", tmp_path / f"theirs{id(extra)}"
        for root in (ours, theirs):
            make_tree(root, {"keep.txt": b"a\r\nb\n", "skip.log": b"ignored?", "sub/x.txt": b"c\r\n", **extra})
        assert helper.seed_commit(str(ours)) == by_git(theirs)
        assert git_out(ours, "status", "--porcelain") == ""


def test_what_git_refuses_or_has_nothing_to_commit_fails_as_git_does(tmp_path):
    for i, files in enumerate(({".GIT/config": b"x"}, {"git~1": b"x"}, {".git. ": b"x"}, {"sub/.Git :x": b"x"},
                               {".gitmodules": "->ab", "ab": b"x"},
                               {"empty/": "/"})):
        ours, theirs = tmp_path / f"ours{i}", tmp_path / f"theirs{i}"
        for root in (ours, theirs):
            make_tree(root, files)
        with pytest.raises(subprocess.CalledProcessError) as git_said:
            by_git(theirs)
        with pytest.raises(subprocess.CalledProcessError) as we_said:
            helper.seed_commit(str(ours))
        assert we_said.value.stderr == git_said.value.stderr


names = st.text(alphabet="ab.-_/xé", min_size=1, max_size=6).filter(
    lambda n: not n.startswith("/") and not n.endswith("/") and "//" not in n
    and all(part not in (".", "..", ".git") and not part.startswith(".git") for part in n.split("/")))
trees = st.dictionaries(names, st.binary(max_size=30) | st.just("x:run") | st.just("->a") | st.just("/"), min_size=1,
                        max_size=8)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=trees)
def test_any_tree_gets_gits_commit(tmp_path_factory, files):
    base = tmp_path_factory.mktemp("tree")
    roots = (base / "ours", base / "theirs")
    try:
        for root in roots:
            root.mkdir()
            make_tree(root, files)
    except (FileExistsError, NotADirectoryError, IsADirectoryError, FileNotFoundError):
        return  # a name that is both a file and a folder: no such tree
    if not any(p.is_file() or p.is_symlink() for p in roots[1].rglob("*")):
        with pytest.raises(subprocess.CalledProcessError):  # git has nothing to commit
            by_git(roots[1])
        return
    assert without_git(roots[0]) == by_git(roots[1])
    assert git_out(roots[0], "status", "--porcelain") == ""
