"""Database operations. Every function is keyword-only after the session."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from envkit.refs import is_prerelease, semver_key
from registry_server import auth, faults
from registry_server.bundles import ReceivedBundle
from registry_server.db import begin_write
from registry_server.errors import RegistryError
from registry_server.models import Blob, Environment, HealthReport, Namespace, Token, TokenScope, User, Version, utcnow
from registry_server.schemas import (
    EnvironmentDetail,
    EnvironmentPublic,
    HealthSummary,
    ProbeSummary,
    TokenPublic,
    VersionDetail,
    VersionPublic,
)
from registry_server.storage import BlobStore


def _insert(session: Session, model: Any) -> Any:
    return (pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert)(model)


# -- users, namespaces, tokens -----------------------------------------------------------
def create_user(session: Session, *, name: str, namespaces: list[str], admin: bool = False) -> tuple[User, str]:
    """Create a user owning ``namespaces`` and a first token scoped to them."""
    if session.scalar(select(User).where(User.name == name)) is not None:
        raise RegistryError(409, f"user `{name}` exists", "choose another name")
    user = User(name=name, is_admin=admin)
    session.add(user)
    session.flush()
    for ns in namespaces:
        if session.scalar(select(Namespace).where(Namespace.name == ns)) is not None:
            raise RegistryError(409, f"namespace `{ns}` is taken", "choose another namespace")
        session.add(Namespace(name=ns, owner_id=user.id))
    session.flush()
    _, token = create_token(session, user=user, name="initial", namespaces=namespaces)
    return user, token


def create_token(session: Session, *, user: User, name: str, namespaces: list[str]) -> tuple[Token, str]:
    rows = session.scalars(select(Namespace).where(Namespace.name.in_(namespaces))).all()
    found = {ns.name: ns for ns in rows}
    for ns_name in namespaces:
        ns = found.get(ns_name)
        if ns is None:
            raise RegistryError(404, f"namespace `{ns_name}` does not exist", "ask the registry operator to create it")
        if ns.owner_id != user.id and not user.is_admin:
            raise RegistryError(403, f"you do not own namespace `{ns_name}`", "scope the token to namespaces you own")
    text, public_id, secret_hash = auth.new_token()
    token = Token(public_id=public_id, secret_hash=secret_hash, user_id=user.id, name=name)
    token.scopes = [TokenScope(namespace_id=found[n].id) for n in dict.fromkeys(namespaces)]
    session.add(token)
    session.flush()
    return token, text


def authenticate(session: Session, *, token: str) -> Token | None:
    parts = auth.split_token(token)
    if parts is None:
        return None
    public_id, secret = parts
    row = session.scalar(select(Token).where(Token.public_id == public_id))
    if row is None or row.revoked_at is not None or not auth.secret_matches(secret, row.secret_hash):
        return None
    return row


def touch_token(session: Session, *, token: Token, every_s: float = 60) -> None:
    """Record when a token was last used, at most once a minute (writes are not free)."""
    now = utcnow()
    if token.last_used_at is not None and (now - aware(token.last_used_at)).total_seconds() < every_s:
        return
    begin_write(session)  # a short write of its own
    token.last_used_at = now
    session.commit()


def token_namespaces(token: Token) -> list[str]:
    return sorted(s.namespace.name for s in token.scopes)


def token_public(token: Token) -> TokenPublic:
    return TokenPublic(id=token.public_id, name=token.name, user=token.user.name, namespaces=token_namespaces(token),
                       created_at=token.created_at, revoked_at=token.revoked_at, last_used_at=token.last_used_at)


def list_tokens(session: Session, *, user: User) -> list[Token]:
    return list(session.scalars(select(Token).where(Token.user_id == user.id).order_by(Token.id)))


def revoke_token(session: Session, *, user: User, public_id: str) -> Token:
    row = session.scalar(select(Token).where(Token.public_id == public_id))
    if row is None or (row.user_id != user.id and not user.is_admin):
        raise RegistryError(404, f"no token `{public_id}`", "list your tokens with GET /api/v1/tokens")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
    return row


# -- environments and versions -----------------------------------------------------------
def get_environment(session: Session, *, namespace: str, name: str) -> Environment:
    env = session.scalar(select(Environment).join(Namespace).where(Namespace.name == namespace,
                                                                   Environment.name == name))
    if env is None:
        raise RegistryError(404, f"Environment `{namespace}/{name}` doesn't exist",
                            "search with GET /api/v1/environments?q=… or `envkit search`")
    return env


def sorted_versions(env: Environment) -> list[Version]:
    return sorted(env.versions, key=lambda v: semver_key(v.version), reverse=True)


def latest(env: Environment) -> Version | None:
    """The newest release that is not yanked: a pre-release (``1.1.0-rc.1``) only by its exact
    version, never as ``latest``."""
    for v in sorted_versions(env):
        if not v.yanked and not is_prerelease(v.version):
            return v
    return None


def get_version(session: Session, *, namespace: str, name: str, version: str) -> Version:
    env = get_environment(session, namespace=namespace, name=name)
    if version == "latest":
        found = latest(env)
        if found is None:
            raise RegistryError(404, f"`{namespace}/{name}` has no release that is not yanked (pre-releases "
                                "count only when asked for by version)", "publish one, or name the version")
        return found
    for v in env.versions:
        if v.version == version:
            return v
    available = ", ".join(v.version for v in sorted_versions(env)[:10])
    raise RegistryError(404, f"`{namespace}/{name}` has no version {version}", f"available: {available or 'none'}")


def namespace_names(session: Session) -> list[str]:
    """Namespaces that hold at least one environment."""
    return list(session.scalars(select(Namespace.name).join(Environment).distinct().order_by(Namespace.name)))


def list_environments(session: Session, *, q: str = "", kind: str | None = None, offset: int = 0,
                      limit: int = 20, namespace: str | None = None,
                      has_health: bool = False) -> tuple[list[Environment], int]:
    stmt = select(Environment).join(Namespace)
    if namespace:
        stmt = stmt.where(Namespace.name == namespace)
    if has_health:
        stmt = stmt.where(select(HealthReport.id).join(Version)
                          .where(Version.environment_id == Environment.id).exists())
    if q:
        like = f"%{q.lower()}%"
        stmt = stmt.where(or_(func.lower(Environment.name).like(like), func.lower(Namespace.name).like(like),
                              func.lower(Environment.description).like(like)))
    if kind:
        stmt = stmt.where(Environment.kind == kind)
    count = session.scalar(select(func.count()).select_from(stmt.subquery())) or 0
    rows = session.scalars(stmt.order_by(Namespace.name, Environment.name).offset(offset).limit(limit)).all()
    return list(rows), int(count)


def publish(session: Session, *, namespace: Namespace, name: str, version: str, bundle: ReceivedBundle, image_id: str,
            base_image: str, oci_ref: str | None, publisher: User, store: BlobStore) -> tuple[Version, bool]:
    """Store a new immutable version. Same version + same content = idempotent success;
    same version + other content = 409. The blob reaches the store only once the version
    row is in place (just before commit), so a conflict leaves nothing behind."""
    spec_env = bundle.spec["environment"]
    if spec_env["name"] != f"{namespace.name}/{name}" or spec_env["version"] != version:
        raise RegistryError(422, f"the bundle is {spec_env['name']}@{spec_env['version']}, "
                                 f"not {namespace.name}/{name}@{version}",
                            "publish to the URL that matches envkit.toml's [environment] name and version")
    session.execute(_insert(session, Environment).values(
        namespace_id=namespace.id, name=name, kind=spec_env["kind"], description=spec_env.get("description", ""),
        created_at=utcnow(), updated_at=utcnow()).on_conflict_do_nothing())
    env = session.scalar(select(Environment).where(Environment.namespace_id == namespace.id, Environment.name == name))
    assert env is not None
    existing = session.scalar(select(Version).where(Version.environment_id == env.id, Version.version == version))
    if existing is not None:
        return _same_or_conflict(existing, bundle, image_id), False
    session.execute(_insert(session, Blob).values(digest=bundle.digest, size=bundle.size, created_at=utcnow())
                    .on_conflict_do_nothing())
    row = Version(environment_id=env.id, version=version, bundle_digest=bundle.digest, image_id=image_id,
                  base_image=base_image, oci_ref=oci_ref, spec=bundle.spec, task_count=bundle.task_count,
                  size=bundle.size, publisher_id=publisher.id)
    session.add(row)
    try:
        session.flush()
    except IntegrityError:
        session.rollback()  # a concurrent publish of the same version won the race
        winner = session.scalar(select(Version).join(Environment).where(
            Environment.namespace_id == namespace.id, Environment.name == name, Version.version == version))
        if winner is None:
            raise
        return _same_or_conflict(winner, bundle, image_id), False
    env.updated_at = utcnow()
    env.description = spec_env.get("description", env.description)
    store.put_file(bundle.digest, bundle.path)
    faults.point("publish.after_blob_write")
    session.commit()
    return row, True


def _same_or_conflict(existing: Version, bundle: ReceivedBundle, image_id: str) -> Version:
    if existing.bundle_digest == bundle.digest and existing.image_id == image_id:
        return existing
    raise RegistryError(
        409, f"version {existing.version} exists with other content "
             f"(bundle {existing.bundle_digest}, image {existing.image_id})",
        "published versions are immutable: bump the version in envkit.toml and publish again",
    )


def set_yanked(session: Session, *, version: Version, yanked: bool, reason: str | None) -> Version:
    version.yanked = yanked
    version.yank_reason = reason if yanked else None
    session.commit()
    return version


def set_deprecated(session: Session, *, version: Version, successor: str | None) -> Version:
    version.deprecated = True
    version.successor = successor
    session.commit()
    return version


def add_health(session: Session, *, version: Version, token: Token, figures: dict[str, Any],
               per_hour: int) -> HealthReport:
    """Record one run's figures, with who sent them: the token (and whether it is one of the
    environment's namespace) and the run it names. A token may send ``per_hour`` reports per
    version per hour; past that, 429."""
    since = utcnow() - dt.timedelta(hours=1)
    recent = session.scalar(select(func.count()).select_from(HealthReport).where(
        HealthReport.token_id == token.public_id, HealthReport.version_id == version.id,
        HealthReport.created_at >= since)) or 0
    if recent >= per_hour:
        raise RegistryError(429, f"this token has sent {recent} health reports for this version in the last hour "
                            f"(the limit is {per_hour})", "send fewer, aggregated reports (one per run), or try later")
    namespace = version.environment.namespace.name
    report = HealthReport(version_id=version.id, reporter_id=token.user.id, token_id=token.public_id,
                          own=namespace in token_namespaces(token), **figures)
    session.add(report)
    session.commit()
    session.refresh(version)
    return report


def health_timeline(version: Version) -> list[dict[str, Any]]:
    """Each report of a version, oldest first, as the page's chart plots it."""
    out = []
    for r in sorted(version.health, key=lambda r: (aware(r.created_at), r.id)):
        probes = r.probes or {}
        out.append({"at": aware(r.created_at), "episodes": r.episodes, "own": bool(r.own), "reporter": r.reporter.name,
                    "run": r.run or "", "infra_failure_rate": sum((r.infra_failures or {}).values()) / r.episodes,
                    "verifier_failure_rate": (r.verifier_failures or 0) / r.episodes,
                    "oracle_pass_rate": r.oracle_pass_rate,
                    "probes_beaten": len(probes.get("beaten") or {}) if r.probes else None})
    return out


