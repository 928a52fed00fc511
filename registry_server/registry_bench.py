"""`envkit bench registry`: the registry under load, SQLite and PostgreSQL side by side.

For each database the registry runs as its own process (`envkit registry serve`) on
loopback; this process is the load generator:

* metadata GET: ``GET /api/v1/environments/envkit/bench-<k>`` for random k among
  ``envs`` seeded environments, ``requests`` in all at ``concurrency`` in flight
  (httpx async), after a warm-up; p50/p99 latency and requests/s;
* publish of a ~``bundle_mb`` MB bundle (one file of random bytes, incompressible);
* pull of it: download plus digest check (what `envkit pull` does before its image step).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from envkit.bundle import Bundle, make_bundle
from envkit.spec import load_environment
from envkit.stats import percentile
from registry_server import admin
from registry_server.pgtemp import create_database, free_port, pg_bindir, temporary_postgres
from registry_server.settings import Settings

__all__ = ["RegistryBenchRow", "bench_registry"]

_SPEC = """spec_version = 1
[environment]
name = "envkit/{name}"
version = "1.0.0"
kind = "repo"
description = "registry benchmark environment {name}"
[image]
files = ["verify", "oracle"]
[state]
repo = {{ path = "repo" }}
[verifier]
command = "true"
"""


@dataclass
class RegistryBenchRow:
    database: str
    get_p50_ms: float
    get_p99_ms: float
    get_rps: float
    get_errors: int
    publish_s: float
    pull_s: float
    bundle_mb: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _env_folder(root: Path, name: str, payload: int = 0) -> Path:
    folder = root / name
    for sub in ("repo", "verify", "oracle"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "envkit.toml").write_text(_SPEC.format(name=name))
    (folder / "tasks.jsonl").write_text('{"id": "t1", "instruction": "do it", "oracle": "oracle/t1.sh"}\n')
    (folder / "oracle" / "t1.sh").write_text("#!/bin/bash\ntrue\n")
    (folder / "repo" / "README.md").write_text(f"{name}\n")
    if payload:
        (folder / "repo" / "data.bin").write_bytes(os.urandom(payload))
    return folder


def _bundle(root: Path, name: str, payload: int = 0) -> Bundle:
    return make_bundle(load_environment(_env_folder(root, name, payload)))


@contextmanager
def _server(db_url: str, storage: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "envkit.cli.app", "registry", "serve", "--db", db_url,
                             "--storage", str(storage), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}/api/v1"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the registry did not start for the benchmark")
            time.sleep(0.1)
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)


def _put(client: httpx.Client, bundle: Bundle, name: str) -> None:
    r = client.put(f"/environments/envkit/{name}/versions/1.0.0", content=bundle.data,
                   params={"bundle_digest": bundle.digest, "image_id": "sha256:" + "0" * 64})
    r.raise_for_status()


async def _load(base: str, envs: int, requests: int, concurrency: int) -> tuple[list[float], int, float]:
    latencies: list[float] = []
    errors = 0
    rng = random.Random(7)
    paths = [f"/environments/envkit/bench-{rng.randrange(envs)}" for _ in range(requests)]
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as client:
        for path in paths[: min(50, requests)]:  # warm-up
            await client.get(path)
        queue: asyncio.Queue[str] = asyncio.Queue()
        for path in paths:
            queue.put_nowait(path)

        async def worker() -> None:
            nonlocal errors
            while not queue.empty():
                path = queue.get_nowait()
                t0 = time.perf_counter()
                r = await client.get(path)
                latencies.append(time.perf_counter() - t0)
                if r.status_code != 200:
                    errors += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return latencies, errors, wall


def _one(database: str, db_url: str, root: Path, *, envs: int, requests: int, concurrency: int,
         big: Bundle, note: Callable[[str], None]) -> RegistryBenchRow:
    storage = root / f"blobs-{database}"
    settings = Settings(database_url=db_url, storage_dir=storage)
    token = admin.create_user(settings, name="bench", namespaces=["envkit"])
    with _server(db_url, storage) as base:
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=600) as client:
            for k in range(envs):
                _put(client, _bundle(root / f"seed-{database}", f"bench-{k}"), f"bench-{k}")
            note(f"{database}: seeded {envs} environments")
            latencies, errors, wall = asyncio.run(_load(base, envs, requests, concurrency))
            note(f"{database}: {requests} GETs")
            t0 = time.perf_counter()
            _put(client, big, "bench-big")
            publish_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            sha = hashlib.sha256()
            with client.stream("GET", "/environments/envkit/bench-big/versions/1.0.0/bundle") as r:
                r.raise_for_status()
                for chunk in r.iter_bytes(1 << 20):
                    sha.update(chunk)
            pull_s = time.perf_counter() - t0
            if "sha256:" + sha.hexdigest() != big.digest:
                raise RuntimeError("the pulled bundle does not match")
    return RegistryBenchRow(database, round(percentile(latencies, 50) * 1000, 2),
                            round(percentile(latencies, 99) * 1000, 2), round(requests / wall, 1), errors,
                            round(publish_s, 3), round(pull_s, 3),
                            round(len(big.data) / 1e6, 1))


def bench_registry(*, envs: int = 50, requests: int = 2000, concurrency: int = 16, bundle_mb: int = 50,
                   note: Callable[[str], None] = lambda _m: None) -> tuple[list[RegistryBenchRow], dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="envkit-bench-registry-") as tmp:
        root = Path(tmp)
        big = _bundle(root / "big", "bench-big", bundle_mb * 1_000_000)
        rows = [_one("sqlite", f"sqlite:///{root}/registry.db", root, envs=envs, requests=requests,
                     concurrency=concurrency, big=big, note=note)]
        if pg_bindir() is not None:
            with temporary_postgres() as server:
                rows.append(_one("postgresql", create_database(server), root, envs=envs, requests=requests,
                                 concurrency=concurrency, big=big, note=note))
        else:
            note("PostgreSQL is not installed: its row is missing (scripts/setup.sh installs it)")
    return rows, {"envs": envs, "requests": requests, "concurrency": concurrency, "bundle_mb": bundle_mb,
                  "cpus": os.cpu_count()}
