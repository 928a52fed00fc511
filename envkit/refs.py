"""Environment references: one grammar, one parser and its inverse.

Grammar::

    ref       := namespace "/" name [ "@" version ]
    namespace := segment            (2-64 chars)
    name      := segment            (1-64 chars)
    segment   := [a-z0-9]+ ( [._-] [a-z0-9]+ )*
    version   := semantic version 2.0.0 (MAJOR.MINOR.PATCH[-pre][+build])

``format_env_ref(parse_env_ref(s)) == s`` for every valid ``s``; a ref without a version
means "the newest non-yanked version" wherever refs are resolved.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from envkit.errors import EnvRefError

__all__ = ["EnvRef", "format_env_ref", "is_prerelease", "is_semver", "parse_env_ref", "semver_key", "NAME_RE",
           "SEGMENT", "SEMVER_RE"]

SEGMENT = r"[a-z0-9]+(?:[._-][a-z0-9]+)*"  # one namespace or name
NAME_RE = re.compile(rf"^{SEGMENT}$")
# The regular expression published with the Semantic Versioning 2.0.0 specification.
SEMVER_RE = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


def is_semver(version: str) -> bool:
    return SEMVER_RE.match(version) is not None


def semver_key(version: str) -> tuple[object, ...]:
    """A sort key with Semantic Versioning 2.0.0 precedence (build metadata ignored)."""
    m = SEMVER_RE.match(version)
    if m is None:
        raise ValueError(f"`{version}` is not a semantic version")
    major, minor, patch, pre = int(m[1]), int(m[2]), int(m[3]), m[4]
    if pre is None:
        return (major, minor, patch, 1, ())
    ids = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split("."))
    return (major, minor, patch, 0, ids)


def is_prerelease(version: str) -> bool:
    """``1.1.0-rc.1`` is; ``1.1.0`` and ``1.1.0+build.5`` are not."""
    m = SEMVER_RE.match(version)
    return m is not None and m[4] is not None


@dataclass(frozen=True, order=True)
class EnvRef:
    namespace: str
    name: str
    version: str | None = None

    @property
    def full_name(self) -> str:
        return f"{self.namespace}/{self.name}"

    def with_version(self, version: str) -> EnvRef:
        return EnvRef(self.namespace, self.name, version)

    def __str__(self) -> str:
        return format_env_ref(self)


_EXAMPLE = "envkit/pyfix@1.0.0"


def _check_segment(kind: str, value: str, text: str, lo: int) -> None:
    if not (lo <= len(value) <= 64) or not NAME_RE.match(value):
        raise EnvRefError(
            f"`{text}` is not an environment ref: the {kind} `{value}` is not allowed",
            f"a {kind} is {lo}-64 chars of a-z, 0-9, with single '.', '_' or '-' between them; "
            f"write refs as namespace/name@version, e.g. {_EXAMPLE}",
        )


def parse_env_ref(text: str) -> EnvRef:
    """Parse ``ns/name[@version]``; raise :class:`EnvRefError` saying what to fix."""
    if not isinstance(text, str) or not text:
        raise EnvRefError("an empty string is not an environment ref", f"write namespace/name@version, e.g. {_EXAMPLE}")
    body, at, version = text.partition("@")
    if body.count("/") != 1:
        raise EnvRefError(
            f"`{text}` is not an environment ref: it needs exactly one '/' between namespace and name",
            f"write namespace/name@version, e.g. {_EXAMPLE}",
        )
    namespace, name = body.split("/")
    _check_segment("namespace", namespace, text, 2)
    _check_segment("name", name, text, 1)
    if at:
        if not is_semver(version):
            raise EnvRefError(
                f"`{text}` is not an environment ref: `{version}` is not a semantic version",
                "versions look like 1.2.0 or 1.2.0-rc.1 (MAJOR.MINOR.PATCH)",
            )
        return EnvRef(namespace, name, version)
    return EnvRef(namespace, name, None)


def format_env_ref(ref: EnvRef) -> str:
    """The inverse of :func:`parse_env_ref`."""
    base = f"{ref.namespace}/{ref.name}"
    return f"{base}@{ref.version}" if ref.version is not None else base
