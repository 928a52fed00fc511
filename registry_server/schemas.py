"""API schemas, in families: <Noun>Public for reads, <Noun>Create for writes, paged lists."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

T = TypeVar("T")

# Free text never carries NUL (PostgreSQL refuses it in text columns).
NO_NUL = r"^[^\x00]*$"
Text = Annotated[str, Field(pattern=NO_NUL)]
NamespaceName = Annotated[str, Field(min_length=2, max_length=64, pattern=r"^[a-z0-9]+(?:[._-][a-z0-9]+)*$")]
FailureKind = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z0-9_.:-]+$")]
Count = Annotated[int, Field(ge=0, le=10_000_000)]


class Page(BaseModel, Generic[T]):
    data: list[T]
    count: int


ProbeName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z0-9-]+$")]
TaskId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


class ProbeFigures(BaseModel):
    """What `envkit validate --probes` found: the probes that beat a task (and which tasks),
    the ones that did not apply (and why), over how many tasks and probe episodes."""

    model_config = ConfigDict(extra="forbid")
    set: Literal["quick", "all"]
    tasks: Count
    episodes: Count
    beaten: dict[ProbeName, list[TaskId]] = Field(default_factory=dict, max_length=100)
    skipped: dict[ProbeName, Annotated[str, Field(max_length=300, pattern=NO_NUL)]] = Field(default_factory=dict, max_length=100)


class ProbeSummary(ProbeFigures):
    reported_at: dt.datetime


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
    created_at: dt.datetime
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
    updated_at: dt.datetime


class EnvironmentDetail(EnvironmentPublic):
    versions: list[VersionPublic]


class PublishResult(BaseModel):
    created: bool
    version: VersionPublic


class YankCreate(BaseModel):
    reason: Text = Field(min_length=1, max_length=2000)


class DeprecateCreate(BaseModel):
    successor: Text | None = Field(default=None, max_length=200, description="ns/name@version to use instead")


class TokenCreate(BaseModel):
    name: Text = Field(default="", max_length=128)
    namespaces: list[NamespaceName] = Field(min_length=1, max_length=100)


class TokenPublic(BaseModel):
    id: str
    name: str
    user: str
    namespaces: list[str]
    created_at: dt.datetime
    revoked_at: dt.datetime | None
    last_used_at: dt.datetime | None


class TokenCreated(TokenPublic):
    token: str = Field(description="shown once; store it now")


class HealthCreate(BaseModel):
    episodes: int = Field(ge=1, le=10_000_000)
    infra_failures: dict[FailureKind, Count] = Field(default_factory=dict, max_length=100)
    model_failures: Count = 0
    verifier_failures: Count = 0
    run: str | None = Field(default=None, max_length=200, pattern=r"^[\x20-\x7e]*$",
                            description="the run the figures come from, as the reporter names it")
    oracle_pass_rate: float | None = Field(default=None, ge=0, le=1)
    p50_episode_s: float | None = Field(default=None, ge=0, le=1e7)
    p95_episode_s: float | None = Field(default=None, ge=0, le=1e7)
    probes: ProbeFigures | None = None
