"""envkit's verifier for a project's own test suite (runs inside the sandbox as the verifier user).

    python3 /opt/envkit/suite_verifier.py --suite /env/suite

For a task made from a real project (``envkit synth``): the task's params name its
fail-to-pass tests; every other test of the suite's baseline is pass-to-pass. The reward is
1.0 only when both hold:

1. **The replayed calls match** (the trusted part). Each fail-to-pass test's recorded calls
   into the package (calltrace.py; recorded on the pristine project) are made again on the
   agent's code through the call server, one worker process of the agent user per test, and
   what comes back is compared here, as fresh data, with what the pristine project gave.
   The expected values never leave this process; the agent's code only ever sees the calls.
2. **The project's own tests pass**: fail-to-pass and pass-to-pass, run from a pristine copy
   of the test tree (the agent's edits to tests do not count) against the agent's package,
   as the agent (``envkit_check.run``). That process runs the agent's code, so its report is
   only as honest as that code: it catches an honest fix that breaks other tests; a forger
   cannot pass part 1 without answering the recorded calls right.

``suite.json``: ``{"tests": [ids], "files": [paths of the test tree], "repo": folder in /env,
"pytest_args": [...], "timeout_s": N}``; ``traces.json.gz`` (or ``traces.json``): ``{id: [steps]}``.
Part 1 runs first and stops at the first test whose calls differ; the suite (part 2, seconds
to minutes for a large project) runs only when every replayed call matched: the reward is 0
either way, and most episodes of an unfinished policy (and the null agent and most probes in
``envkit validate``) end there. Their report says so: ``"suite": "not run: …"`` and ``None``
for the suite's counts.
Last stdout line: ``{"reward", "fail_to_pass", "pass_to_pass", "replay", "agent_code"}``.
A missing suite file or a task without fail-to-pass tests is the environment's problem: exit 3.
"""

import argparse
import gzip
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import envkit_check  # noqa: E402
from calltrace import replay  # noqa: E402
from envkit_check import AgentError, Remote  # noqa: E402

MAX_FILES_BYTES = 24 * 1024 * 1024


def read_traces(folder):
    """The recorded calls: ``traces.json.gz`` (what envkit synth writes), else ``traces.json``."""
    packed = os.path.join(folder, "traces.json.gz")
    if os.path.exists(packed):
        with gzip.open(packed, "rt", encoding="utf-8") as f:
            return json.load(f)
    with open(os.path.join(folder, "traces.json"), encoding="utf-8") as f:
        return json.load(f)


def fail(message):
    print(f"verify: {message}", file=sys.stderr)
    return 3


def invoke(step, args, kwargs, refs):
    """One recorded call, made on the agent's code through the call server."""
    try:
        if "t" in step:  # the request itself, not call(): a recorded keyword may be named `timeout` or `target`
            value = envkit_check.session().request({"op": "call", "target": str(step["t"]), "args": list(args),
                                                     "kwargs": kwargs})
        else:
            target = refs[step["ref"]]
            if type(target) is not Remote:
                return {"exc": ["NotAnObject"]}, []
            value = (envkit_check.attribute(target, step["get"]) if "get" in step
                     else target._call(step["attr"], args, kwargs))
    except AgentError as e:
        if e.kind == "exception":
            return {"exc": [e.type or "?"]}, []
        return {"exc": [f"agent_{e.kind}"]}, []
    if type(step.get("out")) is dict and "$gen" in step["out"]:
        if type(value) is not Remote:  # data is never the generator the recording saw
            return _encoded(value), []
        return {"$gen": 1}, [value]
    return _encoded(value), _remotes(value)


class _Object:
    def __init__(self, remote):
        self.type, self.repr = remote._type, remote._repr


def _swap(v):
    t = type(v)
    if t is Remote:
        return _Object(v)
    if t in (list, tuple):
        return t(_swap(x) for x in v)
    if t in (set, frozenset):
        return t(_swap(x) for x in v)
    if t is dict:
        return {_swap(k): _swap(x) for k, x in v.items()}
    return v


def _encoded(value):
    """What came back, in the recorded encoding: data as data, objects by type and repr."""
    return envkit_check.encode(_swap(value), lambda obj: {"$ref": 0, "type": obj.type, "repr": obj.repr})


def _remotes(value):
    found = []

    def walk(v):
        if type(v) is Remote:
            found.append(v)
        elif type(v) in (list, tuple, set, frozenset):
            for x in v:
                walk(x)
        elif type(v) is dict:
            for k, x in v.items():
                walk(k)
                walk(x)
    walk(value)
    return found


