"""`envkit init DIR --kind repo`."""

from __future__ import annotations

from pathlib import Path

import typer

from envkit.cli.output import console, print_json
from envkit.scaffold import init_environment


def init(
    folder: Path = typer.Argument(..., help="New (or empty) folder for the environment."),
    kind: str = typer.Option("repo", "--kind", help="Environment kind: repo."),
    name: str = typer.Option(None, "--name", help="namespace/name (default: local/<folder name>)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Scaffold an environment that builds and validates as is."""
    written = init_environment(folder, kind=kind, name=name)
    if as_json:
        print_json({"folder": str(folder), "files": [str(p) for p in written]})
        return
    console.print(f"created {folder} ({len(written)} files). Next:")
    console.print(f"  envkit build {folder}\n  envkit validate {folder}")


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    app.command("init")(init)
