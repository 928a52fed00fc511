"""`envkit bench sandbox`, `bench reset` and `bench episode`.

`envkit bench sandbox`: cold start, warm acquire, exec round trip and reset, over N runs.

* cold start: create + start a container until a first command has run in it, and its two
  parts: the engine's create + start (the host attaching to the command channel, the
  container's main process, in between), and the first command (the channel's hello, which
  waits for its Python to start, then the command)
* warm acquire: take a ready sandbox from a full warm pool (liveness check included)
* exec round trip: one trivial command through the full exec path (the sandbox's command
  channel: user, timeout, limits, output caps), and the same through `docker exec` (the
  fallback, informational)
* reset: restore the seeded state and compute its hash (informational)
* process start: one process started and reaped inside the sandbox (bash starting /bin/true
  and waiting for it), timed inside over PROCESS_STARTS of them per sample: the least any
  command costs in that runtime, whatever carries it there (informational; under gVisor it
  shows how much of exec's ratio is the runtime's own floor)

Each row also gives the host CPU per operation spent by the container engine (dockerd,
containerd, the containers' shims and the OCI runtime they start), read from /proc.

`envkit bench episode`: N oracle episodes at a given concurrency, each through the one
episode driver (:func:`envkit.agents.run_episode`: a sandbox made, reset, the oracle, the
verifier, the sandbox removed); per episode, its wall time minus the agent's and the
verifier's own commands (as measured inside the sandbox), split into where it went, and the
host CPU-seconds (every core's busy time over the run) minus the commands' own CPU.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from envkit.runtime import EnvRuntime
from envkit.sandbox.pool import WarmPool
from envkit.stats import percentile

if TYPE_CHECKING:
    from envkit.records import EpisodeResult

__all__ = ["BenchRow", "EPISODE_TARGETS", "TARGETS", "bench_episodes", "bench_sandbox", "core_seconds"]

TARGETS = {"cold_start": ("p50", 0.150), "warm_acquire": ("p50", 0.020), "exec": ("p50", 0.005)}
HOST_CPU_TARGETS = {"exec": 0.002}  # engine CPU-seconds per command
# The container engine's processes on the host (/proc comm, 15 characters at most): their own
# CPU and that of the children they reaped. Those children are the OCI runtime's processes and
# what the engine started in a container and reaped itself: a `docker exec`'d command, a
# removed container's init and what it reaped. So `exec_docker` and `cold_start` include
# in-container CPU; `exec` does not (the channel reaps its commands inside the sandbox).
# (docker-init, the containers' PID 1, is in-container and not counted.)
_ENGINE = ("dockerd", "containerd", "containerd-shim", "runc")


def core_seconds() -> dict[int, float]:
    """CPU-seconds each core has spent busy so far (user, system, interrupts: /proc/stat; not
    idle, iowait or time stolen by a hypervisor). Whatever ran on the core counts."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    with open("/proc/stat") as f:
        for line in f:
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit():
                v = [int(x) for x in fields[:7]]  # user nice system idle iowait irq softirq (not steal)
                out[int(name[3:])] = (sum(v) - v[3] - v[4]) / tick
    return out


