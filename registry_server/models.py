"""Tables (SQLAlchemy 2 typed ORM). Every schema change is an Alembic migration."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy import false as sa_false
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

__all__ = ["Base", "Blob", "Environment", "HealthReport", "Namespace", "Token", "TokenScope", "User", "Version",
           "utcnow"]


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Base(DeclarativeBase):
    pass


class User(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Namespace(Base):
    __tablename__ = "namespaces"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    owner: Mapped[User] = relationship()


class Token(Base):
    """An API token. Only its sha256 is stored; the secret is shown once, at creation."""

    __tablename__ = "tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    public_id: Mapped[str] = mapped_column(String(32), unique=True)
    secret_hash: Mapped[str] = mapped_column(String(64))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    name: Mapped[str] = mapped_column(String(128), default="")
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    last_used_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    user: Mapped[User] = relationship()
    scopes: Mapped[list[TokenScope]] = relationship(cascade="all, delete-orphan", lazy="selectin")


class TokenScope(Base):
    __tablename__ = "token_scopes"
    token_id: Mapped[int] = mapped_column(ForeignKey("tokens.id", ondelete="CASCADE"), primary_key=True)
    namespace_id: Mapped[int] = mapped_column(ForeignKey("namespaces.id", ondelete="CASCADE"), primary_key=True)
    namespace: Mapped[Namespace] = relationship(lazy="selectin")


class Environment(Base):
    __tablename__ = "environments"
    __table_args__ = (UniqueConstraint("namespace_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    namespace_id: Mapped[int] = mapped_column(ForeignKey("namespaces.id"))
    name: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))
    description: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    namespace: Mapped[Namespace] = relationship(lazy="joined")
    versions: Mapped[list[Version]] = relationship(back_populates="environment", order_by="Version.id")


class Blob(Base):
    __tablename__ = "blobs"
    digest: Mapped[str] = mapped_column(String(71), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Version(Base):
    __tablename__ = "versions"
    __table_args__ = (UniqueConstraint("environment_id", "version"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    environment_id: Mapped[int] = mapped_column(ForeignKey("environments.id"))
    version: Mapped[str] = mapped_column(String(128))
    bundle_digest: Mapped[str] = mapped_column(ForeignKey("blobs.digest"))
    image_id: Mapped[str] = mapped_column(String(71))
    base_image: Mapped[str] = mapped_column(String(200), default="")
    oci_ref: Mapped[str | None] = mapped_column(String(300), nullable=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    task_count: Mapped[int] = mapped_column(Integer, default=0)
    size: Mapped[int] = mapped_column(BigInteger)
    publisher_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    yanked: Mapped[bool] = mapped_column(Boolean, default=False)
    yank_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    deprecated: Mapped[bool] = mapped_column(Boolean, default=False)
    successor: Mapped[str | None] = mapped_column(String(200), nullable=True)
    environment: Mapped[Environment] = relationship(back_populates="versions")
    publisher: Mapped[User] = relationship(lazy="joined")
    health: Mapped[list[HealthReport]] = relationship(back_populates="version", lazy="selectin")


class HealthReport(Base):
    """Figures one run reports for one version; the API and pages show their aggregate."""

    __tablename__ = "health_reports"
    __table_args__ = (Index("ix_health_reports_token_version_time", "token_id", "version_id", "created_at"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version_id: Mapped[int] = mapped_column(ForeignKey("versions.id", ondelete="CASCADE"), index=True)
    reporter_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    episodes: Mapped[int] = mapped_column(Integer)
    infra_failures: Mapped[dict[str, int]] = mapped_column(JSON, default=dict)
    model_failures: Mapped[int] = mapped_column(Integer, default=0)
    oracle_pass_rate: Mapped[float | None] = mapped_column(Float, nullable=True)
    p50_episode_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    p95_episode_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    probes: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # hack-probe results (validate --probes)
    verifier_failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    token_id: Mapped[str | None] = mapped_column(String(32), nullable=True)  # the reporting token's public id
    # the run it came from, as the reporter names it
    run: Mapped[str | None] = mapped_column(String(200), nullable=True)
    own: Mapped[bool] = mapped_column(Boolean, default=False, server_default=sa_false())  # a token of the namespace's
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    version: Mapped[Version] = relationship(back_populates="health")
    reporter: Mapped[User] = relationship()
