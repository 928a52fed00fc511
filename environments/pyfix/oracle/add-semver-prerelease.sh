#!/bin/bash
# Oracle for task add-semver-prerelease: applies the reference fix.
set -euo pipefail
cd /workspace
git apply --whitespace=nowarn <<'PATCH'
diff --git a/kit/semver.py b/kit/semver.py
index d72a2d5..f1ddca7 100644
--- a/kit/semver.py
+++ b/kit/semver.py
@@ -1,21 +1,40 @@
-"""Semantic versions: parse and compare "MAJOR.MINOR.PATCH"."""
+"""Semantic versions: parse and compare "MAJOR.MINOR.PATCH[-PRERELEASE]"."""
 
-from typing import Tuple
+from typing import Tuple, Union
 
+Identifier = Union[int, str]
 
-def parse(version: str) -> Tuple[str, str, str]:
-    parts = version.strip().split(".")
+
+def parse(version: str) -> Tuple[int, int, int, Tuple[Identifier, ...]]:
+    core, _, pre = version.strip().partition("-")
+    parts = core.split(".")
     if len(parts) != 3 or not all(p.isdigit() for p in parts):
         raise ValueError(f"not a version: {version!r}")
-    return parts[0], parts[1], parts[2]
+    ids: Tuple[Identifier, ...] = ()
+    if pre:
+        fields = pre.split(".")
+        if not all(fields):
+            raise ValueError(f"not a version: {version!r}")
+        ids = tuple(int(f) if f.isdigit() else f for f in fields)
+    return int(parts[0]), int(parts[1]), int(parts[2]), ids
+
+
+def _pre_key(ids: Tuple[Identifier, ...]):
+    # A release sorts after all of its pre-releases; numeric identifiers sort before
+    # alphanumeric ones; a shorter list of equal identifiers sorts first.
+    if not ids:
+        return (1,)
+    return (0, tuple((0, i, "") if isinstance(i, int) else (1, 0, i) for i in ids))
 
 
 def compare(a: str, b: str) -> int:
-    """-1 if a < b, 0 if equal, 1 if a > b."""
+    """-1 if a < b, 0 if equal, 1 if a > b (semver 2.0.0 precedence)."""
     pa, pb = parse(a), parse(b)
-    if pa < pb:
+    ka = (pa[:3], _pre_key(pa[3]))
+    kb = (pb[:3], _pre_key(pb[3]))
+    if ka < kb:
         return -1
-    if pa > pb:
+    if ka > kb:
         return 1
     return 0
 
PATCH
