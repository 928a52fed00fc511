"""`envkit import harbor` and `envkit export harbor`."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from envkit.catalog import resolve_environment
from envkit.cli.output import console, print_json
from envkit.harbor import export_harbor, import_harbor, parse_base_map

import_app = typer.Typer(no_args_is_help=True, help="Bring tasks from other formats into envkit.")
export_app = typer.Typer(no_args_is_help=True, help="Write envkit environments in other formats.")


@import_app.command("harbor")
def import_harbor_cmd(
    dirs: list[Path] = typer.Argument(..., help="Harbor task folders (each with task.toml), or folders of them."),
    out: Path = typer.Option(..., "--out", "-o", help="The environment folder to write (new or empty)."),
    name: str = typer.Option("harbor/imported", "--name", help="The environment's namespace/name."),
    version: str = typer.Option("1.0.0", "--version", help="The environment's version."),
    base_map: list[str] = typer.Option([], "--base-map", help="FROM=LOCAL: build FROM the local image LOCAL where a "
                                                                 "Dockerfile names FROM (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Turn Harbor / Terminal-Bench task folders into one envkit container environment."""
    report = import_harbor(list(dirs), out, name=name, version=version, base_map=parse_base_map(base_map))
    if as_json:
        print_json(report.to_dict())
        return
    table = Table(title=f"{report.env} → {report.out}")
    for col in ("task", "image", "agent s", "verifier s", "cpus", "memory", "network", "not supported"):
        table.add_column(col)
    for t in report.tasks:
        m = t.mapped
        table.add_row(t.id, t.image, f"{m.get('agent_timeout_s', 600):g}", f"{m.get('verifier_timeout_s', 120):g}",
                      str(m.get("cpus", "-")), str(m.get("memory_mb", "-")), str(m.get("network", "none")),
                      "; ".join(t.unsupported) or "-")
    console.print(table)
    console.print("network: a task without allow_internet = true runs with no network (Harbor's default allows it)")
    console.print(f"{len(report.tasks)} task(s) imported; report in {out}/harbor-import.json. "
                  f"Next: envkit build {out} && envkit validate {out}")


@export_app.command("harbor")
def export_harbor_cmd(
    env: str = typer.Argument(..., help="Environment folder or ns/name@version (a container environment)."),
    out: Path = typer.Option(..., "--out", "-o", help="The folder to write the task folders into (new or empty)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Write a container environment's tasks as Harbor task folders."""
    loaded = resolve_environment(env)
    written = export_harbor(loaded, out)
    if as_json:
        print_json({"env": loaded.ref, "out": str(out), "tasks": written})
        return
    console.print(f"wrote {len(written)} Harbor task folder(s) to {out}: {', '.join(written)}")
