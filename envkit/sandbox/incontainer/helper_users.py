"""Processes, scratch places and IPC objects of the episode's users: killing them, wiping
what they wrote, and the gVisor pids cgroup the channel starts their commands in."""

import os
import shutil
import signal
import stat
import time

WORKSPACE = "/workspace"
# Every place the agent and verifier users can write (tests/integration/test_reset_isolation.py
# checks this list against a search of the whole filesystem as each user).
SCRATCH = ("/tmp", "/home/agent", "/dev/shm", "/dev/mqueue")
AGENT_UID, VERIFIER_UID, SERVICE_UID = 1000, 1001, 1002
EPISODE_UIDS = (AGENT_UID, VERIFIER_UID)
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
    if AGENT_PIDS is not None:
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
            raise RuntimeError(f"{found} processes of the episode's users were still alive "
                               f"after {timeout_s:g} s of SIGKILL")
        time.sleep(0.005)


def _processes(uids, skip_stopped=False, zombies=False):
    """(pid, real uid) of every live process (not a zombie unless ``zombies``; with
    ``skip_stopped``, not stopped either) whose real uid is in ``uids``, as /proc lists them now."""
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
        alive = state not in ("Z", "X") or (zombies and state == "Z")
        if alive and not (skip_stopped and state == "T") and uid in uids:
            yield int(name), uid


def _quiet_users(uids):
    """Those of ``uids`` that provably have no process left (and so cannot start one: only
    root could, and root is the caller). A listing of /proc alone proves nothing: a chain of
    processes that each fork and exit outruns it. So only with a witness that no process was
    born unseen: under gVisor, every process a channel command started is in the agent's pids
    cgroup (it cannot leave it), and the cgroup is empty (it counts a child before its parent
    can exit); elsewhere, no pid was handed out in the whole namespace while /proc was read
    (``ns_last_pid`` the same before and after). No witness: none is quiet."""
    if AGENT_PIDS is not None:
        return set(uids) if AGENT_PIDS.current() == 0 else set()
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
                out.append((kind, int(vals[id_col]),
                            f"{kind} key={vals.get('key')} uid={vals['uid']} perms={vals.get('perms')}"))
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


def chown_tree(path, uid):
    os.lchown(path, uid, uid)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, uid)



class AgentPids:
    """Under gVisor, the spec's pids limit inside the sandbox (the host's limit is sized for the
    sentry and its stub processes, and a full host limit kills the whole sandbox). Enforced
    twice: per user by RLIMIT_NPROC (set on the channel, inherited by every command; see
    limit_agent_pids), and on every command the channel starts together by a pids cgroup of gVisor's own
    cgroupfs (``runsc --cgroupfs``) they are born in, with ``_CGROUP_MARGIN`` more room so that
    a non-root user meets the rlimit first; the cgroup holds a root agent, which the rlimit
    does not. The channel itself, its resets and kills stay outside, so they always have room.
    gVisor counts no ``pids.events``: a hit is seen by sampling ``pids.current`` (at the limit)
    while a command runs (every 0.2 s at most) and when it ends, and the command's user's
    processes, zombies included (``user_full``), 10 ms after it starts, then at doubling
    intervals up to every 0.2 s."""

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
        return current is not None and current >= self.limit - _SATURATED_SLACK

    def user_full(self, uid):
        """Whether ``uid`` (not root) holds the limit's processes, zombies included. gVisor counts
        a task against RLIMIT_NPROC until it is reaped but takes it out of the pids cgroup as
        it starts to exit, so children nobody reaped (a fork bomb's dying processes) have forks
        refused while ``pids.current`` stays below the limit."""
        return bool(uid) and sum(1 for _ in _processes({uid}, zombies=True)) >= self.limit - _SATURATED_SLACK


AGENT_PIDS = None  # an AgentPids under gVisor (serve --agent-pids N)
# The cgroup's room above the per-user RLIMIT_NPROC, so that a non-root user's fork meets the
# rlimit first (see limit_agent_pids)
_CGROUP_MARGIN = 16
# How close to the limit counts as at it: a fork bomb's processes, sampled while gVisor refuses
# its forks, number limit - 1 most of the time (the host's check, docker_backend.pids_saturated,
# leaves the same room)
_SATURATED_SLACK = 2


def limit_agent_pids(limit):
    """Under gVisor (``serve --agent-pids N``): the pids cgroup every command is born in, and
    RLIMIT_NPROC on the channel, which every command inherits. gVisor checks RLIMIT_NPROC before
    it makes the child's address space; a fork its pids cgroup refuses comes later and leaks host
    threads and memory (a fork bomb there took the sandbox's host pids from 270 to 750 in 8 s,
    then the OOM killer took the sentry). A command counts against the limit once it is its user
    (root is exempt: the cgroup holds a root agent)."""
    global AGENT_PIDS
    import resource

    AGENT_PIDS = AgentPids(limit)
    resource.setrlimit(resource.RLIMIT_NPROC, (int(limit), int(limit)))
