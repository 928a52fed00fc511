"""Alembic environment: uses the connection `registry_server.migrate` passes in."""

from __future__ import annotations

from alembic import context

from registry_server.models import Base

target_metadata = Base.metadata
connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through registry_server.migrate.upgrade()")
context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
