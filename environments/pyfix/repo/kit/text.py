"""Text helpers."""

import re
import unicodedata


def slugify(text: str, sep: str = "-") -> str:
    """Lowercase ASCII words joined by ``sep``: "Hello, World!" -> "hello-world"."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^A-Za-z0-9]", sep, text.lower())
    return text.strip(sep)


def truncate(text: str, width: int, ellipsis: str = "...") -> str:
    """Shorten ``text`` to at most ``width`` characters, ending with ``ellipsis`` if cut."""
    if len(text) <= width:
        return text
    return text[:width] + ellipsis


def word_count(text: str) -> int:
    return len(text.split())
