#!/bin/bash
# Oracle for task fix-merge-intervals: applies the reference fix.
set -euo pipefail
cd /workspace
git apply --whitespace=nowarn <<'PATCH'
diff --git a/kit/intervals.py b/kit/intervals.py
index 267f14c..48f511f 100644
--- a/kit/intervals.py
+++ b/kit/intervals.py
@@ -9,7 +9,7 @@ def merge(intervals: List[Interval]) -> List[Interval]:
     """Merge overlapping or touching intervals; the result is sorted."""
     out: List[Interval] = []
     for start, end in sorted(intervals):
-        if out and start < out[-1][1]:
+        if out and start <= out[-1][1]:
             out[-1] = (out[-1][0], max(out[-1][1], end))
         else:
             out.append((start, end))
PATCH
