"""envkit's state verifier (runs inside the sandbox as the verifier user).

    python3 /opt/envkit/state_verifier.py

Grades by the service's final database and the agent's answer, from the task's params
(ENVKIT_TASK_PARAMS):

    {"checks": [{"sql": "SELECT ...", "expect": [[...], ...]}, ...],   each earns credit
     "guards": [{"sql": "...", "expect": [...]}, ...],                 any failure: reward 0
     "answer": {"expect": "42", "type": "text" | "number" | "set"}}     earns credit

Reward = passed checks (+ the answer) / their count, or 0 when a guard fails (the agent
changed something it was not asked to). Last stdout line: {"reward", "passed", "total", ...}.
"""

import json
import os
import re
import sqlite3
import sys

DB = "/var/lib/envkit/db.sqlite"


def norm_text(s):
    return re.sub(r"\s+", " ", str(s)).strip().strip(".").casefold()


def number(s):
    cleaned = re.sub(r"[^0-9.\-]", "", str(s))
    return float(cleaned)


def answer_ok(spec, given):
    if given is None:
        return False
    kind = spec.get("type", "text")
    expect = spec["expect"]
    try:
        if kind == "number":
            return abs(number(given) - float(expect)) <= 1e-6 * max(1.0, abs(float(expect)))
        if kind == "set":
            split = lambda s: {norm_text(x) for x in re.split(r"[,\n;]", str(s)) if x.strip()}  # noqa: E731
            return split(given) == split(expect)
    except ValueError:
        return False
    return norm_text(given) == norm_text(expect)


def main():
    params = json.loads(os.environ.get("ENVKIT_TASK_PARAMS") or "{}")
    given = os.environ.get("ENVKIT_ANSWER")
    conn = sqlite3.connect(f"file:{DB}?mode=ro", uri=True)
    results, failed = [], []

    def run(check):
        got = [list(r) for r in conn.execute(check["sql"]).fetchall()]
        return got == check["expect"], got

    for guard in params.get("guards", []):
        ok, got = run(guard)
        if not ok:
            failed.append({"guard": guard["sql"][:200], "got": got[:5]})
    for check in params.get("checks", []):
        ok, got = run(check)
        results.append(ok)
        if not ok:
            failed.append({"check": check["sql"][:200], "got": got[:5]})
    if "answer" in params:
        ok = answer_ok(params["answer"], given)
        results.append(ok)
        if not ok:
            failed.append({"answer": (given or "")[:200]})
    total = len(results) or 1
    guards_ok = not any("guard" in f for f in failed)
    reward = round(sum(results) / total, 6) if guards_ok else 0.0
    print(json.dumps({"reward": reward, "passed": sum(results), "total": total, "guards_ok": guards_ok,
                      "failed": failed}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