def health_summary(version: Version, *, own: bool | None = None) -> HealthSummary:
    """The aggregate of a version's reports: all of them, or only those from the namespace's
    own tokens (``own=True``) or from anyone else's (``own=False``)."""
    everyone = version.health
    reports = [r for r in everyone if own is None or bool(r.own) == own]
    if not reports:
        return HealthSummary()
    episodes = sum(r.episodes for r in reports)
    infra: dict[str, int] = {}
    for r in reports:
        for kind, n in (r.infra_failures or {}).items():
            infra[kind] = infra.get(kind, 0) + int(n)
    model = sum(r.model_failures for r in reports)

    def weighted(attr: str) -> float | None:
        pairs = [(getattr(r, attr), r.episodes) for r in reports if getattr(r, attr) is not None]
        total = sum(w for _, w in pairs)
        return round(sum(v * w for v, w in pairs) / total, 4) if total else None

    probed = max((r for r in reports if r.probes), key=lambda r: r.id, default=None)  # the newest report with probes
    verifier = sum(r.verifier_failures or 0 for r in reports)
    return HealthSummary(
        reports=len(reports), episodes=episodes, infra_failures=infra,
        infra_failure_rate=round(sum(infra.values()) / episodes, 4), model_failures=model,
        model_failure_rate=round(model / episodes, 4), verifier_failures=verifier,
        verifier_failure_rate=round(verifier / episodes, 4), own_reports=sum(1 for r in everyone if r.own),
        other_reports=sum(1 for r in everyone if not r.own), oracle_pass_rate=weighted("oracle_pass_rate"),
        p50_episode_s=weighted("p50_episode_s"), p95_episode_s=weighted("p95_episode_s"),
        probes=ProbeSummary(**(probed.probes or {}), reported_at=probed.created_at) if probed is not None else None,
    )


