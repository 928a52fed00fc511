"""The envkit registry server: FastAPI + SQLAlchemy 2 + Alembic; SQLite by default, PostgreSQL in production.

Run it with `envkit registry serve`; `create_app(settings)` builds the ASGI app.
"""

__version__ = "0.1.0"
