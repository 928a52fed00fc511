#!/bin/bash
# Oracle for task fix-lru-recency: applies the reference fix.
set -euo pipefail
cd /workspace
git apply --whitespace=nowarn <<'PATCH'
diff --git a/kit/lru.py b/kit/lru.py
index 4c736e0..6000d89 100644
--- a/kit/lru.py
+++ b/kit/lru.py
@@ -14,6 +14,7 @@ class LRUCache:
         """The value for ``key`` (which becomes the most recently used), or ``default``."""
         if key not in self._data:
             return default
+        self._data.move_to_end(key)
         return self._data[key]
 
     def put(self, key, value) -> None:
PATCH
