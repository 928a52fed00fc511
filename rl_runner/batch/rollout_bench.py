"""``envkit bench rollout``: time to a trainable batch under naive and optimized batch
assembly, on the same scripted workload (same seeds), against the same vLLM replicas, in one
run, with an ablation that adds one optimization at a time.

For each policy the assembler collects ``batches`` consecutive batches of ``trajectories``
trajectories with fixed weights (the trainer is not in the loop: the next batch is asked for
the moment one closes). A batch's TTB is the time from the previous batch's close (or the
start) to its own close; the row reports the mean over the batches. Policies that keep
working between batches (continuous admission, carried stragglers) leave unfinished work
behind after the last batch: the row reports it (``left_groups``) rather than hiding it.

The *ideal bound* is the total work of a batch's trajectories (each one's time from reset to
the end of verification, not counting waits for a sandbox) divided by the concurrency limit:
what a batch would take if every slot were busy with useful work all the time.
"""

from __future__ import annotations

import dataclasses
import os
import random
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envkit.catalog import resolve_environment
from envkit.errors import UserError
from envkit.runtime import EnvRuntime
from envkit.sandbox_bench import core_seconds
from envkit.spec import LoadedEnvironment
from rl_runner.batch.assembler import ABLATION, Assembler, AssemblyPolicy, Batch, slot_time_split, work_s
from rl_runner.batch.workload import WorkloadParams, draw_script, scripted_episode
from rl_runner.distributed.rollouts import RayPlacement, Rollouts, open_rollouts
from rl_runner.metrics import pct
from rl_runner.partition import CpuPartition, check_engine, plan_partition
from rl_runner.policy.client import PolicyClient
from rl_runner.policy.router import Router
from rl_runner.policy.server import has_cuda
from rl_runner.policy.service import PolicyService
from rl_runner.rollout.loop import mark_aborted
from rl_runner.rollout.trajectory import Trajectory

__all__ = ["bench_rollout", "replay_policy", "run_policy"]

POOL_FILL_TIMEOUT_S = 300.0  # a pool not full by then: the first batch waits for the rest (and shows it)


def _ensure_model(model: Path | None, say: Callable[[str], None]) -> Path:
    if model is not None:
        if not (model / "config.json").is_file():
            raise UserError(f"`{model}` is not a model folder (no config.json)",
                            "omit --model to use a tiny local model, or give a transformers model folder")
        return model
    path = Path("runs/models/tiny-bench")
    if not (path / "config.json").is_file():
        from rl_runner.policy.tiny import write_tiny_model

        say(f"creating a tiny random model in {path} …")
        write_tiny_model(path)
    return path


def _long_commands(env: LoadedEnvironment, params: WorkloadParams) -> LoadedEnvironment:
    """The workload's slowest commands (builds, test suites) may run ``tool_max_s``: raise
    the environment's command and episode timeouts above that, so they are not cut short."""
    longest = params.tool_max_s * params.time_scale
    limits = env.spec.limits
    update = {"command_timeout_s": max(limits.command_timeout_s, longest + 30),
              "episode_timeout_s": max(limits.episode_timeout_s, longest * params.turns_max + 60)}
    spec = env.spec.model_copy(update={"limits": limits.model_copy(update=update)})
    return dataclasses.replace(env, spec=spec)