def replay_tests(ids, traces):
    """Each test's recorded calls, test after test, up to the first test whose calls differ."""
    checked, replayed, mismatches = 0, 0, []
    for test in ids:
        replayed += 1
        try:
            n, mismatch = replay(traces.get(test) or [], invoke)
        except AgentError as e:  # e.g. an object of a worker that was replaced
            n, mismatch = 0, {"step": 0, "why": f"agent_{e.kind}"}
        finally:
            envkit_check.end_session()  # each test's calls in a fresh worker, as the recording had
        checked += n
        if mismatch is not None:
            mismatches.append({"test": test, **mismatch})
            break
    return {"tests": len(ids), "replayed": replayed, "steps_matched": checked, "mismatches": mismatches,
            "failed": len(mismatches)}


def run_suite(suite, root, ids, timeout):
    """The project's tests from a pristine copy of the test tree, as the agent."""
    files, total = {"envkit-ids.txt": "\n".join(ids) + "\n"}, 0
    for rel in suite["files"]:
        with open(os.path.join(root, rel), "rb") as f:
            data = f.read()
        total += len(data)
        if total > MAX_FILES_BYTES:
            raise ValueError(f"the test tree is over {MAX_FILES_BYTES >> 20} MiB")
        try:
            files[rel] = data.decode()
        except UnicodeDecodeError:
            files[rel] = data
    # -I -S: PYTHONPATH (/workspace), the user site and sitecustomize off from the first process on
    # (suite_runner.py starts itself again with -S and adds the site folders itself)
    argv = ["python3", "-I", "-S", os.path.join(HERE, "suite_runner.py"), "run", "--out", "-", "--ids",
            "envkit-ids.txt", "--", *suite.get("pytest_args", [])]
    try:
        done = envkit_check.run(argv, files=files, timeout=timeout)
    except AgentError as e:
        return None, f"the test run did not finish ({e.kind}: {e.message[:200]})"
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    try:
        report = json.loads(lines[-1])
        not_passed = report["not_passed"]
        if type(not_passed) is not list:
            raise TypeError
    except (IndexError, ValueError, KeyError, TypeError):
        return None, f"the test run gave no report (exit {done.returncode}): {done.stderr[-300:]}"
    return set(map(str, not_passed)), None


def main():
    parser = argparse.ArgumentParser(prog="suite_verifier")
    parser.add_argument("--suite", required=True, help="folder holding suite.json and traces.json.gz")
    args = parser.parse_args()
    try:
        with open(os.path.join(args.suite, "suite.json")) as f:
            suite = json.load(f)
        traces = read_traces(args.suite)
    except (OSError, EOFError, ValueError) as e:
        return fail(f"cannot read the suite's files in {args.suite}: {e}")
    params = json.loads(os.environ.get("ENVKIT_TASK_PARAMS") or "{}")
    f2p = [str(t) for t in params.get("fail_to_pass", [])]
    if not f2p:
        return fail(f"task {os.environ.get('ENVKIT_TASK_ID')!r} names no fail_to_pass tests in its params")
    p2p = [t for t in suite["tests"] if t not in set(f2p)]
    root = os.path.join(os.path.dirname(os.path.abspath(args.suite)), suite.get("repo", "repo"))

    replayed = replay_tests(f2p, traces)
    if replayed["failed"]:
        print(json.dumps({"reward": 0.0, "fail_to_pass": {"total": len(f2p), "failed": None},
                          "pass_to_pass": {"total": len(p2p), "failed": None}, "replay": replayed,
                          "suite": "not run: a replayed call already differs from the pristine project's",
                          "agent_code": envkit_check.stats()}))
        return 0
    try:
        not_passed, why = run_suite(suite, root, f2p + p2p, float(suite.get("timeout_s", 120)))
    except (OSError, ValueError) as e:
        return fail(f"cannot send the pristine test tree: {e}")
    if not_passed is None:
        f2p_failed, p2p_failed = len(f2p), len(p2p)
    else:
        f2p_failed = sum(1 for t in f2p if t in not_passed)
        p2p_failed = sum(1 for t in p2p if t in not_passed)
    ok = not_passed is not None and f2p_failed == 0 and p2p_failed == 0
    out = {"reward": 1.0 if ok else 0.0,
           "fail_to_pass": {"total": len(f2p), "failed": f2p_failed},
           "pass_to_pass": {"total": len(p2p), "failed": p2p_failed},
           "replay": replayed, "agent_code": envkit_check.stats()}
    if why:
        out["suite_error"] = why
    elif not_passed:
        out["not_passed"] = sorted(not_passed)[:10]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    if sys.flags.hash_randomization and not sys.flags.ignore_environment:
        # Under the hash seed the calls were recorded with (suite_runner.CLEAN_ENV): replay rebuilds
        # a recorded set here and sends it on in this process's order, so a generator over it
        # yields the recorded sequence (pathspec, 2026-12-07: the fix scored 0 on 2 of 6 tasks, at random)
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONHASHSEED": "0"})
    sys.exit(main())
