"""Operator tasks that act on the database directly: users (with a first token), gc."""

from __future__ import annotations

from registry_server import crud
from registry_server.db import make_engine, make_sessionmaker
from registry_server.migrate import upgrade
from registry_server.settings import Settings
from registry_server.storage import make_store

__all__ = ["create_user", "gc"]


def create_user(settings: Settings, *, name: str, namespaces: list[str], admin: bool = False) -> str:
    """Create a user owning ``namespaces``; returns its first token (shown once)."""
    upgrade(settings.database_url)
    engine = make_engine(settings.database_url)
    try:
        with make_sessionmaker(engine)() as session:
            _, token = crud.create_user(session, name=name, namespaces=namespaces, admin=admin)
            session.commit()
            return token
    finally:
        engine.dispose()


def gc(settings: Settings, *, grace_s: float = 3600) -> list[str]:
    upgrade(settings.database_url)
    engine = make_engine(settings.database_url)
    try:
        with make_sessionmaker(engine)() as session:
            return crud.gc_orphans(session, store=make_store(settings.storage_dir), grace_s=grace_s)
    finally:
        engine.dispose()
