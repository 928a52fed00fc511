#!/bin/bash
# Oracle for task add-from-roman: applies the reference fix.
set -euo pipefail
cd /workspace
git apply --whitespace=nowarn <<'PATCH'
diff --git a/kit/roman.py b/kit/roman.py
index ff8c12d..fc77469 100644
--- a/kit/roman.py
+++ b/kit/roman.py
@@ -14,3 +14,21 @@ def to_roman(n: int) -> str:
         count, n = divmod(n, value)
         out.append(letters * count)
     return "".join(out)
+
+
+def from_roman(text: str) -> int:
+    """The value of an upper-case roman numeral; ValueError if it is not canonical."""
+    values = dict((letters, value) for value, letters in _NUMERALS)
+    i, total = 0, 0
+    while i < len(text):
+        if text[i:i + 2] in values:
+            total += values[text[i:i + 2]]
+            i += 2
+        elif text[i] in values:
+            total += values[text[i]]
+            i += 1
+        else:
+            raise ValueError(f"not a roman numeral: {text!r}")
+    if not 1 <= total <= 3999 or to_roman(total) != text:
+        raise ValueError(f"not a canonical roman numeral: {text!r}")
+    return total
PATCH
