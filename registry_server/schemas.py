"""API schemas, in families: <Noun>Public for reads, <Noun>Create for writes, paged lists."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from envkit.refs import SEGMENT, SEMVER_RE

T = TypeVar("T")

# Free text never carries NUL (PostgreSQL refuses it in text columns).
NO_NUL = r"^[^\x00]*$"
Text = Annotated[str, Field(pattern=NO_NUL)]
NamespaceName = Annotated[str, Field(min_length=2, max_length=64, pattern=r"^[a-z0-9]+(?:[._-][a-z0-9]+)*$")]
FAILURE_KIND = r"^[a-z0-9_.:-]+$"
FailureKind = Annotated[str, Field(min_length=1, max_length=64, pattern=FAILURE_KIND)]
Count = Annotated[int, Field(ge=0, le=10_000_000)]
# ns/name@version, as envkit.refs spells a segment and a semantic version (lengths are not checked here)
ENV_REF_AT_VERSION = rf"^{SEGMENT}/{SEGMENT}@" + SEMVER_RE.pattern[1:]


def _utc(value: dt.datetime) -> dt.datetime:
    """A time as RFC 3339 wants it: with its offset (SQLite gives stored times back naive, in UTC)."""
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


Timestamp = Annotated[dt.datetime, AfterValidator(_utc)]


def _keys(pattern: str, max_length: int) -> dict[str, Any]:
    """A dict field's key constraint, stated in the schema (Pydantic states it for values only)."""
    return {"propertyNames": {"minLength": 1, "maxLength": max_length, "pattern": pattern}}


class Page(BaseModel, Generic[T]):
    data: list[T]
    count: int


PROBE = r"^[a-z0-9-]+$"
ProbeName = Annotated[str, Field(min_length=1, max_length=64, pattern=PROBE)]
TaskId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


class ProbeFigures(BaseModel):
    """What `envkit validate --probes` found: the probes that beat a task (and which tasks),
    the ones that did not apply (and why), over how many tasks and probe episodes."""

    model_config = ConfigDict(extra="forbid")
    set: Literal["quick", "all"]
    tasks: Count
    episodes: Count
    beaten: dict[ProbeName, list[TaskId]] = Field(default_factory=dict, max_length=100,
                                                  json_schema_extra=_keys(PROBE, 64))
    skipped: dict[ProbeName, Annotated[str, Field(max_length=300, pattern=NO_NUL)]] = Field(
        default_factory=dict, max_length=100, json_schema_extra=_keys(PROBE, 64))


class ProbeSummary(ProbeFigures):
    reported_at: Timestamp


class HealthSummary(BaseModel):
    reports: int = 0
    episodes: int = 0
    infra_failures: dict[str, int] = Field(default_factory=dict)
    infra_failure_rate: float | None = None
    model_failures: int = 0
    model_failure_rate: float | None = None
    verifier_failures: int = 0
    verifier_failure_rate: float | None = None
    own_reports: int = Field(default=0, description="reports sent with a token of the environment's namespace")
    other_reports: int = Field(default=0, description="reports sent by anyone else's token")
    oracle_pass_rate: float | None = None
    p50_episode_s: float | None = None
    p95_episode_s: float | None = None
    probes: ProbeSummary | None = Field(default=None, description="the newest report's hack-probe results")


class VersionPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    ref: str
    version: str
    bundle_digest: str
    image_id: str
    base_image: str
    oci_ref: str | None
    size: int
    task_count: int
    kind: str
    reproducible: bool  # False: a container environment's images, built from Dockerfiles
    publisher: str
    created_at: Timestamp
    yanked: bool
    yank_reason: str | None
    deprecated: bool
    successor: str | None
    health: HealthSummary


class VersionDetail(VersionPublic):
    spec: dict[str, Any]


class EnvironmentPublic(BaseModel):
    namespace: str
    name: str
    full_name: str
    kind: str
    description: str
    latest_version: str | None
    version_count: int
    task_count: int
    updated_at: Timestamp


class EnvironmentDetail(EnvironmentPublic):
    versions: list[VersionPublic]


class PublishResult(BaseModel):
    created: bool
    version: VersionPublic


class YankCreate(BaseModel):
    reason: Text = Field(min_length=1, max_length=2000)


class DeprecateCreate(BaseModel):
    successor: str | None = Field(default=None, max_length=200, pattern=ENV_REF_AT_VERSION,
                                  description="ns/name@version to use instead")


class TokenCreate(BaseModel):
    name: Text = Field(default="", max_length=128)
    namespaces: list[NamespaceName] = Field(min_length=1, max_length=100)


class TokenPublic(BaseModel):
    id: str
    name: str
    user: str
    namespaces: list[str]
    created_at: Timestamp
    revoked_at: Timestamp | None
    last_used_at: Timestamp | None


class TokenCreated(TokenPublic):
    token: str = Field(description="shown once; store it now")


class HealthCreate(BaseModel):
    episodes: int = Field(ge=1, le=10_000_000)
    infra_failures: dict[FailureKind, Count] = Field(default_factory=dict, max_length=100,
                                                     json_schema_extra=_keys(FAILURE_KIND, 64))
    model_failures: Count = 0
    verifier_failures: Count = 0
    run: str | None = Field(default=None, max_length=200, pattern=r"^[\x20-\x7e]*$",
                            description="the run the figures come from, as the reporter names it")
    oracle_pass_rate: float | None = Field(default=None, ge=0, le=1)
    p50_episode_s: float | None = Field(default=None, ge=0, le=1e7)
    p95_episode_s: float | None = Field(default=None, ge=0, le=1e7)
    probes: ProbeFigures | None = None


class ErrorBody(BaseModel):
    code: str = Field(description="machine-readable: not_found, conflict, invalid, too_many_requests, …")
    message: str = Field(description="what went wrong")
    hint: str = Field(description="what to do about it")
    details: list[dict[str, Any]] | None = Field(default=None, description="per field, for invalid requests")


class ErrorEnvelope(BaseModel):
    """Every error the API answers has this shape."""

    error: ErrorBody


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for these error statuses, all in the one error shape."""
    what = {400: "the request cannot be read (e.g. a body that is not a bundle)",
            401: "no token, or a token that is not valid",
            403: "the token may not write to this namespace", 404: "no such environment, version or token",
            409: "the version exists with other content", 411: "no Content-Length", 413: "the body is over the limit",
            415: "the body's content type is not one the route takes", 422: "a field is invalid (details lists them)",
            429: "too many requests of this kind for this token", 500: "the registry failed"}
    return {str(c): {"model": ErrorEnvelope, "description": what[c]} for c in codes}
