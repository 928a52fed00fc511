"""`envkit registry serve | admin create-user | gc`: running the registry server."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from envkit.cli.output import console, print_json
from envkit.errors import UserError
from envkit.extras import require

if TYPE_CHECKING:  # the server is an extra: imported by the commands, after `require`
    from registry_server.settings import Settings

registry_app = typer.Typer(no_args_is_help=True, help="Run the envkit registry server (SQLite by default).")
admin_app = typer.Typer(no_args_is_help=True, help="Operator tasks on the registry's database.")
registry_app.add_typer(admin_app, name="admin")

DB_HELP = "Database URL (default: SQLite in ./envkit-registry; postgresql://… in production)."


def _settings(db: str | None, storage: Path | None, what: str) -> Settings:
    require("server", what)
    from pydantic import ValidationError

    from registry_server.settings import Settings

    try:
        return Settings.from_env(database_url=db, storage_dir=storage)
    except ValidationError as e:
        raise UserError(f"registry settings: {e.errors()[0]['msg']}",
                        "fix the ENVKIT_REGISTRY_* variables or options") from None


@registry_app.command("serve")
def serve(
    db: str = typer.Option(None, "--db", help=DB_HELP),
    storage: Path = typer.Option(None, "--storage", help="Blob folder (default ./envkit-registry/blobs)."),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8700, "--port", min=1, max=65535),
) -> None:
    """Run the registry (API under /api/v1, pages at /), migrating the database first."""
    settings = _settings(db, storage, "`envkit registry serve`")
    import uvicorn
    from sqlalchemy.exc import OperationalError

    from registry_server.app import create_app

    try:
        app = create_app(settings)
    except OperationalError as e:
        raise UserError(f"cannot open the registry database: {str(e.orig)[:200]}",
                        "check --db (the URL and that the server runs)") from None
    console.print(f"envkit registry on http://{host}:{port}  (API /api/v1, docs /docs)")
    uvicorn.run(app, host=host, port=port, log_level="warning")


@admin_app.command("create-user")
def create_user(
    name: str = typer.Argument(..., help="User name."),
    namespace: list[str] = typer.Option(..., "--namespace", "-n", help="Namespace the user owns (repeatable)."),
    admin: bool = typer.Option(False, "--admin"),
    db: str = typer.Option(None, "--db", help=DB_HELP),
    storage: Path = typer.Option(None, "--storage"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Create a user and its namespaces; prints a token (shown once: store it)."""
    settings = _settings(db, storage, "`envkit registry admin`")
    from registry_server import admin as ops
    from registry_server.errors import RegistryError

    try:
        token = ops.create_user(settings, name=name, namespaces=namespace, admin=admin)
    except RegistryError as e:
        raise UserError(e.message, e.hint) from None
    if as_json:
        print_json({"user": name, "namespaces": namespace, "token": token})
    else:
        console.print(f"user {name} owns {', '.join(namespace)}; token (shown once):\n{token}")


@registry_app.command("gc")
def gc(
    grace_s: float = typer.Option(3600, "--grace-s", min=0, help="Only blobs older than this."),
    db: str = typer.Option(None, "--db", help=DB_HELP),
    storage: Path = typer.Option(None, "--storage"),
) -> None:
    """Delete stored blobs no version references (left by interrupted publishes)."""
    settings = _settings(db, storage, "`envkit registry gc`")
    from registry_server import admin as ops

    removed = ops.gc(settings, grace_s=grace_s)
    console.print(f"removed {len(removed)} orphan blob(s)")
