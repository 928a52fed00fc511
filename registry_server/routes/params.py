"""Path and query parameters shared by the routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path

NS_PATTERN = r"^[a-z0-9]+(?:[._-][a-z0-9]+)*$"
SEMVER_PATTERN = (
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
Namespace = Annotated[str, Path(min_length=2, max_length=64, pattern=NS_PATTERN)]
Name = Annotated[str, Path(min_length=1, max_length=64, pattern=NS_PATTERN)]
VersionParam = Annotated[str, Path(max_length=128, pattern=SEMVER_PATTERN)]
VersionOrLatest = Annotated[str, Path(max_length=128, pattern=f"(^latest$)|({SEMVER_PATTERN})",
                                      description="a semantic version, or `latest` (newest not yanked)")]
