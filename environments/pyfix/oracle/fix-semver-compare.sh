#!/bin/bash
# Oracle for task fix-semver-compare: applies the reference fix.
set -euo pipefail
cd /workspace
git apply --whitespace=nowarn <<'PATCH'
diff --git a/kit/semver.py b/kit/semver.py
index d72a2d5..0c8bbde 100644
--- a/kit/semver.py
+++ b/kit/semver.py
@@ -3,11 +3,11 @@
 from typing import Tuple
 
 
-def parse(version: str) -> Tuple[str, str, str]:
+def parse(version: str) -> Tuple[int, int, int]:
     parts = version.strip().split(".")
     if len(parts) != 3 or not all(p.isdigit() for p in parts):
         raise ValueError(f"not a version: {version!r}")
-    return parts[0], parts[1], parts[2]
+    return int(parts[0]), int(parts[1]), int(parts[2])
 
 
 def compare(a: str, b: str) -> int:
PATCH
