#!/bin/bash
# Oracle for task fix-slugify: applies the reference fix.
set -euo pipefail
cd /workspace
git apply --whitespace=nowarn <<'PATCH'
diff --git a/kit/text.py b/kit/text.py
index 1cf66f1..112b6db 100644
--- a/kit/text.py
+++ b/kit/text.py
@@ -7,7 +7,7 @@ import unicodedata
 def slugify(text: str, sep: str = "-") -> str:
     """Lowercase ASCII words joined by ``sep``: "Hello, World!" -> "hello-world"."""
     text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
-    text = re.sub(r"[^A-Za-z0-9]", sep, text.lower())
+    text = re.sub(r"[^A-Za-z0-9]+", sep, text.lower())
     return text.strip(sep)
 
 
PATCH
