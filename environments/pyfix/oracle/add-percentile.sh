#!/bin/bash
# Oracle for task add-percentile: applies the reference fix.
set -euo pipefail
cd /workspace
git apply --whitespace=nowarn <<'PATCH'
diff --git a/kit/stats.py b/kit/stats.py
index d2259d2..f82070f 100644
--- a/kit/stats.py
+++ b/kit/stats.py
@@ -20,6 +20,19 @@ def median(values: Sequence[float]) -> float:
     return (ordered[mid] + ordered[mid + 1]) / 2
 
 
+def percentile(values: Sequence[float], p: float) -> float:
+    """The p-th percentile (0..100), interpolating linearly between closest ranks."""
+    if not values:
+        raise ValueError("percentile() of an empty sequence")
+    if not 0 <= p <= 100:
+        raise ValueError("p must be between 0 and 100")
+    ordered = sorted(values)
+    rank = (len(ordered) - 1) * p / 100
+    low = int(rank)
+    high = min(low + 1, len(ordered) - 1)
+    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
+
+
 def variance(values: Sequence[float]) -> float:
     """Population variance."""
     m = mean(values)
PATCH