def version_public(v: Version, detail: bool = False) -> VersionPublic:
    env = v.environment
    fields: dict[str, Any] = dict(
        ref=f"{env.namespace.name}/{env.name}@{v.version}", version=v.version, bundle_digest=v.bundle_digest,
        image_id=v.image_id, base_image=v.base_image, oci_ref=v.oci_ref, size=v.size, task_count=v.task_count,
        kind=env.kind, reproducible=((v.spec or {}).get("image") or {}).get("build", "envkit") != "dockerfile",
        publisher=v.publisher.name, created_at=v.created_at, yanked=v.yanked, yank_reason=v.yank_reason,
        deprecated=v.deprecated, successor=v.successor, health=health_summary(v),
    )
    return VersionDetail(**fields, spec=v.spec) if detail else VersionPublic(**fields)


def environment_public(env: Environment, with_versions: bool = False) -> EnvironmentPublic:
    newest = latest(env)
    fields: dict[str, Any] = dict(
        namespace=env.namespace.name, name=env.name, full_name=f"{env.namespace.name}/{env.name}", kind=env.kind,
        description=env.description, latest_version=newest.version if newest else None, version_count=len(env.versions),
        task_count=newest.task_count if newest else 0, updated_at=env.updated_at,
    )
    if with_versions:
        return EnvironmentDetail(**fields, versions=[version_public(v) for v in sorted_versions(env)])
    return EnvironmentPublic(**fields)


def gc_orphans(session: Session, *, store: BlobStore, grace_s: float = 3600) -> list[str]:
    """Delete stored blobs that no row references (left by a publish killed before its
    commit), once they are older than ``grace_s`` (a publish may be committing right now)."""
    known = set(session.scalars(select(Blob.digest)))
    now = time.time()
    removed = []
    for digest, mtime in list(store.list()):
        if digest not in known and now - mtime >= grace_s:
            store.delete(digest)
            removed.append(digest)
    return removed


def aware(ts: dt.datetime) -> dt.datetime:
    return ts if ts.tzinfo else ts.replace(tzinfo=dt.UTC)
