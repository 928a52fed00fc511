"""`envkit login`, `envkit publish`, `envkit pull`, `envkit search`."""

from __future__ import annotations

import sys

import typer
from rich.table import Table

from envkit.catalog import resolve_environment
from envkit.cli.output import console, err_console, print_json
from envkit.client import Credentials, Registry, load_credentials, save_credentials
from envkit.errors import UserError


def _registry(url: str | None) -> Registry:
    creds = load_credentials()
    if url:
        token = creds.token if creds and creds.url == url.rstrip("/") else None
        return Registry(url, token)
    if creds is None:
        raise UserError("no registry is configured", "run `envkit login URL --token …` or set ENVKIT_REGISTRY_URL")
    return Registry(creds.url, creds.token)


def register(app: typer.Typer) -> None:
    @app.command("login")
    def login(
        url: str = typer.Argument(..., help="Registry URL, e.g. http://127.0.0.1:8700"),
        token: str = typer.Option(None, "--token", help="API token (ekt_…); '-' reads it from stdin."),
    ) -> None:
        """Store the registry URL and token (checked against the registry) for later commands."""
        if token == "-":
            token = sys.stdin.readline().strip()
        elif token is None:
            token = typer.prompt("token", hide_input=True)
        url = url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise UserError(f"`{url}` is not a URL", "give it with its scheme, e.g. http://127.0.0.1:8700")
        with Registry(url, token) as registry:
            tokens = registry.api.list_tokens()  # fails with 401 for a bad token
        path = save_credentials(Credentials(url=url, token=token))
        mine = next((t for t in tokens if token.startswith(f"ekt_{t['id']}_")), None)
        scope = ", ".join(mine["namespaces"]) if mine else "?"
        console.print(f"logged in to {url} as {mine['user'] if mine else '?'} (namespaces: {scope}); saved to {path}")

    @app.command("publish")
    def publish(
        env: str = typer.Argument(..., help="Environment folder."),
        registry_url: str = typer.Option(None, "--registry", help="Registry URL (default: the one from `envkit login`)."),
        oci: str = typer.Option(None, "--oci", help="Also push the image to this OCI registry (HOST:PORT)."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Build and publish an environment version (immutable; re-publishing the same content is a no-op)."""
        from envkit.distribution import publish as do_publish

        loaded = resolve_environment(env)
        with _registry(registry_url) as registry:
            result = do_publish(loaded, registry=registry, oci=oci)
        if as_json:
            print_json(result.to_dict())
            return
        verb = "published" if result.created else "already published (identical)"
        console.print(f"{verb} {result.ref} to {result.registry}")
        console.print(f"  bundle_digest  {result.bundle_digest}\n  image_id       {result.image_id}")
        if result.oci_ref:
            console.print(f"  oci_ref        {result.oci_ref}")

    @app.command("pull")
    def pull(
        ref: str = typer.Argument(..., help="ns/name[@version] (default: newest not yanked)."),
        registry_url: str = typer.Option(None, "--registry", help="Registry URL (default: the one from `envkit login`)."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Download and verify a version, then rebuild (or fetch) its image and check its ID."""
        from envkit.distribution import pull as do_pull

        with _registry(registry_url) as registry:
            result = do_pull(ref, registry=registry)
        if as_json:
            print_json(result.to_dict())
            return
        console.print(f"pulled {result.ref} into {result.folder}")
        console.print(f"  bundle_digest  {result.bundle_digest} (verified)\n  image_id       {result.image_id} ({result.source}, verified)")
        if result.yanked:
            err_console.print(f"warning: {result.ref} is yanked")
        if result.deprecated:
            err_console.print(f"warning: {result.ref} is deprecated" + (f"; use {result.successor}" if result.successor else ""))

    @app.command("search")
    def search(
        query: str = typer.Argument("", help="Text to look for in namespace, name and description."),
        kind: str = typer.Option(None, "--kind", help="repo | api | website"),
        page: int = typer.Option(1, "--page", min=1),
        registry_url: str = typer.Option(None, "--registry", help="Registry URL (default: the one from `envkit login`)."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Search the registry's environments."""
        with _registry(registry_url) as registry:
            rows, count = registry.environments.list(query, kind=kind, page=page)
        if as_json:
            print_json({"data": rows, "count": count})
            return
        table = Table(title=f"{count} environment(s)" + (f" matching '{query}'" if query else ""))
        for col in ("environment", "kind", "latest", "tasks", "description"):
            table.add_column(col)
        for e in rows:
            table.add_row(e["full_name"], e["kind"], e["latest_version"] or "-", str(e["task_count"]), e["description"][:60])
        console.print(table)
