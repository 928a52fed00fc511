"""`envkit train RECIPE.yaml`, `envkit report RUN_DIR`, `envkit doctor RUN_DIR`, `envkit eval ENV`.

What each needs beyond the core (envkit/extras.py): train the `train` extra and torch (the `cpu`
or `gpu` extra, which bring vLLM too; a run with `policy_url` needs no local vLLM); report
matplotlib; eval the tokenizer (transformers), and vLLM unless --policy-url; doctor nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from envkit.cli.options import requested_runtime, runtime_option
from envkit.cli.output import console, print_json
from envkit.errors import UserError
from envkit.extras import require

if TYPE_CHECKING:
    from rl_runner.metrics import StepMetrics


def _fmt(x: Any, spec: str = ".3g") -> str:
    if x is None:
        return "–"
    if isinstance(x, list):
        return "–".join(_fmt(v, spec) for v in x)
    return format(x, spec) if isinstance(x, float) else str(x)


def print_doctor(run_dir: Path) -> list[dict[str, Any]]:
    from rl_runner.doctor import run_checks

    checks = run_checks(run_dir)
    table = Table(title=f"envkit doctor {run_dir}")
    for col in ("check", "measured", "ok when", "status"):
        table.add_column(col)
    colour = {"ok": "green", "warn": "yellow", "fail": "red", "n/a": "dim"}
    for c in checks:
        table.add_row(c.name, c.measured, c.threshold, f"[{colour[c.status]}]{c.status}[/]")
    console.print(table)
    return [c.to_dict() for c in checks]


def print_summary(summary: dict[str, Any]) -> None:
    table = Table(title="run summary")
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows = [("steps", summary["steps"]), ("mode", summary["mode"]), ("reward: first step", summary["reward_first"]),
            ("reward: last step", summary["reward_last"]), ("reward: mean of last 5", summary["reward_last5_mean"]),
            ("TTB p50 / p90 (s)", f"{_fmt(summary['ttb_s_p50'])} / {_fmt(summary['ttb_s_p90'])}"),
            ("generated tokens/s, trajectories/s (mean over steps)",
             f"{_fmt(summary.get('generated_tokens_per_s_mean'))}, {_fmt(summary.get('trajectories_per_s_mean'))}"),
            ("publication p50 / max (s)", f"{_fmt(summary['publish_s_p50'])} / {_fmt(summary['publish_s_max'])}"),
            ("trajectory time p99 (worst step, s)", summary.get("trajectory_s_p99_max")),
            ("straggler wait share (mean)", summary.get("straggler_wait_share_mean")),
            ("inference idle share (mean)", summary.get("inference_idle_share_mean")),
            ("sandbox utilisation (mean)", summary.get("sandbox_utilisation_mean")),
            ("staleness KL p50 (range over steps)", summary["staleness_kl_p50_range"]),
            ("staleness KL max (range over steps)", summary["staleness_kl_max_range"]),
            ("max version lag", summary["version_lag_max"]), ("samples refused as stale", summary["rejected_stale"]),
            ("mismatch KL (range)", summary["mismatch_kl_range"]),
            ("mismatch max |Δ log-prob|", summary["mismatch_max_abs_range"]),
            ("infra failure rate", summary["infra_failure_rate"]),
            ("model failure rate", summary["model_failure_rate"])]
    before = summary.get("eval_before")
    if before and before.get("mean") is not None:
        rows.append((f"eval reward before training ({before['episodes']} episodes, 95% CI)",
                     f"{before['mean']:.3f} [{before['ci95'][0]:.3f}, {before['ci95'][1]:.3f}]"))
    ev = summary.get("eval")
    if ev and ev.get("mean") is not None:
        rows.append((f"eval reward ({ev['episodes']} episodes, 95% CI)",
                     f"{ev['mean']:.3f} [{ev['ci95'][0]:.3f}, {ev['ci95'][1]:.3f}]"))
    for k, v in rows:
        table.add_row(k, _fmt(v))
    console.print(table)


def train_command(
    recipe: Path = typer.Argument(..., help="Recipe YAML (e.g. rl_runner/recipes/shellcmd.yaml)."),
    overrides: list[str] = typer.Argument(None, help="key=value settings that replace the recipe's, "
                                          "e.g. steps=20 trainer.lr=3e-3."),
    resume: Path = typer.Option(None, "--resume", help="A checkpoint folder (RUN/checkpoints/step-N) to continue "
                                "from (the same as resume=PATH); refused when an environment resolves "
                                "differently than RUN/envkit-run.lock says."),
    sandbox_runtime: str = runtime_option(),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document at the end."),
) -> None:
    """Train a policy with RL on environments (GRPO; sync or async), then report and check it."""
    asked = requested_runtime(sandbox_runtime)
    require("train", "`envkit train`")
    require("cpu", "`envkit train`", "torch")  # vLLM: when a server starts (VLLMServer.start)
    from rl_runner.recipes.config import load_recipe
    from rl_runner.recipes.grpo import train
    from rl_runner.report import write_report

    r = load_recipe(recipe, [*(overrides or []), *([f"resume={resume}"] if resume is not None else [])])

    quiet: list[StepMetrics] = []  # the steps in a row without a learning signal, so far

    def on_step(m: StepMetrics) -> None:
        if as_json:
            return
        st = m.staleness
        tp = m.throughput
        console.print(f"step {m.step:>4}  reward {_fmt(m.reward.mean)}  TTB {m.ttb_s:.1f} s  "
                      f"{_fmt(tp.generated_tokens_per_s)} tok/s  {_fmt(tp.trajectories_per_s)} traj/s  "
                      f"train {_fmt(m.train.train_s)} s  publish {(m.publish.total_s or 0) * 1000:.0f} ms  "
                      f"staleness KL p90 {_fmt(st.kl.p90)} (lag {','.join(st.lag) or '-'}, refused {st.rejected})  "
                      f"mismatch KL {_fmt(m.mismatch.kl)}  infra {m.failures.infra or 0:.0%}")
        sig = m.signal
        if sig.groups is not None and not sig.groups_with_signal:
            quiet.append(m)
            from rl_runner.doctor import STALL_STEPS, signal_cause

            cause = signal_cause([x.reward.mean for x in quiet], [x.signal.valid_actions for x in quiet],
                                 [x.signal.entropy for x in quiet])
            console.print(f"[yellow]step {m.step}: no learning signal ({len(quiet)} step(s) in a row: every group's "
                          f"rewards equal, so no gradient; the doctor fails a run at {STALL_STEPS}). Likely cause: "
                          f"{cause}[/]")
        else:
            quiet.clear()

    run = train(r, on_step=on_step, say=(lambda _m: None) if as_json else console.print, sandbox_runtime=asked)
    summary = write_report(run.run_dir)
    if as_json:
        from rl_runner.doctor import run_checks

        print_json({"run_dir": str(run.run_dir), "summary": summary,
                    "doctor": [c.to_dict() for c in run_checks(run.run_dir)]})
        return
    print_summary(summary)
    print_doctor(run.run_dir)
    console.print(f"plots: {run.run_dir / 'plots'}  ·  metrics: {run.run_dir / 'metrics.jsonl'}  ·  "
                  f"TensorBoard: tensorboard --logdir {run.run_dir / 'tb'}")


def report_command(
    run_dir: Path = typer.Argument(..., help="A run folder written by `envkit train`."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Write PNG plots (reward, TTB, batch assembly, staleness KL, mismatch KL, failure rates) and print a \
summary table."""
    require("train", "`envkit report`", "matplotlib")
    from rl_runner.report import write_report

    summary = write_report(run_dir)
    if as_json:
        print_json(summary)
        return
    print_summary(summary)
    console.print(f"plots: {', '.join(summary['plots'])}")


