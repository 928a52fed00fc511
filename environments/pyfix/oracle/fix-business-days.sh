#!/bin/bash
# Oracle for task fix-business-days: applies the reference fix.
set -euo pipefail
cd /workspace
git apply --whitespace=nowarn <<'PATCH'
diff --git a/kit/dates.py b/kit/dates.py
index 02cda72..a659e94 100644
--- a/kit/dates.py
+++ b/kit/dates.py
@@ -9,7 +9,8 @@ def add_business_days(start: dt.date, days: int) -> dt.date:
     remaining = days
     while remaining > 0:
         current += dt.timedelta(days=1)
-        remaining -= 1
+        if not is_weekend(current):
+            remaining -= 1
     return current
 
 
PATCH
