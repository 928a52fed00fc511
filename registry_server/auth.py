"""API tokens: ``ekt_<public id>_<secret>``. Only sha256(secret) is stored; the token is
shown once, at creation. Tokens are scoped to namespaces and can be revoked."""

from __future__ import annotations

import hashlib
import hmac
import secrets

__all__ = ["PREFIX", "hash_secret", "new_token", "split_token"]

PREFIX = "ekt_"


def hash_secret(secret: str) -> str:
    # The secret is 256 random bits, so a fast hash is enough (no dictionary to attack).
    return hashlib.sha256(secret.encode()).hexdigest()


def new_token() -> tuple[str, str, str]:
    """Returns (token to show once, public id, secret hash to store)."""
    public_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    return f"{PREFIX}{public_id}_{secret}", public_id, hash_secret(secret)


def split_token(token: str) -> tuple[str, str] | None:
    if not token.startswith(PREFIX):
        return None
    public_id, sep, secret = token[len(PREFIX):].partition("_")
    if not sep or len(public_id) != 16 or not secret:
        return None
    return public_id, secret


def secret_matches(secret: str, stored_hash: str) -> bool:
    return hmac.compare_digest(hash_secret(secret), stored_hash)
