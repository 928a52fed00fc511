"""What a sandbox container is given from its limits (cgroup caps, network, runtime, the
sizes gVisor needs) and where the host reads its OOM kills."""

from __future__ import annotations

import os
from typing import Any

import docker.errors

from envkit.engine import TRANSPORT_ERRORS
from envkit.sandbox import SandboxLimits
from envkit.sandbox.runtimes import ENGINE_NAMES

__all__ = ["GVISOR_MEMORY_OVERHEAD_MB", "guest_args", "gvisor_host_pids", "host_oom_file", "limit_options"]


def limit_options(lim: SandboxLimits) -> dict[str, Any]:
    """The container options every sandbox gets from its limits: cgroup caps (memory without
    swap, CPU quota, pids; the cores, under a CPU partition), the network, no new privileges,
    tini as PID 1, the OCI runtime. ``network = "none"`` disables the engine's networking
    for the container: runc still gives it a network namespace of its own with ``lo`` up,
    but the engine builds no network sandbox and runs no prestart hook (a re-exec of
    dockerd), which was half of a container's start here (136 -> 75 ms). The engine then
    writes no /etc/hosts: the envkit base image resolves ``localhost`` with libnss-myhostname
    (an image on an older base does not), container environments get one written in
    (:mod:`envkit.sandbox.container`)."""
    gvisor = lim.gvisor
    # Under gVisor the host cgroup holds the sentry, the gofer and a stub process per guest
    # process: the host limits are sized for them, the spec's pids are enforced inside
    # (guest_args), and the memory limit gets the sentry's and gofer's own share on top.
    mem = f"{lim.memory_mb + (GVISOR_MEMORY_OVERHEAD_MB if gvisor else 0)}m"
    opts: dict[str, Any] = dict(
        detach=True, init=True, user="0:0", network_mode="none" if lim.network == "none" else "bridge",
        network_disabled=lim.network == "none",
        security_opt=["no-new-privileges"], pids_limit=gvisor_host_pids(lim.pids) if gvisor else lim.pids,
        mem_limit=mem, memswap_limit=mem, nano_cpus=int(lim.cpus * 1e9),
    )
    if not gvisor:  # under gVisor the engine would give it to the sentry, which the OOM killer then takes first
        opts["oom_score_adj"] = 500
    if lim.cpuset:
        opts["cpuset_cpus"] = lim.cpuset
    if gvisor:
        opts["runtime"] = ENGINE_NAMES["gvisor"]
    return opts


# gVisor: the sentry's and the gofer's own memory (~60 MB resident here) on top of the spec's
GVISOR_MEMORY_OVERHEAD_MB = 128


def gvisor_host_pids(pids: int) -> int:
    """The host pids limit of a gVisor sandbox: the sentry's and gofer's threads (~34 at rest)
    and, per guest task, its stub's host threads (measured: 100 background sleeps capped at 64
    tasks held 209 host pids; a fork bomb capped at 64, 163)."""
    return 3 * pids + 256


def guest_args(lim: SandboxLimits) -> list[str]:
    """What the command channel (``helper.py serve``) is told about limits it enforces itself:
    under gVisor, the spec's pids limit on every process it starts (helper.py's _AgentPids)."""
    return ["--agent-pids", str(lim.pids)] if lim.gvisor else []


def host_oom_file(container: Any) -> str | None:
    """The host file that counts OOM kills in ``container``'s memory cgroup (cgroup v1's
    memory.oom_control, v2's memory.events), found from its main process's /proc entry; None
    when this process cannot see it (another host, another pid namespace)."""
    try:
        container.reload()
        pid = int((container.attrs.get("State") or {}).get("Pid") or 0)
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except (OSError, ValueError, docker.errors.DockerException, *TRANSPORT_ERRORS):
        return None
    for line in lines:
        _hier, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            candidate = f"/sys/fs/cgroup/memory{path}/memory.oom_control"
        elif controllers == "":
            candidate = f"/sys/fs/cgroup{path}/memory.events"
        else:
            continue
        if os.path.isfile(candidate):
            return candidate
    return None
