"""`envkit synth SOURCE --out DIR`: a real Python project in, a repo environment of
validated bug-fixing tasks out (envkit.synth)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from envkit.cli.output import console, print_json


def synth(
    source: str = typer.Argument(..., help="pypi:NAME==VERSION (its sdist), a project folder, or git:PATH@COMMIT."),
    out: Path = typer.Option(..., "--out", "-o", help="New folder for the environment (never overwritten)."),
    max_tasks: int = typer.Option(40, "--max-tasks", min=1, help="At most this many tasks."),
    seed: int = typer.Option(0, "--seed", help="Seeds the choice of bugs: the same seed gives the same tasks."),
    jobs: int = typer.Option(2, "--jobs", "-j", min=1, max=32, help="Sandboxes checking candidates at once."),
    writer: str = typer.Option(None, "--writer", help="OpenAI-compatible endpoint that rewrites task texts "
                                                     "(the template is kept when it fails), e.g. http://127.0.0.1:8000"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Turn a real Python project into a repo environment of bug-fixing tasks checked by its own tests."""
    from envkit.extras import require

    require("synth", "envkit synth", "libcst")
    from envkit.synth.pipeline import synth as run_synth

    if as_json:
        result = run_synth(source, out, max_tasks=max_tasks, seed=seed, jobs=jobs, writer=writer)
    else:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True) as progress:
            bars: dict[str, TaskID] = {}

            def report(stage: str, done: int, total: int) -> None:
                if stage not in bars:
                    bars[stage] = progress.add_task(stage, total=total)
                progress.update(bars[stage], completed=done, total=total)
            result = run_synth(source, out, max_tasks=max_tasks, seed=seed, jobs=jobs, writer=writer, progress=report)
    figures = {"out": str(result.out), "tasks": result.tasks, "tried": result.tried, "kept": result.kept,
               "seconds": result.seconds, "by_family": result.by_family, "dropped": result.drops,
               "baseline": result.baseline}
    if as_json:
        print_json(figures)
        return
    table = Table(title=f"{result.out}: {result.tasks} tasks ({result.kept} kept of {result.tried} tried, "
                        f"{result.seconds:.0f} s)")
    for col in ("family", "tried", "kept", "yield", "tasks"):
        table.add_column(col)
    for family, v in sorted(result.by_family.items()):
        table.add_row(family, str(v["tried"]), str(v["kept"]), f"{v['kept'] / v['tried']:.0%}" if v["tried"] else "-",
                      str(v["tasks"]))
    console.print(table)
    base = result.baseline
    console.print(f"baseline: {base['stable']} of {base['collected']} tests pass three runs "
                  f"({', '.join(f'{s:.1f}' for s in base['runs_s'])} s); drops: "
                  + ", ".join(f"{n} {why}" for why, n in sorted(result.drops.items(), key=lambda kv: -kv[1])[:5]))
    console.print(f"next: envkit validate {result.out} --sample 20")


def register(app: typer.Typer) -> None:
    app.command("synth")(synth)
