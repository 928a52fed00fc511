#!/bin/bash
# Oracle for task add-csv-filter: applies the reference fix.
set -euo pipefail
cd /workspace
git apply --whitespace=nowarn <<'PATCH'
diff --git a/kit/csvtool.py b/kit/csvtool.py
index 35540fd..3b82ff1 100644
--- a/kit/csvtool.py
+++ b/kit/csvtool.py
@@ -13,12 +13,25 @@ def main(argv=None) -> int:
     parser = argparse.ArgumentParser(prog="csvtool")
     parser.add_argument("file")
     parser.add_argument("--sum", dest="column", required=True, help="column to add up")
+    parser.add_argument("--where", action="append", default=[], metavar="COLUMN=VALUE",
+                        help="only rows whose COLUMN equals VALUE (repeatable; all must match)")
     args = parser.parse_args(argv)
+    conditions = []
+    for item in args.where:
+        name, eq, value = item.partition("=")
+        if not eq or not name:
+            print(f"csvtool: --where takes COLUMN=VALUE, got {item!r}", file=sys.stderr)
+            return 2
+        conditions.append((name, value))
     with open(args.file, newline="") as f:
-        rows = list(csv.DictReader(f))
-    if rows and args.column not in rows[0]:
-        print(f"csvtool: no column {args.column!r}", file=sys.stderr)
-        return 2
+        reader = csv.DictReader(f)
+        header = reader.fieldnames or []
+        rows = list(reader)
+    for name in [args.column] + [name for name, _ in conditions]:
+        if header and name not in header:
+            print(f"csvtool: no column {name!r}", file=sys.stderr)
+            return 2
+    rows = [row for row in rows if all(row[name] == value for name, value in conditions)]
     total = column_sum(rows, args.column)
     print(f"{total:g}")
     return 0
PATCH
