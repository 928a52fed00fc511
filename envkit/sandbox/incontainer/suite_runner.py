"""Run a project's own tests and report each test's outcome as JSON (inside the sandbox).

    python3 suite_runner.py [--path DIR] run --out FILE [--ids FILE] [--select FILE] [--trace FILE | --cover FILE]
        [--package PATH...] -- PYTEST_ARGS...
    python3 suite_runner.py [--path DIR] replay --traces FILE --ids FILE --out FILE

It always runs as ``python3 -S`` with PYTHONPATH unset (it starts itself again so): the site
folders are added by it, .pth files included (an image's envkit-workspace.pth puts the project
on the path for the agent), but no sitecustomize. ``--path DIR`` puts DIR first on the path
(outside an image: the tests of this module).

``run`` runs pytest in this process with a plugin that records, per test id, its outcome
(``passed``, ``failed``, ``error``, ``skipped``), its call duration and, for a failure, the
first lines of its crash message; collection errors are listed apart. With ``--ids``, only
the listed tests' outcomes are written: ``{"not_passed": [ids], "collected": N,
"collection_errors": [...]}``. With ``--trace``, the calls each test makes into the
package (``--package``: the package's folders or module files) are recorded
(calltrace.Recorder) and written as ``{id: [steps]}``. With ``--select``, only the listed
tests run (the others are collected, then deselected). With ``--cover``, the package's
functions each test's call runs are written as ``{"functions": {"FILE:QUALNAME": [ids]},
"outside": [...]}``; "outside" holds those run anywhere else (imports, collection, fixtures,
teardown), whose results any test may share.

``replay`` makes each listed test's recorded calls again, each test in a fresh process,
and writes ``{id: [checked, mismatch]}``.

This runs as the agent: the project's code runs in this process, so what it writes is only
as trustworthy as that code (the verifier trusts the replayed calls, not this report).
``FILE`` ``-`` is the last line of stdout.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

MESSAGE_LINES = 4
MESSAGE_CHARS = 400


class Outcomes:
    """A pytest plugin: each test's outcome, duration and crash message."""

    def __init__(self, recorder=None, traced=None, select=None, cover=None):
        self.tests = {}
        self.select = select
        self.cover = cover
        self.collection_errors = []
        self.recorder = recorder
        self.traced = traced
        self.traces = {}
        self.names, self.ambiguous = {}, []

    def pytest_collection_modifyitems(self, session, config, items):
        """Test ids by a name that stays put: pytest numbers parameters it cannot name
        (``expected3``) in the order of their list, which a set of tuples changes from run to
        run; such parts become ``expected#``. Names two tests then share are left out."""
        seen = {}
        for item in items:
            seen.setdefault(_stable_id(item), []).append(item.nodeid)
        self.names = {nodes[0]: key for key, nodes in seen.items() if len(nodes) == 1}
        self.ambiguous = sorted(key for key, nodes in seen.items() if len(nodes) > 1)
        if self.select is not None:
            keep = [item for item in items if self.names.get(item.nodeid) in self.select]
            gone = [item for item in items if self.names.get(item.nodeid) not in self.select]
            if gone:
                config.hook.pytest_deselected(items=gone)
            items[:] = keep

    def pytest_collectreport(self, report):
        if report.failed:
            self.collection_errors.append({"node": report.nodeid, "message": _message(report)})

    def pytest_runtest_logreport(self, report):
        name = self.names.get(report.nodeid)
        if name is None:
            return
        entry = self.tests.setdefault(name, {"outcome": "passed", "duration": 0.0})
        entry["duration"] = round(entry["duration"] + report.duration, 4)
        if report.failed:
            entry["outcome"] = "failed" if report.when == "call" else "error"
            entry.setdefault("message", _message(report))
        elif report.skipped and entry["outcome"] == "passed":
            entry["outcome"] = "skipped"

    def _traced(self, item):
        name = self.names.get(item.nodeid)
        return self.recorder is not None and name is not None and (self.traced is None or name in self.traced)

    def pytest_runtest_setup(self, item):
        if self._traced(item):
            self.recorder.start()

    def pytest_runtest_call(self, item):  # runs before the test function is called
        if self.cover is not None:
            self.cover.enter(self.names.get(item.nodeid))

    def pytest_runtest_teardown(self, item):  # before the fixtures' finalizers
        if self.cover is not None:
            self.cover.enter(None)
        if self._traced(item):
            self.traces[self.names[item.nodeid]] = self.recorder.stop()


