"""Reading environments and versions; downloading bundles."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from registry_server import crud
from registry_server.deps import SessionDep, SettingsDep, StoreDep
from registry_server.errors import RegistryError
from registry_server.routes.params import NS_PATTERN, Name, Namespace, VersionOrLatest
from registry_server.schemas import EnvironmentDetail, EnvironmentPublic, Page, VersionDetail

router = APIRouter(prefix="/environments", tags=["environments"])


@router.get("", response_model=Page[EnvironmentPublic])
def list_environments(
    session: SessionDep, settings: SettingsDep,
    q: Annotated[str, Query(max_length=200, pattern=r"^[^\x00]*$",
                            description="search in namespace, name and description")] = "",
    kind: Annotated[Literal["repo", "api", "website", "container"] | None, Query()] = None,
    namespace: Annotated[str | None, Query(min_length=2, max_length=64, pattern=NS_PATTERN)] = None,
    has_health: Annotated[bool, Query(description="only environments with at least one health report")] = False,
    page: Annotated[int, Query(ge=1, le=100_000)] = 1,
    page_size: Annotated[int, Query(ge=1, le=1000)] = 20,
) -> Page[EnvironmentPublic]:
    size = min(page_size, settings.page_size_max)
    rows, count = crud.list_environments(session, q=q, kind=kind, namespace=namespace, has_health=has_health,
                                         offset=(page - 1) * size, limit=size)
    return Page[EnvironmentPublic](data=[crud.environment_public(e) for e in rows], count=count)


@router.get("/{namespace}/{name}", response_model=EnvironmentDetail)
def get_environment(session: SessionDep, namespace: Namespace, name: Name) -> EnvironmentDetail:
    detail = crud.environment_public(crud.get_environment(session, namespace=namespace, name=name), with_versions=True)
    assert isinstance(detail, EnvironmentDetail)
    return detail


@router.get("/{namespace}/{name}/versions/{version}", response_model=VersionDetail)
def get_version(session: SessionDep, namespace: Namespace, name: Name, version: VersionOrLatest) -> VersionDetail:
    detail = crud.version_public(crud.get_version(session, namespace=namespace, name=name, version=version),
                                 detail=True)
    assert isinstance(detail, VersionDetail)
    return detail


@router.get("/{namespace}/{name}/versions/{version}/bundle", response_class=StreamingResponse,
            responses={200: {"content": {"application/x-tar": {}}, "description": "the bundle (uncompressed tar)"}})
def download_bundle(session: SessionDep, store: StoreDep, namespace: Namespace, name: Name,
                    version: VersionOrLatest) -> StreamingResponse:
    row = crud.get_version(session, namespace=namespace, name=name, version=version)
    if not store.exists(row.bundle_digest):
        raise RegistryError(500, f"the bundle {row.bundle_digest} is missing from storage",
                            "tell the registry operator")
    headers = {"X-Envkit-Digest": row.bundle_digest, "Content-Length": str(row.size),
               "Content-Disposition": f'attachment; filename="{namespace}-{name}-{row.version}.tar"'}
    return StreamingResponse(store.open(row.bundle_digest), media_type="application/x-tar", headers=headers)
