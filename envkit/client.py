"""The registry client, in two layers (as docker-py does):

* :class:`RegistryAPI`: one method per endpoint, dicts in and out, no policy.
* :class:`Registry`: resources on top: ``Registry().environments.get("envkit/pyfix@1.0.0")``
  returns an :class:`EnvironmentVersion` with ``.reload()``, ``.yank()``, ``.deprecate()``.

Credentials come from ``envkit login`` (``~/.config/envkit/credentials.json``, mode 0600) or
``ENVKIT_REGISTRY_URL`` / ``ENVKIT_TOKEN``. Tests may pass an ``httpx`` transport: it is the
declared seam for faking the network.
"""

from __future__ import annotations

import builtins
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from envkit.errors import UserError
from envkit.refs import EnvRef, parse_env_ref

__all__ = ["Credentials", "EnvironmentVersion", "Registry", "RegistryAPI", "RegistryAPIError",
           "RegistryUnavailableError", "load_credentials", "save_credentials"]

DEFAULT_TIMEOUT = httpx.Timeout(30.0, read=300.0)


class RegistryAPIError(UserError):
    """The registry answered with an error; ``status`` and ``code`` say which."""

    def __init__(self, status: int, code: str, message: str, hint: str = "", details: Any = None) -> None:
        super().__init__(message, hint)
        self.status = status
        self.code = code
        self.details = details


class RegistryUnavailableError(UserError):
    """No registry answers at the configured URL."""


@dataclass
class Credentials:
    url: str
    token: str | None = None


def _config_path() -> Path:
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "envkit" / "credentials.json"


def load_credentials() -> Credentials | None:
    url = os.environ.get("ENVKIT_REGISTRY_URL")
    token = os.environ.get("ENVKIT_TOKEN")
    path = _config_path()
    if path.is_file():
        try:
            saved = json.loads(path.read_text())
        except ValueError:
            saved = {}
        url = url or saved.get("url")
        token = token or (saved.get("token") if saved.get("url") == url else None)
    return Credentials(url=url.rstrip("/"), token=token) if url else None


def save_credentials(creds: Credentials) -> Path:
    path = _config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": creds.url, "token": creds.token}, f)
    os.chmod(path, 0o600)
    return path


