#!/bin/bash
# Oracle for task fix-negative-money: applies the reference fix.
set -euo pipefail
cd /workspace
git apply --whitespace=nowarn <<'PATCH'
diff --git a/kit/money.py b/kit/money.py
index 58c2c78..c03df21 100644
--- a/kit/money.py
+++ b/kit/money.py
@@ -3,5 +3,6 @@
 
 def format_cents(cents: int, symbol: str = "$") -> str:
     """1234567 -> "$12,345.67"; negative amounts put the sign first: "-$1.50"."""
-    dollars, rest = divmod(cents, 100)
-    return f"{symbol}{dollars:,}.{rest:02d}"
+    sign = "-" if cents < 0 else ""
+    dollars, rest = divmod(abs(cents), 100)
+    return f"{sign}{symbol}{dollars:,}.{rest:02d}"
PATCH
