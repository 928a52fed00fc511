"""Semantic versions: parse and compare "MAJOR.MINOR.PATCH"."""

from typing import Tuple


def parse(version: str) -> Tuple[str, str, str]:
    parts = version.strip().split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a version: {version!r}")
    return parts[0], parts[1], parts[2]


def compare(a: str, b: str) -> int:
    """-1 if a < b, 0 if equal, 1 if a > b."""
    pa, pb = parse(a), parse(b)
    if pa < pb:
        return -1
    if pa > pb:
        return 1
    return 0


def newest(versions):
    best = None
    for v in versions:
        if best is None or compare(v, best) > 0:
            best = v
    return best
