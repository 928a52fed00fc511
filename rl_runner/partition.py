"""Which of this machine's CPU cores inference gets, and which the sandboxes get.

On a CPU-only machine vLLM's worker threads spin on their cores, and every sandbox command
(and the container engine behind it) wants a core too: sharing them stretches both. A
partition gives the vLLM replicas one set of cores (each replica its own slice: its OpenMP
threads bound with ``VLLM_CPU_OMP_THREADS_BIND``, the whole process held there by CPU
affinity) and confines every sandbox container to the rest (the engine's ``cpuset``). This
is the one-machine form of scaling inference and sandbox capacity apart.

Written ``INFERENCE/SANDBOXES`` as two core lists (``0/1``, ``0-3/4-7``, ``0,2/1,3``), or:

* ``auto`` (the default): on a machine with a CUDA device, none (vLLM runs on the device);
  on a CPU-only machine, the first half of the cores (at least one per replica) to inference
  and the rest to sandboxes, when that leaves the sandboxes a core; otherwise none, saying why;
* ``none``: no partition; several replicas are still pinned one core each, round the cores.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from envkit.errors import UserError

_MAX_CORES = 8192  # no machine has more; a bigger number is a typo, refused before it is expanded

__all__ = ["CpuPartition", "check_engine", "cpu_list", "describe", "format_cpus", "plan_partition"]


@dataclass(frozen=True)
class CpuPartition:
    """``replica_cores[k]``: the cores of replica k (empty: not bound). ``sandboxes``: the
    containers' cpuset (empty: not confined). ``how``: how it was chosen, for the table."""

    inference: tuple[int, ...]
    sandboxes: tuple[int, ...]
    replica_cores: tuple[tuple[int, ...], ...]
    how: str

    @property
    def active(self) -> bool:
        return bool(self.sandboxes)

    @property
    def replicas(self) -> int:
        return len(self.replica_cores)

    def cpuset(self) -> str | None:
        """The sandbox containers' cpuset (``docker --cpuset-cpus``), or None."""
        return format_cpus(self.sandboxes) if self.sandboxes else None

    def bind(self, k: int) -> str | None:
        """Replica k's ``VLLM_CPU_OMP_THREADS_BIND``, or None."""
        cores = self.replica_cores[k]
        return format_cpus(cores) if cores else None

    def affinity(self, k: int) -> set[int] | None:
        """The cores replica k's whole process is held to (only under a partition)."""
        return set(self.replica_cores[k]) if self.active else None

    def to_dict(self) -> dict[str, Any]:
        return {"inference": format_cpus(self.inference) if self.active else None,
                "sandboxes": self.cpuset(), "replicas": [self.bind(k) for k in range(self.replicas)], "how": self.how}

    def describe(self) -> str:
        return describe(self.to_dict())


def describe(part: dict[str, Any]) -> str:
    """Which cores each side had, from :meth:`CpuPartition.to_dict` (a result's record)."""
    bound = ", ".join(f"replica {k}: {c}" for k, c in enumerate(part["replicas"]) if c)
    if part["sandboxes"] is None:
        return f"cores: shared by inference and sandboxes ({part['how']})" + (f"; {bound}" if bound else "")
    return f"cores: inference {part['inference']} ({bound}), sandboxes {part['sandboxes']} ({part['how']})"


def cpu_list(text: str) -> tuple[int, ...]:
    """``"0-3,6"`` -> (0, 1, 2, 3, 6). Raises ValueError on anything else."""
    cores: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(part or "(empty)")
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a or b >= _MAX_CORES:
            raise ValueError(part)
        cores.update(range(a, b + 1))
    return tuple(sorted(cores))


def format_cpus(cores: tuple[int, ...] | list[int]) -> str:
    """(0, 1, 2, 5) -> ``"0-2,5"``: the form cpusets and VLLM_CPU_OMP_THREADS_BIND take."""
    out: list[str] = []
    ordered = sorted(cores)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def _slices(cores: tuple[int, ...], n: int) -> tuple[tuple[int, ...], ...]:
    """``cores`` split into n contiguous slices, as even as they go."""
    size, extra = divmod(len(cores), n)
    out, i = [], 0
    for k in range(n):
        step = size + (1 if k < extra else 0)
        out.append(cores[i:i + step])
        i += step
    return tuple(out)


def _unpartitioned(replicas: int, available: tuple[int, ...], gpu: bool, how: str) -> CpuPartition:
    pinned = replicas > 1 and not gpu  # several CPU replicas must not share cores
    cores = tuple((available[k % len(available)],) if pinned else () for k in range(replicas))
    return CpuPartition(available, (), cores, how)


