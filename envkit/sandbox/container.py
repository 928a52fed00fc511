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
* The in-container helpers are shell only (``exec.sh``, ``killall.sh``), copied in before
  the container starts: the image needs /bin/bash and coreutils' ``timeout``, not Python.
"""

from __future__ import annotations

import hashlib
import io
import secrets
import tarfile
import threading
import time
from dataclasses import replace
from importlib import resources
from typing import Any

import docker.errors

from envkit.engine import TRANSPORT_ERRORS, connect
from envkit.errors import InfraFailure
from envkit.sandbox import AGENT, VERIFIER, ExecResult, ResetResult, SandboxLimits
from envkit.sandbox.docker_backend import SANDBOX_LABEL, DockerSandbox, limit_options, remove_labelled, start_container
from envkit.spec import LoadedEnvironment, Task

__all__ = ["ContainerBackend", "ContainerSandbox"]

_HELPERS = ("exec.sh", "killall.sh")
_HASH = ("cd \"$1\" 2>/dev/null || exit 3; find . -xdev \\( -type f -o -type l \\) -print0 | LC_ALL=C sort -z "
         "| xargs -0r sha256sum | sha256sum | cut -c1-64")


def _tar(entries: list[tuple[str, bytes | None, int]]) -> bytes:
    """A tar of (path, data or None for a folder, mode), owned by root."""
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


def _helper_tar() -> bytes:
    pkg = resources.files("envkit.sandbox") / "incontainer"
    entries: list[tuple[str, bytes | None, int]] = [("opt/envkit", None, 0o755)]
    entries += [(f"opt/envkit/{n}", (pkg / n).read_bytes(), 0o755) for n in _HELPERS]
    entries += [("logs", None, 0o777), ("logs/agent", None, 0o777), ("logs/verifier", None, 0o777)]
    return _tar(entries)


class ContainerBackend:
    """Creates sandboxes for a container environment; each gets its task's image at reset."""

    def __init__(self, env: LoadedEnvironment, task_images: dict[str, str], limits: SandboxLimits, *,
                 client: Any | None = None, labels: dict[str, str] | None = None, runtime: str | None = None) -> None:
        self.env = env
        self.client = client or connect()
        self.task_images = task_images
        self.limits = limits
        self.labels = {SANDBOX_LABEL: "1", **(labels or {})}
        self.runtime = runtime
        self.helpers = _helper_tar()
        self._workdirs: dict[str, str] = {}
        self._lock = threading.Lock()
        # The image a pool prepares (reset without a task) is the first task's.
        self.image = task_images[env.tasks[0].id] if env.tasks else ""

    def task(self, task_id: str | None) -> Task:
        return self.env.task(task_id) if task_id else self.env.tasks[0]

    def workdir(self, image: str) -> str:
        with self._lock:
            if image not in self._workdirs:
                config = self.client.images.get(image).attrs.get("Config") or {}
                self._workdirs[image] = config.get("WorkingDir") or "/"
            return self._workdirs[image]

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
            raise InfraFailure("image_missing", f"no image was built for task {task.id}", hint="run `envkit build` for this environment")
        limits = self.task_limits(task)
        opts: dict[str, Any] = dict(**limit_options(limits, self.runtime), entrypoint=["sleep"], command=["infinity"],
                                    labels={**self.labels, "org.envkit.task": task.id}, shm_size="64m")
        t0 = time.monotonic()
        try:
            workdir = self.workdir(image)
        except docker.errors.ImageNotFound:
            raise InfraFailure("image_missing", f"the image {image} of task {task.id} is not in the engine",
                               hint="run `envkit build` for this environment") from None
        container = start_container(self.client, image, opts, prepare=lambda made: made.put_archive("/", self.helpers))
        users = {AGENT: c.agent_user, VERIFIER: c.verifier_user, "root": "0:0"}
        return DockerSandbox(container=container, limits=limits, image=image, created_s=round(time.monotonic() - t0, 4),
                             has_repo=False, has_service=False, users=users, user_env={}, workdir=workdir,
                             channel=False)  # an imported task's agent may be root, who could reach a channel

    def create(self) -> ContainerSandbox:
        return ContainerSandbox(self)

    def cleanup(self) -> int:
        """Remove every sandbox this backend's labels match."""
        return remove_labelled(self.client, self.labels)


class ContainerSandbox:
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
        self.inner.kill_command = ["/bin/sh", "/opt/envkit/killall.sh", self._main_pid()]
        state_hash = self.state_hash()
        result = ResetResult(state_hash=state_hash, commit="", seed=int(seed), seconds=round(time.monotonic() - t0, 4),
                             extra={"task": chosen.id, "image": self.inner.image})
        self.last_reset = result
        return result

    def _main_pid(self) -> str:
        """The container's `sleep infinity` (the init's child), which killall.sh must spare."""
        inner = self._live()
        for _ in range(50):  # the init may not have forked it yet
            out, _err, _hit, _ = inner._run(["cat", "/proc/1/task/1/children"], user="root", env=None, workdir="/",
                                            stdin=None, deadline=time.monotonic() + 30, limit=4096)
            pids = out.value().decode(errors="replace").split()
            if pids:
                return pids[0]
            time.sleep(0.02)
        raise InfraFailure("sandbox_start", "the sandbox's main process did not start", container=self.id)

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

    def put_tree(self, dest: str, files: list[tuple[str, bytes, int]]) -> None:
        """Copy files (relative path, data, mode) under ``dest``, owned by root; parents are made."""
        inner = self._live()
        mk = inner.exec(f"mkdir -p '{dest}'", user="root", timeout_s=30, workdir="/")
        if mk.exit_code != 0:
            raise InfraFailure("copy_failed", f"could not make {dest} in the sandbox", stderr_tail=mk.stderr[-500:])
        dirs = sorted({"/".join(rel.split("/")[:i]) for rel, _, _ in files for i in range(1, rel.count("/") + 1)})
        entries: list[tuple[str, bytes | None, int]] = [(d, None, 0o755) for d in dirs]
        entries += [(rel, data, mode) for rel, data, mode in files]
        try:
            ok = inner.container.put_archive(dest, _tar(entries))
        except (docker.errors.DockerException, *TRANSPORT_ERRORS) as e:
            raise inner._infra(e, f"copy to {dest}") from None
        if not ok:
            raise InfraFailure("copy_failed", f"the engine refused the copy to {dest}")

    def put_file(self, path: str, data: bytes, *, mode: int = 0o644, user: str = AGENT) -> None:
        folder, _, name = path.rpartition("/")
        self.put_tree(folder or "/", [(name, data, mode)])

    def get_file(self, path: str, *, user: str = AGENT, max_bytes: int = 16 * 1024 * 1024) -> bytes:
        return self._live().get_file(path, user="root", max_bytes=max_bytes)

    def kill_processes(self, user: str = AGENT) -> None:
        """Kill every process but the container's own two (works for a root agent too)."""
        self._live().kill_processes(user)

    def start_agent_calls(self) -> str:
        return "unavailable: container environments keep Harbor's trust model (tests run in the agent's container)"

    def pids_saturated(self) -> bool:
        return self.inner.pids_saturated() if self.inner is not None else False

    def alive(self) -> bool:
        return self.inner.alive() if self.inner is not None else True

    def destroy(self) -> None:
        if self.inner is not None:
            self.inner.destroy()
            self.inner = None
