#!/bin/bash
# Oracle for task fix-median: applies the reference fix.
set -euo pipefail
cd /workspace
git apply --whitespace=nowarn <<'PATCH'
diff --git a/kit/stats.py b/kit/stats.py
index d2259d2..0abf1eb 100644
--- a/kit/stats.py
+++ b/kit/stats.py
@@ -17,7 +17,7 @@ def median(values: Sequence[float]) -> float:
     mid = len(ordered) // 2
     if len(ordered) % 2:
         return ordered[mid]
-    return (ordered[mid] + ordered[mid + 1]) / 2
+    return (ordered[mid - 1] + ordered[mid]) / 2
 
 
 def variance(values: Sequence[float]) -> float:
PATCH
