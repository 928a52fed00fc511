"""`envkit login`, `publish`, `pull`, `search`, the version verbs (`yank`, `unyank`,
`deprecate`) and `envkit token create|list|revoke`."""

from __future__ import annotations

import sys

import typer
from rich.table import Table

from envkit.catalog import resolve_environment
from envkit.cli.output import console, err_console, print_json
from envkit.client import Credentials, Registry, load_credentials, save_credentials
from envkit.errors import UserError
from envkit.refs import EnvRef, parse_env_ref

token_app = typer.Typer(no_args_is_help=True, help="Your API tokens on the registry: create, list, revoke.")


def _registry(url: str | None) -> Registry:
    creds = load_credentials()
    if url:
        token = creds.token if creds and creds.url == url.rstrip("/") else None
        return Registry(url, token)
    if creds is None:
        raise UserError("no registry is configured", "run `envkit login URL --token …` or set ENVKIT_REGISTRY_URL")
    return Registry(creds.url, creds.token)


def _exact(ref: str, verb: str) -> EnvRef:
    """``ns/name@version``: the version verbs act on one exact version, never on `latest`."""
    r = parse_env_ref(ref)
    if r.version is None:
        raise UserError(f"`{ref}` names no version; {verb} acts on one exact version",
                        f"give it as {r.full_name}@VERSION (`envkit search {r.name}` lists the newest)")
    return r


def _show_version(v: dict, as_json: bool) -> None:
    if as_json:
        print_json(v)
        return
    state = ["yanked" + (f" ({v['yank_reason']})" if v.get("yank_reason") else "")] if v["yanked"] else []
    if v["deprecated"]:
        state.append("deprecated" + (f", successor {v['successor']}" if v.get("successor") else ""))
    console.print(f"{v['ref']}: {'; '.join(state) or 'active'}")


def _show_token(t: dict) -> str:
    used = t.get("last_used_at") or "never"
    revoked = f"  revoked {t['revoked_at']}" if t.get("revoked_at") else ""
    return f"{t['id']}  {t['name'] or '-'}  namespaces {', '.join(t['namespaces'])}  last used {used}{revoked}"


registry_opt = typer.Option(None, "--registry", help="Registry URL (default: the one from `envkit login`).")


def yank(
    ref: str = typer.Argument(..., help="ns/name@version"),
    reason: str = typer.Option(..., "--reason", help="Why (shown to whoever pulls it by version)."),
    registry_url: str = registry_opt,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Hide a version from `latest` (it stays downloadable by its exact version)."""
    r = _exact(ref, "yank")
    with _registry(registry_url) as registry:
        _show_version(registry.api.yank(r.namespace, r.name, str(r.version), reason), as_json)


def unyank(
    ref: str = typer.Argument(..., help="ns/name@version"),
    registry_url: str = registry_opt,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Undo a yank: the version counts for `latest` again."""
    r = _exact(ref, "unyank")
    with _registry(registry_url) as registry:
        _show_version(registry.api.unyank(r.namespace, r.name, str(r.version)), as_json)


def deprecate(
    ref: str = typer.Argument(..., help="ns/name@version"),
    successor: str = typer.Option(None, "--successor", help="The version to use instead (ns/name@version)."),
    registry_url: str = registry_opt,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Mark a version deprecated (pulls and runs of it warn, naming the successor)."""
    r = _exact(ref, "deprecate")
    if successor is not None:
        _exact(successor, "--successor")
    with _registry(registry_url) as registry:
        _show_version(registry.api.deprecate(r.namespace, r.name, str(r.version), successor), as_json)


def token_create(
    namespace: list[str] = typer.Option(..., "--namespace", "-n", help="A namespace the token may publish to "
                                        "(repeatable; yours only)."),
    name: str = typer.Option("", "--name", help="A label to tell it apart in `envkit token list`."),
    registry_url: str = registry_opt,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """A new token for your user; its secret is printed once (stdout), store it now."""
    with _registry(registry_url) as registry:
        made = registry.api.create_token(name=name, namespaces=namespace)
    if as_json:
        print_json(made)
        return
    err_console.print(f"created {_show_token(made)} (the secret below is shown once)")
    print(made["token"])


def token_list(
    registry_url: str = registry_opt,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Your tokens (never their secrets)."""
    with _registry(registry_url) as registry:
        tokens = registry.api.list_tokens()
    if as_json:
        print_json(tokens)
        return
    table = Table(title=f"{len(tokens)} token(s)")
    for col in ("id", "name", "namespaces", "created", "last used", "revoked"):
        table.add_column(col)
    for t in tokens:
        table.add_row(t["id"], t["name"] or "-", ", ".join(t["namespaces"]), str(t.get("created_at") or "-"),
                      str(t.get("last_used_at") or "never"), str(t.get("revoked_at") or "-"))
    console.print(table)


def token_revoke(
    token_id: str = typer.Argument(..., help="The token's id (`envkit token list`)."),
    registry_url: str = registry_opt,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Revoke a token of yours: the registry refuses it from now on."""
    with _registry(registry_url) as registry:
        gone = registry.api.revoke_token(token_id)
    if as_json:
        print_json(gone)
        return
    console.print(f"revoked {_show_token(gone)}")


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
    console.print(f"  bundle_digest  {result.bundle_digest} (verified)\n"
                  f"  image_id       {result.image_id} ({result.source}, verified)")
    if result.yanked:
        err_console.print(f"warning: {result.ref} is yanked")
    if result.deprecated:
        err_console.print(f"warning: {result.ref} is deprecated"
                          + (f"; use {result.successor}" if result.successor else ""))


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
        table.add_row(e["full_name"], e["kind"], e["latest_version"] or "-", str(e["task_count"]),
                      e["description"][:60])
    console.print(table)


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    app.command("yank")(yank)
    app.command("unyank")(unyank)
    app.command("deprecate")(deprecate)
    token_app.command("create")(token_create)
    token_app.command("list")(token_list)
    token_app.command("revoke")(token_revoke)
    app.command("login")(login)
    app.command("publish")(publish)
    app.command("pull")(pull)
    app.command("search")(search)
