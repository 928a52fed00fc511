"""Alembic migrations build exactly the schema the models describe (SQLite and PostgreSQL)."""

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from registry_server.db import make_engine
from registry_server.migrate import upgrade
from registry_server.models import Base


def test_migrations_match_models(db_url):
    upgrade(db_url)
    upgrade(db_url)  # idempotent
    engine = make_engine(db_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        version = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
    engine.dispose()
    assert diff == []
    assert version == "0003"
