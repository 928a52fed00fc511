#!/bin/bash
# Oracle for task fix-truncate: applies the reference fix.
set -euo pipefail
cd /workspace
git apply --whitespace=nowarn <<'PATCH'
diff --git a/kit/text.py b/kit/text.py
index 1cf66f1..0a0ad73 100644
--- a/kit/text.py
+++ b/kit/text.py
@@ -15,7 +15,7 @@ def truncate(text: str, width: int, ellipsis: str = "...") -> str:
     """Shorten ``text`` to at most ``width`` characters, ending with ``ellipsis`` if cut."""
     if len(text) <= width:
         return text
-    return text[:width] + ellipsis
+    return text[: max(width - len(ellipsis), 0)] + ellipsis
 
 
 def word_count(text: str) -> int:
PATCH
