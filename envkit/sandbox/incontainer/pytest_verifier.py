"""envkit's pytest verifier (runs inside the sandbox as the verifier user).

    python3 /opt/envkit/pytest_verifier.py --tests DIR [--call-timeout S]

Runs DIR/<task id>.py, the task's hidden tests, in a trusted pytest process and prints the
reward: passed / total over those tests (partial credit).

The trust boundary: the pytest process never imports the workspace (which its user cannot
even read). Tests reach the agent's code only through ``envkit_check``, which runs it in
worker processes of the agent user and brings back JSON data (see envkit_check.py). Test
outcomes are recorded by a plugin in this process, not read from files the agent's code could
reach. The test file runs from a private copy, with conftest files, the cache and
third-party plugins disabled.

Last stdout line: {"reward", "passed", "total", "failed": [names], "agent_code": {calls,
timeouts, crashes, …}}. A test file that does not collect, or collects no test, is the
environment's problem: exit 3 with the reason on stderr (a verifier failure).
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BOOT = ("import sys; sys.path.insert(0, sys.argv[1]); import envkit_check, pytest; "
        "sys.exit(pytest.main(sys.argv[3:], plugins=[envkit_check.Plugin(sys.argv[2])]))")
KEEP_ENV = ("ENVKIT_CALLS", "ENVKIT_WORKSPACE", "ENVKIT_TASK_ID", "ENVKIT_TASK_PARAMS", "ENVKIT_SEED", "ENVKIT_ANSWER",
            "ENVKIT_ENV", "PATH", "LANG")


def main() -> int:
    parser = argparse.ArgumentParser(prog="pytest_verifier")
    parser.add_argument("--tests", required=True, help="folder of hidden tests, one <task id>.py each")
    parser.add_argument("--call-timeout", type=float, default=10.0, help="seconds for each call into the agent's code")
    args = parser.parse_args()
    task = os.environ.get("ENVKIT_TASK_ID", "")
    source = os.path.join(args.tests, f"{task}.py")
    if not task or not os.path.isfile(source):
        print(f"verify: no hidden tests for task {task!r}", file=sys.stderr)
        return 3
    with tempfile.TemporaryDirectory(prefix="envkit-verify-") as tmp:
        test_file = os.path.join(tmp, "test_task.py")
        shutil.copyfile(source, test_file)
        results = os.path.join(tmp, "results.json")
        env = {k: os.environ[k] for k in KEEP_ENV if k in os.environ}
        env.update(HOME=tmp, TMPDIR=tmp, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
                   ENVKIT_CALL_TIMEOUT_S=f"{args.call_timeout:g}")
        cmd = [sys.executable, "-I", "-c", BOOT, HERE, results, "-q", "-p", "no:cacheprovider", "--noconftest",
               f"--rootdir={tmp}", "-c", os.devnull, f"--basetemp={os.path.join(tmp, 'base')}", test_file]
        proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
        print(proc.stdout[-3000:] + proc.stderr[-2000:], file=sys.stderr)
        try:
            with open(results) as f:
                report = json.load(f)
        except (OSError, ValueError):
            print(f"verify: pytest ended ({proc.returncode}) without its results", file=sys.stderr)
            return 3
    outcomes = report.get("tests", {})
    if proc.returncode not in (0, 1) or not outcomes:
        why = ("collected no test" if not outcomes
               else f"did not run (pytest exit {proc.returncode}: a collection error)")
        missing = re.search(r"No module named '([^']+)'", proc.stdout + proc.stderr)
        if missing:
            why += (f": they import `{missing.group(1)}`, which this process cannot "
                    "(the agent's code is never imported by the verifier); "
                    "call it through envkit_check, e.g. function(\"" + missing.group(1) + ".NAME\")")
        print(f"verify: the hidden tests of {task!r} {why}; hidden tests reach the workspace only through envkit_check",
              file=sys.stderr)
        return 3
    failed = [name.rpartition("::")[2] for name, ok in outcomes.items() if not ok]
    passed = len(outcomes) - len(failed)
    print(json.dumps({"reward": round(passed / len(outcomes), 6), "passed": passed, "total": len(outcomes),
                      "failed": failed, "agent_code": report.get("agent_code", {})}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