class RegistryAPI:
    """Endpoint layer: thin, 1:1 with /api/v1."""

    def __init__(self, url: str, token: str | None = None, *, transport: httpx.BaseTransport | None = None,
                 timeout: httpx.Timeout = DEFAULT_TIMEOUT) -> None:
        self.url = url.rstrip("/")
        headers = {"User-Agent": "envkit"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.http = httpx.Client(base_url=f"{self.url}/api/v1", headers=headers, transport=transport, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as e:
            raise RegistryUnavailableError(f"the registry at {self.url} does not answer ({type(e).__name__})",
                                           "check the URL (`envkit login URL`) and that the server runs") from None
        if response.status_code >= 400:
            raise _api_error(response)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

    # environments
    def list_environments(self, *, q: str = "", kind: str | None = None, page: int = 1, page_size: int = 20) -> Any:
        params: dict[str, Any] = {"q": q, "page": page, "page_size": page_size}
        if kind:
            params["kind"] = kind
        return self._json("GET", "/environments", params=params)

    def get_environment(self, namespace: str, name: str) -> Any:
        return self._json("GET", f"/environments/{namespace}/{name}")

    def get_version(self, namespace: str, name: str, version: str) -> Any:
        return self._json("GET", f"/environments/{namespace}/{name}/versions/{version}")

    def download_bundle(self, namespace: str, name: str, version: str) -> Iterator[bytes]:
        try:
            with self.http.stream("GET", f"/environments/{namespace}/{name}/versions/{version}/bundle") as response:
                if response.status_code >= 400:
                    response.read()
                    raise _api_error(response)
                yield from response.iter_bytes(1 << 20)
        except httpx.TransportError as e:
            raise RegistryUnavailableError(f"the download from {self.url} broke ({type(e).__name__})",
                                           "try again") from None

    def publish_version(self, namespace: str, name: str, version: str, *, bundle: bytes, bundle_digest: str,
                        image_id: str, base_image: str = "", oci_ref: str | None = None) -> tuple[int, Any]:
        params = {"bundle_digest": bundle_digest, "image_id": image_id, "base_image": base_image}
        if oci_ref:
            params["oci_ref"] = oci_ref
        response = self._request("PUT", f"/environments/{namespace}/{name}/versions/{version}", params=params,
                                 content=bundle, headers={"Content-Type": "application/x-tar"})
        return response.status_code, response.json()

    def yank(self, namespace: str, name: str, version: str, reason: str) -> Any:
        return self._json("POST", f"/environments/{namespace}/{name}/versions/{version}/yank", json={"reason": reason})

    def unyank(self, namespace: str, name: str, version: str) -> Any:
        return self._json("POST", f"/environments/{namespace}/{name}/versions/{version}/unyank")

    def deprecate(self, namespace: str, name: str, version: str, successor: str | None) -> Any:
        return self._json("POST", f"/environments/{namespace}/{name}/versions/{version}/deprecate",
                          json={"successor": successor})

    def report_health(self, namespace: str, name: str, version: str, figures: dict[str, Any]) -> Any:
        return self._json("POST", f"/environments/{namespace}/{name}/versions/{version}/health", json=figures)

    # tokens
    def create_token(self, *, name: str, namespaces: list[str]) -> Any:
        return self._json("POST", "/tokens", json={"name": name, "namespaces": namespaces})

    def list_tokens(self) -> Any:
        return self._json("GET", "/tokens")

    def revoke_token(self, token_id: str) -> Any:
        return self._json("DELETE", f"/tokens/{token_id}")


def _api_error(response: httpx.Response) -> RegistryAPIError:
    try:
        body = response.json()["error"]
        return RegistryAPIError(response.status_code, body.get("code", ""), f"registry: {body['message']}",
                                body.get("hint", ""), body.get("details"))
    except (ValueError, KeyError, TypeError):
        return RegistryAPIError(response.status_code, "", f"registry answered HTTP {response.status_code}",
                                "check the registry URL")


@dataclass
class EnvironmentVersion:
    """One published version (resource layer)."""

    collection: EnvironmentCollection = field(repr=False)
    attrs: dict[str, Any]

    @property
    def ref(self) -> EnvRef:
        return parse_env_ref(self.attrs["ref"])

    def __getattr__(self, name: str) -> Any:
        attrs = self.__dict__.get("attrs", {})
        if name in attrs:
            return attrs[name]
        raise AttributeError(name)

    def reload(self) -> EnvironmentVersion:
        r = self.ref
        assert r.version is not None
        self.attrs = self.collection.api.get_version(r.namespace, r.name, r.version)
        return self

    def yank(self, reason: str) -> EnvironmentVersion:
        r = self.ref
        assert r.version is not None
        self.attrs = self.collection.api.yank(r.namespace, r.name, r.version, reason)
        return self

    def deprecate(self, successor: str | None = None) -> EnvironmentVersion:
        r = self.ref
        assert r.version is not None
        self.attrs = self.collection.api.deprecate(r.namespace, r.name, r.version, successor)
        return self


@dataclass
class EnvironmentCollection:
    api: RegistryAPI

    def get(self, ref: str | EnvRef) -> EnvironmentVersion:
        """A version by ref; without a version, the newest that is not yanked."""
        r = parse_env_ref(ref) if isinstance(ref, str) else ref
        return EnvironmentVersion(self, self.api.get_version(r.namespace, r.name, r.version or "latest"))

    def list(self, q: str = "", *, kind: str | None = None, page: int = 1,
             page_size: int = 20) -> tuple[builtins.list[dict[str, Any]], int]:
        page_data = self.api.list_environments(q=q, kind=kind, page=page, page_size=page_size)
        return page_data["data"], page_data["count"]

    def versions(self, ref: str) -> builtins.list[EnvironmentVersion]:
        r = parse_env_ref(ref)
        detail = self.api.get_environment(r.namespace, r.name)
        return [EnvironmentVersion(self, v) for v in detail["versions"]]


class Registry:
    """Resource layer: ``Registry(url, token).environments.get("ns/name@1.0.0")``."""

    def __init__(self, url: str | None = None, token: str | None = None, *,
                 transport: httpx.BaseTransport | None = None) -> None:
        if url is None:
            creds = load_credentials()
            if creds is None:
                raise UserError("no registry is configured", "run `envkit login URL` or set ENVKIT_REGISTRY_URL")
            url, token = creds.url, token or creds.token
        self.api = RegistryAPI(url, token, transport=transport)
        self.environments = EnvironmentCollection(self.api)

    @property
    def url(self) -> str:
        return self.api.url

    def close(self) -> None:
        self.api.close()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

