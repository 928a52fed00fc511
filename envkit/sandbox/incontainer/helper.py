"""envkit in-sandbox helper (runs inside the container with the base image's python3).

    helper.py reset SEED [TASK]  as root: the whole-sandbox reset (kill every process of the agent
                            and verifier users, wipe every place they can write, remove their
                            IPC objects, restore the seeded repository, with TASK's patch
                            applied when the image has one), print JSON
                            {"state_hash", "commit", "seed"} (and "task" when a patch applied)
    helper.py scrub         as root: the same without a repository (service environments)
    helper.py hash          as root: {"state_hash", "commit"} for the sandbox as it is
    helper.py killall       kill every process of the calling user
    helper.py write PATH MODE   write stdin to PATH (atomically) with MODE (octal)
    helper.py service-reset SEED   as the service user: restore the database from its fixture,
                            start the service if it is not running, wait for its health check,
                            print {"state_hash"} (or {"error", "log_tail"} and exit 3)
    helper.py service-hash  the service state's hash as it is now
    helper.py http METHOD PATH  a request to the service (JSON body on stdin), printed as JSON
    helper.py relay         pipe stdin/stdout to the service's TCP port (the host's port forward)
    helper.py serve         the sandbox's command channel: JSON lines in and out (see serve())

Root in the sandbox holds only CAP_KILL, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_CHOWN, CAP_SETUID
and CAP_SETGID, and only these helpers run as root: the agent, verifier and service users have
no capabilities (and no-new-privileges), so no process of theirs can signal, trace or steer a
reset. The state hash covers the workspace (files, modes, links, the commit) and a listing of
whatever is left in the scratch places and IPC namespace after the wipe (normally nothing: a
leftover changes the hash, so the runtime's same-seed-same-state check destroys the sandbox).
Files and IPC objects of the service user are the environment's own and are left alone.
"""

import hashlib
import json
import os
import shutil
import signal
import socket
import stat
import sys
import time

# sqlite3, subprocess and threading are imported where they are used: every millisecond of
# start-up is paid on each reset (http.client is avoided altogether: its import costs ~25 ms).

WORKSPACE = "/workspace"
SEED_REPO = "/seed/repo"
# Every place the agent and verifier users can write (tests/integration/test_reset_isolation.py
# checks this list against a search of the whole filesystem as each user).
SCRATCH = ("/tmp", "/home/agent", "/dev/shm", "/dev/mqueue")
AGENT_UID, VERIFIER_UID, SERVICE_UID = 1000, 1001, 1002
EPISODE_UIDS = (AGENT_UID, VERIFIER_UID)
GIT_ENV = {
    "GIT_AUTHOR_NAME": "envkit", "GIT_AUTHOR_EMAIL": "seed@envkit.invalid",
    "GIT_COMMITTER_NAME": "envkit", "GIT_COMMITTER_EMAIL": "seed@envkit.invalid",
    "GIT_AUTHOR_DATE": "1970-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "1970-01-01T00:00:00Z",
    "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "HOME": "/nonexistent",
}
IPC_KINDS = (("shm", "shmctl", "shmid"), ("msg", "msgctl", "msqid"), ("sem", "semctl", "semid"))


def killall():
    try:
        os.kill(-1, signal.SIGKILL)  # every process of this user but ourselves
    except ProcessLookupError:
        pass


def kill_users(uids, timeout_s=30.0):
    """As root (CAP_KILL): SIGKILL every process whose real uid is in ``uids``, round after
    round until none is left (a fork bomb's children appear while the first round runs).
    Killed processes take a while to go on a loaded machine (seen: more than 200 rounds of a
    few ms at load 270), so the rounds run to a deadline, not to a count."""
    deadline = time.monotonic() + timeout_s
    if _AGENT_PIDS is not None:
        # Under gVisor a killed process is slow to go, and each one gone frees a slot for a
        # fork bomb's next child (rounds of SIGKILL alone ran past 30 s); a fork the pids cgroup
        # refuses leaks host memory (so no "pids.max = 0" either). Stopped processes cannot
        # fork: stop them round after round until a round finds none running, then kill.
        while _signal_round(uids, signal.SIGSTOP, skip_stopped=True):
            if time.monotonic() > deadline:
                break
    while True:
        found = _signal_round(uids, signal.SIGKILL)
        if not found:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{found} processes of the episode's users were still alive after {timeout_s:g} s of SIGKILL")
        time.sleep(0.005)


