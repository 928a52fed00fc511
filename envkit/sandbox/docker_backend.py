"""The Docker sandbox backend (docker SDK only; never the CLI).

Threat model
============

The agent is an untrusted program that runs shell commands in the sandbox as uid 1000.

Runtimes
--------

Every sandbox runs under one of two OCI runtimes, ``SandboxLimits.runtime``:

* ``runc``: the engine's default; Linux namespaces and cgroups on the host kernel.
* ``gvisor``: gVisor's ``runsc`` (the engine's name for it, :data:`envkit.sandbox.runtimes.ENGINE_NAMES`;
  ``scripts/gvisor.sh``, run by ``scripts/setup.sh``, registers it with ``--network=none
  --cgroupfs``). The agent's system calls are served by gVisor's user-space kernel, the sentry,
  not by the host kernel.

:func:`envkit.sandbox.runtimes.choose_runtime` decides, first answer wins: ``--runtime``,
``ENVKIT_RUNTIME``, the user's ``~/.config/envkit/config.toml`` (``[runtime] pulled`` /
``local``), the spec's ``[limits] runtime`` (a pulled environment may ask for ``gvisor``, never
for ``runc``), then the default: an environment ``envkit pull`` unpacked runs under gVisor (under
runc, with a warning, when the engine lists no ``runsc``), a local folder under runc. gVisor
asked for explicitly where the engine lacks it is exit 2, and gVisor with ``network = "bridge"``
is refused (the registered runtime has no network). :func:`limit_options` turns the choice into
the container's options.

What gVisor changes here (docs/architecture.md, "Runtimes: runc and gVisor", has the measured
figures): the host pids limit is ``gvisor_host_pids`` (room for the sentry, the gofer and a
stub per guest task) and the spec's ``pids`` is enforced inside the sandbox by the command
channel (RLIMIT_NPROC per user and a pids cgroup of gVisor's cgroupfs; hits are sampled, not
counted by the kernel); the memory limit is ``memory_mb`` plus ``GVISOR_MEMORY_OVERHEAD_MB``
and no ``oom_score_adj`` is set, so the host's OOM killer may take the sentry, which stops the
whole sandbox (``model_failure:oom``); any user in the sandbox can read other users'
``/proc/PID`` cmdline, environ, maps and fd lists.

Covered (each has an adversarial test in ``tests/integration/test_sandbox_adversarial.py``):

* **Runaway time**: at the spec's ``command_timeout_s`` a command's process group gets TERM,
  then KILL 2 s later (by the command channel; by exec.sh's ``timeout`` on the ``docker
  exec`` path); a host-side backstop kills the agent's processes when
  a command holds its output open past the deadline (e.g. a ``setsid`` child).
* **Memory**: the container's memory cgroup is capped at ``memory_mb`` with no swap; an OOM
  kill inside it is detected (cgroup ``oom_kill`` counter) and reported as ``oom``.
* **Processes**: ``pids`` caps the cgroup (under gVisor: the agent's pids cgroup inside the
  sandbox, see "Runtimes"), so a fork bomb stalls inside its own sandbox and is reported as
  ``pids_limit``; it is cleared by killing the agent's processes.
* **Disk**: the root filesystem is read-only; the only writable places are tmpfs mounts
  (``/workspace`` at ``disk_mb``, ``/tmp``, ``/home/agent``, a small ``/dev/shm``), so
  filling them fails with ENOSPC inside the sandbox and never touches the host's disk.
* **Network**: ``network = "none"`` (the default) gives the container only a loopback
  interface (a network namespace of its own with networking disabled in the engine: no
  interface but ``lo``, no resolver): no egress, no route to the host or other sandboxes.
* **Privilege**: the agent is uid 1000 and holds no capability (nor do the verifier and
  service users); ``no-new-privileges`` is set, the Docker socket is never mounted, and
  nothing from the host is mounted except what the spec declares (nothing, in spec version
  1). Hidden files (tasks, oracles, tests under ``/env``) belong to the verifier user (uid
  1001, mode 0700); the agent's own (``/workspace``, ``/home/agent``) are 0700. Root holds
  only CAP_KILL, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_CHOWN, CAP_SETUID and CAP_SETGID, and only
  envkit's helpers run as root (resets, hashes).
* **The verifier**: the agent's code never runs as the verifier user nor in the process that
  decides the reward; hidden tests reach it through the call server (envkit_check), as the
  agent, and get data back (docs/spec.md, "Verifiers").
* **Leftovers**: a reset kills every process of the agent and verifier users, wipes every
  place they can write (``/workspace``, ``/tmp``, ``/home/agent``, ``/dev/shm``,
  ``/dev/mqueue``) and removes their System V IPC objects; the state hash lists anything left.
* **The command channel**: commands, resets, hashes, kills and file writes go to one
  long-lived ``helper.py serve`` per sandbox (the container's main process under tini, as
  root; the host attaches to its stdin and stdout before the container starts), which starts each
  command in a child that becomes its user exactly as ``docker exec --user`` would (same
  groups, environment, capabilities: none) and is first in line for the OOM killer. The
  agent and verifier users can neither signal it, trace it nor open its pipes (it is root's,
  and they hold no capability), so no process of theirs can forge an answer or kill its
  user's processes out of a reset. A connection to it that breaks is an
  ``infra_failure:channel_lost`` with what it said last, and the next command attaches again
  (replies carry their request's id, so a late reply is never taken for another's); a channel
  process that dies takes the container with it (``infra_failure:container_lost``, with its
  last words); images without it (an older helper; imported Harbor tasks when no envkit base
  image is there to carry Python in, see :mod:`envkit.sandbox.container`) use one ``docker
  exec`` per command. Replies are read by their id from the last JSON object of a line and
  anything else on the channel's output is skipped: a container environment's agent may be
  root, which can write there (and can stop the sandbox: ``model_failure:sandbox_stopped``).
* **Other sandboxes**: each sandbox has its own cgroup limits, PID, IPC, mount and network
  namespaces; the adversarial tests check that a neighbour keeps working.

Not covered:

* Kernel exploits under runc: a runc sandbox shares the host kernel (its system calls
  filtered by Docker's default seccomp profile). Under gVisor the sentry serves them, so a host
  kernel bug is not a way out; a bug in gVisor itself is not covered. Untrusted code should run
  under gVisor: ``--runtime gvisor``, ``[runtime]`` in the user's config, or the spec's
  ``[limits] runtime = "gvisor"`` (pulled environments get it by default).
* CPU fairness beyond ``cpus`` (a quota, not an isolation guarantee), disk I/O bandwidth,
  and side channels.
* ``network = "bridge"`` gives the sandbox ordinary outbound access: use it only for
  environments that need it.
* A service's own files and memory (it keeps running across resets; its database is
  restored): the environment's responsibility.
* A verifier command of the environment's own that runs or trusts what the agent wrote
  (docs/spec.md says what each verifier kind guarantees).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import io
import json
import secrets
import shlex
import socket
import tarfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import docker.errors

from envkit.base_image import AGENT_UID, SERVICE_UID, VERIFIER_UID
from envkit.engine import TRANSPORT_ERRORS, connect
from envkit.errors import EpisodeFailure, InfraFailure, ModelFailure
from envkit.sandbox import AGENT, VERIFIER, ExecResult, ResetResult, Sandbox, SandboxLimits
from envkit.sandbox.channel import (
    CHANNEL_PROTOCOL,
    Capped,
    Channel,
    Deadline,
    attach_channel,
    close_hijacked,
    frames,
    own_time,
    with_last_words,
)
from envkit.sandbox.limits import guest_args, host_oom_file, limit_options

__all__ = ["DockerBackend", "DockerSandbox", "SANDBOX_LABEL", "remove_labelled", "start_container", "tar_of"]

SANDBOX_LABEL = "org.envkit.sandbox"
_IDEMPOTENT_HELPERS = frozenset({"reset", "scrub", "hash", "killall", "write"})
_CHANNEL_HELPERS = frozenset({"reset", "scrub", "hash", "write"})  # run inside the channel's process
_CHANNEL_SLACK_S = 15.0  # how much longer than a command's own deadline the host waits for the channel
SERVICE = "service"
ROOT = "root"
_USERS = {AGENT: f"{AGENT_UID}:{AGENT_UID}", VERIFIER: f"{VERIFIER_UID}:{VERIFIER_UID}",
          SERVICE: f"{SERVICE_UID}:{VERIFIER_UID}", ROOT: "0:0"}
# Each user's own HOME, and no Python user site: a process of the verifier or root must never
# pick up files from the agent's home (~/.local/.../usercustomize.py, .pth files).
_USER_ENV = {VERIFIER: {"HOME": "/home/verifier", "PYTHONNOUSERSITE": "1"},
             SERVICE: {"HOME": "/var/lib/envkit", "PYTHONNOUSERSITE": "1"},
             ROOT: {"HOME": "/root", "PYTHONNOUSERSITE": "1"}}
# What root (and only root: envkit's own helpers) may do inside a sandbox: kill any process,
# read, remove and chown any file, become another user (to remove its IPC objects, which only
# an owner may). Nothing else; no other user has any capability.
ROOT_CAPS = ["KILL", "DAC_OVERRIDE", "FOWNER", "CHOWN", "SETUID", "SETGID"]
_BACKSTOP_S = 5.0
_HELPER = "/opt/envkit/helper.py"
_CALLSERVER = "/opt/envkit/callserver.py"
_EXEC = "/opt/envkit/exec.sh"


def tar_of(entries: list[tuple[str, bytes | None, int]]) -> bytes:
    """A tar of (path, data or None for a folder, mode), owned by root, every time 0."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, data, mode in entries:
            ti = tarfile.TarInfo(path)
            ti.mode = mode
            ti.mtime = 0
            if data is None:
                ti.type = tarfile.DIRTYPE
                tar.addfile(ti)
            else:
                ti.size = len(data)
                tar.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