def engine_cpu_snapshot() -> dict[tuple[str, ...], float]:
    """The container engine's CPU so far, in seconds, per thread (its run time in
    /proc/PID/task/TID/schedstat) and per process (what its exited children used,
    cutime+cstime). Keys carry the process's start time, so a reused PID is a new key."""
    snap: dict[tuple[str, ...], float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            comm = stat[stat.index("(") + 1: stat.rindex(")")]
            if comm not in _ENGINE:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            started = fields[19]
            snap[(pid, started)] = (int(fields[13]) + int(fields[14])) / tick
            tids = os.listdir(f"/proc/{pid}/task")
        except (OSError, ValueError, IndexError):
            continue  # a process that exited while being read
        for tid in tids:
            try:  # each thread on its own: one that exits must not hide its siblings from this snapshot
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    snap[(pid, started, tid)] = int(f.read().split()[0]) / 1e9
            except (OSError, ValueError, IndexError):
                continue
    return snap


def engine_cpu_between(before: dict[tuple[str, ...], float], after: dict[tuple[str, ...], float]) -> float:
    """Engine CPU-seconds used between two snapshots. Each counter only grows while its thread
    or process lives, so the sum is of per-key growth: a thread or process that appeared counts
    in full, one that exited in between counts nothing (its last slice is lost, never
    subtracted: a sum over whoever is alive would go negative when a busy thread exits)."""
    return sum(max(0.0, value - before.get(key, 0.0)) for key, value in after.items())


@dataclass
class BenchRow:
    metric: str
    n: int
    p50_ms: float
    p90_ms: float
    mean_ms: float
    target: str
    passed: bool | None
    host_cpu_ms: float | None = None  # the engine's CPU per operation
    host_cpu_target: str = ""
    vs_runc: float | None = None  # under gVisor: this p50 over runc's, measured in the same run

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _row(metric: str, samples: list[float], engine_s: float | None = None) -> BenchRow:
    p50, p90 = percentile(samples, 50), percentile(samples, 90)
    target, passed = "", None
    if metric in TARGETS:
        which, limit = TARGETS[metric]
        value = p50 if which == "p50" else p90
        target = f"{which} <= {limit * 1000:g} ms"
        passed = value <= limit
    host_ms = None if engine_s is None else round(engine_s / len(samples) * 1000, 3)
    host_target = ""
    if metric in HOST_CPU_TARGETS and host_ms is not None:
        host_target = f"<= {HOST_CPU_TARGETS[metric] * 1000:g} ms"
        passed = bool(passed is not False and host_ms <= HOST_CPU_TARGETS[metric] * 1000)
    return BenchRow(metric, len(samples), round(p50 * 1000, 2), round(p90 * 1000, 2),
                    round(statistics.fmean(samples) * 1000, 2), target, passed, host_ms, host_target)


def bench_sandbox(runtime: EnvRuntime, *, n: int = 50, pool_size: int = 4,
                  tick: Callable[[str], None] | None = None) -> tuple[list[BenchRow], dict[str, Any]]:
    """Returns the table's rows and context (pool hits, sizes, image)."""
    backend = runtime.backend
    note = tick or (lambda _m: None)
    engine: dict[str, float] = {}

    cold: list[float] = []
    parts: dict[str, list[float]] = {"cold_start.engine": [], "cold_start.first_command": []}
    engine["cold_start"] = 0.0
    for _ in range(n):
        e0 = engine_cpu_snapshot()
        t0 = time.perf_counter()
        sb = backend.create()
        t1 = time.perf_counter()
        sb.exec("true")  # the channel's hello (its Python started with the container), then the command
        t2 = time.perf_counter()
        engine["cold_start"] += engine_cpu_between(e0, engine_cpu_snapshot())  # removal not included
        cold.append(t2 - t0)
        parts["cold_start.engine"].append(t1 - t0)
        parts["cold_start.first_command"].append(t2 - t1)
        sb.destroy()
        note("cold_start")

    sb = backend.create()
    fallback = backend.create()
    fallback.channel = False  # every command by its own `docker exec`
    try:
        timed: dict[str, list[float]] = {"exec": [], "exec_docker": [], "reset": []}
        sb.exec("true")  # the channel's hello: counted in cold_start, not here
        for metric, box in (("exec", sb), ("exec_docker", fallback)):
            e0 = engine_cpu_snapshot()
            for _ in range(n):
                t0 = time.perf_counter()
                box.exec("true")
                timed[metric].append(time.perf_counter() - t0)
                note("exec")
            engine[metric] = engine_cpu_between(e0, engine_cpu_snapshot())
        timed["process_start"] = []
        for _ in range(n):
            timed["process_start"].append(_process_start(sb))
            note("process_start")
        e0 = engine_cpu_snapshot()
        for i in range(n):
            t0 = time.perf_counter()
            sb.reset(i)
            timed["reset"].append(time.perf_counter() - t0)
            note("reset")
        engine["reset"] = engine_cpu_between(e0, engine_cpu_snapshot())
        timed["reset"] = timed.pop("reset")  # the table's order: exec, exec_docker, reset, process_start
        timed["process_start"] = timed.pop("process_start")
    finally:
        sb.destroy()
        fallback.destroy()

    warm: list[float] = []
    with WarmPool(backend.create, pool_size, max_create_per_s=8, prepare=lambda s: s.reset(0)) as pool:
        pool.wait_ready(timeout=120)
        for _ in range(n):
            t0 = time.perf_counter()
            got = pool.acquire()
            warm.append(time.perf_counter() - t0)
            pool.release(got)
            pool.wait_ready(timeout=120)
            note("warm_acquire")
        hits = pool.stats.hits

    rows = [_row("cold_start", cold, engine["cold_start"]), *(_row(k, v) for k, v in parts.items()),
            _row("warm_acquire", warm),
            *(_row(metric, samples, engine.get(metric)) for metric, samples in timed.items())]
    return rows, {"n": n, "pool_size": pool_size, "warm_pool_hits": hits, "image_id": runtime.build.image_id,
                  "cpus": os.cpu_count()}


PROCESS_STARTS = 10  # processes started inside the sandbox per process_start sample


def _process_start(sb: Any) -> float:
    """Seconds one process start costs inside ``sb`` (see the module's doc), timed by bash's
    own clock there, so that no round trip to the host is in it."""
    r = sb.exec(f"s=$EPOCHREALTIME; for i in {{1..{PROCESS_STARTS}}}; do /bin/true; done; echo $s $EPOCHREALTIME",
                timeout_s=120)
    try:
        start, end = (float(v) for v in r.stdout.split())
    except ValueError:
        raise RuntimeError(f"the process-start probe printed {r.stdout!r} (exit {r.exit_code}): "
                           f"{r.stderr[-300:]}") from None
    return (end - start) / PROCESS_STARTS


# gVisor against runc, measured side by side in one run (issue 20): p50 ratios
GVISOR_RATIO_TARGETS = {"cold_start": 1.5, "exec": 1.5}


def against_runc(rows: list[BenchRow], runc_rows: list[BenchRow]) -> list[BenchRow]:
    """``rows`` (measured under gVisor) judged by their p50 against runc's in the same run:
    cold start and exec within GVISOR_RATIO_TARGETS of runc's; runc's absolute targets are not
    gVisor's. Adds ``vs_runc`` (the p50 ratio) to each row."""
    base = {r.metric: r for r in runc_rows}
    judged = []
    for r in rows:
        ratio = round(r.p50_ms / base[r.metric].p50_ms, 3) if r.metric in base and base[r.metric].p50_ms > 0 else None
        limit = GVISOR_RATIO_TARGETS.get(r.metric)
        judged.append(dataclasses.replace(
            r, target=f"p50 <= {limit:g}x runc" if limit else "", host_cpu_target="",
            passed=(ratio is not None and ratio <= limit) if limit else None, vs_runc=ratio))
    return judged


def bench_resets(runtimes: list[EnvRuntime], *, n: int = 50,
                 tick: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Reset latency per environment, on one container each (no re-creation), plus a check
    that every reset gave the same state hash."""
    note = tick or (lambda _m: None)
    rows = []
    for runtime in runtimes:
        sb = runtime.backend.create()
        try:
            sb.reset(0)  # first reset starts services; not counted
            samples, hashes = [], set()
            for _ in range(n):
                t0 = time.perf_counter()
                hashes.add(sb.reset(0).state_hash)
                samples.append(time.perf_counter() - t0)
                note(runtime.env.ref)
        finally:
            sb.destroy()
        p50 = percentile(samples, 50)
        rows.append({"env": runtime.env.ref, "kind": runtime.env.spec.environment.kind, "n": n,
                     "p50_ms": round(p50 * 1000, 2), "p90_ms": round(percentile(samples, 90) * 1000, 2),
                     "target": "p50 <= 100 ms" if runtime.env.spec.state.database is not None else "",
                     "passed": (p50 <= 0.100) if runtime.env.spec.state.database is not None else None,
                     "same_hash": len(hashes) == 1})
    return rows


# `envkit bench episode`'s goals (issue 17): what running an episode costs on top of its own
# commands, per episode, at concurrency 4 on a container environment.
EPISODE_TARGETS = {"overhead_s": 0.5, "overhead_cpu_s": 0.5}
# Where an episode's overhead goes: (column, timing key, the commands' own time inside it)
_PARTS = (("acquire", "sandbox_acquire_s", None), ("reset", "reset_s", None),
          ("agent tools", "tools_s", "agent_commands_s"), ("verify", "verify_s", "verifier_commands_s"))


def _overhead(r: EpisodeResult) -> dict[str, float]:
    """One episode's wall time, its commands' own time and the rest, split into parts (what is
    left after the parts: removing the sandbox and the driver's own bookkeeping)."""
    t = r.timings
    own = t.get("agent_commands_s", 0.0) + t.get("verifier_commands_s", 0.0)
    wall = t.get("episode_s", 0.0)
    out = {"wall": wall, "commands": own, "overhead": wall - own}
    for name, key, inner in _PARTS:
        out[name] = t.get(key, 0.0) - (t.get(inner, 0.0) if inner else 0.0)
    out["teardown, other"] = out["overhead"] - sum(out[name] for name, _, _ in _PARTS)
    return out


def bench_episodes(runtime: EnvRuntime, *, n: int = 20, concurrency: int = 4, seed: int = 0, docker_exec: bool = False,
                   tick: Callable[[str], None] | None = None) -> dict[str, Any]:
    """N oracle episodes (the environment's tasks in turn, one seed), ``concurrency`` at a
    time, after one that is not counted (first image and hash lookups). Returns the per-episode
    figures (p50, p90, mean of each part), the host CPU per episode and the verdicts.
    ``docker_exec``: every command by its own `docker exec` (the fallback path), to compare."""
    from concurrent.futures import ThreadPoolExecutor

    from envkit.agents import OracleAgent, run_episode

    if docker_exec:
        runtime.backend.channel_off = "bench episode --docker-exec: every command by its own `docker exec`"
    note = tick or (lambda _m: None)
    tasks = runtime.env.tasks
    agent = OracleAgent()
    run_episode(runtime, tasks[0], seed, agent)  # warm-up, not counted

    def one(i: int) -> EpisodeResult:
        result = run_episode(runtime, tasks[i % len(tasks)], seed, agent)
        note(result.outcome)
        return result

    cores0, engine0, self0 = core_seconds(), engine_cpu_snapshot(), _self_cpu()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as workers:
        results = list(workers.map(one, range(n)))
    elapsed = time.perf_counter() - t0
    cores1, engine1, self1 = core_seconds(), engine_cpu_snapshot(), _self_cpu()

    failed = [r for r in results if r.outcome != "ok" or r.reward != 1.0]
    parts = [_overhead(r) for r in results]
    names = list(parts[0]) if parts else []
    stats = {name: {"p50": round(percentile([p[name] for p in parts], 50), 4),
                    "p90": round(percentile([p[name] for p in parts], 90), 4),
                    "mean": round(statistics.fmean(p[name] for p in parts), 4)} for name in names}
    mine = sorted(set(cores1) & os.sched_getaffinity(0))
    cpu_all = sum(cores1[c] - cores0.get(c, 0.0) for c in mine) / n
    cpu_own = sum(r.timings.get("agent_commands_cpu_s", 0.0) + r.timings.get("verifier_commands_cpu_s", 0.0)
                  for r in results) / n
    cpu = {"all": round(cpu_all, 4), "commands": round(cpu_own, 4), "overhead": round(cpu_all - cpu_own, 4),
           "engine": round(engine_cpu_between(engine0, engine1) / n, 4), "driver": round((self1 - self0) / n, 4)}
    overhead_mean = stats["overhead"]["mean"] if stats else float("nan")
    targets = {"overhead_s": {"value": overhead_mean, "target": EPISODE_TARGETS["overhead_s"],
                              "met": overhead_mean <= EPISODE_TARGETS["overhead_s"]},
               "overhead_cpu_s": {"value": cpu["overhead"], "target": EPISODE_TARGETS["overhead_cpu_s"],
                                  "met": cpu["overhead"] <= EPISODE_TARGETS["overhead_cpu_s"]}}
    return {"env": runtime.env.ref, "kind": runtime.env.spec.environment.kind, "n": n, "concurrency": concurrency,
            "path": "docker exec" if docker_exec else "command channel",
            "seconds": round(elapsed, 2), "episodes_per_s": round(n / elapsed, 3), "per_episode_s": stats,
            "host_cpu_s_per_episode": cpu, "targets": targets, "cpus": os.cpu_count(),
            "failed": [{"task": r.task_id, "outcome": r.outcome, "reward": r.reward,
                        "message": str(r.evidence.get("message", ""))[:300]} for r in failed]}


def _self_cpu() -> float:
    """This process's CPU so far (every thread: the episode driver's own work)."""
    t = os.times()
    return t.user + t.system
