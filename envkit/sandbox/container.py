"""Sandboxes of container environments (imported Harbor tasks): the agent works in the whole
filesystem of its task's own image, as that task's user (root unless ``task.toml`` says
otherwise), the way Harbor runs it.

Differences from the envkit-image sandbox (:mod:`envkit.sandbox.docker_backend`), each a
consequence of that model:

* The state is the image's whole filesystem, so ``reset(seed, task)`` starts a **fresh
  container** of the task's image (there is no in-place restore); a pooled sandbox is a shell
  that gets its container at reset. The seed does not change a Harbor task's state.
* The root filesystem is writable (tasks write anywhere, e.g. /app) and Docker's default
  capabilities are kept (tasks install packages as root); memory, CPU, pids and network
  limits apply as for every sandbox. Disk is not capped (no tmpfs: the rootfs is the state).
* Nothing hidden is in the image: the task's ``tests/`` reach /tests and ``solution/``
  reaches /solution only when the verifier or the oracle runs (copied in from the host).
  An agent running as root can still tamper with the system the tests run on (as in Harbor).
* The command channel (helper.py, the container's main process, as in envkit images) runs
  on a Python carried in by a read-only volume (:mod:`envkit.sandbox.pyruntime`), so the image
  needs /bin/bash, not Python; the shell helpers (``killall.sh``; ``exec.sh`` for the
  `docker exec` path, used when there is no envkit base image to carry Python from) are
  written in through the channel (or copied in before the start).
* The agent is root unless the task says otherwise, and root can stop the sandbox: a sandbox
  that stopped while the engine answers is ``model_failure:sandbox_stopped``, never infra.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from dataclasses import replace
from importlib import resources
from typing import Any

import docker.errors
from docker.types import Mount

from envkit.engine import connect
from envkit.errors import EnvkitError, InfraFailure, VerifierFailure
from envkit.sandbox import AGENT, VERIFIER, ExecResult, ResetResult, Sandbox, SandboxLimits
from envkit.sandbox.channel import attach_channel
from envkit.sandbox.docker_backend import SANDBOX_LABEL, DockerSandbox, remove_labelled, start_container, tar_of
from envkit.sandbox.limits import guest_args, limit_options
from envkit.sandbox.pyruntime import MOUNT, channel_command, ensure_volume
from envkit.spec import LoadedEnvironment, Task

__all__ = ["ContainerBackend", "ContainerSandbox"]

_HELPERS = ("exec.sh", "killall.sh")
_KILLALL = ("/bin/sh", "/opt/envkit/killall.sh")
# /etc/hosts as the engine writes it for `--network none`: a sandbox without a network is made
# with the engine's networking disabled (see limit_options), which writes none, so the copy
# made before the start puts this one in the container's own layer.
_LOOPBACK_HOSTS = (b"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\n"
                   b"ff00::0\tip6-mcastprefix\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n")
_HASH = ("cd \"$1\" 2>/dev/null || exit 3; find . -xdev \\( -type f -o -type l \\) -print0 | LC_ALL=C sort -z "
         "| xargs -0r sha256sum | sha256sum | cut -c1-64")


def _helper_entries(network: str) -> list[tuple[str, bytes | None, int]]:
    """What every sandbox of a task gets before its agent starts: envkit's shell helpers,
    Harbor's /logs folders and (with no network) /etc/hosts."""
    pkg = resources.files("envkit.sandbox") / "incontainer"
    entries: list[tuple[str, bytes | None, int]] = [("opt/envkit", None, 0o755)]
    entries += [(f"opt/envkit/{n}", (pkg / n).read_bytes(), 0o755) for n in _HELPERS]
    entries += [("logs", None, 0o777), ("logs/agent", None, 0o777), ("logs/verifier", None, 0o777)]
    if network == "none":  # with a network, the engine mounts its own
        entries += [("etc/hosts", _LOOPBACK_HOSTS, 0o644)]
    return entries