@dataclass
class DockerSandbox(Sandbox):
    """One container. Use :meth:`DockerBackend.create` to make one."""

    container: Any
    limits: SandboxLimits
    image: str
    created_s: float = 0.0
    last_reset: ResetResult | None = field(default=None, repr=False)
    has_repo: bool = True
    has_service: bool = False
    scrub: bool = False  # no repository, but the agent runs commands: resets scrub the sandbox as root
    users: dict[str, str] = field(default_factory=lambda: dict(_USERS), repr=False)  # role -> uid:gid
    user_env: dict[str, dict[str, str]] = field(default_factory=lambda: dict(_USER_ENV), repr=False)  # role -> env
    workdir: str = "/workspace"  # where commands run unless told otherwise
    # How to kill the agent's processes when the image has no Python helper: a command run as
    # root that prints "killed" (container environments' killall.sh); None: helper.py killall.
    kill_command: list[str] | None = None
    # The command channel (helper.py serve as root: the container's main process, attached
    # at create): every command, reset, hash, kill and file write goes through it; False, or
    # ``channel_off`` saying why, sends them through one `docker exec` each (images without
    # envkit's helper, a channel that did not answer its hello).
    channel: bool = True
    channel_off: str = ""
    # HOME of a command as `docker exec` gives it when the image sets none: the user's home in
    # the sandbox's /etc/passwd (container environments; envkit images set it per user)
    home_from_passwd: bool = False
    # The agent runs as root in the sandbox (a container environment's default): it can stop
    # the sandbox, so a sandbox that stopped while the engine answers is the model's doing.
    root_agent: bool = False
    channel_pid: int | None = field(default=None, repr=False)  # the channel's pid in the sandbox (its hello says)
    _root: Channel | None = field(default=None, repr=False)
    _root_ready: bool = field(default=False, repr=False)  # its hello was answered
    _root_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _lost: BaseException | None = field(default=None, repr=False)  # how the channel's container was lost, once it was
    _channel: Channel | None = field(default=None, repr=False)  # the service user's
    _channel_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _oom_file: str | None = field(default=None, repr=False)  # gVisor: the host cgroup's OOM counter ("" unreadable)

    @property
    def id(self) -> str:
        return str(self.container.id)

    @property
    def _api(self) -> Any:
        return self.container.client.api

    # -- low level -----------------------------------------------------------------
    def host_oom_kills(self) -> int | None:
        """Under gVisor: the OOM kills the host's memory cgroup of this sandbox has counted (the
        guest has no OOM counter of its own; the host kills a guest process's stub, or the
        sentry); None where the host's cgroup cannot be read from here (an engine elsewhere)."""
        if self._oom_file is None:
            self._oom_file = host_oom_file(self.container) or ""
        if not self._oom_file:
            return None
        try:
            with open(self._oom_file) as f:
                for line in f:
                    name, _, count = line.partition(" ")
                    if name == "oom_kill":
                        return int(count)
        except (OSError, ValueError):
            pass
        return None

    def pids_saturated(self) -> bool:
        """Whether the sandbox's processes fill its pids limit (the engine's stats, ~5 ms).
        Under gVisor the host counts the sentry's threads, not the agent's processes: the
        channel samples the guest's own count instead (helper.py's _AgentPids)."""
        if self.limits.gvisor:
            return False
        try:
            stats = self.container.stats(stream=False, one_shot=True).get("pids_stats") or {}
        except (docker.errors.DockerException, *TRANSPORT_ERRORS):
            return False
        limit = int(stats.get("limit") or 0)
        return limit > 0 and int(stats.get("current") or 0) >= limit - 2

    def _infra(self, err: BaseException, what: str) -> EpisodeFailure:
        """Classify an SDK error: the container gone, the engine/transport failing, or (when
        the pids limit is full of the agent's processes, so no exec can start) the model."""
        detail = f"{type(err).__name__}: {str(err)[:300]}"
        running: bool | None = None
        # A killed container takes a moment to show as exited: look for up to ~1 s.
        for _ in range(10):
            try:
                self.container.reload()
                running = self.container.status == "running"
            except docker.errors.NotFound:
                return InfraFailure("container_lost", f"the sandbox container vanished during {what}",
                                    container=self.id, error=detail)
            except Exception:  # noqa: BLE001 - the engine itself is failing; say so below
                running = None
                break
            if not running:
                break
            time.sleep(0.1)
        if running is False:
            state = self.container.attrs.get("State") or {}
            if self.limits.gvisor and state.get("OOMKilled") and self._engine_answers():
                # The host's OOM killer took the sentry with the agent's memory (its pick, not the
                # agent's process's stub): the sandbox's memory was the agent's doing, never infra.
                return ModelFailure("oom", f"the sandbox ran out of memory during {what}: under gVisor the host's OOM "
                                    "killer stopped the whole sandbox", container=self.id,
                                    exit_code=state.get("ExitCode"), error=detail)
            if self.root_agent and self._engine_answers():
                # Its agent (or the agent's code, run by the tests) is root in there and can stop
                # it; the engine did not fail: never an excuse for the episode.
                return ModelFailure("sandbox_stopped", f"the sandbox stopped during {what}; its agent runs as root, "
                                    "which can stop it", container=self.id, exit_code=state.get("ExitCode"),
                                    oom_killed=bool(state.get("OOMKilled")), error=detail)
            return InfraFailure("container_lost", f"the sandbox container stopped during {what}",
                                container=self.id, status=self.container.status, error=detail)
        if self.pids_saturated():
            return ModelFailure("pids_limit", f"the sandbox's pids limit is full, so {what} could not start a process",
                                container=self.id, error=detail)
        kind = "exec_transport" if isinstance(err, TRANSPORT_ERRORS) else "docker_api"
        return InfraFailure(kind, f"Docker failed during {what}", container=self.id, error=detail)

    def _engine_answers(self) -> bool:
        try:
            return bool(self.container.client.ping())
        except (docker.errors.DockerException, *TRANSPORT_ERRORS):
            return False

    def _open_root(self) -> Channel | None:
        """The root channel, checked by a hello on first use (call with ``_root_lock`` held);
        after a broken connection, attached again. None when this sandbox runs its commands
        through `docker exec` (``channel_off`` says why)."""
        if not self.channel or self.channel_off:
            return None
        if self._lost is not None:  # the container stopped with its channel: attaching again would wait for a start
            raise self._lost
        if self._root is not None and self._root_ready:
            return self._root
        if self._root is None:
            try:
                self._root = attach_channel(self.container)
            except (docker.errors.DockerException, *TRANSPORT_ERRORS) as e:
                raise self._infra(e, "attaching to the command channel") from None
        chan = self._root
        try:
            hello = chan.call({"cmd": "hello"}, timeout=60, strict=False)
        except (OSError, ValueError, Deadline, *TRANSPORT_ERRORS) as e:  # type: ignore[misc]
            chan.close()
            self._root = None
            failure = self._infra(e, "the command channel's hello")
            if not isinstance(failure, InfraFailure):  # the sandbox stopped, by its root agent's doing
                self._lost = failure
                raise failure from None
            if failure.kind == "container_lost":
                self._lost = with_last_words(failure, chan)
                raise self._lost from None
            self.channel_off = f"the command channel did not answer: {type(e).__name__}: {str(e)[:200]}"
            return None
        if hello.get("protocol") != CHANNEL_PROTOCOL or hello.get("uid") != 0:
            chan.close()  # an image built with an older helper
            self._root = None
            self.channel_off = f"the image's helper speaks another channel protocol: {hello}"
            return None
        self._root_ready = True
        self.channel_pid = int(hello.get("pid") or 0) or None
        return chan

    def _channel_call(self, request: dict[str, Any], timeout: float, what: str) -> dict[str, Any] | None:
        """One request on the root channel; None when commands go through `docker exec`. A
        channel that breaks is closed (the next call opens another) and raised as an infra
        failure with what it said last, or as the container's loss."""
        with self._root_lock:
            chan = self._open_root()
            if chan is None:
                return None
            try:
                return chan.call(request, timeout)
            except (OSError, ValueError, Deadline, *TRANSPORT_ERRORS) as e:  # type: ignore[misc]
                chan.close()
                self._root, self._root_ready = None, False  # the next call attaches again
                failure = self._infra(e, what)
                if isinstance(failure, InfraFailure):
                    if failure.kind == "container_lost":  # the channel is the main process: it died, or took it down
                        failure = with_last_words(failure, chan)
                    else:
                        failure = InfraFailure("channel_lost", f"the sandbox's command channel broke during {what}",
                                               container=self.id, error=f"{type(e).__name__}: {str(e)[:300]}",
                                               helper_stderr=chan.stderr_tail())
                if not isinstance(failure, InfraFailure) or failure.kind == "container_lost":
                    self._lost = failure  # stopped for good: later calls say so at once
                raise failure from None

    def _spawn_failure(self, reply: dict[str, Any], what: str) -> EpisodeFailure:
        """The channel could not start a process: the agent's processes filling the pids limit
        is the model's doing; anything else is the sandbox's."""
        if reply.get("errno") == errno.EAGAIN or self.pids_saturated():
            return ModelFailure("pids_limit", f"the sandbox's pids limit is full, so {what} could not start a process",
                                container=self.id, error=reply.get("message", ""))
        return InfraFailure("exec_spawn", f"the sandbox could not start {what}", container=self.id,
                            error=reply.get("message", ""))

    def _run(self, cmd: list[str], *, user: str, env: dict[str, str] | None, workdir: str,
             stdin: bytes | None, deadline: float, limit: int,
             wrapped: tuple[str, float] | None = None) -> tuple[Capped, Capped, bool, list[Any] | None]:
        """Run one command as ``user``; returns (stdout, stderr, hit_deadline, status). Raises
        InfraFailure (or ModelFailure when no process can start for the agent's processes).

        ``wrapped`` = (shell command, timeout) when ``cmd`` is exec.sh's: the channel then runs
        the shell command and does exec.sh's work itself (timeout, OOM and pids counters, in
        ``status`` = [exit code or None, OOM kills, pids-limit hits]); through `docker exec`,
        exec.sh runs and ``status`` is None (its status line is in stderr)."""
        ids = self.users.get(user, user)
        if self.channel:
            request = {"cmd": "run", "argv": [wrapped[0]] if wrapped else cmd, "user": ids,
                       "env": {**self.user_env.get(user, {}), **(env or {})},
                       "workdir": workdir, "stdin": base64.b64encode(stdin).decode() if stdin is not None else None,
                       "timeout": max(deadline - time.monotonic(), 0.0), "limit": limit}
            if self.home_from_passwd:
                request["home"] = "passwd"
            if wrapped:
                request["wrap"] = wrapped[1]
            reply = self._channel_call(request, timeout=max(deadline - time.monotonic(), 0.0) + _CHANNEL_SLACK_S,
                                       what=f"`{cmd[0]}`")
            if reply is not None:
                if "error" in reply:
                    if reply["error"] == "spawn_failed":
                        raise self._spawn_failure(reply, "a command")
                    raise InfraFailure("channel_failed", "the sandbox's command channel failed", container=self.id,
                                       error=reply.get("message", ""))
                try:
                    status = reply.get("status")
                    if status is not None and (not isinstance(status, list) or len(status) < 3):
                        raise ValueError(f"status {status!r}")
                    return (Capped.from_parts(limit, reply["stdout"]), Capped.from_parts(limit, reply["stderr"]),
                            bool(reply["hit"]), status)
                except (KeyError, TypeError, ValueError) as e:  # binascii.Error is a ValueError
                    raise InfraFailure("channel_failed", "the sandbox's command channel answered something else",
                                       container=self.id, error=f"{type(e).__name__}: {str(e)[:200]}") from None
        return (*self._run_exec(cmd, user=user, env=env, workdir=workdir, stdin=stdin, deadline=deadline, limit=limit),
                None)

    def _run_exec(self, cmd: list[str], *, user: str, env: dict[str, str] | None, workdir: str,
             stdin: bytes | None, deadline: float, limit: int) -> tuple[Capped, Capped, bool]:
        """Run one command by its own `docker exec` (the fallback); as :meth:`_run`. Under gVisor
        the command is given the spec's pids as RLIMIT_NPROC (no channel puts it in the agent's
        pids cgroup; hits are not counted on this path)."""
        out, err = Capped(limit), Capped(limit)
        if self.limits.gvisor and self.users.get(user, user).split(":")[0] not in ("0", "root"):
            cmd = ["/bin/bash", "-c", f'ulimit -u {int(self.limits.pids)} && exec "$@"', "envkit-exec", *cmd]
        try:
            ex = self._api.exec_create(self.id, cmd, stdin=stdin is not None, user=self.users.get(user, user),
                                       environment={**self.user_env.get(user, {}), **(env or {})}, workdir=workdir)
            sock = self._api.exec_start(ex["Id"], socket=True)
        except (docker.errors.DockerException, *TRANSPORT_ERRORS) as e:
            raise self._infra(e, "exec start") from None
        raw: socket.socket = getattr(sock, "_sock", sock)
        try:
            if stdin is not None:
                raw.sendall(stdin)
                raw.shutdown(socket.SHUT_WR)
            for stream, data in frames(sock, deadline):
                (err if stream == 2 else out).add(data)
        except Deadline:
            return out, err, True
        except (OSError, *TRANSPORT_ERRORS) as e:  # type: ignore[misc]
            raise self._infra(e, "exec") from None
        finally:
            close_hijacked(sock)
        return out, err, False

    # -- the Sandbox operations ----------------------------------------------------
    def exec(self, command: str, *, timeout_s: float | None = None, user: str = AGENT,
             env: dict[str, str] | None = None, workdir: str | None = None) -> ExecResult:
        workdir = workdir or self.workdir
        timeout = float(timeout_s if timeout_s is not None else self.limits.command_timeout_s)
        nonce = "@@envkit-" + secrets.token_hex(8)
        oom_before = self.host_oom_kills() if self.limits.gvisor else None
        t0 = time.monotonic()
        out, err, backstop, status = self._run(
            ["/bin/bash", _EXEC, nonce, f"{timeout:g}", command], user=user, env=env, workdir=workdir,
            stdin=None, deadline=t0 + timeout + _BACKSTOP_S, limit=self.limits.output_limit_bytes,
            wrapped=(command, timeout),
        )
        if backstop:
            # The command held its output open past the deadline (a detached child, a
            # stalled fork bomb): kill the user's processes so nothing lingers.
            self.kill_processes(user)
        duration = time.monotonic() - t0
        stderr = err.value()
        rc, oom, pids, trailer = -1, 0, 0, 0
        own_s: float | None = None
        own_cpu: float | None = None
        if status is not None:  # the channel did exec.sh's work
            rc = -1 if status[0] is None else int(status[0])
            oom, pids = int(status[1]), int(status[2])
            if len(status) >= 5:
                own_s = None if status[3] is None else float(status[3])
                own_cpu = float(status[4])
        elif (idx := stderr.rfind(nonce.encode())) >= 0:
            fields = stderr[idx:].split()
            with contextlib.suppress(ValueError, IndexError):
                rc, oom, pids = int(fields[1]), int(fields[2]), int(fields[3])
            own_s, own_cpu = own_time(fields[4:8])
            trailer = len(stderr) - max(idx - 1, 0)
            stderr = stderr[: max(idx - 1, 0)]
        elif not backstop:
            # The wrapper died without its status line: the container went away, or the exec broke.
            raise self._infra(ConnectionError("the command's status line never arrived: "
                                              + stderr[-300:].decode(errors="replace")), "exec")
        if oom_before is not None and (oom_after := self.host_oom_kills()) is not None:
            oom = max(oom, oom_after - oom_before)
        timed_out = backstop or rc == 124 or (rc == 137 and duration >= timeout)
        if pids == 0 and (rc != 0 or duration >= 1.5):
            # Background processes can hit the limit after the wrapper wrote its status line
            # (the exec then outlives it by Docker's 2 s stdio grace): ask the cgroup.
            pids = int(self.pids_saturated())
        return ExecResult(
            exit_code=124 if backstop else rc, stdout=out.value().decode(errors="replace"),
            stderr=stderr.decode(errors="replace"), duration_s=round(duration, 4), timed_out=timed_out,
            oom_killed=oom > 0, pids_limited=pids > 0, stdout_bytes=out.total,
            stderr_bytes=err.total - trailer,
            truncated=out.truncated or err.truncated,
            command_s=None if own_s is None else round(own_s, 6),
            command_cpu_s=None if own_cpu is None else round(own_cpu, 6),
        )

    def _helper(self, args: list[str], *, user: str, stdin: bytes | None = None, timeout: float = 60) -> dict[str, Any]:
        if args[0] in _CHANNEL_HELPERS and (user == ROOT or args[0] == "write") and user in _USERS:
            request = {"cmd": args[0], "args": args[1:], "user": self.users.get(user, user),
                       "stdin": base64.b64encode(stdin or b"").decode()}
            try:
                data = self._channel_call(request, timeout=timeout, what=f"the sandbox helper `{args[0]}`")
            except InfraFailure as e:
                if e.kind == "container_lost":
                    raise
                data = None  # these are idempotent: once more by `docker exec`
            if data is not None:
                if "error" in data:
                    raise InfraFailure(f"{args[0]}_failed", f"the sandbox helper `{args[0]}` failed", container=self.id,
                                       stderr_tail=data.get("message", ""))
                return data
            return self._helper_exec(args, user=user, stdin=stdin, timeout=timeout, run=self._run_exec)
        return self._helper_exec(args, user=user, stdin=stdin, timeout=timeout)

    def _helper_exec(self, args: list[str], *, user: str, stdin: bytes | None = None, timeout: float = 60,
                     run: Any = None) -> dict[str, Any]:
        """A helper command as its own process (``python3 -I helper.py ...``): over the channel
        when there is one, unless ``run`` says otherwise (the fallback: `docker exec`)."""
        run = run or self._run
        for attempt in range(2):
            out, err, hit, *_ = run(["python3", "-I", _HELPER, *args], user=user, env=None, workdir="/",
                                    stdin=stdin, deadline=time.monotonic() + timeout, limit=1 << 20)
            # Docker can lose a short exec's output entirely (moby/moby#27289, docker/docker-py#2042;
            # seen here as a reset that answered nothing: once in each of two 160-episode bench runs).
            # These helper commands are idempotent, so one that answered nothing at all is run once more.
            if hit or out.total or err.total or attempt or args[0] not in _IDEMPOTENT_HELPERS:
                break
        if hit:
            raise InfraFailure("exec_transport", f"the sandbox helper `{args[0]}` did not answer in {timeout:g} s",
                               container=self.id)
        try:
            result: dict[str, Any] = json.loads(out.value().decode().strip().splitlines()[-1])
            return result
        except (ValueError, IndexError):
            raise InfraFailure(f"{args[0]}_failed", f"the sandbox helper `{args[0]}` failed", container=self.id,
                               stderr_tail=err.value()[-1000:].decode(errors="replace")) from None

    def put_tree(self, dest: str, files: list[tuple[str, bytes | None, int]]) -> None:
        """Copy files (relative path, data or None for a folder, mode) under ``dest``, owned by
        root, folders below ``dest`` made as needed: one request on the command channel, or
        (without one) one copy into the container by the engine."""
        entries = [[rel, f"{mode:o}", None if data is None else base64.b64encode(data).decode()]
                   for rel, data, mode in files]
        reply = self._channel_call({"cmd": "put", "dest": dest, "entries": entries}, timeout=120,
                                   what=f"the copy to {dest}")
        if reply is not None:
            if "error" in reply:
                raise InfraFailure("copy_failed", f"the copy to {dest} failed", container=self.id,
                                   error=reply.get("message", ""))
            return
        prefix = dest.strip("/")
        name = (lambda rel: f"{prefix}/{rel}") if prefix else (lambda rel: rel)
        dirs = sorted({"/".join(rel.split("/")[:i]) for rel, _, _ in files for i in range(1, rel.count("/") + 1)})
        tar_entries: list[tuple[str, bytes | None, int]] = [(name(d), None, 0o755) for d in dirs]
        tar_entries += [(name(rel), data, mode) for rel, data, mode in files]
        try:  # the engine makes ``dest`` and its parents (0755) when missing
            ok = self.container.put_archive("/", tar_of(tar_entries))
        except (docker.errors.DockerException, *TRANSPORT_ERRORS) as e:
            raise self._infra(e, f"copy to {dest}") from None
        if not ok:
            raise InfraFailure("copy_failed", f"the engine refused the copy to {dest}")

    def prepare_verifier(self, clear: tuple[str, ...]) -> bool:
        """Stop the agent's processes and remove ``clear`` as root; False when a folder
        could not be removed."""
        self.kill_processes(AGENT)
        if not clear:
            return True
        _out, hit = self.run_as_root(["rm", "-rf", "--", *clear], timeout_s=30)
        if hit:
            return False
        check = self.exec(" && ".join(f"test ! -e {shlex.quote(c)}" for c in clear), timeout_s=30, user="root")
        return check.exit_code == 0

    def run_as_root(self, argv: list[str], *, timeout_s: float = 30, limit: int = 4096) -> tuple[bytes, bool]:
        """``argv`` (no shell) as root in ``/``: its stdout (up to ``limit`` bytes) and whether it
        hit the time limit."""
        out, _err, hit, _ = self._run(argv, user="root", env=None, workdir="/", stdin=None,
                                      deadline=time.monotonic() + timeout_s, limit=limit)
        return out.value(), bool(hit)

    def put_file(self, path: str, data: bytes, *, mode: int = 0o644, user: str = AGENT) -> None:
        self._helper(["write", path, f"{mode:o}"], user=user, stdin=data)

    def get_file(self, path: str, *, user: str = AGENT, max_bytes: int = 16 * 1024 * 1024) -> bytes:
        out, err, hit, _ = self._run(["cat", "--", path], user=user, env=None, workdir="/", stdin=None,
                                  deadline=time.monotonic() + 60, limit=2 * max_bytes + 2)
        if hit or err.total:
            raise FileNotFoundError(f"{path}: {err.value().decode(errors='replace').strip() or 'read timed out'}")
        if out.total > max_bytes:
            raise ValueError(f"{path} is {out.total} bytes, over the {max_bytes}-byte cap")
        return out.value()

    def reset(self, seed: int, task: str | None = None) -> ResetResult:
        """Restore the seeded state: the whole sandbox as root (every process of the agent and
        verifier users killed, every place they can write wiped, the repository restored; see
        helper.py) and the service's database (as the service user, which also (re)starts the
        service and waits for its health check). The state hash covers both. One image holds
        every task's seeded state; a task with a patch (``/seed/patches/<task>.diff``) gets it
        applied, and the result then names the task (its state is the task's own).)"""
        t0 = time.monotonic()
        parts, commit, extra = [], "", {}
        if self.has_repo:
            data = self._root_helper(["reset", str(int(seed)), *([task] if task else [])])
            parts.append(data["state_hash"])
            commit = data.get("commit", "")
            if data.get("task"):
                extra["task"] = str(data["task"])
        elif self.scrub:  # no repository, but the agent runs commands: scrub what they left
            left = self._root_helper(["scrub"])["leftovers"]
            parts.append("sha256:" + hashlib.sha256("\n".join(left).encode()).hexdigest())
        if self.has_service:
            data = self._service_call(["service-reset", str(int(seed))])
            parts.append(data["state_hash"])
            extra["service_hash"] = data["state_hash"]
        state_hash = parts[0] if len(parts) == 1 else "sha256:" + hashlib.sha256("|".join(parts).encode()).hexdigest()
        result = ResetResult(state_hash=state_hash, commit=commit, seed=int(seed),
                             seconds=round(time.monotonic() - t0, 4), extra=extra)
        self.last_reset = result
        return result

    def _root_helper(self, args: list[str]) -> dict[str, Any]:
        """A reset step as root. Processes an earlier episode left may fill the pids limit so
        that no exec can start: that is never the next episode's doing, so the limit is lifted
        for the reset (which kills them) and restored."""
        try:
            return self._helper(args, user=ROOT)
        except ModelFailure:
            self._raise_pids_limit_briefly()
            try:
                return self._helper(args, user=ROOT)
            except ModelFailure as e:
                raise InfraFailure("reset_failed", "the reset could not start a process", container=self.id,
                                   error=e.message) from None
            finally:
                self.restore_limits()

    def _service_call(self, args: list[str]) -> dict[str, Any]:
        """Run a service-user helper command through the sandbox's long-lived channel (opened
        on first use); if the channel breaks, fall back to a one-off exec."""
        with self._channel_lock:
            try:
                if self._channel is None:
                    ex = self._api.exec_create(self.id, ["python3", "-I", _HELPER, "serve"], stdin=True,
                                               user=_USERS[SERVICE], environment=_USER_ENV[SERVICE])
                    self._channel = Channel(self._api.exec_start(ex["Id"], socket=True))
                data = self._channel.call({"cmd": args[0], "args": args[1:]}, timeout=120)
            except (OSError, ValueError, Deadline, docker.errors.DockerException, *TRANSPORT_ERRORS):
                if self._channel is not None:
                    self._channel.close()
                    self._channel = None
                data = self._helper(args, user=SERVICE, timeout=120)
        if "error" in data:
            raise InfraFailure(data["error"], data.get("message", "the service failed"), container=self.id,
                               log_tail=data.get("log_tail", ""))
        return data

    def state_hash(self) -> str:
        parts = []
        if self.has_repo:
            parts.append(str(self._helper(["hash"], user=ROOT)["state_hash"]))
        if self.has_service:
            parts.append(str(self._service_call(["service-hash"])["state_hash"]))
        return parts[0] if len(parts) == 1 else "sha256:" + hashlib.sha256("|".join(parts).encode()).hexdigest()

    def http(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """One request to the environment's service, made from inside the sandbox as the agent."""
        payload = json.dumps(body).encode() if body is not None else b""
        return self._helper(["http", method.upper(), path], user=AGENT, stdin=payload, timeout=60)

    def open_relay(self) -> Any:
        """A hijacked exec socket piped to the service's port inside the sandbox (see forward.py)."""
        try:
            ex = self._api.exec_create(self.id, ["python3", "-I", _HELPER, "relay"], stdin=True, user=_USERS[AGENT])
            return self._api.exec_start(ex["Id"], socket=True)
        except (docker.errors.DockerException, *TRANSPORT_ERRORS) as e:
            raise self._infra(e, "relay start") from None

    def start_agent_calls(self) -> str:
        """Start the call server (callserver.py) as the agent, for a verification: the
        verifier's tests reach the agent's code through it (envkit_check). Returns its socket,
        or ``unavailable: <why>`` when it did not start for a reason inside the sandbox (e.g.
        the agent filled /tmp): the tests then fail, which is the model's doing."""
        folder = f"/tmp/.envkit-calls-{secrets.token_hex(8)}"
        out, err, hit, _ = self._run(["python3", "-I", _CALLSERVER, "start", folder], user=AGENT, env=None, workdir="/",
                                  stdin=None, deadline=time.monotonic() + 30, limit=1 << 16)
        try:
            return str(json.loads(out.value().decode().strip().splitlines()[-1])["socket"])
        except (ValueError, IndexError, KeyError):
            why = "did not answer in 30 s" if hit else err.value()[-300:].decode(errors="replace").strip()
            return f"unavailable: the call server did not start: {why or 'no output'}"

    def kill_processes(self, user: str = AGENT) -> None:
        """Kill every process of ``user``. Works even when the pids limit is exhausted."""
        for attempt in range(3):
            try:
                self._kill_once(user)
                self.restore_limits()
                return
            except EpisodeFailure as e:
                if e.kind in ("container_lost", "sandbox_stopped"):
                    raise
                if attempt == 0:
                    self._raise_pids_limit_briefly()
        raise InfraFailure("container_stuck", f"could not stop the {user}'s processes", container=self.id)

    def _kill_once(self, user: str) -> None:
        ids = self.users.get(user, user)
        if self.kill_command is None and ids.split(":")[0].isdigit():
            # As root through the channel: the user's own processes can neither fake its answer
            # nor outrun it (rounds of SIGKILL until none is left).
            with contextlib.suppress(InfraFailure):
                reply = self._channel_call({"cmd": "kill", "uids": [int(ids.split(":")[0])]}, timeout=40,
                                           what=f"killing the {user}'s processes")
                if reply is not None and "error" not in reply:
                    return
        if self.kill_command is None:
            self._helper_exec(["killall"], user=user, timeout=10, run=self._run_exec)
            return
        out, _err, hit, _ = self._run(self.kill_command, user="root", env=None, workdir="/", stdin=None,
                                   deadline=time.monotonic() + 15, limit=4096)
        if hit or b"killed" not in out.value():
            raise InfraFailure("killall_failed", "the sandbox's killall did not answer", container=self.id)

    def _raise_pids_limit_briefly(self) -> None:
        # A saturated pids cgroup leaves no room for the exec that would clean it: lift the
        # limit for the cleanup (raw update endpoint; the SDK's update() lacks PidsLimit).
        # (Under gVisor the channel's cleanup runs outside the agent's pids limit: nothing to lift.)
        if self.limits.gvisor:
            return
        try:
            url = self._api._url("/containers/{0}/update", self.id)
            self._api._result(self._api._post_json(url, data={"PidsLimit": self.limits.pids + 64}), True)
            self._pids_raised = True
        except (docker.errors.DockerException, *TRANSPORT_ERRORS):
            pass

    def restore_limits(self) -> None:
        if getattr(self, "_pids_raised", False):
            url = self._api._url("/containers/{0}/update", self.id)
            with contextlib.suppress(docker.errors.DockerException, *TRANSPORT_ERRORS):
                self._api._result(self._api._post_json(url, data={"PidsLimit": self.limits.pids}), True)
            self._pids_raised = False

    def alive(self) -> bool:
        try:
            self.container.reload()
            return bool(self.container.status == "running")
        except (docker.errors.DockerException, *TRANSPORT_ERRORS):
            return False

    def destroy(self) -> None:
        for name in ("_channel", "_root"):
            chan = getattr(self, name)
            if chan is not None:
                chan.close()
                setattr(self, name, None)
        with contextlib.suppress(docker.errors.NotFound):
            try:
                self.container.remove(force=True)
            except docker.errors.APIError as e:
                if "already in progress" not in str(e):
                    raise


class DockerBackend:
    """Creates sandboxes of one image with one set of limits."""

    def __init__(self, image: str, limits: SandboxLimits, *, client: Any | None = None,
                 labels: dict[str, str] | None = None,
                 has_repo: bool = True, has_service: bool = False, scrub: bool = False) -> None:
        self.client = client or connect()
        self.has_repo = has_repo
        self.has_service = has_service
        self.scrub = scrub
        self.image = image
        self.limits = limits
        self.labels = {SANDBOX_LABEL: "1", **(labels or {})}
        self.channel_off = ""  # set (saying why): the sandboxes take every command by `docker exec`

    def container_options(self) -> dict[str, Any]:
        lim = self.limits
        opts: dict[str, Any] = dict(
            **limit_options(lim),
            # The command channel is the main process (under tini), its stdin kept open for the
            # host to attach to; what it says is not logged (the attach is its only reader).
            command=["python3", "-I", _HELPER, "serve", *guest_args(lim)], stdin_open=True,
            log_config={"type": "none", "config": {}},
            labels=self.labels, read_only=True,
            tmpfs={
                # 0700: no other user reads the agent's files, so no verifier can import or run them
                "/workspace": f"size={lim.disk_mb}m,uid={AGENT_UID},gid={AGENT_UID},mode=0700,exec",
                "/tmp": f"size={max(lim.disk_mb // 4, 16)}m,mode=1777,exec",
                "/home/agent": f"size=64m,uid={AGENT_UID},gid={AGENT_UID},mode=0700",
                "/var/lib/envkit": f"size={max(lim.disk_mb // 2, 16)}m,uid={SERVICE_UID},gid={VERIFIER_UID},mode=0750",
            },
            shm_size="16m", cap_drop=["ALL"], cap_add=ROOT_CAPS, environment={"HOME": "/home/agent"},
            working_dir="/workspace",
        )
        return opts

    def create(self) -> DockerSandbox:
        """A started sandbox, the host attached to its command channel: the attach is made
        before the start, so the channel needs no exec and Python's start-up inside overlaps
        the engine's work (its hello is asked for on first use)."""
        t0 = time.monotonic()
        attached: list[Channel] = []

        def attach(made: Any) -> None:
            attached.append(attach_channel(made))

        try:
            container = start_container(self.client, self.image, self.container_options(), prepare=attach)
        except BaseException:
            for chan in attached:
                chan.close()
            raise
        return DockerSandbox(container=container, limits=self.limits, image=self.image,
                             created_s=round(time.monotonic() - t0, 4), has_repo=self.has_repo,
                             has_service=self.has_service, scrub=self.scrub, channel_off=self.channel_off,
                             _root=attached[0])

    def cleanup(self) -> int:
        """Remove every sandbox this backend's labels match (e.g. after a crash)."""
        return remove_labelled(self.client, self.labels)


def start_container(client: Any, image: str, options: dict[str, Any], prepare: Any = None) -> Any:
    """Create and start a sandbox container (``prepare(container)`` runs between the two);
    engine errors become infra failures and a half-made container is removed."""
    container = None
    try:
        container = client.containers.create(image, **options)
        if prepare is not None:
            prepare(container)
        container.start()
    except docker.errors.ImageNotFound:
        raise InfraFailure("image_missing", f"the image {image} is not in the engine",
                           hint="run `envkit build` for this environment") from None
    except (docker.errors.DockerException, *TRANSPORT_ERRORS) as e:
        if container is not None:
            with contextlib.suppress(Exception):
                container.remove(force=True)
        raise InfraFailure("sandbox_start", "the sandbox container did not start",
                           error=f"{type(e).__name__}: {str(e)[:300]}") from None
    return container


def remove_labelled(client: Any, labels: dict[str, str]) -> int:
    """Remove every container that carries all of ``labels``; returns how many."""
    n = 0
    flt = {"label": [f"{k}={v}" for k, v in labels.items()]}
    for c in client.containers.list(all=True, filters=flt):
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            c.remove(force=True)
            n += 1
    return n
