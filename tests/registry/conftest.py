"""Registry fixtures: a real PostgreSQL server (Debian's package, started here in a temp
folder) and SQLite; a live registry served by uvicorn on loopback for each test."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn

from registry_server import admin
from registry_server.app import create_app
from registry_server.pgtemp import create_database, free_port, pg_bindir, temporary_postgres
from registry_server.settings import Settings


@pytest.fixture(scope="session")
def postgres() -> Iterator[str]:
    """A PostgreSQL server of our own on 127.0.0.1 (Debian's binaries, run as `postgres`)."""
    if pg_bindir() is None:
        pytest.fail("PostgreSQL is not installed: run scripts/setup.sh (it installs Debian's postgresql)")
    with temporary_postgres() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/registry.db"
    return create_database(request.getfixturevalue("postgres"))


@dataclass
class LiveRegistry:
    url: str
    settings: Settings
    token: str  # alice, owns namespace "envkit"
    other_token: str  # bob, owns namespace "bobs"

    @property
    def storage(self) -> Path:
        return self.settings.storage_dir

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=f"{self.url}/api/v1", headers=headers, timeout=120)

    def blob_files(self) -> list[Path]:
        return [p for p in (self.storage / "sha256").glob("*/*")]

    def tmp_files(self) -> list[Path]:
        return list((self.storage / "tmp").glob("*"))


@contextlib.contextmanager
def serve(settings: Settings) -> Iterator[str]:
    app = create_app(settings)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the registry did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        app.state.engine.dispose()


def make_settings(db_url: str, tmp_path: Path, **overrides: object) -> Settings:
    return Settings(database_url=db_url, storage_dir=tmp_path / "blobs", **overrides)  # type: ignore[arg-type]


@pytest.fixture
def registry(db_url: str, tmp_path: Path) -> Iterator[LiveRegistry]:
    settings = make_settings(db_url, tmp_path, max_upload_bytes=8 * 1024 * 1024, max_bundle_bytes=16 * 1024 * 1024)
    token = admin.create_user(settings, name="alice", namespaces=["envkit"])
    other = admin.create_user(settings, name="bob", namespaces=["bobs"])
    with serve(settings) as url:
        yield LiveRegistry(url=url, settings=settings, token=token, other_token=other)


@pytest.fixture
def cli_env(registry: LiveRegistry, tmp_path: Path) -> dict[str, str]:
    """Environment for `envkit` subprocesses talking to the live registry as alice."""
    return {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "ENVKIT_REGISTRY_URL": registry.url, "ENVKIT_TOKEN": registry.token}
