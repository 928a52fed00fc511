"""`envkit run` and `envkit validate`."""

from __future__ import annotations

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from envkit.agents import parse_agent, run_episode
from envkit.catalog import resolve_environment
from envkit.cli.options import requested_runtime, runtime_option
from envkit.cli.output import console, print_json
from envkit.client import Registry
from envkit.errors import FailureCategory, parse_outcome
from envkit.probes import probe_set
from envkit.runtime import EnvRuntime, EpisodeResult
from envkit.validate import ValidationReport
from envkit.validate import validate as run_validation

_TRACE_LINES = 40


def _indent(text: str) -> str:
    lines = text.rstrip("\n").splitlines()
    if len(lines) > _TRACE_LINES:
        lines = (lines[: _TRACE_LINES // 2] + [f"[... {len(lines) - _TRACE_LINES} lines ...]"]
                 + lines[-_TRACE_LINES // 2:])
    return "\n".join("    " + line for line in lines)


def _print_trace(result: EpisodeResult) -> None:
    console.print(f"[bold]{result.env}[/]  task [bold]{result.task_id}[/]  seed {result.seed}  agent {result.agent}")
    console.print(f"  image {result.image_id}\n  state {result.state_hash or '-'}")
    for step in result.steps:
        flag = f", {step.limit_hit}" if step.limit_hit else ""
        code = f"HTTP {step.exit_code}" if step.command.startswith("http ") else f"exit {step.exit_code}"
        console.print(f"[cyan]$ {step.command}[/]   [dim]({code}, {step.duration_s:.2f} s{flag})[/]",
                      markup=True, soft_wrap=True)
        for text in (step.stdout, step.stderr):
            if text.strip():
                console.print(_indent(text), markup=False, soft_wrap=True)
    if result.verifier:
        shown = {k: v for k, v in result.verifier.items() if k != "reward"}
        console.print(f"verifier: {shown}", markup=False)
    reward = "-" if result.reward is None else f"{result.reward:g}"
    category = parse_outcome(result.outcome).category
    color = "green" if category is FailureCategory.OK else ("yellow" if category is FailureCategory.MODEL else "red")
    console.print(f"[bold]reward {reward}[/]  outcome [{color}]{result.outcome}[/]")
    if result.outcome != "ok" and result.evidence:
        console.print(f"  evidence: {result.evidence}", markup=False, soft_wrap=True)


def run(
    env: str = typer.Argument(..., help="Environment folder or ns/name@version."),
    task: str = typer.Option(..., "--task", "-t", help="Task id."),
    agent: str = typer.Option("oracle", "--agent", "-a", help="oracle | null | shell:COMMAND"),
    seed: int = typer.Option(0, "--seed", help="Reset seed."),
    sandbox_runtime: str = runtime_option(),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Run one episode and print its trace and reward."""
    asked = requested_runtime(sandbox_runtime)
    loaded = resolve_environment(env)
    chosen_task = loaded.task(task)
    chosen_agent = parse_agent(agent)
    runtime = EnvRuntime(loaded, sandbox_runtime=asked)
    result = run_episode(runtime, chosen_task, seed, chosen_agent)
    if as_json:
        print_json(result.to_dict())
    else:
        _print_trace(result)
    if parse_outcome(result.outcome).retryable:
        raise typer.Exit(1)


def validate(
    env: str = typer.Argument(..., help="Environment folder or ns/name@version."),
    seed: int = typer.Option(0, "--seed", help="Reset seed for every episode."),
    jobs: int = typer.Option(2, "--jobs", "-j", min=1, max=32, help="Tasks checked at once."),
    probes: str = typer.Option("quick", "--probes", help="Hack probes played on every task: none | quick | all."),
    tasks: list[str] = typer.Option(None, "--task", "-t", help="Check only this task (repeatable)."),
    sample: int = typer.Option(None, "--sample", min=1, help="Check N tasks drawn at random (seeded by --seed)."),
    send_report: bool = typer.Option(False, "--report", help="Send this run's health figures to the registry "
                                     "(`envkit login`)."),
    sandbox_runtime: str = runtime_option(),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Oracle must reach 1.0, null stay 0.0 and no hack probe beat any task; resets must be deterministic."""
    asked = requested_runtime(sandbox_runtime)
    probe_set(probes)  # a wrong set name is refused before anything starts
    loaded = resolve_environment(env)
    for t in tasks or []:
        loaded.task(t)
    runtime = EnvRuntime(loaded, sandbox_runtime=asked)
    registry = Registry() if send_report else None  # fail early when no registry is configured
    if as_json:
        report = run_validation(runtime, seed=seed, jobs=jobs, probes=probes, tasks=tasks, sample=sample)
        print_json(report.to_dict())
    else:
        columns = (TextColumn("validating {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True) as progress:
            bar = progress.add_task(loaded.ref, total=min(len(tasks or loaded.tasks), sample or 10**9))
            report = run_validation(runtime, seed=seed, jobs=jobs, probes=probes, tasks=tasks, sample=sample,
                                    progress=lambda _c: progress.advance(bar))
        _print_validation(report, runtime)
    if registry is not None:
        ns, name = loaded.spec.environment.name.split("/")
        with registry:
            summary = registry.api.report_health(ns, name, loaded.spec.environment.version, report.health_figures())
        if not as_json:
            console.print(f"reported to {registry.url}: {summary['episodes']} episodes over "
                          f"{summary['reports']} report(s)")
    if not report.ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    app.command("run")(run)
    app.command("validate")(validate)


def _print_validation(report: ValidationReport, runtime: EnvRuntime) -> None:
    table = Table(title=f"{report.env}  image {report.image_id[:19]}…  runtime {report.runtime}")
    for col in ("task", "difficulty", "oracle", "null", "probes", "time", "status"):
        table.add_column(col)
    for t in report.tasks:
        status = "[green]ok[/]" if t.ok else "[red]FAIL[/] " + "; ".join(t.problems)
        held = f"{len(t.probes) - len(t.beaten_by)}/{len(t.probes)} held" if report.probes_run else "-"
        table.add_row(t.task_id, t.difficulty, f"{t.oracle_reward}", f"{t.null_reward}", held, f"{t.seconds:.1f} s",
                      status)
    console.print(table)
    if report.probe_set != "none":
        ptable = Table(title=f"hack probes ({report.probe_set})")
        for col in ("probe", "result"):
            ptable.add_column(col)
        beaten = report.beaten()
        for name in report.probes_run:
            row = (f"[red]beat {', '.join(beaten[name])}[/]" if name in beaten
                   else f"[green]held on {len(report.tasks)} task(s)[/]")
            ptable.add_row(name, row)
        for name, why in report.probes_skipped.items():
            ptable.add_row(name, f"[yellow]skipped[/]: {why}")
        console.print(ptable)
    det = report.determinism
    mark = "[green]ok[/]" if det.get("ok") else "[red]FAIL[/]"
    console.print(f"determinism (seed {det.get('seed')}, two fresh sandboxes): {mark} "
                  f"{', '.join(h[:19] for h in det.get('hashes', []))} {det.get('error', '')}")
    if not report.reproducible:
        console.print(f"image: [yellow]not reproducible[/] ({len(runtime.build.task_images)} task images built from "
                      "Dockerfiles; their IDs are recorded in envkit.lock, `envkit build --check-recorded` compares "
                      "a rebuild)")
    n_ok = sum(t.ok for t in report.tasks)
    console.print(f"[bold]{'PASS' if report.ok else 'FAIL'}[/]: {n_ok}/{len(report.tasks)} tasks, "
                  f"{report.seconds:.1f} s")