def plan_partition(spec: str, replicas: int | None, *, gpu: bool, available: tuple[int, ...] | None = None,
                   option: str = "--cpu-partition", replicas_option: str = "--replicas",
                   remote_sandboxes: bool = False) -> CpuPartition:
    """The partition ``spec`` asks for, for ``replicas`` vLLM replicas (None: as many as fit,
    two at most). ``available``: the cores this process may use (default: its affinity).
    ``remote_sandboxes``: the sandboxes run on other machines (a Ray cluster's address), so
    there is nothing here to confine them to. Bad input raises a UserError naming ``option``."""
    cores = tuple(sorted(available if available is not None else os.sched_getaffinity(0)))
    if replicas is not None and replicas < 1:
        raise UserError(f"{replicas_option} {replicas}: at least one vLLM replica is needed",
                        f"give {replicas_option} 1 or more (or leave it out: as many as fit)")
    spec = spec.strip()
    if spec == "none":
        return _unpartitioned(replicas or 1, cores, gpu, f"{option} none")
    if spec == "auto":
        if gpu:
            return _unpartitioned(replicas or 1, cores, gpu, "a CUDA device serves inference")
        if remote_sandboxes:
            return _unpartitioned(replicas or 1, cores, gpu, "the sandboxes run on the cluster's hosts")
        half = max(1, len(cores) // 2)
        n = replicas if replicas is not None else min(2, half)
        inference = cores[:max(n, half)]
        if len(inference) >= len(cores):
            return _unpartitioned(n, cores, gpu, f"{n} replica(s) need {n} of the {len(cores)} cores: none left for "
                                                 "sandboxes to have their own")
        return CpuPartition(inference, cores[len(inference):], _slices(inference, n), "auto")
    if remote_sandboxes:
        raise UserError(f"{option} {spec} partitions this machine's cores, "
                        "but the sandboxes run on the Ray cluster's hosts",
                        f"drop {option} (or give none) with a cluster address")
    left, sep, right = spec.partition("/")
    if not sep:
        raise UserError(f"{option} {spec!r} is not INFERENCE/SANDBOXES (two core lists with a `/` between them)",
                        f"e.g. {option} 0/1 or 0-3/4-7; or auto, or none")
    for side, text in (("inference", left), ("the sandboxes", right)):
        if not text.strip():
            raise UserError(f"{option} {spec} leaves no core for {side}",
                            f"give both sides at least one core, e.g. {option} 0/1; "
                            f"or {option} none to share every core")
    try:
        inference, sandboxes = cpu_list(left), cpu_list(right)
    except ValueError as e:
        raise UserError(f"{option} {spec!r} is not INFERENCE/SANDBOXES core lists (`{e}` is not a core or range)",
                        f"write it as two core lists, e.g. {option} 0/1 or 0-3/4-7; or auto, or none") from None
    outside = sorted(set(inference + sandboxes) - set(cores))
    if outside:
        raise UserError(f"{option} {spec}: core(s) {format_cpus(outside)} are not available here (this process may use "
                        f"{format_cpus(cores)})", f"choose cores among {format_cpus(cores)}")
    both = sorted(set(inference) & set(sandboxes))
    if both:
        raise UserError(f"{option} {spec}: core(s) {format_cpus(both)} are on both sides",
                        "give each core to inference or to the sandboxes, not both")
    n = replicas if replicas is not None else min(2, len(inference))
    if n > len(inference):
        raise UserError(f"{n} vLLM replicas need a core each, and {option} {spec} gives inference {len(inference)}",
                        f"give inference at least {n} cores, or lower {replicas_option}")
    return CpuPartition(inference, sandboxes, _slices(inference, n), "given")


def check_engine(runtime: Any, option: str = "--cpu-partition") -> None:
    """Before anything starts: the container engine accepts the runtime's sandbox cpuset (it
    checks a cpuset when a container is created; one is created and removed, never started)."""
    cpuset = runtime.limits.cpuset
    client = getattr(runtime.backend, "client", None)
    if not cpuset or client is None:
        return
    import docker

    images = runtime.sandbox_spec().images()
    if not images:
        return
    from envkit.sandbox.docker_backend import SANDBOX_LABEL

    try:  # labelled as a sandbox, so a cleanup of sandboxes removes it if this run is killed here
        made = client.containers.create(images[0], command=["true"], cpuset_cpus=cpuset, network_mode="none",
                                        labels={SANDBOX_LABEL: "1", "org.envkit.cpuset-check": "1"})
    except docker.errors.APIError as e:
        if e.status_code is not None and 400 <= e.status_code < 500 and "cpu" in str(e.explanation).lower():
            raise UserError(f"the container engine refuses the sandboxes' cores ({cpuset}): {e.explanation}",
                            f"give the sandboxes cores the engine has in {option}, or {option} none") from None
        raise
    try:
        kept = (made.attrs.get("HostConfig") or {}).get("CpusetCpus") or ""
    finally:
        made.remove(force=True)
    if kept != cpuset:  # an engine without the cpuset controller accepts the option and discards it
        raise UserError(f"the container engine discarded the sandboxes' cores ({cpuset}; it kept {kept or 'none'}): "
                        "it cannot confine containers to cores here", f"run with {option} none")
