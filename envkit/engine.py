"""The connection to the Docker engine (through the docker SDK; never the CLI)."""

from __future__ import annotations

import os
import threading
from typing import Any

import docker
import docker.errors
import requests.exceptions

from envkit.errors import DockerUnavailableError

__all__ = ["TRANSPORT_ERRORS", "connect", "engine_error"]

# What the SDK raises when the engine is gone or the connection broke (not a 4xx answer).
TRANSPORT_ERRORS: tuple[type[Exception], ...] = (
    requests.exceptions.ConnectionError,
    requests.exceptions.Timeout,
    requests.exceptions.ChunkedEncodingError,
    ConnectionError,
    BrokenPipeError,
    TimeoutError,
)

_lock = threading.Lock()
_clients: dict[str, docker.DockerClient] = {}
DOCKER_URL_POOLS = 64


def _where() -> str:
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


def engine_error(err: BaseException | None = None) -> DockerUnavailableError:
    detail = f" ({type(err).__name__}: {str(err)[:200]})" if err is not None else ""
    return DockerUnavailableError(
        f"the Docker engine at {_where()} does not answer{detail}",
        "start it: `bash scripts/setup.sh` installs and starts dockerd on this machine "
        "(or run `dockerd &` as root), or point DOCKER_HOST at a running engine",
    )


def _safe_url_pools(client: Any) -> None:
    adapter = getattr(client.api, "_custom_adapter", None)
    pools = getattr(adapter, "pools", None)
    if adapter is None or pools is None or not hasattr(pools, "_maxsize"):
        return  # another transport (TCP/TLS, SSH): requests' own pooling
    from urllib3._collections import RecentlyUsedContainer

    adapter.pools = RecentlyUsedContainer(DOCKER_URL_POOLS)  # no dispose_func: eviction never closes a pool


def connect(timeout: float = 120) -> Any:
    """A docker SDK client for the local engine, checked with a ping; cached per DOCKER_HOST."""
    key = f"{_where()}|{timeout}"
    with _lock:
        client = _clients.get(key)
        if client is not None:
            return client
        try:
            # docker-py keeps one connection pool per request URL (per container, per exec) in an
            # LRU of 25 and *closes* the pool it evicts, even while another thread's request (a
            # long exec) still uses it: at 64 concurrent sandboxes that surfaced as
            # AttributeError ('NoneType' object has no attribute 'qsize') inside urllib3. The LRU
            # is replaced by one that drops evicted pools without closing them (a pool in use
            # lives on until its request returns; then its sockets are freed with it).
            client = docker.DockerClient(base_url=_where(), timeout=int(timeout), version="auto")
            _safe_url_pools(client)
            client.ping()
        except (docker.errors.DockerException, *TRANSPORT_ERRORS) as e:
            raise engine_error(e) from None
        _clients[key] = client
        return client
