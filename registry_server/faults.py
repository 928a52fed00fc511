"""Fault points: a declared seam for crash tests. ``ENVKIT_REGISTRY_FAULTS=name:seconds,…``
makes the server stop at the named point for that long (a test then SIGKILLs it). Unset
in normal operation; reading it costs one dict lookup."""

from __future__ import annotations

import os
import time

__all__ = ["point"]


def _parse(text: str) -> dict[str, float]:
    out = {}
    for item in filter(None, text.split(",")):
        name, _, seconds = item.partition(":")
        out[name] = float(seconds or 60)
    return out


_FAULTS = _parse(os.environ.get("ENVKIT_REGISTRY_FAULTS", ""))


def point(name: str) -> None:
    delay = _FAULTS.get(name)
    if delay:
        time.sleep(delay)
