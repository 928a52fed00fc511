"""Folders written whole or not at all: filled in a staging folder beside the target, then
moved into place with one rename (same filesystem), so an error or a kill mid-way leaves the
target as it was and no half-written folder behind."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["staged_folder"]


@contextmanager
def staged_folder(target: Path, *, prefix: str) -> Iterator[Path]:
    """Yield an empty staging folder next to ``target``; when the block ends without an error,
    ``target`` (if any, replaced) becomes that folder's content. On an error it is removed."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))
    try:
        yield staging
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