class Cover:
    """Which of the package's functions each test's call runs: a trace function that sees
    only frames being entered (it returns None, so no line events), keyed by file and
    qualified name with ``<locals>``, lambdas and comprehensions folded into their function."""

    def __init__(self, packages):
        self.roots = tuple(os.path.abspath(p) for p in packages)
        self.keys = {}
        self.current = self.outside = set()
        self.by_test = {}

    def enter(self, test):
        self.current = self.outside if test is None else self.by_test.setdefault(test, set())

    def _key(self, code):
        name = code.co_filename
        if not any(name == r or name.startswith(r + os.sep) for r in self.roots):
            return None
        parts = [p for p in code.co_qualname.split(".") if not p.startswith("<")]
        return f"{name}:{'.'.join(parts)}" if parts else None

    def trace(self, frame, event, arg):
        code = frame.f_code
        key = self.keys.get(code, 0)
        if key == 0:
            key = self.keys[code] = self._key(code)
        if key is not None:
            self.current.add(key)

    def start(self):
        import threading

        threading.settrace(self.trace)
        sys.settrace(self.trace)

    def stop(self):
        import threading

        sys.settrace(None)
        threading.settrace(None)
        functions = {}
        for test, keys in sorted(self.by_test.items()):
            for key in keys:
                functions.setdefault(key, []).append(test)
        return {"functions": functions, "outside": sorted(self.outside)}


def _stable_id(item):
    spec = getattr(item, "callspec", None)
    if spec is None or "[" not in item.nodeid:
        return item.nodeid
    head, _, ids = item.nodeid.partition("[")
    parts = ids[:-1].split("-")
    for i, part in enumerate(parts):
        name = part.rstrip("0123456789")
        if name != part and name in spec.params:
            parts[i] = name + "#"
    return f"{head}[{'-'.join(parts)}]"


def _message(report):
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    text = getattr(crash, "message", None) or str(getattr(report, "longrepr", "") or "")
    lines = [line for line in text.splitlines() if line.strip()][:MESSAGE_LINES]
    return "\n".join(lines)[:MESSAGE_CHARS]


def _write(path, data):
    text = json.dumps(data, separators=(",", ":"))
    if path == "-":
        print("\n" + text, flush=True)
    else:
        with open(path, "w") as f:
            f.write(text)


def _read_ids(path):
    with open(path) as f:
        return [line.rstrip("\n") for line in f if line.strip()]


def run(argv, pytest_args):
    import argparse

    parser = argparse.ArgumentParser(prog="suite_runner run")
    parser.add_argument("--out", required=True)
    parser.add_argument("--ids")
    parser.add_argument("--trace")
    parser.add_argument("--cover")
    parser.add_argument("--select")
    parser.add_argument("--package", action="append", default=[])
    args = parser.parse_args(argv)
    ids = _read_ids(args.ids) if args.ids else None
    recorder = None
    if args.trace:
        from calltrace import Recorder

        recorder = Recorder(args.package, [os.getcwd()])
    cover = Cover(args.package) if args.cover else None
    import pytest

    plugin = Outcomes(recorder, set(ids) if ids is not None and recorder is not None else None,
                      set(_read_ids(args.select)) if args.select else None, cover)
    t0 = time.monotonic()
    if cover is not None:
        cover.start()
    try:
        code = pytest.main(["-p", "no:cacheprovider", *pytest_args], plugins=[plugin])
    finally:
        covered = cover.stop() if cover is not None else None
    seconds = round(time.monotonic() - t0, 3)
    if args.trace:
        _write(args.trace, plugin.traces)
    if covered is not None:
        _write(args.cover, covered)
    report = {"exit": int(code), "seconds": seconds, "collected": len(plugin.tests),
              "collection_errors": plugin.collection_errors[:50], "ambiguous": len(plugin.ambiguous)}
    if ids is None:
        report["tests"] = plugin.tests
    else:
        report["not_passed"] = [i for i in ids if plugin.tests.get(i, {}).get("outcome") != "passed"]
    _write(args.out, report)
    return 0


def replay(argv):
    import argparse

    from calltrace import replay_local

    parser = argparse.ArgumentParser(prog="suite_runner replay")
    parser.add_argument("--traces", required=True)
    parser.add_argument("--ids", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    with open(args.traces) as f:
        traces = json.load(f)
    _write(args.out, replay_local(traces, _read_ids(args.ids)))
    return 0


CLEAN_ENV = {"PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}


def main(argv):
    if not sys.flags.no_site or any(os.environ.get(k) != v for k, v in CLEAN_ENV.items()) or "PYTHONPATH" in os.environ:
        # Run again, the same way every time: test ids made from sets or dicts of strings
        # (parametrize) change with hash randomisation, so one fixed seed keeps the baseline's
        # ids the verifier's; no .pyc (a file rewritten within the same second at the same size
        # would run its old code); and no site start-up: neither PYTHONPATH nor a
        # sitecustomize.py anywhere on the path runs before the tests (the site folders are
        # added below, their .pth files included, so the project still imports).
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        os.execve(sys.executable, [sys.executable, "-S", *argv], {**env, **CLEAN_ENV})
    import site

    for folder in site.getsitepackages():
        site.addsitedir(folder)
    while argv[1:2] == ["--path"]:
        sys.path.insert(0, os.path.abspath(argv[2]))
        argv = [argv[0], *argv[3:]]
    if argv[1:2] == ["run"]:
        rest = argv[2:]
        i = rest.index("--") if "--" in rest else len(rest)
        return run(rest[:i], rest[i + 1:])
    if argv[1:2] == ["replay"]:
        return replay(argv[2:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
