"""`envkit build DIR` and `envkit base build`."""

from __future__ import annotations

import typer

from envkit.base_image import build_base, recipe_digest
from envkit.catalog import resolve_environment
from envkit.cli.output import console, print_json
from envkit.kinds import build as build_image

base_app = typer.Typer(no_args_is_help=True, help="The envkit base image (built locally from Debian packages).")


def build(
    env: str = typer.Argument(..., help="Environment folder (or ns/name@version of a local one)."),
    check_recorded: bool = typer.Option(False, "--check-recorded",
                                        help="Container environments: fail if a rebuilt task image differs "
                                        "from envkit.lock's."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Bundle an environment and assemble its image; write envkit.lock."""
    loaded = resolve_environment(env)
    result = build_image(loaded, check_recorded=check_recorded)
    if as_json:
        print_json(result.to_dict())
        return
    console.print(f"[bold]{result.env}[/]  {'(cached) ' if result.cached else ''}{result.seconds:.2f} s")
    console.print(f"  bundle_digest  {result.bundle_digest}  ({result.bundle_size} bytes)")
    console.print(f"  base_image     {result.base_image}")
    console.print(f"  image_id       {result.image_id}")
    console.print(f"  tag            {result.tag}")
    console.print(f"  lock           {result.lock_file}")
    if not result.reproducible:
        console.print(f"  [yellow]not reproducible[/]: {len(result.task_images)} task image(s) built from Dockerfiles, "
                      "IDs recorded in the lock" + (" and equal to the recorded ones" if check_recorded else ""))
        for task, image in sorted(result.task_images.items()):
            console.print(f"    {task:<24} {image}")


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    app.command("build")(build)


@base_app.command("build")
def base_build(
    force: bool = typer.Option(False, "--force", help="Rebuild even if the image exists."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Build the base image with mmdebstrap (reproducible: same packages, same ID)."""
    if not as_json:
        console.print(f"base recipe {recipe_digest()[:12]}: building if missing (about 30 s)…")
    base, built = build_base(force=force)
    if as_json:
        print_json({"image_id": base.id, "ref": base.ref, "tag": base.tag, "built": built, "recipe": base.recipe})
        return
    console.print(f"{'built' if built else 'found'} {base.tag}\n  image_id  {base.id}")
