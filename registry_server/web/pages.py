"""HTML pages (Jinja2), rendered from the same CRUD layer as the API: the search page (`/`) and
an environment's page (`/e/NS/NAME`, one version at a time: `?version=`). No script runs on
them: every page carries a Content-Security-Policy that allows none and no remote resource."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from registry_server import crud
from registry_server.deps import SessionDep, StoreDep
from registry_server.errors import RegistryError
from registry_server.models import Version
from registry_server.routes.params import NS_PATTERN, SEMVER_PATTERN, Name, Namespace
from registry_server.web.present import bundle_view, health_chart, verifier_kind

templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
router = APIRouter(include_in_schema=False)

PAGE_SIZE = 25
TASKS_PAGE_SIZE = 50  # an environment's tasks (envkit synth makes hundreds)
FILES_SHOWN = 300
CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; form-action 'self'; base-uri 'none'; "
       "frame-ancestors 'none'")


def _page(request: Request, name: str, context: dict, status_code: int = 200) -> HTMLResponse:
    response = templates.TemplateResponse(request, name, context, status_code=status_code)
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


@router.get("/", response_class=HTMLResponse)
def index(request: Request, session: SessionDep, q: Annotated[str, Query(max_length=200, pattern=r"^[^\x00]*$")] = "",
          kind: Annotated[Literal["", "repo", "api", "website", "container"], Query()] = "",
          namespace: Annotated[str, Query(max_length=64, pattern=f"(^$)|({NS_PATTERN})")] = "",
          has_health: Annotated[bool, Query()] = False,
          page: Annotated[int, Query(ge=1, le=100_000)] = 1) -> HTMLResponse:
    rows, count = crud.list_environments(session, q=q, kind=kind or None, namespace=namespace or None,
                                         has_health=has_health, offset=(page - 1) * PAGE_SIZE, limit=PAGE_SIZE)
    envs = [crud.environment_public(e) for e in rows]
    pages = max(1, -(-count // PAGE_SIZE))
    query = {k: v for k, v in {"q": q, "kind": kind, "namespace": namespace,
                               "has_health": "true" if has_health else ""}.items() if v}
    return _page(request, "index.html", {"envs": envs, "q": q, "kind": kind, "namespace": namespace,
                                         "has_health": has_health, "namespaces": crud.namespace_names(session),
                                         "count": count, "page": page, "pages": pages, "query": query})


@router.get("/e/{namespace}/{name}", response_class=HTMLResponse)
def environment(request: Request, session: SessionDep, store: StoreDep, namespace: Namespace, name: Name,
                version: Annotated[str, Query(max_length=128, pattern=f"(^$)|({SEMVER_PATTERN})")] = "",
                task_q: Annotated[str, Query(max_length=200, pattern=r"^[^\x00]*$")] = "",
                task_page: Annotated[int, Query(ge=1, le=100_000)] = 1) -> HTMLResponse:
    try:
        row = crud.get_environment(session, namespace=namespace, name=name)
        env = crud.environment_public(row, with_versions=True)
        ordered = crud.sorted_versions(row)
        chosen: Version | None
        if version:
            chosen = crud.get_version(session, namespace=namespace, name=name, version=version)
        else:
            chosen = crud.latest(row) or (ordered[0] if ordered else None)
    except RegistryError as e:
        return _page(request, "missing.html", {"message": e.message, "hint": e.hint}, status_code=404)
    context: dict = {"env": env, "chosen": None}
    if chosen is not None:
        spec = chosen.spec or {}
        kind, trust = verifier_kind(spec)
        bundle = bundle_view(store, chosen.bundle_digest, chosen.size, spec)
        needle = task_q.strip().lower()
        matching = [t for t in bundle.tasks
                    if not needle or needle in t["id"].lower() or needle in t["instruction"].lower()]
        task_pages = max(1, -(-len(matching) // TASKS_PAGE_SIZE))
        page = min(task_page, task_pages)
        query = {k: v for k, v in {"version": version, "task_q": task_q}.items() if v}
        context.update(
            tasks=matching[(page - 1) * TASKS_PAGE_SIZE: page * TASKS_PAGE_SIZE], task_count=len(matching),
            task_q=task_q, task_page=page, task_pages=task_pages, task_query=query,
            files_shown=bundle.files[:FILES_SHOWN])
        context.update(
            chosen=crud.version_public(chosen), spec=spec,
            verifier={"kind": kind, "trust": trust, **(spec.get("verifier") or {})},
            bundle=bundle,
            chart=health_chart(crud.health_timeline(chosen)),
            own=crud.health_summary(chosen, own=True), others=crud.health_summary(chosen, own=False))
    return _page(request, "environment.html", context)
