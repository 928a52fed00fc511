"""The registry's FastAPI application: `create_app(settings)`."""

from __future__ import annotations

from fastapi import FastAPI

from registry_server import __version__
from registry_server.db import make_engine, make_sessionmaker
from registry_server.errors import install_handlers
from registry_server.migrate import upgrade
from registry_server.routes import environments, health, tokens, versions
from registry_server.schemas import error_responses
from registry_server.settings import Settings
from registry_server.storage import make_store
from registry_server.web import pages


def create_app(settings: Settings | None = None, *, migrate: bool = True) -> FastAPI:
    settings = settings or Settings.from_env()
    if migrate:
        upgrade(settings.database_url)
    engine = make_engine(settings.database_url)
    app = FastAPI(
        title="envkit registry", version=__version__,
        description="Versioned, content-addressed environments for LLM-agent RL. "
                    "Reads are public; writes need a token.",
        docs_url="/docs", redoc_url=None, openapi_url="/api/v1/openapi.json",
        responses=error_responses(400, 401, 404, 422, 500),  # any route (a bad token is refused on reads too)
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessions = make_sessionmaker(engine)
    app.state.store = make_store(settings.storage_dir)
    install_handlers(app)
    for router in (environments.router, versions.router, tokens.router, health.router):
        app.include_router(router, prefix="/api/v1")
    app.include_router(pages.router)

    @app.get("/api/v1/health", tags=["meta"])
    def liveness() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    return app
