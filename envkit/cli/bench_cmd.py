"""`envkit bench sandbox`."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer
from rich.progress import Progress
from rich.table import Table

from envkit.catalog import resolve_environment
from envkit.cli.options import requested_runtime, runtime_option
from envkit.cli.output import console, print_json
from envkit.errors import UserError
from envkit.extras import require
from envkit.kinds import kind_of
from envkit.runtime import EnvRuntime
from envkit.sandbox_bench import against_runc, bench_sandbox

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks that print a table.")


def _advance(progress: Progress, bar: Any) -> Any:
    return lambda _m: progress.advance(bar)


@bench_app.command("sandbox")
def sandbox(
    env: str = typer.Option("envkit/pyfix", "--env", help="Environment whose image to use (folder or ref)."),
    n: int = typer.Option(50, "-n", min=2, max=10000, help="Samples per metric."),
    pool_size: int = typer.Option(4, "--pool-size", min=1, max=64, help="Warm pool size."),
    sandbox_runtime: str = typer.Option(None, "--runtime", help="runc (default here) or gvisor: under gvisor the same "
                                        "rows are measured under runc first, in the same run, and gVisor's cold start "
                                        "and exec are judged against them (p50 <= 1.5x)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Cold start, warm acquire, exec round trip and reset latencies."""
    asked = requested_runtime(sandbox_runtime)
    loaded = resolve_environment(env)
    if kind_of(loaded.spec).name == "container":  # before building its task images
        raise UserError(f"`bench sandbox` measures sandboxes that exist before a task; {loaded.ref} is a container "
                        "environment, whose sandbox starts from its task's own image at reset",
                        f"measure its episodes instead: envkit bench episode {env}")
    runtime = EnvRuntime(loaded, sandbox_runtime=asked)
    runs = [runtime]
    if runtime.limits.gvisor:  # runc first, as the baseline of the same run
        runs.insert(0, EnvRuntime(loaded, sandbox_runtime="runc", build_result=runtime.build))
    results: list[tuple[EnvRuntime, list[Any], dict[str, Any]]] = []
    with Progress(console=console, transient=True, disable=as_json) as progress:
        for rt in runs:
            bar = progress.add_task(f"benchmarking under {rt.limits.runtime}", total=6 * n)
            rows, context = bench_sandbox(rt, n=n, pool_size=pool_size, tick=_advance(progress, bar))
            results.append((rt, rows, context))
    if len(results) == 2:
        results[1] = (results[1][0], against_runc(results[1][1], results[0][1]), results[1][2])
    failed = any(r.passed is False for _rt, rows, _c in results for r in rows)
    if as_json:
        doc = {"runtime": runtime.limits.runtime, "rows": [r.to_dict() for r in results[-1][1]], **results[-1][2]}
        if len(results) == 2:
            doc["runc"] = {"rows": [r.to_dict() for r in results[0][1]], **results[0][2]}
        print_json(doc)
    else:
        for rt, rows, context in results:
            gvisor = rt.limits.gvisor
            table = Table(title=f"envkit bench sandbox --runtime {rt.limits.runtime}  (N={n}, pool {pool_size}, "
                                f"{rt.env.ref}, {context['cpus']} CPUs)")
            cols = ("metric", "p50", "p90", "mean", "target", "host CPU/op", "target ",
                    *(("vs runc",) if gvisor else ()), "met")
            for col in cols:
                table.add_column(col, justify="right" if col in ("p50", "p90", "mean", "host CPU/op", "vs runc")
                                 else "left")
            for r in rows:
                met = "" if r.passed is None else ("[green]yes[/]" if r.passed else "[red]no[/]")
                host = "" if r.host_cpu_ms is None else f"{r.host_cpu_ms:.2f} ms"
                ratio = (("-" if r.vs_runc is None else f"{r.vs_runc:.2f}x"),) if gvisor else ()
                table.add_row(r.metric, f"{r.p50_ms:.1f} ms", f"{r.p90_ms:.1f} ms", f"{r.mean_ms:.1f} ms", r.target,
                              host, r.host_cpu_target, *ratio, met)
            console.print(table)
            console.print(f"warm pool hits: {context['warm_pool_hits']}/{n}")
        console.print("host CPU/op: the container engine's CPU (dockerd, containerd, shims, the OCI runtime) per "
                      "operation, from /proc; exec_docker: the same command by its own `docker exec` (the fallback); "
                      "process_start: one process started and reaped inside the sandbox, timed there (the least any "
                      "command costs in that runtime)")
    if failed:
        raise typer.Exit(1)


