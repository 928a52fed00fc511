"""The workspace's state: the seed commit (written without running git), the state hash, the
reset to a seed (with a task's patch) and atomic file writes."""

import hashlib
import json
import os
import shutil
import stat
import time

from helper_users import AGENT_UID, WORKSPACE, chown_tree, leftovers, scrub

SEED_REPO = "/seed/repo"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "envkit", "GIT_AUTHOR_EMAIL": "seed@envkit.invalid",
    "GIT_COMMITTER_NAME": "envkit", "GIT_COMMITTER_EMAIL": "seed@envkit.invalid",
    "GIT_AUTHOR_DATE": "1970-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "1970-01-01T00:00:00Z",
    "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "HOME": "/nonexistent",
}


def _read_chunks(fd, size=1 << 20):
    while chunk := os.read(fd, size):
        yield chunk


def _digest(path):
    """sha256 of a regular file, opened without following links or blocking (a FIFO)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "not-a-file"
        h = hashlib.sha256()
        for chunk in _read_chunks(fd):
            h.update(chunk)
        return h.hexdigest()
    finally:
        os.close(fd)


class _NeedGit(Exception):
    """The seed repository has something only git itself reads right (ignore or attribute
    files, a nested repository, a file that is neither regular nor a link)."""


def _git_special(name, link=False):
    """A name git itself reads or refuses (case-insensitively, as git 2.39 with its defaults on
    Linux does): .git and the spellings NTFS takes for it (".git.", ".git :x", "git~1"),
    .gitignore and .gitattributes, and a link with a name like .gitmodules or .gitignore.
    Ordinary names (.github, .gitkeep) are not."""
    lower = name.lower()
    if link and lower.startswith((b".git", b"git~", b"gitmod~", b".mailmap")):
        return True
    stem = lower.split(b":")[0].split(b"\\")[0]
    return stem.rstrip(b" .") in (b".git", b"git~1") or lower in (b".gitignore", b".gitattributes")


def _git_put(git_dir, kind, data):
    """Write one loose object (zlib) into ``git_dir``; its hex id."""
    return _git_put_stream(git_dir, kind, len(data), (data,))


def _git_put_stream(git_dir, kind, size, chunks):
    """``_git_put`` of ``size`` bytes given in ``chunks``, never all held at once (a large file
    of the seed repository must not take the sandbox's memory): hashed and compressed as they
    come into a temporary file, then renamed to the object's path."""
    import zlib

    sha, pack = hashlib.sha1(), zlib.compressobj(1)
    tmp = os.path.join(git_dir, b"objects", b"incoming")
    got = 0
    with open(tmp, "wb") as f:
        for chunk in _prefixed(kind, size, chunks):
            sha.update(chunk)
            f.write(pack.compress(chunk))
            got += len(chunk)
        f.write(pack.flush())
    if got != len(b"%s %d\0" % (kind, size)) + size:
        os.unlink(tmp)
        raise _NeedGit("a file changed while it was read")
    oid = sha.hexdigest()
    folder = os.path.join(git_dir, b"objects", oid[:2].encode())
    os.makedirs(folder, exist_ok=True)
    os.replace(tmp, os.path.join(folder, oid[2:].encode()))
    return oid


def _prefixed(kind, size, chunks):
    yield b"%s %d\0" % (kind, size)
    yield from chunks



def _git_tree(root, rel, git_dir, index):
    """The tree object of ``root/rel`` (bytes paths) as `git add -A` would stage it: files
    (100755 when the owner may execute them, else 100644), links (120000, their target),
    folders (40000; an empty one is left out, as git does); its hex id, or None when empty.
    Appends (path, lstat, mode, id) of each file and link to ``index``."""
    entries = []
    with os.scandir(os.path.join(root, rel) if rel else root) as listing:
        found = list(listing)
    for entry in found:
        name = entry.name
        if name == b".git" and not rel:
            continue  # the one being written (seed_commit made sure there was none)
        path = os.path.join(rel, name) if rel else name
        st = entry.stat(follow_symlinks=False)
        if _git_special(name, link=stat.S_ISLNK(st.st_mode)):
            raise _NeedGit(name)
        if stat.S_ISDIR(st.st_mode):
            oid = _git_tree(root, path, git_dir, index)
            if oid is not None:
                entries.append((name + b"/", b"40000 " + name, oid))
            continue
        if stat.S_ISLNK(st.st_mode):
            mode = 0o120000
            oid = _git_put(git_dir, b"blob", os.readlink(entry.path))
        elif stat.S_ISREG(st.st_mode):
            mode = 0o100755 if st.st_mode & stat.S_IXUSR else 0o100644
            fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise _NeedGit(path)
                oid = _git_put_stream(git_dir, b"blob", st.st_size, _read_chunks(fd))
            finally:
                os.close(fd)
        else:
            raise _NeedGit(path)
        index.append((path, st, mode, oid))
        entries.append((name, b"%o " % mode + name, oid))
    if not entries:
        return None
    entries.sort(key=lambda e: e[0])  # git orders a folder as if its name ended in "/"
    return _git_put(git_dir, b"tree", b"".join(head + b"\0" + bytes.fromhex(oid) for _key, head, oid in entries))


def _git_index(index):
    """The index file (version 2) of the staged files, with the stat data they had when read."""
    import struct

    out = [b"DIRC", struct.pack(">II", 2, len(index))]
    for path, st, mode, oid in sorted(index, key=lambda e: e[0]):
        fields = (st.st_ctime_ns // 10**9, st.st_ctime_ns % 10**9, st.st_mtime_ns // 10**9, st.st_mtime_ns % 10**9,
                  st.st_dev, st.st_ino, mode, st.st_uid, st.st_gid, st.st_size)
        entry = struct.pack(">10I", *(v & 0xFFFFFFFF for v in fields)) + bytes.fromhex(oid)
        entry += struct.pack(">H", min(len(path), 0xFFF)) + path
        out.append(entry + b"\0" * (8 - len(entry) % 8))  # 1-8 NULs: the entry ends on 8 bytes
    data = b"".join(out)
    return data + hashlib.sha1(data).digest()


def seed_commit(workspace=WORKSPACE):
    """`git init -b main && git add -A && git commit -m "envkit seed"` with GIT_ENV's author,
    committer and dates, written directly (objects, index, branch and its log): the same commit
    id, and three processes fewer on every reset (each 40-60 ms under gVisor). What git treats
    specially or refuses (ignore, attribute or module files, a nested repository, names such as
    ".GIT" or "git~1", a file that is neither regular nor a link) and an empty repository
    (nothing to commit) are left to git itself, which does what it always did. Returns the id."""
    root = os.fsencode(workspace)
    git_dir = os.path.join(root, b".git")
    try:
        if os.path.lexists(git_dir):
            raise _NeedGit(".git")
        for sub in (b"objects/info", b"objects/pack", b"refs/heads", b"refs/tags", b"info"):
            os.makedirs(os.path.join(git_dir, sub))
        index = []
        tree = _git_tree(root, b"", git_dir, index)
        if tree is None:
            raise _NeedGit("nothing to commit")
    except _NeedGit as e:
        if str(e) != ".git":
            shutil.rmtree(git_dir)  # the one begun here
        git("init", "-q", "-b", "main", cwd=workspace)
        git("add", "-A", cwd=workspace)
        git("commit", "-q", "--no-gpg-sign", "-m", "envkit seed", cwd=workspace)
        return git("rev-parse", "HEAD", cwd=workspace)
    who = {}
    for role in ("AUTHOR", "COMMITTER"):
        stamp = int(_iso_seconds(GIT_ENV[f"GIT_{role}_DATE"]))
        who[role] = f"{GIT_ENV[f'GIT_{role}_NAME']} <{GIT_ENV[f'GIT_{role}_EMAIL']}> {stamp} +0000"
    commit = _git_put(git_dir, b"commit", (f"tree {tree}\nauthor {who['AUTHOR']}\ncommitter {who['COMMITTER']}\n\n"
                                           "envkit seed\n").encode())
    logged = f"{'0' * 40} {commit} {who['COMMITTER']}\tcommit (initial): envkit seed\n".encode()
    os.makedirs(os.path.join(git_dir, b"logs/refs/heads"))
    files = {b"HEAD": b"ref: refs/heads/main\n", b"refs/heads/main": commit.encode() + b"\n",
             b"index": _git_index(index),
             b"logs/HEAD": logged, b"logs/refs/heads/main": logged,
             b"config": b"[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n"
                        b"\tlogallrefupdates = true\n"}
    for name, data in files.items():
        with open(os.path.join(git_dir, name), "xb") as f:
            f.write(data)
    return commit


def _iso_seconds(text):
    """Seconds since the epoch of a UTC time written as GIT_ENV writes it (...T...Z)."""
    import calendar

    return calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ"))


def git(*args, cwd=WORKSPACE):
    import subprocess

    env = dict(os.environ, **GIT_ENV)
    return subprocess.run(["git", "-c", f"safe.directory={cwd}", *args], cwd=cwd, env=env, check=True,
                          capture_output=True, text=True).stdout.strip()


def _head():
    """The workspace's HEAD commit, read from .git's files (never by running git as root on a
    repository the agent controls): a 40-hex id, or ""."""
    def read(rel):
        try:
            fd = os.open(os.path.join(WORKSPACE, ".git", rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return ""
        try:
            return os.read(fd, 4096).decode(errors="replace") if stat.S_ISREG(os.fstat(fd).st_mode) else ""
        finally:
            os.close(fd)

    head = read("HEAD").strip()
    if head.startswith("ref: refs/heads/") and ".." not in head:
        ref = head[5:]
        head = read(ref).strip()
        if not head:
            for line in read("packed-refs").splitlines():
                if line.endswith(" " + ref):
                    head = line.split()[0]
    return head if len(head) == 40 and all(c in "0123456789abcdef" for c in head) else ""


def state():
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(WORKSPACE):
        dirnames[:] = sorted(d for d in dirnames if not (dirpath == WORKSPACE and d == ".git"))
        rel_dir = os.path.relpath(dirpath, WORKSPACE)
        h.update(f"D {rel_dir}\n".encode())
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            p = os.path.join(dirpath, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if stat.S_ISLNK(st.st_mode):
                h.update(f"L {rel} {os.readlink(p)}\n".encode())
            elif stat.S_ISREG(st.st_mode):
                try:
                    digest = _digest(p)
                except OSError:
                    digest = "unreadable"
                h.update(f"F {rel} {st.st_mode & 0o777:o} {digest}\n".encode())
            else:
                h.update(f"O {rel} {stat.S_IFMT(st.st_mode):o}\n".encode())
    commit = _head()
    h.update(f"C {commit}\n".encode())
    left = leftovers()
    for line in left:
        h.update(f"{line}\n".encode())
    out = {"state_hash": "sha256:" + h.hexdigest(), "commit": commit}
    if left:
        out["leftovers"] = left[:20]
    return out


def reset(seed, task=None):
    scrub()
    patched = None
    if os.path.isdir(SEED_REPO):
        for name in os.listdir(SEED_REPO):
            src, dst = os.path.join(SEED_REPO, name), os.path.join(WORKSPACE, name)
            if os.path.isdir(src) and not os.path.islink(src):
                shutil.copytree(src, dst, symlinks=True)
            else:
                shutil.copy2(src, dst, follow_symlinks=False)
        seed_file = _seed_file()
        if seed_file:  # the environment's seeded state: the seed in a file of the workspace, committed
            path = os.path.join(WORKSPACE, seed_file)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if os.path.lexists(path):
                os.unlink(path)  # a file of the seed repository by that name (a link is never followed)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "w") as f:
                f.write(f"{int(seed)}\n")
        patched = _task_patch(task)
        if patched is not None:
            apply_patch(WORKSPACE, patched)
        seed_commit()
    chown_tree(WORKSPACE, AGENT_UID)
    out = state()
    out["seed"] = seed
    if patched is not None:
        out["task"] = task
    return out


SEED_PATCHES = "/seed/patches"


def _task_patch(task):
    """The task's patch (bytes), when the image holds patches and one for this task."""
    if not task or not os.path.isdir(SEED_PATCHES):
        return None
    if not all(c.isalnum() or c in "-_." for c in task) or task.startswith("."):
        raise ValueError(f"not a task id: {task[:80]!r}")
    try:
        with open(os.path.join(SEED_PATCHES, task + ".diff"), "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def apply_patch(root, patch):
    """Apply a unified diff (``--- a/PATH`` / ``+++ b/PATH`` and hunks) to files under root,
    strictly: every context and removed line must be where the hunk says, or it raises."""
    lines = patch.decode().splitlines(keepends=True)
    i = 0
    while i < len(lines):
        if not lines[i].startswith("--- "):
            i += 1
            continue
        path = lines[i + 1][4:].strip().split("\t")[0]
        path = path[2:] if path.startswith("b/") else path
        full = os.path.normpath(os.path.join(root, path))
        if not full.startswith(root + os.sep) or os.path.islink(full):
            raise ValueError(f"patch path outside the repository: {path!r}")
        with open(full) as f:
            old = f.read().splitlines(keepends=True)
        times = os.stat(full)
        new, pos, i = [], 0, i + 2
        while i < len(lines) and lines[i].startswith("@@"):
            old_side, new_side = lines[i].split()[1:3]
            start, _, size = old_side[1:].partition(",")
            left_old, left_new = int(size or 1), int(new_side[1:].partition(",")[2] or 1)
            start = int(start) if size == "0" else int(start) - 1  # an empty old side inserts after its line
            if start < pos:
                raise ValueError(f"patch hunks out of order in {path}")
            new.extend(old[pos:start])
            pos, i = start, i + 1
            while left_old or left_new:  # the hunk's own lines, by its counts ("--- " may be a removed line)
                tag, text = lines[i][:1], lines[i][1:]
                if tag == "+":
                    new.append(text)
                    left_new -= 1
                elif tag in (" ", "-"):
                    if pos >= len(old) or old[pos] != text:
                        raise ValueError(f"patch does not apply to {path} at line {pos + 1}")
                    if tag == " ":
                        new.append(old[pos])
                        left_new -= 1
                    left_old -= 1
                    pos += 1
                elif tag != "\\":
                    raise ValueError(f"not a hunk line in the patch of {path}: {lines[i][:40]!r}")
                i += 1
        new.extend(old[pos:])
        with open(full, "w") as f:
            f.write("".join(new))
        # its time says nothing of which files the patch touched
        os.utime(full, ns=(times.st_atime_ns, times.st_mtime_ns))


def _seed_file():
    """The workspace file each reset writes the seed into (envkit.toml's [state] repo.seed_file), or None."""
    try:
        with open(SEED_REPO + ".json") as f:
            return json.load(f).get("seed_file")
    except FileNotFoundError:
        return None


def write(path, mode, data):
    tmp = f"{path}.envkit-tmp"
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(tmp, "wb") as f:
        f.write(data)
    os.chmod(tmp, int(mode, 8))
    os.replace(tmp, path)
    return {"written": len(data)}

