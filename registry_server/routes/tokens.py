"""API tokens: create (shown once), list, revoke."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from registry_server import crud
from registry_server.deps import CurrentToken, SessionDep
from registry_server.schemas import TokenCreate, TokenCreated, TokenPublic, error_responses

router = APIRouter(prefix="/tokens", tags=["tokens"], responses=error_responses(403))


@router.post("", response_model=TokenCreated, status_code=201)
def create_token(session: SessionDep, token: CurrentToken, body: TokenCreate) -> TokenCreated:
    """A new token for the caller's user, scoped to namespaces the user owns. Its secret is
    in this response only."""
    row, text = crud.create_token(session, user=token.user, name=body.name, namespaces=body.namespaces)
    session.commit()
    return TokenCreated(**crud.token_public(row).model_dump(), token=text)


@router.get("", response_model=list[TokenPublic])
def list_tokens(session: SessionDep, token: CurrentToken) -> list[TokenPublic]:
    return [crud.token_public(t) for t in crud.list_tokens(session, user=token.user)]


@router.delete("/{token_id}", response_model=TokenPublic)
def revoke_token(session: SessionDep, token: CurrentToken,
                 token_id: Annotated[str, Path(min_length=1, max_length=32, pattern=r"^[0-9a-f]+$")]) -> TokenPublic:
    row = crud.revoke_token(session, user=token.user, public_id=token_id)
    session.commit()
    return crud.token_public(row)