def _processes(uids, skip_stopped=False):
    """(pid, real uid) of every live process (not a zombie; with ``skip_stopped``, not stopped
    either) whose real uid is in ``uids``, as /proc lists them now."""
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            state, uid = fields["State"].split()[0], int(fields["Uid"].split()[0])
        except (OSError, KeyError, ValueError, IndexError):
            continue
        if state not in ("Z", "X") and not (skip_stopped and state == "T") and uid in uids:
            yield int(name), uid


def _quiet_users(uids):
    """Those of ``uids`` that provably have no process left (and so cannot start one: only
    root could, and root is the caller). A listing of /proc alone proves nothing: a chain of
    processes that each fork and exit outruns it. So only with a witness that no process was
    born unseen: under gVisor, every process a channel command started is in the agent's pids
    cgroup (it cannot leave it), and the cgroup is empty (it counts a child before its parent
    can exit); elsewhere, no pid was handed out in the whole namespace while /proc was read
    (``ns_last_pid`` the same before and after). No witness: none is quiet."""
    if _AGENT_PIDS is not None:
        return set(uids) if _AGENT_PIDS.current() == 0 else set()
    try:
        with open("/proc/sys/kernel/ns_last_pid") as f:
            before = f.read()
        alive = {uid for _pid, uid in _processes(uids)}
        with open("/proc/sys/kernel/ns_last_pid") as f:
            after = f.read()
    except OSError:
        return set()
    return set(uids) - alive if before == after else set()


def _signal_round(uids, sig, skip_stopped=False):
    """Send ``sig`` to every live process whose real uid is in ``uids``; how many got it."""
    found = 0
    for pid, _uid in _processes(uids, skip_stopped):
        try:
            os.kill(pid, sig)
            found += 1
        except OSError:
            continue
    return found


def wipe(path, keep_uids=(SERVICE_UID,)):
    """Remove everything in ``path`` but what belongs to ``keep_uids`` (as root: modes and
    sticky bits do not stop it; nothing of the agent's runs any more, so no link can move)."""
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return
    for name in names:
        p = os.path.join(path, name)
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        if st.st_uid in keep_uids:
            continue
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(p, ignore_errors=True)
        else:
            try:
                os.unlink(p)
            except OSError:
                pass


def _ipc_objects(keep_uids=(SERVICE_UID,)):
    """(kind, id, description) of each System V IPC object not owned by ``keep_uids``."""
    out = []
    for kind, _, id_col in IPC_KINDS:
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                head, *rows = f.read().splitlines()
        except (OSError, ValueError):
            continue
        cols = head.split()
        for row in rows:
            vals = dict(zip(cols, row.split(), strict=False))
            try:
                if int(vals["uid"]) in keep_uids:
                    continue
                out.append((kind, int(vals[id_col]), f"{kind} key={vals.get('key')} uid={vals['uid']} perms={vals.get('perms')}"))
            except (KeyError, ValueError):
                continue
    return out


