"""Grade a one-line shell command against the task's target.

reward = 0    when the program (first word) differs, or there is no answer;
       = 0.5 + 0.5 * similarity(arguments, target arguments) otherwise (difflib ratio),
         so the exact command earns 1.0.
Prints {"reward": r, ...} as its last line.
"""

import difflib
import json
import os

target = json.loads(os.environ["ENVKIT_TASK_PARAMS"])["target"]
answer = os.environ.get("ENVKIT_ANSWER", "").strip().splitlines()
given = answer[0].strip() if answer else ""
g, t = given.split(None, 1), target.split(None, 1)
if not g or g[0] != t[0]:
    reward = 0.0
else:
    ga, ta = (g[1] if len(g) > 1 else ""), (t[1] if len(t) > 1 else "")
    reward = 0.5 + 0.5 * (difflib.SequenceMatcher(None, ga, ta).ratio() if (ga or ta) else 1.0)
print(json.dumps({"reward": round(reward, 6), "given": given[:200], "target": target}))
