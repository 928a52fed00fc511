"""Health reports: runs report per-version figures; the registry aggregates them."""

from __future__ import annotations

from fastapi import APIRouter

from registry_server import crud
from registry_server.deps import CurrentToken, SessionDep
from registry_server.routes.params import Name, Namespace, VersionParam
from registry_server.schemas import HealthCreate, HealthSummary

router = APIRouter(prefix="/environments", tags=["health"])


@router.post("/{namespace}/{name}/versions/{version}/health", response_model=HealthSummary, status_code=201)
def report_health(session: SessionDep, token: CurrentToken, namespace: Namespace, name: Name, version: VersionParam,
                  body: HealthCreate) -> HealthSummary:
    """Add one run's figures (any valid token may report); returns the new aggregate."""
    row = crud.get_version(session, namespace=namespace, name=name, version=version)
    crud.add_health(session, version=row, reporter=token.user, figures=body.model_dump())
    return crud.health_summary(row)
