"""Publishing versions and changing their status (yank, unyank, deprecate)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from registry_server import crud
from registry_server.bundles import receive_bundle
from registry_server.db import begin_write
from registry_server.deps import CurrentToken, SessionDep, SettingsDep, StoreDep, require_namespace
from registry_server.errors import RegistryError
from registry_server.routes.params import Name, Namespace, VersionParam
from registry_server.schemas import DeprecateCreate, PublishResult, VersionPublic, YankCreate, error_responses

router = APIRouter(prefix="/environments", tags=["versions"], responses=error_responses(403, 409, 411, 413, 415))

DIGEST = r"^sha256:[0-9a-f]{64}$"


@router.put(
    "/{namespace}/{name}/versions/{version}", response_model=PublishResult, status_code=201,
    responses={200: {"model": PublishResult, "description": "identical re-publish (idempotent)"}, 409: {}, 413: {}},
    openapi_extra={"requestBody": {"required": True,
                                   "description": "the bundle tar from `envkit build`, optionally gzipped "
                                   "(detected by its magic bytes, whatever the Content-Type)",
                                   "content": {"application/octet-stream":
                                               {"schema": {"type": "string", "format": "binary"}}}}},
)
async def publish_version(
    request: Request, response: Response, session: SessionDep, settings: SettingsDep, store: StoreDep,
    token: CurrentToken, namespace: Namespace, name: Name, version: VersionParam,
    bundle_digest: Annotated[str, Query(pattern=DIGEST, description="sha256 of the uncompressed bundle")],
    image_id: Annotated[str, Query(pattern=DIGEST, description="the image ID `envkit build` gave")],
    base_image: Annotated[str, Query(max_length=200, pattern=r"^[^\s\x00]*$")] = "",
    oci_ref: Annotated[str | None, Query(max_length=300, pattern=r"^[^\s@]+@sha256:[0-9a-f]{64}$")] = None,
) -> PublishResult:
    """Upload a bundle (the body: tar, optionally gzipped) as a new immutable version. The
    server recomputes the digest; a mismatch is rejected and nothing is stored."""
    ns = require_namespace(token, namespace)
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > settings.max_upload_bytes:
        raise RegistryError(413, f"the upload is {length} bytes, over the limit of {settings.max_upload_bytes}",
                            "drop data the tasks do not need, or ask the operator to raise the limit")
    tmp_dir = getattr(store, "tmp_dir", settings.storage_dir / "tmp")
    received = await receive_bundle(request.stream(), tmp_dir=tmp_dir, max_upload=settings.max_upload_bytes,
                                    max_bundle=settings.max_bundle_bytes, max_entries=settings.max_bundle_entries)
    try:
        if received.digest != bundle_digest:
            raise RegistryError(400, f"the bundle's digest is {received.digest}, not {bundle_digest} as claimed",
                                "the upload was damaged or the bundle changed after `envkit build`: "
                                "build and publish again")

        def store_version() -> tuple[Any, bool]:
            begin_write(session)
            return crud.publish(session, namespace=ns, name=name, version=version, bundle=received,
                                image_id=image_id, base_image=base_image, oci_ref=oci_ref,
                                publisher=token.user, store=store)

        row, created = await run_in_threadpool(store_version)
    finally:
        received.discard()
    if not created:
        response.status_code = 200
    return PublishResult(created=created, version=crud.version_public(row))


@router.post("/{namespace}/{name}/versions/{version}/yank", response_model=VersionPublic)
def yank(session: SessionDep, token: CurrentToken, namespace: Namespace, name: Name, version: VersionParam,
         body: YankCreate) -> VersionPublic:
    """Hide a version from `latest` (it stays downloadable by its exact version)."""
    require_namespace(token, namespace)
    row = crud.get_version(session, namespace=namespace, name=name, version=version)
    return crud.version_public(crud.set_yanked(session, version=row, yanked=True, reason=body.reason))


@router.post("/{namespace}/{name}/versions/{version}/unyank", response_model=VersionPublic)
def unyank(session: SessionDep, token: CurrentToken, namespace: Namespace, name: Name,
           version: VersionParam) -> VersionPublic:
    require_namespace(token, namespace)
    row = crud.get_version(session, namespace=namespace, name=name, version=version)
    return crud.version_public(crud.set_yanked(session, version=row, yanked=False, reason=None))


@router.post("/{namespace}/{name}/versions/{version}/deprecate", response_model=VersionPublic)
def deprecate(session: SessionDep, token: CurrentToken, namespace: Namespace, name: Name, version: VersionParam,
              body: DeprecateCreate) -> VersionPublic:
    """Mark a version deprecated, naming its successor (ns/name@version)."""
    require_namespace(token, namespace)
    row = crud.get_version(session, namespace=namespace, name=name, version=version)
    return crud.version_public(crud.set_deprecated(session, version=row, successor=body.successor))
