"""envkit's pytest verifier (runs inside the sandbox as the verifier user).

    python3 /opt/envkit/pytest_verifier.py --tests DIR

Runs DIR/<task id>.py (the task's hidden tests) against /workspace and prints the reward.

Reward = passed / total over the task's hidden tests (partial credit). The tests run from a
private copy, with conftest files and pytest's cache disabled and an isolated interpreter,
so files the agent left in the workspace cannot change how the tests are collected.
Last stdout line: {"reward": float, "passed": int, "total": int, "failed": [names]}.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

WORKSPACE = os.environ.get("ENVKIT_WORKSPACE", "/workspace")


def main() -> int:
    parser = argparse.ArgumentParser(prog="pytest_verifier")
    parser.add_argument("--tests", required=True, help="folder of hidden tests, one <task id>.py each")
    args = parser.parse_args()
    task = os.environ.get("ENVKIT_TASK_ID", "")
    source = os.path.join(args.tests, f"{task}.py")
    if not task or not os.path.isfile(source):
        print(f"verify: no hidden tests for task {task!r}", file=sys.stderr)
        return 3
    with tempfile.TemporaryDirectory(prefix="verify-") as tmp:
        test_file = os.path.join(tmp, "test_task.py")
        shutil.copyfile(source, test_file)
        report = os.path.join(tmp, "report.xml")
        cmd = [sys.executable, "-I", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest",
               f"--rootdir={tmp}", "-c", os.devnull, "-o", f"pythonpath={WORKSPACE}",
               f"--junitxml={report}", test_file]
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=300)
        passed, total, failed = 0, 0, []
        if os.path.exists(report):
            for case in ET.parse(report).getroot().iter("testcase"):
                total += 1
                if any(child.tag in ("failure", "error", "skipped") for child in case):
                    failed.append(case.get("name"))
                else:
                    passed += 1
        if total == 0:
            # Nothing collected: the agent's code did not import (a model failure, not ours).
            failed = ["<collection>"]
            total = 1
        print(proc.stdout[-3000:], file=sys.stderr)
    print(json.dumps({"reward": round(passed / total, 6), "passed": passed, "total": total, "failed": failed}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