def run_policy(policy: AssemblyPolicy, backend: Rollouts, router: Router, *, trajectories: int, group_size: int,
               concurrency: int, batches: int, pool_size: int, seed: int, params: WorkloadParams) -> dict[str, Any]:
    """Collect ``batches`` batches under ``policy`` on ``backend`` (the environment's
    :class:`~rl_runner.distributed.rollouts.Rollouts`: this machine's or a Ray cluster's;
    ``router`` is the policy it uses); returns the row."""
    if trajectories % group_size:
        raise UserError(f"{trajectories} trajectories do not split into groups of {group_size}",
                        "choose a batch size that is a multiple of the group size")
    runtime = backend.runtime
    tasks = list(runtime.env.tasks)
    # a warm pool is full before the first batch is asked for, as in `envkit train` on the local
    # backend, where it fills while the run's own vLLM starts (not with policy_url or Ray: there
    # the first step waits for it); the fill's time is reported (``pool_fill_s``), not hidden
    t_fill = time.monotonic()
    backend.configure("pool" if policy.warm_pool else "fresh", pool_size, fill_timeout=POOL_FILL_TIMEOUT_S)
    fill_s = time.monotonic() - t_fill if policy.warm_pool else None

    def episode(g: int, i: int, cancel: Any) -> Any:
        task = tasks[g % len(tasks)]

        def describe() -> Trajectory:
            return Trajectory(env_ref=runtime.env.ref, image_digest=runtime.build.image_id,
                              bundle_digest=runtime.build.bundle_digest, runtime=runtime.limits.runtime,
                              task_id=task.id, seed=seed + g, group_id=f"{task.id}/{seed + g}")

        return backend.run(scripted_episode, {"g": g, "i": i, "seed": seed, "params": params},
                           session=f"{policy.name}/{g}/{i}", cancel=cancel, describe=describe)

    asm = Assembler(episode, group_size=group_size, groups_per_batch=trajectories // group_size,
                    concurrency=concurrency, policy=policy)
    got: list[Batch] = []
    rows: list[dict[str, Any]] = []
    try:
        asm.start()
        for _ in range(batches):
            b = asm.next_batch()
            held, alive = backend.occupancy(b.t_open, b.t_close)
            b.stats["inference_idle_share"] = _r(router.idle_share(b.t_open, b.t_close))
            b.stats["sandbox_utilisation"] = _r(held / alive if alive > 0 else None)
            got.append(b)
            rows.append(b.stats)
    finally:
        left = asm.stop()
        stats = backend.sandbox_stats()
        backend.configure("fresh", 0)  # the pool's sandboxes go now, not with the next policy's
    trajs = [t for b in got for t in b.trajectories]
    times = [t.timings.get("episode_s", 0.0) for t in trajs]
    ttbs = [b.ttb_s for b in got]
    ideal = statistics.fmean(sum(work_s(t) for t in b.trajectories) / concurrency for b in got)
    return {
        "policy": policy.name,
        "switches": {k: v for k, v in policy.__dict__.items() if k != "name"},
        "ttb_s": round(statistics.fmean(ttbs), 3),
        "ttb_per_batch_s": [round(x, 3) for x in ttbs],
        "ideal_s": round(ideal, 3),
        "ttb_over_ideal": round(statistics.fmean(ttbs) / ideal, 3) if ideal > 0 else None,
        "pool_fill_s": _r(fill_s),
        # the same ratio with the fill added to the first batch's TTB: a bound from above for a run whose
        # pool starts cold (its first episodes would take sandboxes as they come, not after the last)
        "ttb_over_ideal_with_fill": (round((sum(ttbs) + (fill_s or 0.0)) / len(ttbs) / ideal, 3)
                                     if ideal > 0 and ttbs else None),
        "trajectory_s": {"p50": pct(times, 50), "p90": pct(times, 90), "p99": pct(times, 99)},
        "straggler_wait_share": _mean(r["straggler_wait_share"] for r in rows),
        "slot_idle_share": _mean(r["slot_idle_share"] for r in rows),
        "slot_time": slot_time_split(got, concurrency),
        "inference_idle_share": _mean(r["inference_idle_share"] for r in rows),
        "sandbox_utilisation": _mean(r["sandbox_utilisation"] for r in rows),
        "sandboxes": stats,
        "prefix_cache": router.cache_stats(),
        "trajectories": len(trajs),
        # for capacity arithmetic (docs/cluster.md): per trajectory, generated tokens and the
        # seconds it held a sandbox; generated tokens per second of TTB, over all replicas
        "tokens_per_trajectory": _r(statistics.fmean(t.generated_tokens for t in trajs)) if trajs else None,
        "sandbox_s_per_trajectory": _r(statistics.fmean(work_s(t) for t in trajs)) if trajs else None,
        "tokens_per_s": _r(sum(t.generated_tokens for t in trajs) / sum(ttbs)) if sum(ttbs) > 0 else None,
        # measured over scripted: a trajectory's work (reset to verified) and its commands' time, over the drawn
        # durations of the commands it played (1.0: the work ran as fast as if it had the machine to itself)
        "work_stretch": _stretch(trajs, work_s),
        "command_stretch": _stretch(trajs, lambda t: t.timings.get("tools_s", 0.0)),
        "excluded": sum(t.excluded for t in trajs),
        "retries": sum(t.retries for t in trajs),
        "outcomes": sorted({t.outcome for t in trajs}),
        "exclusions": _exclusions(trajs),
        "placement": dict(Counter(t.placement.get("sandbox_node", "local")[:12] for t in trajs)),
        "aborted": sum(r["aborted_episodes"] for r in rows),
        "late": sum(r["late_trajectories"] for r in rows),  # members that joined a batch after their group
        "left_groups": left["groups"],
        "late_undelivered": left.get("late_undelivered", 0),  # late members finished after the last batch
        "batches": rows,
    }


