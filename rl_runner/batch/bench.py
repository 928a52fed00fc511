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
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from envkit.catalog import resolve_environment
from envkit.errors import UserError
from envkit.runtime import EnvRuntime
from envkit.spec import LoadedEnvironment
from rl_runner.batch.assembler import ABLATION, Assembler, AssemblyPolicy, Batch, work_s
from rl_runner.batch.workload import WorkloadParams, draw_script, run_scripted_episode
from rl_runner.policy.client import PolicyClient
from rl_runner.policy.router import Router
from rl_runner.policy.server import VLLMServer, has_cuda
from rl_runner.rollout.reuse import FreshSandboxes, Sandboxes, sandbox_pool, sandbox_stats

__all__ = ["bench_rollout", "run_policy"]


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


def run_policy(policy: AssemblyPolicy, runtime: EnvRuntime, router: Router, *, trajectories: int, group_size: int,
               concurrency: int, batches: int, pool_size: int, seed: int, params: WorkloadParams) -> dict[str, Any]:
    """Collect ``batches`` batches under ``policy``; returns the row (and the batches' stats)."""
    if trajectories % group_size:
        raise UserError(f"{trajectories} trajectories do not split into groups of {group_size}",
                        "choose a batch size that is a multiple of the group size")
    tasks = list(runtime.env.tasks)
    sandboxes: Sandboxes = sandbox_pool(runtime.backend, pool_size) if policy.warm_pool else FreshSandboxes(runtime.backend)

    def episode(g: int, i: int, cancel: Any) -> Any:
        task = tasks[g % len(tasks)]
        script = draw_script(params, random.Random(f"{seed}:{g}:{i}"))
        return run_scripted_episode(runtime, task, seed + g, script, policy=router, sandboxes=sandboxes,
                                    group_id=f"{task.id}/{seed + g}", params=params, cancel=cancel,
                                    session=f"{policy.name}/{g}/{i}")

    asm = Assembler(episode, group_size=group_size, groups_per_batch=trajectories // group_size, concurrency=concurrency,
                    policy=policy)
    got: list[Batch] = []
    rows: list[dict[str, Any]] = []
    try:
        asm.start()
        for _ in range(batches):
            b = asm.next_batch()
            held = sandboxes.held.integral(b.t_open, b.t_close)
            alive = sandboxes.alive.integral(b.t_open, b.t_close)
            b.stats["inference_idle_share"] = _r(router.idle_share(b.t_open, b.t_close))
            b.stats["sandbox_utilisation"] = _r(held / alive if alive > 0 else None)
            got.append(b)
            rows.append(b.stats)
    finally:
        left = asm.stop()
        sandboxes.close()
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
        "trajectory_s": {"p50": _pct(times, 50), "p90": _pct(times, 90), "p99": _pct(times, 99)},
        "straggler_wait_share": _mean(r["straggler_wait_share"] for r in rows),
        "slot_idle_share": _mean(r["slot_idle_share"] for r in rows),
        "inference_idle_share": _mean(r["inference_idle_share"] for r in rows),
        "sandbox_utilisation": _mean(r["sandbox_utilisation"] for r in rows),
        "sandboxes": sandbox_stats(sandboxes),
        "prefix_cache": router.cache_stats(),
        "trajectories": len(trajs),
        "excluded": sum(t.excluded for t in trajs),
        "outcomes": sorted({t.outcome for t in trajs}),
        "aborted": sum(r["aborted_episodes"] for r in rows),
        "left_groups": left["groups"],
        "batches": rows,
    }


def bench_rollout(*, env: str = "envkit/pyfix", trajectories: int = 256, group_size: int = 8, concurrency: int = 64,
                  batches: int = 2, replicas: int = 2, pool_size: int | None = None, model: Path | None = None, seed: int = 0,
                  params: WorkloadParams | None = None, policies: list[AssemblyPolicy] | None = None,
                  say: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    params = params or WorkloadParams()
    policies = policies or ABLATION
    pool_size = pool_size if pool_size is not None else concurrency + max(2, concurrency // 4)
    runtime = EnvRuntime(_long_commands(resolve_environment(env), params))
    model_path = _ensure_model(model, say)
    say(f"starting {replicas} vLLM replica(s) of {model_path} …")
    cpus = os.cpu_count() or 1
    bind = replicas > 1 and not has_cuda()
    servers = [VLLMServer(model_path, log_path=Path("runs/bench") / f"vllm-{k}.log",
                          cpu_bind=str(k % cpus) if bind else None) for k in range(replicas)]
    started: list[VLLMServer] = []
    try:
        with ThreadPoolExecutor(max_workers=replicas) as ex:
            for s in ex.map(lambda s: s.start(), servers):
                started.append(s)
        clients = [PolicyClient(s.url) for s in started]
        out_rows = []
        for policy in policies:
            for s in started:  # every policy starts with cold prefix caches
                httpx.post(f"{s.url}/reset_prefix_cache", params={"reset_running_requests": "true"}, timeout=30)
            router = Router(clients, affinity=policy.affinity)
            say(f"{policy.name}: {batches} batch(es) of {trajectories} …")
            t0 = time.monotonic()
            row = run_policy(policy, runtime, router, trajectories=trajectories, group_size=group_size,
                             concurrency=concurrency, batches=batches, pool_size=pool_size, seed=seed, params=params)
            row["wall_s"] = round(time.monotonic() - t0, 2)
            say(f"  TTB {row['ttb_s']:.1f} s (ideal {row['ideal_s']:.1f} s)")
            out_rows.append(row)
        for c in clients:
            c.close()
    finally:
        for s in started:
            s.stop()
    naive = next((r for r in out_rows if r["policy"] == "naive"), out_rows[0])
    best = out_rows[-1]
    for r in out_rows:
        r["speedup_vs_naive"] = round(naive["ttb_s"] / r["ttb_s"], 3) if r["ttb_s"] else None
    return {
        "rows": out_rows,
        "naive_ttb_s": naive["ttb_s"],
        "optimized_ttb_s": best["ttb_s"],
        "ratio": round(best["ttb_s"] / naive["ttb_s"], 4) if naive["ttb_s"] else None,
        "ideal_s": best["ideal_s"],
        "optimized_over_ideal": best["ttb_over_ideal"],
        "targets": {"optimized_le_naive_over_3_5": best["ttb_s"] <= naive["ttb_s"] / 3.5,
                    "optimized_within_1_3_ideal": (best["ttb_over_ideal"] or 99) <= 1.3},
        "setup": {"env": runtime.env.ref, "trajectories": trajectories, "group_size": group_size, "concurrency": concurrency,
                  "batches": batches, "replicas": replicas, "pool_size": pool_size, "seed": seed, "model": str(model_path),
                  "cpus": os.cpu_count(), "workload": params.to_dict()},
    }


def _r(x: float | None) -> float | None:
    return round(x, 4) if x is not None else None


def _mean(values: Any) -> float | None:
    vals = [v for v in values if v is not None]
    return round(statistics.fmean(vals), 4) if vals else None


def _pct(values: list[float], p: float) -> float | None:
    from envkit.bench import percentile

    return round(percentile(values, p), 3) if values else None