def as_user(uid, fn):
    """Run ``fn`` in a child process that has become ``uid`` (root holds CAP_SETUID): some
    things only an owner may do, e.g. remove its System V IPC objects."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            fn()
            os._exit(0)
        except BaseException:  # noqa: BLE001 - the child reports by its exit status
            os._exit(1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def _remove_own_ipc():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    ctl = {kind: fn for kind, fn, _ in IPC_KINDS}
    me = os.getuid()
    for kind, ident, _ in _ipc_objects(keep_uids=()):
        if ident is not None and _ipc_owner(kind, ident) == me:
            if kind == "sem":
                libc.semctl(ident, 0, 0)  # IPC_RMID
            else:
                getattr(libc, ctl[kind])(ident, 0, None)


def remove_ipc():
    """Remove the episode users' shared memory, message queues and semaphores (IPC_RMID needs
    the owner: done as each user)."""
    owners = {_ipc_owner(kind, ident) for kind, ident, _ in _ipc_objects()}
    for uid in sorted(owners & set(EPISODE_UIDS)):
        as_user(uid, _remove_own_ipc)


def _ipc_owner(kind, ident):
    for k, i, line in _ipc_objects(keep_uids=()):
        if k == kind and i == ident:
            return int(line.split(" uid=")[1].split()[0])
    return None


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


def leftovers():
    """What the wipe left in the scratch places and the IPC namespace (normally nothing)."""
    lines = []
    for root in SCRATCH:
        for dirpath, dirnames, filenames in os.walk(root):
            kept = []
            for name in sorted(dirnames + filenames):
                p = os.path.join(dirpath, name)
                try:
                    st = os.lstat(p)
                except OSError:
                    continue
                if st.st_uid == SERVICE_UID:
                    continue
                if name in dirnames and not stat.S_ISLNK(st.st_mode):
                    kept.append(name)
                lines.append(f"S {p} {st.st_uid} {st.st_mode:o} {st.st_size}")
            dirnames[:] = kept
    lines += [f"I {line}" for _, _, line in _ipc_objects()]
    return lines


def scrub():
    """The part of every reset that needs root: no process or file of an earlier episode's
    agent or verifier survives."""
    # kill(-1) as the user: every process of it, at once (fork cannot race it). The child that
    # does it (a fork: 25-55 ms under gVisor) is spared only for a user shown to have no process.
    quiet = _quiet_users(EPISODE_UIDS)
    for uid in EPISODE_UIDS:
        if uid in quiet:
            continue
        try:
            as_user(uid, killall)
        except OSError:  # no process can be forked (the pids limit is full): the rounds below do it
            pass
    kill_users(EPISODE_UIDS)  # and whatever was still being born
    for p in (WORKSPACE, *SCRATCH):
        wipe(p)
    for p in (WORKSPACE, "/home/agent"):  # the agent's own: no other user reads (or imports) its files
        if os.path.isdir(p):
            os.chmod(p, 0o700)
    remove_ipc()


def _chown_tree(path, uid):
    os.lchown(path, uid, uid)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, uid)


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


def _read_chunks(fd, size=1 << 20):
    while chunk := os.read(fd, size):
        yield chunk


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
    files = {b"HEAD": b"ref: refs/heads/main\n", b"refs/heads/main": commit.encode() + b"\n", b"index": _git_index(index),
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
    _chown_tree(WORKSPACE, AGENT_UID)
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
        os.utime(full, ns=(times.st_atime_ns, times.st_mtime_ns))  # its time says nothing of which files the patch touched


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


SERVICE_CONF = "/seed/service.json"
STATE_DIR = "/var/lib/envkit"
DB = os.path.join(STATE_DIR, "db.sqlite")
FIXTURE_SQL = "/seed/db/fixture.sql"
FIXTURE_DB = os.path.join(STATE_DIR, "fixture.sqlite")
PIDFILE = os.path.join(STATE_DIR, "service.pid")
LOG = os.path.join(STATE_DIR, "service.log")
HTTP_BODY_CAP = 64 * 1024


def service_conf():
    with open(SERVICE_CONF) as f:
        return json.load(f)


def _service_running():
    try:
        with open(PIDFILE) as f:
            pid = int(f.read().strip())
        os.kill(pid, 0)
        return True
    except (OSError, ValueError):
        return False


def _request(port, method, path, body=b"", timeout=30.0):
    """A minimal HTTP/1.0 client: (status, content type, body bytes up to the cap)."""
    if not path.startswith("/") or any(c.isspace() for c in path):
        raise ValueError(f"the path must start with / and contain no spaces: {path!r}")
    head = f"{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
    if body:
        head += "Content-Type: application/json\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head.encode() + b"\r\n" + body)
        chunks, size = [], 0
        while size <= HTTP_BODY_CAP + 65536:
            data = sock.recv(65536)
            if not data:
                break
            chunks.append(data)
            size += len(data)
    raw = b"".join(chunks)
    header, _, payload = raw.partition(b"\r\n\r\n")
    lines = header.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise ValueError("the service's answer is not HTTP")
    ctype = next((ln.split(":", 1)[1].strip() for ln in lines[1:] if ln.lower().startswith("content-type:")), "")
    return int(parts[1]), ctype, payload


def _healthy(conf, timeout=1.0):
    try:
        return _request(conf["port"], "GET", conf["health"], timeout=timeout)[0] == 200
    except (OSError, ValueError):
        return False


def _restore_db():
    import sqlite3

    if not os.path.exists(FIXTURE_DB):
        tmp = FIXTURE_DB + ".tmp"
        if os.path.exists(tmp):
            os.unlink(tmp)
        with open(FIXTURE_SQL) as f:
            script = f.read()
        conn = sqlite3.connect(tmp)
        conn.executescript(script)
        conn.commit()
        conn.close()
        os.replace(tmp, FIXTURE_DB)
    for suffix in ("-journal", "-wal", "-shm"):
        try:
            os.unlink(DB + suffix)
        except FileNotFoundError:
            pass
    tmp = DB + ".restore"
    shutil.copyfile(FIXTURE_DB, tmp)
    os.chmod(tmp, 0o640)
    os.replace(tmp, DB)


def db_hash():
    """sha256 over every table's rows, in a canonical order (independent of page layout)."""
    import sqlite3

    h = hashlib.sha256()
    if not os.path.exists(DB):
        return "sha256:" + h.hexdigest()
    conn = sqlite3.connect(f"file:{DB}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        for table in tables:
            h.update(f"T {table}\n".encode())
            rows = [json.dumps(list(r), default=repr) for r in conn.execute(f'SELECT * FROM "{table}"')]
            for row in sorted(rows):
                h.update(row.encode() + b"\n")
    finally:
        conn.close()
    return "sha256:" + h.hexdigest()


def service_reset(seed):
    conf = service_conf()
    if conf.get("database"):
        _restore_db()
    if conf.get("restart_on_reset") and _service_running():
        with open(PIDFILE) as f:
            os.killpg(int(f.read().strip()), signal.SIGKILL)
    if not _service_running() or not _healthy(conf):
        import subprocess

        env = dict(os.environ, ENVKIT_DB=DB, ENVKIT_PORT=str(conf["port"]), ENVKIT_SEED=str(seed), HOME=STATE_DIR)
        with open(LOG, "ab") as log:
            proc = subprocess.Popen(["/bin/sh", "-c", "exec " + conf["command"]], cwd="/seed/app", env=env,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        with open(PIDFILE, "w") as f:
            f.write(str(proc.pid))
        deadline = time.monotonic() + conf["startup_timeout_s"]
        while not _healthy(conf, timeout=0.5):
            if proc.poll() is not None or time.monotonic() > deadline:
                try:
                    with open(LOG, "rb") as f:
                        tail = f.read()[-3000:].decode(errors="replace")
                except OSError:
                    tail = ""
                why = f"exited with {proc.returncode}" if proc.poll() is not None else "never answered its health check"
                return {"error": "service_unhealthy", "message": f"the service {why}", "log_tail": tail}
            time.sleep(0.02)
    return {"state_hash": db_hash(), "seed": seed}


def http_request(method, path):
    conf = service_conf()
    body = sys.stdin.buffer.read()
    try:
        status, ctype, data = _request(conf["port"], method, path, body)
        out = {"status": status, "content_type": ctype, "body": data[:HTTP_BODY_CAP].decode(errors="replace"),
               "truncated": len(data) > HTTP_BODY_CAP}
    except (OSError, ValueError) as e:
        # e.g. a path with spaces (the agent's mistake): an observation, not a crash
        out = {"status": 0, "error": f"{type(e).__name__}: {e}"}
    print(json.dumps(out))
    return 0


def relay():
    import threading

    conf = service_conf()
    sock = socket.create_connection(("127.0.0.1", conf["port"]), timeout=30)
    sock.settimeout(None)

    def upstream():
        try:
            while True:
                data = os.read(0, 65536)
                if not data:
                    break
                sock.sendall(data)
        except OSError:
            pass
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    threading.Thread(target=upstream, daemon=True).start()
    out = sys.stdout.buffer
    while True:
        data = sock.recv(65536)
        if not data:
            break
        out.write(data)
        out.flush()
    return 0


CHANNEL_PROTOCOL = 3  # 3: replies carry the request's "id"; the root channel is the container's main process
_STDIO_GRACE_S = 2.0  # how long output may stay open after the command exited (Docker's own grace)
_KILL_AFTER_S = 2.0  # a timed-out command's TERM is followed by KILL this much later (exec.sh's `timeout -k 2`)
_COUNTERS = (("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events"), "oom_kill"), \
    (("/sys/fs/cgroup/pids/pids.events", "/sys/fs/cgroup/pids.events"), "max")


class _AgentPids:
    """Under gVisor, the spec's pids limit inside the sandbox (the host's limit is sized for the
    sentry and its stub processes, and a full host limit kills the whole sandbox). Enforced
    twice: per user by RLIMIT_NPROC (set on the channel, inherited by every command; see
    main), and on every command the channel starts together by a pids cgroup of gVisor's own
    cgroupfs (``runsc --cgroupfs``) they are born in, with ``_CGROUP_MARGIN`` more room so that
    a non-root user meets the rlimit first; the cgroup holds a root agent, which the rlimit
    does not. The channel itself, its resets and kills stay outside, so they always have room.
    gVisor counts no ``pids.events``: a hit is seen by sampling ``pids.current`` (at the limit)
    while a command runs (every 0.2 s at most) and when it ends."""

    ROOT = "/sys/fs/cgroup/pids"

    def __init__(self, limit):
        self.path = os.path.join(self.ROOT, "envkit-agent")
        os.makedirs(self.path, exist_ok=True)
        self.limit = int(limit)
        self.set_max(self.limit + _CGROUP_MARGIN)

    def set_max(self, value):
        with open(os.path.join(self.path, "pids.max"), "w") as f:
            f.write(str(int(value)))

    def enter(self):
        """Move the (single-threaded) channel into the cgroup for a fork: the child is born in it."""
        with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    def leave(self):
        with open(os.path.join(self.ROOT, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    def current(self):
        """Processes in the cgroup now; None when it cannot be read."""
        try:
            with open(os.path.join(self.path, "pids.current")) as f:
                return int(f.read())
        except (OSError, ValueError):
            return None

    def full(self):
        current = self.current()
        return current is not None and current >= self.limit


_AGENT_PIDS = None  # an _AgentPids under gVisor (serve --agent-pids N)
# The cgroup's room above the per-user RLIMIT_NPROC, so that a non-root user's fork meets the
# rlimit first (see main)
_CGROUP_MARGIN = 16


def _counters():
    """The sandbox cgroup's OOM kills and pids-limit hits so far (exec.sh's ``counters``)."""
    values = []
    for paths, key in _COUNTERS:
        value = 0
        for path in paths:
            try:
                with open(path) as f:
                    for line in f:
                        name, _, count = line.partition(" ")
                        if name == key:
                            value = int(count)
            except (OSError, ValueError):
                continue
        values.append(value)
    return values


class _Capped:
    """Keeps the head and the tail of a stream, up to ``limit`` bytes in all (the host keeps
    the same parts: docker_backend._Capped)."""

    def __init__(self, limit):
        self.half = max(limit // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data):
        self.total += len(data)
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.half:
                del self.tail[: len(self.tail) - self.half]

    def parts(self):
        import base64

        return {"head": base64.b64encode(bytes(self.head)).decode(),
                "tail": base64.b64encode(bytes(self.tail[-self.half:])).decode(), "total": self.total}


def _user_ids(spec):
    """A user as `docker exec --user` takes it ("uid:gid", "uid", "name", "name:group") ->
    (uid, gid, groups, home): the groups and home Docker's exec gives that user (a uid with no
    passwd entry: gid 0 unless given, no other group, home /)."""
    import grp
    import pwd

    user, _, group = str(spec).partition(":")
    try:
        entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except KeyError:
        if not user.isdigit():
            raise ValueError(f"no user {user!r} in this sandbox's /etc/passwd") from None
        entry = None
    uid = int(user) if user.isdigit() else entry.pw_uid
    if group:
        gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    else:
        gid = entry.pw_gid if entry is not None else 0
    groups = os.getgrouplist(entry.pw_name, gid) if entry is not None else [gid]
    return uid, gid, groups, entry.pw_dir if entry is not None else "/"


def _oom_score_adj(value):
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write(str(value))


def _spawn(argv, uid, gid, groups, **kwargs):
    """Start ``argv`` as ``uid:gid`` with the user's groups (which drops root's capabilities),
    first in line for the OOM killer: the channel is single-threaded, so it raises its own
    ``oom_score_adj`` to 1000 for the fork (the child inherits it with no window) and lowers
    it back (never below the kernel's minimum for it, which its own value respects). No
    Python runs in the child, so the fork is cheaper than with a ``preexec_fn`` (~1.6 ms).

    A command as the channel's own identity (root, with root's groups: a container
    environment's agent and verifier, its resets and kills) needs no switch, and without one
    CPython starts the child by vfork instead of fork: nothing of the channel's memory is
    copied. Under gVisor that halves a command (a fork there is 15-30 ms here)."""
    import subprocess

    with open("/proc/self/oom_score_adj") as f:
        own = int(f.read())
    _oom_score_adj(1000)
    try:
        if _AGENT_PIDS is not None:
            _AGENT_PIDS.enter()  # OSError: the cgroup refuses (run() reports the errno)
        if (uid, gid, set(groups)) == (os.getuid(), os.getgid(), set(os.getgroups())):
            return subprocess.Popen(argv, **kwargs)
        return subprocess.Popen(argv, user=uid, group=gid, extra_groups=groups, **kwargs)
    finally:
        if _AGENT_PIDS is not None:
            _AGENT_PIDS.leave()
        _oom_score_adj(own)


def run(req, base_env, outlived):
    """One command as a user: output capped, read to a deadline; a command whose output stays
    open after it exited is given Docker's grace, then left (its processes are the host's to kill).

    With ``wrap`` (seconds), the command is what exec.sh would run, without exec.sh's two extra
    processes: ``bash -c argv[0]`` with no stdin, TERM to its process group at ``wrap`` and KILL
    2 s later (exit 124, or 137 when KILL was needed, as `timeout -k 2` gives), and the reply's
    ``status`` holds [exit code, new OOM kills, new pids-limit hits, seconds from the start to
    the exit, CPU-seconds of the processes reaped meanwhile] (exit code and seconds None: the
    command was still running at the deadline). The last two are the command's own time, as
    measured inside the sandbox: `envkit bench episode` subtracts them from an episode's wall time."""
    import base64
    import resource
    import selectors
    import signal
    import subprocess

    uid, gid, groups, home = _user_ids(req["user"])
    wrap = req.get("wrap")
    argv = ["/bin/bash", "-c", req["argv"][0]] if wrap is not None else req["argv"]
    stdin = base64.b64decode(req["stdin"]) if req.get("stdin") is not None and wrap is None else None
    start = time.monotonic()
    deadline = start + float(req["timeout"])
    term_at = start + float(wrap) if wrap is not None else None
    kill_at = None
    before = _counters() if wrap is not None else None
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_before = usage.ru_utime + usage.ru_stime
    try:
        env = {**base_env, **({"HOME": home} if req.get("home") == "passwd" else {}), **req.get("env", {})}
        proc = _spawn(argv, uid, gid, groups, cwd=req.get("workdir") or "/", env=env,
                      stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except (OSError, subprocess.SubprocessError) as e:
        return {"error": "spawn_failed", "errno": getattr(e, "errno", None) or 0, "message": f"{type(e).__name__}: {e}"}
    out, err = _Capped(int(req["limit"])), _Capped(int(req["limit"]))
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    if stdin is not None:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE, None)
    pending = memoryview(stdin or b"")
    hit, exited_at, open_outputs, termed, killed = False, None, 2, False, False

    def signal_group(sig):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    sampled_full = False  # under gVisor: the agent's pids cgroup was seen full
    while open_outputs or (wrap is not None and exited_at is None):
        if _AGENT_PIDS is not None and not sampled_full:
            sampled_full = _AGENT_PIDS.full()
        now = time.monotonic()
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        if exited_at is None and term_at is not None and now >= term_at:
            signal_group(signal.SIGTERM)
            term_at, kill_at, termed = None, now + _KILL_AFTER_S, True
        if exited_at is None and kill_at is not None and now >= kill_at:
            signal_group(signal.SIGKILL)
            kill_at, killed = None, True
        if exited_at is not None and now - exited_at > _STDIO_GRACE_S:
            break
        if now >= deadline:
            hit = True
            break
        limit = deadline - now if exited_at is None else min(deadline - now, _STDIO_GRACE_S - (now - exited_at))
        for at in (term_at, kill_at):
            if at is not None and exited_at is None:
                limit = min(limit, at - now)
        if not open_outputs:  # wrapped: the output is closed, the command still runs
            try:
                proc.wait(timeout=min(max(limit, 0.0), 0.2))
            except subprocess.TimeoutExpired:
                pass
            continue
        for key, _ in sel.select(min(max(limit, 0.0), 0.2)):
            if key.data is None:  # stdin
                try:
                    pending = pending[os.write(key.fd, pending[:65536]):]
                except BrokenPipeError:
                    pending = pending[:0]
                if not pending:
                    sel.unregister(key.fileobj)
                    key.fileobj.close()
                continue
            chunk = os.read(key.fd, 65536)
            if chunk:
                key.data.add(chunk)
            else:
                sel.unregister(key.fileobj)
                open_outputs -= 1
    held = [key.fileobj for key in sel.get_map().values() if key.data is not None]
    sel.close()
    if proc.stdin is not None and not proc.stdin.closed:
        proc.stdin.close()
    rc = proc.poll()
    if held or rc is None:
        # Something of the command's still holds its output: keep our ends open (as Docker
        # does; closing them would kill its writers with SIGPIPE and hide, e.g., a fork bomb
        # filling the pids limit) until the user's processes are killed.
        outlived.append((proc, held))
    reply = {"stdout": out.parts(), "stderr": err.parts(), "hit": hit}
    if wrap is not None:
        if rc is not None:
            rc = 128 - rc if rc < 0 else rc  # killed by a signal: as a shell reports it
            if termed:  # the command timed out
                rc = 137 if killed else 124
        after = _counters()
        if _AGENT_PIDS is not None and (sampled_full or _AGENT_PIDS.full()):
            after[1] = before[1] + 1
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        reply["status"] = [rc, after[0] - before[0], after[1] - before[1],
                           None if exited_at is None else round(exited_at - start, 6),
                           round(usage.ru_utime + usage.ru_stime - cpu_before, 6)]
    return reply


def write_as(user, path, mode, data):
    """``write`` as ``user`` (uid:gid), in a child that has become it: the user's own
    permissions decide where it may write."""
    import base64

    uid, gid, groups, _home = _user_ids(user)
    payload = base64.b64decode(data)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            out = json.dumps(write(path, mode, payload)).encode()
        except BaseException as e:  # noqa: BLE001 - the child reports to its parent
            out = json.dumps({"error": "write_failed", "message": f"{type(e).__name__}: {e}"}).encode()
        os.write(w, out)
        os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks) or b'{"error": "write_failed", "message": "the writer died"}')


def put_tree(dest, entries):
    """As root: write ``entries`` ([relative path, octal mode, base64 data, or None for a
    folder]) under ``dest``, owned by root: folders made as needed (0755) and given their mode,
    files replaced atomically (a container environment's tests/ and solution/ copied in)."""
    import base64

    for rel, mode, data in entries:
        path = os.path.join(dest, rel)
        if data is None:
            os.makedirs(path, exist_ok=True)
            os.chmod(path, int(mode, 8))
        else:
            write(path, mode, base64.b64decode(data))
    return {"written": len(entries)}


def release(outlived):
    """Close the output pipes of commands whose processes outlived their reply (after a kill
    or reset, or when too many are held) and reap what has exited."""
    keep = []
    for proc, held in outlived:
        for f in held:
            f.close()
        if proc.poll() is None:
            keep.append((proc, []))
    outlived[:] = keep


def serve():
    """The sandbox's command channel: JSON-line requests on stdin, one JSON line each on
    stdout, so a command costs one round trip instead of one `docker exec` (~55 ms, and host
    CPU in dockerd, containerd, a shim and runc). As root (the runtime's channel: the
    container's main process, under tini, its stdin and stdout attached by the host before the
    container starts, so no exec opens it and its start-up overlaps the engine's; replies carry
    the request's ``id``, so a host that attaches again never takes an earlier command's late
    reply for its own): commands of any user (`run`, each in a child that becomes the user,
    as `docker exec --user` would), resets, hashes, kills and file writes. As the service
    user: the service's reset and hash. Nothing in the sandbox can reach it: its pipes and
    signals belong to root (or to the service user), and no other user holds a capability."""
    base_env = dict(os.environ)  # the container's environment: each command's starts from it
    os.environ["HOME"] = "/root" if os.getuid() == 0 else os.environ.get("HOME", "/")
    outlived = []
    commands = {
        "hello": lambda req: {"protocol": CHANNEL_PROTOCOL, "uid": os.getuid(), "pid": os.getpid()},
        "run": lambda req: run(req, base_env, outlived),
        "reset": lambda req: reset(int(req["args"][0]), *req["args"][1:2]),
        "scrub": lambda req: (scrub(), {"leftovers": leftovers()})[1],
        "hash": lambda req: state(),
        "kill": lambda req: (kill_users(tuple(req["uids"])), {})[1],
        "write": lambda req: write_as(req["user"], req["args"][0], req["args"][1], req.get("stdin") or ""),
        "put": lambda req: put_tree(req["dest"], req["entries"]),
        "service-reset": lambda req: service_reset(int(req["args"][0])),
        "service-hash": lambda req: {"state_hash": db_hash()},
    }
    for line in sys.stdin:
        req = None
        try:
            req = json.loads(line)
            out = commands[req["cmd"]](req)
            if req["cmd"] in ("kill", "reset", "scrub") or len(outlived) > 32:
                release(outlived)
        except Exception as e:  # noqa: BLE001 - reported to the host, which raises it as an infra failure
            out = {"error": "helper_failed", "message": f"{type(e).__name__}: {e}"}
        if isinstance(req, dict) and "id" in req:  # the host pairs replies with requests by it
            out["id"] = req["id"]
        sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
        sys.stdout.flush()
    return 0


def main(argv):
    global _AGENT_PIDS
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "reset":
        out = reset(int(argv[2]), *argv[3:4])
    elif cmd == "scrub":
        scrub()
        out = {"leftovers": leftovers()}
    elif cmd == "hash":
        out = state()
    elif cmd == "killall":
        killall()
        out = {}
    elif cmd == "write":
        out = write(argv[2], argv[3], sys.stdin.buffer.read())
    elif cmd == "service-reset":
        out = service_reset(int(argv[2]))
    elif cmd == "serve":
        if argv[2:4] and argv[2] == "--agent-pids":
            _AGENT_PIDS = _AgentPids(int(argv[3]))
            import resource

            # gVisor checks RLIMIT_NPROC before it makes the child's address space; a fork its pids
            # cgroup refuses comes later and leaks host threads and memory (a fork bomb there took the
            # sandbox's host pids from 270 to 750 in 8 s, then the OOM killer took the sentry). Every
            # command inherits the limit and counts against it once it is its user (root is exempt:
            # the cgroup holds a root agent).
            resource.setrlimit(resource.RLIMIT_NPROC, (int(argv[3]), int(argv[3])))
        return serve()
    elif cmd == "service-hash":
        out = {"state_hash": db_hash()}
    elif cmd == "http":
        return http_request(argv[2], argv[3])
    elif cmd == "relay":
        return relay()
    else:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