def replay_policy(policy: AssemblyPolicy, *, trajectories: int, group_size: int, concurrency: int, batches: int,
                  seed: int, params: WorkloadParams, scale: float) -> dict[str, Any]:
    """The assembler alone, on the workload's scripts: each episode of the real run (the same
    seed, group and member: the same drawn script) sleeps its drawn commands' and
    verification's total (``scripted_s``) times ``scale``, with no model, sandbox or engine.
    What batch assembly gives when the work runs exactly as drawn: the bound the real row is
    measured against. Times in the row are divided back by ``scale``.

    Its ``bias`` says whether the batches favour short episodes: each episode gets a
    length-correlated reward (1 when its drawn work is at most the workload's median, else 0,
    so a policy that delivers short episodes first shows a mean above 0.5), and the delivered
    trajectories' drawn work and reward are set beside those of every member of every group
    admitted up to the newest one delivered (what an unbiased policy would train on)."""
    def drawn(g: int, i: int) -> float:
        return draw_script(params, random.Random(f"{seed}:{g}:{i}")).tool_s

    sample = [drawn(g, i) for g in range(10_000, 10_000 + max(64, 4 * trajectories // group_size))
              for i in range(group_size)]
    median = statistics.median(sample)  # groups no batch uses: the workload's own median

    def episode(g: int, i: int, cancel: threading.Event) -> Trajectory:
        duration = drawn(g, i) * scale
        t = Trajectory(env_ref="replay", image_digest="", task_id=f"t{g}", seed=seed + g, group_id=f"replay/{g}")
        t.evidence = {"group": g, "member": i}
        t0 = time.monotonic()
        while (left := duration - (time.monotonic() - t0)) > 0:
            if cancel.wait(min(left, 0.05)):
                return mark_aborted(t)
        t.reward = 1.0 if duration / scale <= median else 0.0
        t.timings = {"episode_s": round(duration, 4), "work_s": round(duration, 4)}
        return t

    asm = Assembler(episode, group_size=group_size, groups_per_batch=trajectories // group_size,
                    concurrency=concurrency, policy=policy)
    got: list[Batch] = []
    try:
        asm.start()
        got = [asm.next_batch() for _ in range(batches)]
    finally:
        asm.stop()
    ttbs = [b.ttb_s / scale for b in got]
    ideal = statistics.fmean(sum(work_s(t) for t in b.trajectories) / scale / concurrency for b in got)
    return {"policy": policy.name, "replay": True, "scale": scale, "ttb_s": round(statistics.fmean(ttbs), 3),
            "ttb_per_batch_s": [round(x, 3) for x in ttbs], "ideal_s": round(ideal, 3),
            "ttb_over_ideal": round(statistics.fmean(ttbs) / ideal, 3) if ideal > 0 else None,
            "straggler_wait_share": _mean(b.stats["straggler_wait_share"] for b in got),
            "slot_idle_share": _mean(b.stats["slot_idle_share"] for b in got),
            "slot_time": slot_time_split(got, concurrency),
            "late": sum(b.late for b in got),
            "bias": admission_bias(got, drawn, group_size, median)}


def admission_bias(batches: list[Batch], drawn: Callable[[int, int], float], group_size: int,
                   median: float) -> dict[str, Any]:
    """The delivered trajectories against every member of the groups admitted up to the newest
    one that entered a batch:
    drawn work (mean, p50, p90) and the replay's length-correlated reward; and, for groups
    that entered with members missing, how far the reward mean of the members that came first
    was from the whole group's (the baseline their advantages used, against the right one)."""
    delivered = [t for b in batches for t in b.trajectories]
    firsts: dict[int, list[Trajectory]] = {}
    for b in batches:
        for grp in b.groups:
            g = grp[0].evidence["group"]
            if not any(t.late for t in grp):
                firsts[g] = grp
    # every group up to the newest that entered a batch: the admission order, so a policy that
    # lets short groups overtake long ones shows it
    population = [drawn(g, i) for g in range(min(firsts), max(firsts) + 1) for i in range(group_size)] if firsts else []
    shifts = []
    for g, grp in firsts.items():
        if len(grp) < group_size:
            whole = statistics.fmean(1.0 if drawn(g, i) <= median else 0.0 for i in range(group_size))
            shifts.append(statistics.fmean(float(t.reward or 0.0) for t in grp) - whole)

    def dist(xs: list[float]) -> dict[str, float | None]:
        return {"mean": _r(statistics.fmean(xs)) if xs else None, "p50": pct(xs, 50), "p90": pct(xs, 90)}

    return {"work_s": {"delivered": dist([drawn(t.evidence["group"], t.evidence["member"]) for t in delivered]),
                       "groups_admitted": dist(population)},
            "reward_mean": {"delivered": _mean(float(t.reward or 0.0) for t in delivered),
                            "groups_admitted": _mean(1.0 if d <= median else 0.0 for d in population)},
            "partial_groups": len(shifts),
            "baseline_shift": {"mean": _mean(shifts), "mean_abs": _mean(abs(x) for x in shifts)}}


def bench_rollout(*, env: str = "envkit/pyfix", trajectories: int = 256, group_size: int = 8, concurrency: int = 64,
                  batches: int = 2, replicas: int | None = None, pool_size: int | None = None,
                  model: Path | None = None, seed: int = 0, params: WorkloadParams | None = None,
                  policies: list[AssemblyPolicy] | None = None,
                  backend: str = "local", ray_address: str | None = None, ray_nodes: int = 2,
                  cpu_partition: str = "auto", replay_scale: float = 0.1, sandbox_runtime: str | None = None,
                  say: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """``backend``: ``local`` (this machine's Docker, episodes on threads) or ``ray`` (sandbox
    hosts and rollout workers on the Ray cluster at ``ray_address``; without one, a local
    cluster of ``ray_nodes`` node processes is started and stopped). ``cpu_partition``: which
    cores the replicas and the sandboxes get (:mod:`rl_runner.partition`); ``replicas`` None:
    as many as the partition fits (two at most). ``replay_scale`` > 0: after the real rows,
    every policy again on the same scripts replayed by the assembler alone
    (:func:`replay_policy`), at that time scale."""
    if backend not in ("local", "ray"):
        raise UserError(f"unknown backend `{backend}`", "use --backend local or --backend ray")
    params = params or WorkloadParams()
    policies = policies or ABLATION
    pool_size = pool_size if pool_size is not None else concurrency + max(2, concurrency // 4)
    cores = plan_partition(cpu_partition, replicas, gpu=has_cuda(), remote_sandboxes=ray_address is not None)
    runtime = EnvRuntime(_long_commands(resolve_environment(env), params), cpuset=cores.cpuset(),
                         sandbox_runtime=sandbox_runtime)
    check_engine(runtime)
    model_path = _ensure_model(model, say)
    replicas = cores.replicas
    say(f"starting {replicas} vLLM replica(s) of {model_path} … {cores.describe()}")
    cluster: Any = None
    service = PolicyService(model_path, replicas=replicas, cores=cores, log_dir=Path("runs/bench"))
    try:
        service.start()
        if backend == "ray" and ray_address is None:
            from rl_runner.distributed.cluster import LocalRayCluster

            say(f"starting a local Ray cluster of {ray_nodes} node(s) …")
            cluster = LocalRayCluster(ray_nodes).start()
            ray_address = cluster.address
        out_rows = []
        for policy in policies:
            service.reset_prefix_caches()  # every policy starts with cold prefix caches
            say(f"{policy.name}: {batches} batch(es) of {trajectories} …")
            t0 = time.monotonic()
            router = Router([PolicyClient(u) for u in service.urls], affinity=policy.affinity)
            placement = (RayPlacement(ray_address or "auto", episodes_per_worker=concurrency)
                         if backend == "ray" else None)
            runner = None
            try:
                runner = open_rollouts(runtime, router, ray=placement, policy_ready=service.ready())
                cpu0 = core_seconds()
                row = run_policy(policy, runner, router, trajectories=trajectories, group_size=group_size,
                                 concurrency=concurrency, batches=batches, pool_size=pool_size, seed=seed,
                                 params=params)
                cpu1 = core_seconds()  # before the rollouts close (their teardown is not the policy's work)
            finally:
                if runner is not None:
                    runner.close()
                router.close()
            row["host_cpu_s_per_trajectory"] = host_cpu(cpu0, cpu1, cores, row["trajectories"])
            row["wall_s"] = round(time.monotonic() - t0, 2)
            say(f"  TTB {row['ttb_s']:.1f} s (ideal {row['ideal_s']:.1f} s)")
            out_rows.append(row)
    finally:
        if cluster is not None:
            cluster.stop()
        service.stop()
    naive = next((r for r in out_rows if r["policy"] == "naive"), out_rows[0])
    best = out_rows[-1]
    for r in out_rows:
        r["speedup_vs_naive"] = round(naive["ttb_s"] / r["ttb_s"], 3) if r["ttb_s"] else None
    replay: list[dict[str, Any]] = []
    if replay_scale > 0:
        say(f"replay: the same scripts, the assembler alone, at time scale {replay_scale:g} …")
        replay = [replay_policy(p, trajectories=trajectories, group_size=group_size, concurrency=concurrency,
                                batches=batches, seed=seed, params=params, scale=replay_scale) for p in policies]
        for r in replay:
            r["speedup_vs_naive"] = round(replay[0]["ttb_s"] / r["ttb_s"], 3) if r["ttb_s"] else None
    return {
        "replay": replay,
        "rows": out_rows,
        "naive_ttb_s": naive["ttb_s"],
        "optimized_ttb_s": best["ttb_s"],
        "ratio": round(best["ttb_s"] / naive["ttb_s"], 4) if naive["ttb_s"] else None,
        "ideal_s": best["ideal_s"],
        "optimized_over_ideal": best["ttb_over_ideal"],
        "targets": {"optimized_le_naive_over_3_5": best["ttb_s"] <= naive["ttb_s"] / 3.5,
                    "optimized_within_1_3_ideal": (best["ttb_over_ideal"] or 99) <= 1.3},
        "setup": {"env": runtime.env.ref, "backend": backend, "trajectories": trajectories, "group_size": group_size,
                  "concurrency": concurrency, "batches": batches, "replicas": replicas, "pool_size": pool_size,
                  "seed": seed, "model": str(model_path), "cpus": os.cpu_count(), "partition": cores.to_dict(),
                  "workload": params.to_dict()},
    }


def _exclusions(trajs: list[Any]) -> dict[str, dict[str, Any]]:
    """Why trajectories were excluded: a count per outcome and the first one's evidence."""
    out: dict[str, dict[str, Any]] = {}
    for t in trajs:
        if t.excluded:
            e = out.setdefault(t.exclude_reason or t.outcome, {"count": 0, "evidence": t.evidence})
            e["count"] += 1
    return out


def _stretch(trajs: list[Trajectory], measured: Callable[[Trajectory], float]) -> float | None:
    played = [t for t in trajs if t.timings.get("scripted_s")]
    scripted = sum(t.timings["scripted_s"] for t in played)
    return _r(sum(measured(t) for t in played) / scripted) if scripted > 0 else None


def host_cpu(before: dict[int, float], after: dict[int, float], cores: CpuPartition,
             trajectories: int) -> dict[str, float | None]:
    """Host CPU-seconds per trajectory between two :func:`core_seconds` reads: on every core,
    and (under a partition) on the inference side's and the sandboxes' cores."""
    def per(side: tuple[int, ...] | list[int]) -> float | None:
        if not trajectories:
            return None
        return round(sum(after.get(c, 0.0) - before.get(c, 0.0) for c in side) / trajectories, 3)

    mine = sorted(set(after) & os.sched_getaffinity(0))  # the cores this run may use
    out = {"all": per(mine), "inference": None, "sandboxes": None}
    if cores.active:
        out["inference"], out["sandboxes"] = per(cores.inference), per(cores.sandboxes)
    return out


def _r(x: float | None) -> float | None:
    return round(x, 4) if x is not None else None


def _mean(values: Any) -> float | None:
    vals = [v for v in values if v is not None]
    return round(statistics.fmean(vals), 4) if vals else None



