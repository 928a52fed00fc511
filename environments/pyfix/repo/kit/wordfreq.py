"""Word frequencies."""

import re
from collections import Counter
from typing import List, Tuple


def words(text: str) -> List[str]:
    return re.findall(r"[a-z']+", text.lower())


def top_words(text: str, n: int = 3) -> List[Tuple[str, int]]:
    """The ``n`` most frequent words, most frequent first; ties in alphabetical order."""
    counts = Counter(words(text))
    return counts.most_common(n)
