"""A throw-away PostgreSQL server (Debian's binaries) in a temporary folder, on loopback,
for tests and benchmarks. Run as root: the server runs as the `postgres` user."""

from __future__ import annotations

import contextlib
import glob
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

__all__ = ["create_database", "free_port", "pg_bindir", "temporary_postgres"]


def pg_bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def temporary_postgres() -> Iterator[str]:
    """Yields a server URL ``postgresql://postgres@127.0.0.1:PORT`` (trust auth, fsync off)."""
    bindir = pg_bindir()
    if bindir is None:
        raise RuntimeError("PostgreSQL is not installed (Debian package postgresql; scripts/setup.sh installs it)")
    data = Path(tempfile.mkdtemp(prefix="envkit-pg-"))
    shutil.chown(data, "postgres", "postgres")
    port = free_port()
    as_pg = ["runuser", "-u", "postgres", "--"]
    subprocess.run([*as_pg, str(bindir / "initdb"), "-D", str(data / "db"), "-U", "postgres", "--auth=trust",
                    "-E", "UTF8"],
                   check=True, capture_output=True)
    subprocess.run([*as_pg, str(bindir / "pg_ctl"), "-D", str(data / "db"), "-w", "-l", str(data / "log"), "-o",
                    f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200", "start"],
                   check=True, capture_output=True)
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}"
    finally:
        subprocess.run([*as_pg, str(bindir / "pg_ctl"), "-D", str(data / "db"), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(data, ignore_errors=True)


def create_database(server: str) -> str:
    """A new, empty database on ``server``; returns its URL."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{server}/{name}"