@bench_app.command("episode")
def episode(
    env: str = typer.Argument(..., help="Environment folder or ns/name@version."),
    n: int = typer.Option(20, "-n", min=1, max=100_000, help="Episodes (after one warm-up that is not counted)."),
    concurrency: int = typer.Option(4, "--concurrency", min=1, max=256, help="Episodes at a time."),
    seed: int = typer.Option(0, "--seed", help="Reset seed of every episode."),
    docker_exec: bool = typer.Option(False, "--docker-exec", help="Every command by its own `docker exec` (the "
                                     "fallback path), to compare with the command channel."),
    sandbox_runtime: str = runtime_option(),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Per-episode overhead: N oracle episodes, wall time and host CPU beyond the commands' own."""
    asked = requested_runtime(sandbox_runtime)
    from envkit.sandbox_bench import bench_episodes

    runtime = EnvRuntime(resolve_environment(env), sandbox_runtime=asked)
    if as_json:
        result = bench_episodes(runtime, n=n, concurrency=concurrency, seed=seed, docker_exec=docker_exec)
        print_json(result)
    else:
        with Progress(console=console, transient=True) as progress:
            bar = progress.add_task("episodes", total=n)
            result = bench_episodes(runtime, n=n, concurrency=concurrency, seed=seed, docker_exec=docker_exec,
                                    tick=lambda _m: progress.advance(bar))
        show_episodes(result)
    if result["failed"] or not all(t["met"] for t in result["targets"].values()):
        raise typer.Exit(1)


def show_episodes(result: dict[str, Any]) -> None:
    """Print `envkit bench episode`'s table for a result."""
    table = Table(title=f"envkit bench episode  ({result['n']} oracle episodes of {result['env']} ({result['kind']}), "
                        f"concurrency {result['concurrency']}, {result['path']}, {result['cpus']} CPUs, "
                        f"{result['seconds']:.1f} s)")
    for col in ("per episode", "p50", "p90", "mean"):
        table.add_column(col, justify="left" if col == "per episode" else "right")
    labels = {"wall": "wall time", "commands": "agent's + verifier's own commands",
              "overhead": "overhead (wall - commands)"}
    for name, st in result["per_episode_s"].items():
        label = labels.get(name, f"  {name}")
        table.add_row(label, f"{st['p50']:.3f} s", f"{st['p90']:.3f} s", f"{st['mean']:.3f} s",
                      style="bold" if name == "overhead" else None)
    console.print(table)
    cpu = result["host_cpu_s_per_episode"]
    console.print(f"host CPU-s per episode: {cpu['all']:.3f} on every core, of which the commands' own "
                  f"{cpu['commands']:.3f}: overhead {cpu['overhead']:.3f} (container engine {cpu['engine']:.3f}, "
                  f"this process {cpu['driver']:.3f})")
    for name, t in result["targets"].items():
        what = "overhead per episode (mean)" if name == "overhead_s" else "overhead CPU-s per episode"
        console.print(f"{what}: {t['value']:.3f} (target ≤ {t['target']:g}: {'met' if t['met'] else 'NOT met'})")
    for f in result["failed"]:
        console.print(f"[red]task {f['task']}: {f['outcome']}, reward {f['reward']}: {f['message']}[/]")
    console.print("[dim]commands' own time and CPU are measured inside the sandbox (the channel, or exec.sh); the "
                  "parts: acquire (the sandbox made), reset, agent tools and verify beyond their commands, "
                  "teardown and other (the sandbox removed, the driver's bookkeeping)[/]")


@bench_app.command("registry")
def registry(
    envs: int = typer.Option(50, "--envs", min=1, max=10000, help="Environments seeded before the GETs."),
    requests: int = typer.Option(2000, "--requests", min=10, max=1_000_000, help="Metadata GETs in all."),
    concurrency: int = typer.Option(16, "--concurrency", min=1, max=512, help="GETs in flight."),
    bundle_mb: int = typer.Option(50, "--bundle-mb", min=1, max=400, help="Size of the published/pulled bundle."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Metadata GET latency and throughput, publish and pull time: SQLite and PostgreSQL side by side."""
    require("server", "`envkit bench registry`")
    from registry_server.registry_bench import bench_registry

    note = (lambda _m: None) if as_json else (lambda m: console.print(f"[dim]{m}[/]"))
    rows, context = bench_registry(envs=envs, requests=requests, concurrency=concurrency, bundle_mb=bundle_mb,
                                   note=note)
    if as_json:
        print_json({"rows": [r.to_dict() for r in rows], **context})
        return
    table = Table(title=f"envkit bench registry  ({requests} GETs at concurrency {concurrency}, {envs} envs, "
                        f"{bundle_mb} MB bundle, {context['cpus']} CPUs)")
    for col in ("database", "GET p50", "GET p99", "GET req/s", "errors", f"publish {bundle_mb} MB",
                f"pull {bundle_mb} MB"):
        table.add_column(col, justify="left" if col == "database" else "right", no_wrap=True)
    for r in rows:
        table.add_row(r.database, f"{r.get_p50_ms:.1f} ms", f"{r.get_p99_ms:.1f} ms", f"{r.get_rps:.0f}",
                      str(r.get_errors), f"{r.publish_s:.2f} s", f"{r.pull_s:.2f} s")
    console.print(table)


@bench_app.command("reset")
def reset(
    env: list[str] = typer.Option(None, "--env", help="Environments (folders or refs); default: every bundled one."),
    n: int = typer.Option(50, "-n", min=2, max=10000, help="Resets per environment."),
    sandbox_runtime: str = runtime_option(),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Reset latency per environment kind, on a running sandbox (no container re-creation)."""
    asked = requested_runtime(sandbox_runtime)
    from envkit.catalog import local_environments
    from envkit.sandbox_bench import bench_resets

    refs = env or [f"{name}@{max(versions)}" for name, versions in sorted(local_environments().items())]
    runtimes = [EnvRuntime(resolve_environment(r), sandbox_runtime=asked) for r in refs]
    if as_json:
        rows = bench_resets(runtimes, n=n)
        print_json({"rows": rows})
    else:
        with Progress(console=console, transient=True) as progress:
            bar = progress.add_task("resetting", total=n * len(runtimes))
            rows = bench_resets(runtimes, n=n, tick=lambda _m: progress.advance(bar))
        table = Table(title=f"envkit bench reset  (N={n} per environment, one running sandbox each)")
        for col in ("environment", "kind", "p50", "p90", "target", "met", "same hash"):
            table.add_column(col, no_wrap=True)
        for r in rows:
            met = "" if r["passed"] is None else ("[green]yes[/]" if r["passed"] else "[red]no[/]")
            table.add_row(r["env"], r["kind"], f"{r['p50_ms']:.1f} ms", f"{r['p90_ms']:.1f} ms", r["target"], met,
                          "yes" if r["same_hash"] else "[red]NO[/]")
        console.print(table)
    if any(r["passed"] is False or not r["same_hash"] for r in rows):
        raise typer.Exit(1)


@bench_app.command("rollout")
def rollout(
    env: str = typer.Option("envkit/pyfix", "--env", help="Environment the workload's commands run in "
                            "(folder or ref)."),
    trajectories: int = typer.Option(256, "-n", "--trajectories", min=2, max=100_000, help="Trajectories per batch."),
    group_size: int = typer.Option(8, "--group-size", min=1, max=1024, help="Trajectories per group (GRPO)."),
    concurrency: int = typer.Option(64, "--concurrency", min=1, max=4096, help="Episodes in flight, for every policy."),
    batches: int = typer.Option(2, "--batches", min=1, max=100, help="Consecutive batches per policy."),
    replicas: int = typer.Option(0, "--replicas", min=0, max=16, help="vLLM replicas started for the run "
                                 "(0: as many as the CPU partition fits, two at most)."),
    cpu_partition: str = typer.Option("auto", "--cpu-partition", help="Cores for inference and for sandboxes: "
                                      "INFERENCE/SANDBOXES core lists (0/1, 0-3/4-7), auto (on CPU-only machines half "
                                      "each) or none (shared)."),
    pool_size: int = typer.Option(0, "--pool-size", min=0, max=100_000, help="Warm pool size (0: concurrency + 25%)."),
    time_scale: float = typer.Option(1.0, "--time-scale", min=0.01, max=100.0, help="Multiply every tool duration."),
    policies: str = typer.Option("ablation", "--policies", help="ablation (all six rows) or naive,optimized."),
    model: Path = typer.Option(None, "--model", help="Model folder (default: a tiny random model, "
                               "created if missing)."),
    seed: int = typer.Option(0, "--seed", help="Workload seed (the same for every policy)."),
    backend: str = typer.Option("local", "--backend", help="local (this machine's Docker) or ray (sandbox hosts and "
                                "rollout workers on a Ray cluster)."),
    replay_scale: float = typer.Option(0.1, "--replay-scale", min=0.0, max=10.0, help="After the real rows, "
                                       "every policy on the same scripts replayed by the assembler alone (sleeps, "
                                       "no model or sandbox) at this time scale; 0: no replay."),
    ray_address: str = typer.Option(None, "--ray-address", help="With --backend ray: the cluster (HOST:PORT); default: "
                                    "start a local one."),
    ray_nodes: int = typer.Option(2, "--ray-nodes", min=1, max=16, help="With --backend ray and no address: node "
                                  "processes of the local cluster (each one sandbox host)."),
    sandbox_runtime: str = runtime_option(),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Time to a trainable batch: naive vs optimized batch assembly on the same workload, with an ablation."""
    asked = requested_runtime(sandbox_runtime)
    require("cpu", "`envkit bench rollout`")  # vLLM replicas; torch and transformers for the tiny model
    from rl_runner.batch.assembler import ABLATION, NAIVE, OPTIMIZED
    from rl_runner.batch.rollout_bench import bench_rollout
    from rl_runner.batch.workload import WorkloadParams

    chosen = {"ablation": ABLATION, "naive,optimized": [NAIVE, OPTIMIZED]}.get(policies.replace(" ", ""))
    if chosen is None:
        raise UserError(f"--policies {policies!r} is not known",
                        "use --policies ablation or --policies naive,optimized")
    if trajectories % group_size:
        raise UserError(f"{trajectories} trajectories do not split into groups of {group_size}",
                        "make -n a multiple of --group-size")
    if backend not in ("local", "ray"):
        raise UserError(f"--backend {backend!r} is not known", "use --backend local or --backend ray")
    if ray_address is not None and backend != "ray":
        raise UserError("--ray-address is for --backend ray", "add --backend ray, or drop --ray-address")
    note = (lambda _m: None) if as_json else (lambda m: console.print(f"[dim]{m}[/]"))
    result = bench_rollout(env=env, trajectories=trajectories, group_size=group_size, concurrency=concurrency,
                           batches=batches, replicas=replicas or None, pool_size=pool_size or None, model=model,
                           seed=seed, params=WorkloadParams(time_scale=time_scale), policies=chosen, backend=backend,
                           ray_address=ray_address, ray_nodes=ray_nodes, cpu_partition=cpu_partition,
                           replay_scale=replay_scale, sandbox_runtime=asked, say=note)
    if as_json:
        print_json(result)
        return
    saved = Path("runs/bench") / f"rollout-{time.strftime('%Y%m%d-%H%M%S')}.json"
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    show_rollout(result, saved)


def _num(x: float | None, unit: str = "") -> str:
    return "" if x is None else f"{x:.2f}{unit}"


def _cpu(cpu: dict[str, Any] | None) -> str:
    """Host CPU-seconds per trajectory: all cores, and (under a partition) inference + sandboxes."""
    if not cpu or cpu.get("all") is None:
        return ""
    if cpu.get("inference") is None:
        return f"{cpu['all']:.2f}"
    return f"{cpu['all']:.2f} ({cpu['inference']:.2f}+{cpu['sandboxes']:.2f})"


def _share(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.0f}%"


def show_rollout(result: dict[str, Any], saved: Path) -> None:
    """Print `envkit bench rollout`'s table and verdicts for a result (``saved``: where its JSON is)."""
    s = result["setup"]
    table = Table(title=f"envkit bench rollout  ({s['batches']} batch(es) of {s['trajectories']} per policy, groups of "
                        f"{s['group_size']}, concurrency {s['concurrency']}, {s['replicas']} vLLM replica(s), "
                        f"pool {s['pool_size']}, {s['env']}, {s['cpus']} CPUs, {s['backend']} backend)")
    cols = ("policy", "TTB s", "×naive", "/ideal", "traj p50", "p90", "p99", "stragg wait", "slots idle",
            "running at end", "infer idle", "sbx util", "prefix hit", "stretch", "CPU-s/traj", "late", "carried",
            "retried", "excl")
    for col in cols:
        table.add_column(col, justify="left" if col == "policy" else "right")
    for r in result["rows"]:
        t = r["trajectory_s"]
        table.add_row(r["policy"], f"{r['ttb_s']:.1f}", f"{r['speedup_vs_naive']:.2f}", f"{r['ttb_over_ideal']:.2f}",
                      f"{t['p50']:.1f}", f"{t['p90']:.1f}", f"{t['p99']:.1f}", _share(r["straggler_wait_share"]),
                      _share(r["slot_idle_share"]), _share(r["slot_time"].get("in_flight_at_end")),
                      _share(r["inference_idle_share"]), _share(r["sandbox_utilisation"]),
                      _share(r["prefix_cache"]["prefix_hit_rate"]), _num(r.get("command_stretch"), "×"),
                      _cpu(r.get("host_cpu_s_per_trajectory")), str(r.get("late", 0)), str(r["left_groups"]),
                      str(r["retries"]),
                      str(r["excluded"]))
    console.print(table)
    if result.get("replay"):
        replay = Table(title=f"replay: the same scripts, the assembler alone (no model, sandbox or engine; "
                             f"each episode sleeps its drawn work; run at time scale {result['replay'][0]['scale']:g}, "
                             "shown at scale 1)")
        for col in ("policy (replay)", "TTB s", "per batch s", "×naive", "/ideal", "ideal s", "stragg wait",
                    "slots idle", "running at end", "late", "work mean: batches / admitted",
                    "reward: batches / admitted", "baseline shift"):
            replay.add_column(col, justify="left" if col.startswith("policy") else "right")
        for r in result["replay"]:
            b = r["bias"]
            shift = b["baseline_shift"]["mean"]
            replay.add_row(f"{r['policy']} (replay)", f"{r['ttb_s']:.1f}",
                           ", ".join(f"{x:.1f}" for x in r["ttb_per_batch_s"]),
                           f"{r['speedup_vs_naive']:.2f}", f"{r['ttb_over_ideal']:.2f}", f"{r['ideal_s']:.1f}",
                           _share(r["straggler_wait_share"]), _share(r["slot_idle_share"]),
                           _share(r["slot_time"].get("in_flight_at_end")), str(r["late"]),
                           f"{b['work_s']['delivered']['mean']:.1f} / {b['work_s']['groups_admitted']['mean']:.1f}",
                           f"{b['reward_mean']['delivered']:.3f} / {b['reward_mean']['groups_admitted']:.3f}",
                           "" if shift is None else f"{shift:+.3f} ({b['partial_groups']} groups)")
        console.print(replay)
        console.print("[dim]replay reward: 1 when an episode's drawn work is at most the workload's median, so batches "
                      "that favour short episodes show a mean above the admitted groups'; baseline shift: for groups "
                      "that entered a batch with members missing, the reward mean of the members that came first "
                      "minus the whole group's; running at end: the share of the slot-time spent on episodes "
                      "still running when the last batch closed (work a longer run delivers later)[/]")
    if s.get("partition"):
        from rl_runner.partition import describe

        console.print(describe(s["partition"]))
    tg = result["targets"]
    console.print(f"naive TTB {result['naive_ttb_s']:.1f} s, optimized {result['optimized_ttb_s']:.1f} s: ratio "
                  f"{result['ratio']:.3f} (1/{1 / result['ratio']:.2f}; target ≤ 1/3.5: "
                  f"{'met' if tg['optimized_le_naive_over_3_5'] else 'NOT met'})")
    console.print(f"ideal bound (work / concurrency) {result['ideal_s']:.1f} s; optimized / ideal "
                  f"{result['optimized_over_ideal']:.2f} (target ≤ 1.3: "
                  f"{'met' if tg['optimized_within_1_3_ideal'] else 'NOT met'})")
    best = result["rows"][-1]
    if best.get("pool_fill_s") is not None:
        console.print(f"{best['policy']}'s warm pool ({s['pool_size']}) was filled in {best['pool_fill_s']:.1f} s "
                      f"before its first batch was asked for (envkit train fills it while its own vLLM starts); "
                      f"that time added to the first batch's TTB, optimized / ideal would be "
                      f"{best['ttb_over_ideal_with_fill']:.2f} (a bound from above: a cold pool hands sandboxes "
                      f"out as they come)")
    for r in result["rows"]:
        for why, e in r["exclusions"].items():
            console.print(f"[yellow]{r['policy']}: {e['count']} excluded ({why}): "
                          f"{e['evidence'].get('message', '')}[/]")
    console.print("[dim]stretch: the commands' measured time over their drawn durations (1.00: as on an idle "
                  "machine); CPU-s/traj: host CPU-seconds per trajectory, all cores (inference "
                  "cores + sandbox cores under a partition); carried: groups still running after the last batch "
                  "(work not counted in any TTB); retried: "
                  "infra failures run again on a fresh sandbox; excl: trajectories whose retries ran out. "
                  f"Workload parameters: docs/bench.md; every figure: {saved}[/]")


@bench_app.command("synth")
def synth_bench(
    packages: list[str] = typer.Argument(None, help="NAME==VERSION from the package index "
                                         "(default: the ten of docs/synth.md)."),
    out: Path = typer.Option(Path("runs/synth-bench"), "--out", help="Folder for the environments and bench.json "
                                                                     "(a rerun reuses what it finds there)."),
    max_tasks: int = typer.Option(50, "--max-tasks", min=1, help="Tasks per package."),
    sample: int = typer.Option(50, "--sample", min=0, help="Tasks validated per package (0: none)."),
    probes: str = typer.Option("quick", "--probes", help="Probe set for the validation: none | quick | all."),
    seed: int = typer.Option(0, "--seed"),
    jobs: int = typer.Option(2, "--jobs", "-j", min=1, max=32),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """envkit synth over real packages: tasks, yield per family, time, bytes per task, and a validated sample."""
    require("synth", "envkit bench synth", "libcst")
    from envkit.synth.synth_bench import PACKAGES, bench_synth

    started = time.monotonic()
    rows = bench_synth(list(packages or PACKAGES), out, max_tasks=max_tasks, sample=sample, probes=probes, seed=seed,
                       jobs=jobs, progress=lambda m: None if as_json else console.print(f"[dim]{m}[/]"))
    if as_json:
        print_json(rows)
        return
    table = Table(title=f"envkit synth over {len(rows)} packages ({time.monotonic() - started:.0f} s this run)")
    for col in ("package", "tasks", "tried", "kept", "yield", "synth", "B/task", "stable tests", "oracle", "null",
                "probes beat"):
        table.add_column(col)
    for r in rows:
        if "refused" in r:
            table.add_row(r["package"], "refused", "", "", "", "", "", "", "", "", r["refused"][:80])
            continue
        v = r.get("validated")
        table.add_row(r["package"], str(r["tasks"]), str(r["tried"]), str(r["kept"]), f"{r['kept'] / r['tried']:.0%}",
                      f"{r['synth_s']:.0f} s", str(r["bytes_per_task"]),
                      f"{r['baseline']['stable']}/{r['baseline']['collected']}",
                      f"{r['oracle_ok']}/{v}" if v else "-", f"{r['null_ok']}/{v}" if v else "-",
                      f"{r['tasks_beaten']}/{v}" if v else "-")
    console.print(table)
    families = sorted({f for r in rows for f in r.get("by_family", {})})
    ftable = Table(title="yield (kept / tried) per family")
    ftable.add_column("package")
    for f in families:
        ftable.add_column(f)
    for r in rows:
        if "by_family" in r:
            ftable.add_row(r["package"], *(f"{r['by_family'][f]['kept']}/{r['by_family'][f]['tried']}"
                                           if f in r["by_family"] else "-" for f in families))
    console.print(ftable)
    done = [r for r in rows if "tasks" in r]
    console.print(f"total: {sum(r['tasks'] for r in done)} tasks from {len(done)} packages, synthesis "
                  f"{sum(r['synth_s'] for r in done) / 60:.1f} min; {out / 'bench.json'} has every figure")


@bench_app.command("learn")
def learn_bench(
    recipe: Path = typer.Argument(..., help="A recipe YAML (e.g. rl_runner/recipes/lookup.yaml)."),
    overrides: list[str] = typer.Argument(None, help="key=value settings, as for `envkit train` "
                                          "(not seed or run_dir)."),
    seeds: int = typer.Option(5, "--seeds", min=1, max=100, help="Seeds 0..K-1 (or from --first-seed)."),
    first_seed: int = typer.Option(0, "--first-seed", min=0),
    out: Path = typer.Option(Path("runs/learn-bench"), "--out", help="Folder for each seed's run, sweep.json and "
                                                                     "learn.png (a rerun reuses the seeds it finds "
                                                                     "finished)."),
    threshold: float = typer.Option(0.5, "--threshold", min=0.0, max=1.0,
                                    help="A seed learned when its evaluation after training is above this."),
    warmup: str = typer.Option(None, "--warmup", help="TASK:STEPS: warm a tiny model up at each seed first (e.g. "
                               "lookup:1000), so the warm-up's luck is measured too."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The recipe on K seeds: eval before/after per seed with intervals, steps to the threshold, one figure \
of every curve."""
    require("cpu", "`envkit bench learn`")
    from rl_runner.recipes.sweep import parse_warmup, sweep

    result = sweep(recipe, list(overrides or []), list(range(first_seed, first_seed + seeds)), out, threshold=threshold,
                   warmup=parse_warmup(warmup),
                   say=(lambda _m: None) if as_json else (lambda m: console.print(f"[dim]{m}[/]")))
    if as_json:
        print_json(result)
        return
    table = Table(title=f"envkit bench learn {recipe.name}: {result['learned']} of {result['runs']} seeds above "
                        f"{threshold:g} (95% CI {result['learned_ci95'][0]:.2f}-{result['learned_ci95'][1]:.2f})")
    for col in ("seed", "eval before", "eval after", "learned", "first step ≥ threshold", "reward first → last",
                "signal", "warm-up copied", "minutes"):
        table.add_column(col)

    def ev(e: dict[str, Any] | None) -> str:
        return "–" if e is None else f"{e['mean']:.3f} [{e['ci95'][0]:.3f}, {e['ci95'][1]:.3f}]"

    for r in result["seeds"]:
        rw = [x for x in r["rewards"] if x is not None]
        copied = (r.get("warmup") or {}).get("answer_copied")
        table.add_row(str(r["seed"]), ev(r["eval_before"]), ev(r["eval"]), "yes" if r["learned"] else "[red]no[/]",
                      str(r["steps_to_threshold"] or "–"), f"{rw[0]:.3f} → {rw[-1]:.3f}" if rw else "–",
                      r["signal"]["status"], "–" if copied is None else f"{copied:.0%}", f"{r['seconds'] / 60:.1f}")
    console.print(table)
    console.print(f"figure: {result['figure']}  ·  every figure: {out / 'sweep.json'}")
