"""Dependencies as Annotated aliases: SessionDep, SettingsDep, StoreDep, CurrentToken."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from registry_server import crud
from registry_server.errors import RegistryError
from registry_server.models import Namespace, Token
from registry_server.settings import Settings
from registry_server.storage import BlobStore

_bearer = HTTPBearer(auto_error=False,
                     description="ekt_… token from `envkit registry admin create-user` or POST /api/v1/tokens")


def _session(request: Request) -> Iterator[Session]:
    with request.app.state.sessions() as session:
        yield session


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _store(request: Request) -> BlobStore:
    store: BlobStore = request.app.state.store
    return store


SessionDep = Annotated[Session, Depends(_session)]
SettingsDep = Annotated[Settings, Depends(_settings)]
StoreDep = Annotated[BlobStore, Depends(_store)]


def _current_token(session: SessionDep,
                   creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> Token:
    if creds is None:
        raise RegistryError(401, "this request needs an API token",
                            "send `Authorization: Bearer ekt_…` (`envkit login`)")
    token = crud.authenticate(session, token=creds.credentials)
    if token is None:
        raise RegistryError(401, "the API token is not valid (unknown, malformed or revoked)",
                            "create a new token and run `envkit login` again")
    crud.touch_token(session, token=token)
    return token


CurrentToken = Annotated[Token, Depends(_current_token)]


def require_namespace(token: Token, namespace: str) -> Namespace:
    for scope in token.scopes:
        if scope.namespace.name == namespace:
            return scope.namespace
    raise RegistryError(403, f"this token may not write to namespace `{namespace}`",
                        f"use a token scoped to `{namespace}` "
                        f"(it covers: {', '.join(crud.token_namespaces(token)) or 'nothing'})")