class ContainerBackend:
    """Creates sandboxes for a container environment; each gets its task's image at reset."""

    def __init__(self, env: LoadedEnvironment, task_images: dict[str, str], limits: SandboxLimits, *,
                 client: Any | None = None, labels: dict[str, str] | None = None) -> None:
        self.env = env
        self.client = client or connect()
        self.task_images = task_images
        self.limits = limits
        self.labels = {SANDBOX_LABEL: "1", **(labels or {})}
        self.channel_off = ""
        self._volume: str | None = None
        self._configs: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        # The image a pool prepares (reset without a task) is the first task's.
        self.image = task_images[env.tasks[0].id] if env.tasks else ""

    def task(self, task_id: str | None) -> Task:
        return self.env.task(task_id) if task_id else self.env.tasks[0]

    def image_config(self, image: str) -> dict[str, Any]:
        """The image's config (working folder, environment), read once."""
        with self._lock:
            if image not in self._configs:
                self._configs[image] = self.client.images.get(image).attrs.get("Config") or {}
            return self._configs[image]

    def workdir(self, image: str) -> str:
        return str(self.image_config(image).get("WorkingDir") or "/")

    def task_limits(self, task: Task) -> SandboxLimits:
        c = task.container
        assert c is not None
        return replace(self.limits, cpus=c.cpus or self.limits.cpus, memory_mb=c.memory_mb or self.limits.memory_mb,
                       network=c.network or self.limits.network)

    def start(self, task: Task) -> DockerSandbox:
        """A running container of ``task``'s image, helpers in place."""
        c = task.container
        assert c is not None
        image = self.task_images.get(task.id)
        if image is None:
            raise InfraFailure("image_missing", f"no image was built for task {task.id}",
                               hint="run `envkit build` for this environment")
        limits = self.task_limits(task)
        opts: dict[str, Any] = dict(**limit_options(limits), labels={**self.labels, "org.envkit.task": task.id},
                                    shm_size="64m")
        volume = self.channel_volume()
        if volume is not None:  # the command channel is the main process, on the carried Python
            opts.update(entrypoint=channel_command(), command=guest_args(limits), stdin_open=True,
                        log_config={"type": "none", "config": {}},
                        mounts=[Mount(MOUNT, volume, type="volume", read_only=True)])
        else:
            opts.update(entrypoint=["sleep"], command=["infinity"])
        t0 = time.monotonic()
        try:
            workdir = self.workdir(image)
        except docker.errors.ImageNotFound:
            raise InfraFailure("image_missing", f"the image {image} of task {task.id} is not in the engine",
                               hint="run `envkit build` for this environment") from None
        helpers = _helper_entries(limits.network)
        attached: list[Any] = []

        def prepare(made: Any) -> None:
            if volume is not None:
                attached.append(attach_channel(made))
            else:
                made.put_archive("/", tar_of(helpers))

        try:
            container = start_container(self.client, image, opts, prepare=prepare)
        except BaseException:
            for chan in attached:
                chan.close()
            raise
        users = {AGENT: c.agent_user, VERIFIER: c.verifier_user, "root": "0:0"}
        sandbox = DockerSandbox(container=container, limits=limits, image=image, has_repo=False, has_service=False,
                                users=users, user_env={}, workdir=workdir, kill_command=list(_KILLALL),
                                channel=volume is not None, channel_off=self.channel_off,
                                home_from_passwd=not any(e.startswith("HOME=")
                                                         for e in self.image_config(image).get("Env") or []),
                                _root=attached[0] if attached else None)
        # the helpers through the channel (its hello first): a copy by the engine costs ~40 ms more
        if volume is not None:
            try:
                sandbox.put_tree("/", helpers)
            except BaseException:
                sandbox.destroy()
                raise
            if sandbox.channel_pid:  # killall spares the channel by its pid
                sandbox.kill_command = [*_KILLALL, "-k", str(sandbox.channel_pid)]
        sandbox.created_s = round(time.monotonic() - t0, 4)
        return sandbox

    def channel_volume(self) -> str | None:
        """The volume of the channel's Python (made once per engine); None, with
        ``channel_off`` saying why, when it cannot be made (commands then go by `docker exec`)."""
        if self._volume is None and not self.channel_off:
            try:
                self._volume = ensure_volume(self.client)
            except EnvkitError as e:  # e.g. no envkit base image on this engine
                self.channel_off = f"no Python for the command channel: {e}"
        return self._volume

    def create(self) -> ContainerSandbox:
        return ContainerSandbox(self)

    def cleanup(self) -> int:
        """Remove every sandbox this backend's labels match."""
        return remove_labelled(self.client, self.labels)


