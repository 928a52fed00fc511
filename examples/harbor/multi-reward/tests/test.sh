#!/bin/bash
python3 - <<'PY'
import json
try:
    r = json.load(open('/app/report.json'))
except Exception:
    r = {}
c = 1.0 if r.get('total') == 10 else 0.0
items = r.get('items')
s = 1.0 if isinstance(items, list) and len(items) == 4 and all(isinstance(i, str) for i in items) else 0.0
json.dump({'correctness': c, 'shape': s}, open('/logs/verifier/reward.json', 'w'))
PY
