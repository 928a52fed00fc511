"""Health reports: runs report per-version figures; the registry aggregates them."""

from __future__ import annotations

from fastapi import APIRouter

from registry_server import crud
from registry_server.deps import CurrentToken, SessionDep, SettingsDep
from registry_server.routes.params import Name, Namespace, VersionParam
from registry_server.schemas import HealthCreate, HealthSummary, error_responses

router = APIRouter(prefix="/environments", tags=["health"], responses=error_responses(429))


@router.post("/{namespace}/{name}/versions/{version}/health", response_model=HealthSummary, status_code=201)
def report_health(session: SessionDep, settings: SettingsDep, token: CurrentToken, namespace: Namespace, name: Name,
                  version: VersionParam, body: HealthCreate) -> HealthSummary:
    """Add one run's figures; returns the new aggregate. Any valid token may report; each
    report records the token, whether it is one of the namespace's own (the pages show those
    apart) and the run it names. A token may send a bounded number of reports per version per
    hour (`health_reports_per_hour`); past it, 429."""
    row = crud.get_version(session, namespace=namespace, name=name, version=version)
    crud.add_health(session, version=row, token=token, figures=body.model_dump(),
                    per_hour=settings.health_reports_per_hour)
    return crud.health_summary(row)
