#!/bin/bash
# Oracle for task fix-top-words-ties: applies the reference fix.
set -euo pipefail
cd /workspace
git apply --whitespace=nowarn <<'PATCH'
diff --git a/kit/wordfreq.py b/kit/wordfreq.py
index 64f51fb..20373fc 100644
--- a/kit/wordfreq.py
+++ b/kit/wordfreq.py
@@ -12,4 +12,4 @@ def words(text: str) -> List[str]:
 def top_words(text: str, n: int = 3) -> List[Tuple[str, int]]:
     """The ``n`` most frequent words, most frequent first; ties in alphabetical order."""
     counts = Counter(words(text))
-    return counts.most_common(n)
+    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:n]
PATCH