def doctor_command(
    run_dir: Path = typer.Argument(..., help="A run folder written by `envkit train`."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The readiness checks before scaling (and whether the run could learn), measured from a run."""
    if as_json:
        from rl_runner.doctor import run_checks

        print_json([c.to_dict() for c in run_checks(run_dir)])
        return
    print_doctor(run_dir)


def eval_command(
    envs: list[str] = typer.Argument(..., help="Environment folders or ns/name@version refs."),
    model: Path = typer.Option(..., "--model", help="Model folder."),
    n: int = typer.Option(64, "-n", min=1, max=100_000, help="Episodes."),
    concurrency: int = typer.Option(8, "--concurrency", "-c", min=1, max=512),
    temperature: float = typer.Option(1.0, "--temperature", min=0.0, max=5.0),
    max_tokens: int = typer.Option(64, "--max-tokens", min=1, max=32768),
    seed: int = typer.Option(0, "--seed"),
    policy_url: str = typer.Option(None, "--policy-url", help="Use a running vLLM server instead of starting one."),
    tool_format: str = typer.Option("auto", "--tool-format", help="How the model writes tool calls: auto (by its "
                                    "chat template), envkit, hermes, llama3_json."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Mean reward with a 95% confidence interval (bootstrap), overall and per task."""
    require("train", "`envkit eval`", "transformers")
    from transformers import AutoTokenizer

    from envkit.catalog import resolve_environment
    from envkit.runtime import EnvRuntime
    from rl_runner.distributed.rollouts import open_rollouts
    from rl_runner.evaluate import evaluate
    from rl_runner.policy.client import SamplingParams
    from rl_runner.policy.service import PolicyService
    from rl_runner.rollout.chat import ChatFormat

    if not (model / "config.json").is_file():
        raise UserError(f"`{model}` is not a model folder (no config.json)", "create one with `envkit model tiny DIR`")
    fmt = ChatFormat(AutoTokenizer.from_pretrained(model), tool_format, model=str(model))  # bad: exit 2 now
    runtimes = [EnvRuntime(resolve_environment(e)) for e in envs]
    with PolicyService(model, urls=[policy_url] if policy_url else None) as policy:
        router = policy.start().router()
        rollouts: list[Any] = []
        try:
            for rt in runtimes:
                rollouts.append(open_rollouts(rt, router, setup=lambda: fmt, policy_ready=policy.ready()))
            result = evaluate([(r, list(r.runtime.env.tasks)) for r in rollouts],
                              sampling=SamplingParams(max_tokens=max_tokens, temperature=temperature,
                                                      stop_token_ids=fmt.stop_ids),
                              episodes=n, concurrency=concurrency, seed=seed)
        finally:
            for r in rollouts:
                r.close()
    if as_json:
        print_json(result)
        return
    table = Table(title=f"envkit eval: {result['scored']} scored episodes "
                        f"({result['excluded']} excluded as infra failures)")
    for col in ("task", "n", "mean reward", "95% CI"):
        table.add_column(col)
    for task, row in result["by_task"].items():
        table.add_row(task, str(row["n"]), f"{row['mean']:.3f}", f"[{row['ci95'][0]:.3f}, {row['ci95'][1]:.3f}]")
    if result["mean"] is not None:
        table.add_row("[bold]all[/]", str(result["scored"]), f"{result['mean']:.3f}",
                      f"[{result['ci95'][0]:.3f}, {result['ci95'][1]:.3f}] (±{result['half_width']:.3f})")
    console.print(table)
    if result.get("episodes_for_half_width_0.05"):
        console.print(f"about {result['episodes_for_half_width_0.05']} episodes give a 95% CI of ±0.05")


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    app.command("train", context_settings={"allow_extra_args": False})(train_command)
    app.command("report")(report_command)
    app.command("doctor")(doctor_command)
    app.command("eval")(eval_command)