class ContainerSandbox(Sandbox):
    """One episode's place; its container is (re)made from the task's image at every reset."""

    def __init__(self, backend: ContainerBackend) -> None:
        self.backend = backend
        self.inner: DockerSandbox | None = None
        self.task_id: str | None = None
        self.last_reset: ResetResult | None = None
        self.created_s = 0.0
        self._name = "unstarted-" + secrets.token_hex(6)

    @property
    def id(self) -> str:
        return self.inner.id if self.inner is not None else self._name

    @property
    def limits(self) -> SandboxLimits:
        return self.inner.limits if self.inner is not None else self.backend.limits

    @property
    def image(self) -> str:
        return self.inner.image if self.inner is not None else self.backend.image

    def _live(self) -> DockerSandbox:
        if self.inner is None:
            raise InfraFailure("sandbox_not_reset", "the sandbox has no container yet (reset it with a task first)")
        return self.inner

    def reset(self, seed: int, task: str | None = None) -> ResetResult:
        """A fresh container of the task's image (the previous one, if any, is removed)."""
        t0 = time.monotonic()
        chosen = self.backend.task(task)
        if self.inner is not None:
            self.inner.destroy()
            self.inner = None
        self.inner = self.backend.start(chosen)
        self.task_id = chosen.id
        self.created_s = self.inner.created_s
        state_hash = self.state_hash()
        # From here on the agent acts: if it is root in there, it can stop the sandbox (so a
        # stop while the engine answers is its doing); before, a stop is the sandbox's failure.
        whoami = self.inner.exec("id -u", user=AGENT, timeout_s=30, workdir="/")
        self.inner.root_agent = whoami.exit_code == 0 and whoami.stdout.strip() == "0"
        result = ResetResult(state_hash=state_hash, commit="", seed=int(seed), seconds=round(time.monotonic() - t0, 4),
                             extra={"task": chosen.id, "image": self.inner.image})
        self.last_reset = result
        return result

    def state_hash(self) -> str:
        """The task's working folder (its files' paths and contents), with the image ID."""
        inner = self._live()
        parts = [inner.image]
        if inner.workdir != "/":
            r = inner.exec(f"bash -c '{_HASH}' hash {inner.workdir}", user="root", timeout_s=120, workdir="/")
            parts.append(r.stdout.strip() if r.exit_code == 0 else f"unhashable:{r.exit_code}")
        return "sha256:" + hashlib.sha256("|".join(parts).encode()).hexdigest()

    def exec(self, command: str, *, timeout_s: float | None = None, user: str = AGENT,
             env: dict[str, str] | None = None, workdir: str | None = None) -> ExecResult:
        return self._live().exec(command, timeout_s=timeout_s, user=user, env=env, workdir=workdir)

    @property
    def workdir(self) -> str:
        return self._live().workdir

    def put_tree(self, dest: str, files: list[tuple[str, bytes | None, int]]) -> None:
        self._live().put_tree(dest, files)

    def put_file(self, path: str, data: bytes, *, mode: int = 0o644, user: str = AGENT) -> None:
        folder, _, name = path.rpartition("/")
        self.put_tree(folder or "/", [(name, data, mode)])

    def get_file(self, path: str, *, user: str = AGENT, max_bytes: int = 16 * 1024 * 1024) -> bytes:
        """A file's bytes, read as root (``cat`` in the sandbox: through the channel, or one exec)."""
        return self._live().get_file(path, user="root", max_bytes=max_bytes)

    def prepare_verifier(self, clear: tuple[str, ...]) -> bool:
        """Stop the agent (every process but the container's own two) and remove ``clear`` (the
        verifier's folders), in one exec as root; False when a folder could not be removed."""
        text, hit = self._live().run_as_root([*_KILLALL, *clear], timeout_s=30)
        if hit or b"killed" not in text:
            raise InfraFailure("killall_failed", "the sandbox's killall did not answer", container=self.id)
        if b'"killed": true' not in text:  # processes of the agent's kept appearing for 1000 rounds: it forks them
            raise VerifierFailure("verifier_setup", "the agent's processes could not all be stopped before the tests",
                                  container=self.id)
        return b'"removed": true' in text

    def kill_processes(self, user: str = AGENT) -> None:
        """Kill every process but the container's own two (works for a root agent too)."""
        self._live().kill_processes(user)

    def start_agent_calls(self) -> str:
        return "unavailable: container environments keep Harbor's trust model (tests run in the agent's container)"

    def http(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        return {"error": "a container environment has no service: its tasks offer bash only"}

    def pids_saturated(self) -> bool:
        return self.inner.pids_saturated() if self.inner is not None else False

    def alive(self) -> bool:
        return self.inner.alive() if self.inner is not None else True

    def destroy(self) -> None:
        if self.inner is not None:
            self.inner.destroy()
            self.inner = None
