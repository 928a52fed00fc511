"""The sandbox's command channel (``helper.py serve``): JSON lines in and out, commands
run as their users with caps on time and output."""

import json
import os
import sys
import time

import helper_users as users
from helper_repo import reset, state, write
from helper_service import db_hash, service_reset
from helper_users import kill_users, leftovers, scrub

CHANNEL_PROTOCOL = 3  # 3: replies carry the request's "id"; the root channel is the container's main process
_STDIO_GRACE_S = 2.0  # how long output may stay open after the command exited (Docker's own grace)
_KILL_AFTER_S = 2.0  # a timed-out command's TERM is followed by KILL this much later (exec.sh's `timeout -k 2`)
_COUNTERS = (("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events"), "oom_kill"), \
    (("/sys/fs/cgroup/pids/pids.events", "/sys/fs/cgroup/pids.events"), "max")




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
        if users.AGENT_PIDS is not None:
            users.AGENT_PIDS.enter()  # OSError: the cgroup refuses (run() reports the errno)
        if (uid, gid, set(groups)) == (os.getuid(), os.getgid(), set(os.getgroups())):
            return subprocess.Popen(argv, **kwargs)
        return subprocess.Popen(argv, user=uid, group=gid, extra_groups=groups, **kwargs)
    finally:
        if users.AGENT_PIDS is not None:
            users.AGENT_PIDS.leave()
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

    sampled_full = False  # under gVisor: the agent's pids cgroup, or its user's processes, seen at the limit
    scan_at, scan_gap = start + 0.01, 0.01  # when the user's processes are next counted (AgentPids.user_full)
    while open_outputs or (wrap is not None and exited_at is None):
        now = time.monotonic()
        if users.AGENT_PIDS is not None and not sampled_full:
            sampled_full = users.AGENT_PIDS.full()
            if not sampled_full and now >= scan_at:
                sampled_full = users.AGENT_PIDS.user_full(uid)
                scan_gap = min(scan_gap * 2, 0.2)
                scan_at = now + scan_gap
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
        for at in (term_at, kill_at, scan_at if users.AGENT_PIDS is not None and not sampled_full else None):
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
        if users.AGENT_PIDS is not None and (sampled_full or users.AGENT_PIDS.full()):
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

