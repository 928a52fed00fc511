"""HTML pages (Jinja2), rendered from the same CRUD layer as the API."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from registry_server import crud
from registry_server.deps import SessionDep
from registry_server.errors import RegistryError
from registry_server.routes.params import Name, Namespace

templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
router = APIRouter(include_in_schema=False)

PAGE_SIZE = 25


@router.get("/", response_class=HTMLResponse)
def index(request: Request, session: SessionDep, q: Annotated[str, Query(max_length=200, pattern=r"^[^\x00]*$")] = "",
          page: Annotated[int, Query(ge=1, le=100_000)] = 1) -> HTMLResponse:
    rows, count = crud.list_environments(session, q=q, offset=(page - 1) * PAGE_SIZE, limit=PAGE_SIZE)
    envs = [crud.environment_public(e) for e in rows]
    pages = max(1, -(-count // PAGE_SIZE))
    return templates.TemplateResponse(request, "index.html", {"envs": envs, "q": q, "count": count, "page": page, "pages": pages})


@router.get("/e/{namespace}/{name}", response_class=HTMLResponse)
def environment(request: Request, session: SessionDep, namespace: Namespace, name: Name) -> HTMLResponse:
    try:
        env = crud.environment_public(crud.get_environment(session, namespace=namespace, name=name), with_versions=True)
    except RegistryError as e:
        return templates.TemplateResponse(request, "missing.html", {"message": e.message, "hint": e.hint}, status_code=404)
    return templates.TemplateResponse(request, "environment.html", {"env": env})
