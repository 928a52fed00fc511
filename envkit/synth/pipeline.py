"""envkit synth: a real Python project in, a validated repo environment of bug-fixing tasks out.

The steps (each suite run inside a sandbox of the project's own image, as the agent user,
under the sandbox's time, memory and process limits; the host never runs the project's code
but for pip's metadata step of an sdist download):

1. **Source**: the sdist (sha256 recorded), a folder, or a git commit's files; pytest's
   configuration made runnable without plugins the project does not ship.
2. **Image**: the test dependencies (and pytest) resolved once into ``python.lock`` (hashes);
   a staging environment is built on the base (wheels layer + the pristine project).
3. **Baseline**: the suite runs three times; only tests that pass every time are used. A
   project with < 80% passing or a suite slower than 60 s is refused with the reason.
4. **Candidates**: seeded mutations (envkit.synth.mutate), each checked by one run of the
   tests whose call runs the changed function (a coverage map from one traced baseline run;
   the whole suite where the function also runs outside a test's call): kept when at least
   one of them fails, collection works and it ends within its cap. A change to a function no
   test runs is dropped without a run.
5. **Traces**: the failing tests' calls into the package are recorded on the pristine code
   and replayed twice there (what does not replay the same is cut); a candidate is kept only
   when a replayed call tells it apart from the fix, and when a second run, of the whole
   suite, fails the same tests (flakes dropped, and bugs that fail tests the map did not
   link to the function: the map only makes the first check cheaper). Combinations of 2-3 kept
   bugs are checked the same way.
6. **Output**: tasks (patch, fix, fail-to-pass tests, text), the suite's files for the
   verifier (suite_verifier.py), and a provenance file with every drop and its reason.
"""

from __future__ import annotations

import gzip
import json
import os
import queue
import random
import re
import shutil
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envkit.errors import UserError
from envkit.refs import is_semver
from envkit.synth import mutate, text
from envkit.synth.project import Project, analyse, neutralise_config
from envkit.synth.source import Source, fetch
from envkit.version import __version__

__all__ = ["SynthResult", "synth"]

BASELINE_RUNS = 3
MIN_PASSING = 0.8
MAX_SUITE_S = 60.0
SLOW_TEST_S = 2.0  # a test slower than this in the baseline is left out (every check and verification would pay it)
MAX_F2P_STORED = 12
MAX_TRACE_BYTES = 3000  # a test's recorded calls kept (a prefix): what a task stores stays small
CANDIDATES_PER_TASK = 3
INVALID = "the change does not make a different, valid module"
SUITE = "/tmp/envkit-suite"
RUNNER = "/opt/envkit/suite_runner.py"
NETWORK_ERRORS = re.compile(r"Network is unreachable|Temporary failure in name resolution|Name or service not known|"
                            r"gaierror|ConnectionRefusedError|urlopen error|Max retries exceeded|No route to host")
Progress = Callable[[str, int, int], None]


@dataclass
class Candidate:
    sites: list[mutate.Site]
    mutation: mutate.Mutation | None = None
    fail_to_pass: list[str] = field(default_factory=list)
    messages: dict[str, str] = field(default_factory=dict)
    drop: str | None = None
    discriminating: list[str] = field(default_factory=list)
    selected: set[str] | None = None  # the tests the first check ran (None: the whole suite)
    unlinked: int = 0  # failing tests the coverage map did not link to the function (found by the whole suite)

    @property
    def family(self) -> str:
        return self.sites[0].family if len(self.sites) == 1 else "combo"

    @property
    def label(self) -> str:
        return " + ".join(f"{s.file}:{s.line} {s.function} ({s.family})" for s in self.sites)


@dataclass
class Coverage:
    """Which stable tests' calls run each function (``file:qualname``, as mutate names them),
    and the functions that also run outside any test's call (imports, fixtures)."""

    functions: dict[str, set[str]]
    outside: set[str]

    def tests_for(self, sites: list[mutate.Site]) -> set[str] | None:
        """The tests a change at ``sites`` can make fail, or None: any of them."""
        keys = {f"{s.file}:{s.function}" for s in sites}
        if keys & self.outside:
            return None
        return set().union(*(self.functions.get(k, set()) for k in keys))


@dataclass
class SynthResult:
    out: Path
    tasks: int
    tried: int
    kept: int
    seconds: float
    drops: dict[str, int]
    by_family: dict[str, dict[str, int]]
    baseline: dict[str, Any]


def _noop(stage: str, done: int, total: int) -> None:
    pass


# -- the sandbox side ------------------------------------------------------------------------------

class SuiteBox:
    """One sandbox of the staging image with the pristine test tree copied to SUITE; runs
    the suite on the workspace (with a mutation written in), and replays traces."""

    def __init__(self, sandbox: Any, project: Project) -> None:
        from envkit.sandbox import AGENT

        self.sandbox, self.project, self.agent = sandbox, project, AGENT
        self.pristine = {rel: (project.root / rel).read_bytes() for rel in project.source_files()}
        sandbox.reset(0)
        paths = " ".join(_quote(p) for p in [*project.test_dirs, *[c for c in project.test_files() if "/" not in c]])
        res = sandbox.exec(f"mkdir -p {SUITE} && tar -C /workspace -cf - {paths} | tar -C {SUITE} -xf -", timeout_s=120)
        if res.exit_code != 0:
            raise UserError(f"could not copy the test tree in the sandbox: {res.stderr[-300:]}",
                            "report this as an envkit bug")

    def _write(self, files: dict[str, str]) -> None:
        for rel, data in files.items():
            self.sandbox.put_file(f"/workspace/{rel}", data.encode(), mode=0o644)

    def _restore(self, files: dict[str, str]) -> None:
        for rel in files:
            self.sandbox.put_file(f"/workspace/{rel}", self.pristine[rel], mode=0o644)

    def run(self, files: dict[str, str], timeout_s: float, *, trace_ids: list[str] | None = None,
            replay_ids: list[str] | None = None, traces: dict[str, Any] | None = None, select: list[str] | None = None,
            cover: bool = False) -> dict[str, Any]:
        """The suite (or the ``select``ed tests) on the workspace with ``files`` written in
        (then restored): ``{"report", "replay", "traces", "cover", "timeout", "log"}``."""
        packages = " ".join(f"--package /workspace/{_quote(p)}" for p in self.project.package_paths)
        args = " ".join(_quote(a) for a in self.project.pytest_args())
        steps = ["rm -f /tmp/envkit-out.json /tmp/envkit-replay.json /tmp/envkit-cover.json"]
        options = ""
        if trace_ids is not None:
            self.sandbox.put_file("/tmp/envkit-trace-ids.txt", "\n".join(trace_ids).encode())
            options += f" --ids /tmp/envkit-trace-ids.txt --trace /tmp/envkit-traces.json {packages}"
        elif cover:
            options += f" --cover /tmp/envkit-cover.json {packages}"
        if select is not None:
            self.sandbox.put_file("/tmp/envkit-select.txt", "\n".join(select).encode())
            options += " --select /tmp/envkit-select.txt"
        steps.append(f"python3 {RUNNER} run --out /tmp/envkit-out.json{options} -- {args} >/tmp/envkit-log.txt 2>&1")
        if replay_ids:
            assert traces is not None
            self.sandbox.put_file("/tmp/envkit-replay-traces.json",
                                  json.dumps({t: traces[t] for t in replay_ids}).encode())
            self.sandbox.put_file("/tmp/envkit-replay-ids.txt", "\n".join(replay_ids).encode())
            # as the verifier replays: from /, with no test tree and none of the files the tests
            # made (pytest's temporary folders), so a call that only works beside them is cut
            steps.append(f"cd / && mv {SUITE} {SUITE}.away && rm -rf /tmp/pytest-of-*; "
                         f"python3 {RUNNER} replay --traces /tmp/envkit-replay-traces.json "
                         "--ids /tmp/envkit-replay-ids.txt --out /tmp/envkit-replay.json >>/tmp/envkit-log.txt 2>&1; "
                         f"mv {SUITE}.away {SUITE}")
        self._write(files)
        try:
            back = f"if [ -d {SUITE}.away ]; then rm -rf {SUITE} && mv {SUITE}.away {SUITE}; fi"  # a replay cut short
            res = self.sandbox.exec(f"{back}; cd {SUITE} && {'; '.join(steps)}", timeout_s=timeout_s)
        finally:
            if files:
                self.sandbox.kill_processes(self.agent)
                self._restore(files)
        out: dict[str, Any] = {"timeout": res.timed_out or res.limit_hit is not None, "limit": res.limit_hit}
        for key, path in (("report", "/tmp/envkit-out.json"), ("replay", "/tmp/envkit-replay.json"),
                          ("traces", "/tmp/envkit-traces.json" if trace_ids is not None else ""),
                          ("cover", "/tmp/envkit-cover.json" if cover else "")):
            if path:
                try:
                    out[key] = json.loads(self.sandbox.get_file(path, max_bytes=64 << 20))
                except (FileNotFoundError, ValueError):
                    out[key] = None
        if out.get("report") is None:
            try:
                out["log"] = self.sandbox.get_file("/tmp/envkit-log.txt",
                                                   max_bytes=1 << 20).decode(errors="replace")[-2000:]
            except (FileNotFoundError, ValueError):
                out["log"] = ""
        return out


def _quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


class Boxes:
    """J sandboxes, handed out one per check."""

    def __init__(self, boxes: list[SuiteBox]) -> None:
        self.all = boxes
        self.free: queue.Queue[SuiteBox] = queue.Queue()
        for b in boxes:
            self.free.put(b)

    @contextmanager
    def one(self) -> Iterator[SuiteBox]:
        box = self.free.get()
        try:
            yield box
        finally:
            self.free.put(box)

    @contextmanager
    def _workers(self) -> Iterator[ThreadPoolExecutor]:
        """A thread per box. Interrupted (Ctrl-C, SIGTERM: an exception that is not an
        ``Exception``), the boxes' sandboxes go at once, so the runs in them end now rather than
        at their cap (a suite run may take minutes; the threads are joined before the caller's
        own clean-up, which then finds them gone), and no queued check starts."""
        pool = ThreadPoolExecutor(max_workers=len(self.all))
        try:
            yield pool
        except BaseException as e:
            if not isinstance(e, Exception):
                self._end_runs()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _end_runs(self) -> None:
        for b in self.all:
            try:
                b.sandbox.destroy()
            except Exception:  # noqa: BLE001 - cleanup while unwinding: the caller destroys what is left
                pass

    def map(self, fn: Callable[[SuiteBox, Any], Any], items: list[Any], progress: Callable[[], None]) -> list[Any]:
        def work(item: Any) -> Any:
            with self.one() as box:
                try:
                    return fn(box, item)
                finally:
                    progress()
        with self._workers() as pool:
            return list(pool.map(work, items))

    def until(self, fn: Callable[[SuiteBox, Any], Any], items: list[Any], *, settle: Callable[[Any], None],
              enough: Callable[[], bool], progress: Callable[[], None]) -> int:
        """``fn`` over ``items`` in their order, each started the moment a box frees (no box
        waits for another's straggler); ``settle`` takes each item's result in order, and no
        item is started once ``enough()`` holds after one. Returns how many items count (a
        prefix): those beyond it that had started are left out, so what counts does not
        depend on which run finished first."""
        box_count = len(self.all)
        finished: set[int] = set()
        counted, started = 0, 0

        def work(i: int) -> None:
            with self.one() as box:
                try:
                    fn(box, items[i])
                finally:
                    progress()
        with self._workers() as pool:
            running: dict[Future[None], int] = {}
            stop = False
            while True:
                while not stop and started < len(items) and len(running) < box_count:
                    running[pool.submit(work, started)] = started
                    started += 1
                if not running:
                    break
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for f in done:
                    finished.add(running.pop(f))
                    f.result()
                while not stop and counted in finished:
                    settle(items[counted])
                    counted += 1
                    stop = enough()
        return counted


# -- the pipeline ---------------------------------------------------------------------------------

def _outcomes(report: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return (report or {}).get("tests") or {}


def baseline(boxes: Boxes, project: Project, progress: Progress) -> tuple[list[str], dict[str, Any]]:
    """Three runs on the pristine project: the tests that pass every time, and the figures. A
    test file that does not collect here (it needs an extra the project's test requirements do
    not list, e.g. a diagram library) stops pytest's whole run: such files are left out
    (``--ignore``, for the verifier too) with their errors, and the baseline runs again."""
    first = _baseline_runs(boxes, project, progress)
    broken = {e["node"].split("::")[0]: str(e.get("message", ""))[:300]
              for r in first for e in ((r.get("report") or {}).get("collection_errors") or [])}
    if broken and not project.ignored:
        project.ignored = sorted(broken)
        stable, figures = _baseline_figures(_baseline_runs(boxes, project, progress), project)
    else:
        stable, figures = _baseline_figures(first, project)
    slow = slow_tests(figures["durations"])
    if slow:  # left out (--deselect, for the verifier too), and the baseline runs again without them
        project.deselected = sorted(slow)
        stable, figures = _baseline_figures(_baseline_runs(boxes, project, progress), project)
    figures["ignored_files"] = {path: broken[path] for path in project.ignored if path in broken}
    figures["slow_tests_s"] = slow
    if max(figures["runs_s"]) > MAX_SUITE_S:  # the suite as every check runs it: its slow tests already left out
        without = f", with its {len(slow)} tests slower than {SLOW_TEST_S:.0f} s left out" if slow else ""
        raise UserError(f"{project.name}'s test suite takes {max(figures['runs_s']):.1f} s{without} (limit "
                        f"{MAX_SUITE_S:.0f} s): every candidate bug runs it",
                        "pick a smaller project, or a version with a faster suite")
    return stable, figures


def slow_tests(durations: dict[str, float], limit_s: float = SLOW_TEST_S) -> dict[str, float]:
    """The tests that took longer than ``limit_s`` in the baseline (more-itertools' prime sieve,
    17 s of a 40-s suite): every first check, confirmation and verification would run them.
    Only ids pytest can be given back (not the stable ``argname#`` form of an unnamed parameter)."""
    return {t: round(d, 2) for t, d in sorted(durations.items()) if d > limit_s and "#" not in t}


def _baseline_runs(boxes: Boxes, project: Project, progress: Progress) -> list[dict[str, Any]]:
    done = [0]

    def tick() -> None:
        done[0] += 1
        progress("baseline", done[0], BASELINE_RUNS)
    return boxes.map(lambda box, _: box.run({}, MAX_SUITE_S * 2 + 30), list(range(BASELINE_RUNS)), tick)


def _baseline_figures(runs: list[dict[str, Any]], project: Project) -> tuple[list[str], dict[str, Any]]:
    if any(r.get("report") is None for r in runs):
        bad = next(r for r in runs if r.get("report") is None)
        why = "ran past 2 min" if bad["timeout"] else f"gave no report: {bad.get('log', '')[-600:]}"
        raise UserError(f"{project.name} {project.version}'s test suite {why}",
                        "check that its tests run with pytest and only the packages its metadata lists for tests")
    reports: list[dict[str, Any]] = [r["report"] for r in runs]
    collected = max(r["collected"] for r in reports)
    names = set(_outcomes(reports[0]))
    stable = sorted(t for t in names if all(_outcomes(r).get(t, {}).get("outcome") == "passed" for r in reports))
    failing = [t for t in names if _outcomes(reports[0])[t]["outcome"] in ("failed", "error")]
    flaky = [t for t in names if t not in stable and _outcomes(reports[0])[t]["outcome"] == "passed"]
    seconds = [float(r["seconds"]) for r in reports]
    total = collected + int(reports[0].get("ambiguous", 0))
    figures = {"runs_s": seconds, "collected": collected, "stable": len(stable), "failing": len(failing),
               "flaky": len(flaky),
               "skipped": sum(1 for t in names if _outcomes(reports[0])[t]["outcome"] == "skipped"),
               "ambiguous_ids": int(reports[0].get("ambiguous", 0)),
               "collection_errors": [e["node"] for e in reports[0].get("collection_errors", [])][:20],
               "durations": {t: _outcomes(reports[0])[t]["duration"] for t in stable}}
    share = len(stable) / total if total else 0.0
    if share < MIN_PASSING:
        network = sum(1 for t in failing if NETWORK_ERRORS.search(_outcomes(reports[0])[t].get("message", "")))
        why = (f"{network} of them fail reaching the network, which sandboxes do not have" if network > len(failing) / 2
               else f"collection errors: {figures['collection_errors'][:3]}" if figures["collection_errors"]
               else f"e.g. {failing[:2]}")
        raise UserError(f"only {len(stable)} of {total} tests of {project.name} {project.version} pass every time "
                        f"({share:.0%}; at least {MIN_PASSING:.0%} needed): {why}",
                        "pick a version whose suite passes offline with pytest alone, or a project whose tests do not "
                        "need the network or services")
    return stable, figures


def coverage(boxes: Boxes, stable: set[str], progress: Progress) -> tuple[Coverage | None, float]:
    """One traced run of the pristine suite: the map from functions to the stable tests whose
    call runs them (None when that run fails: every check then runs the whole suite)."""
    t = time.monotonic()
    progress("coverage", 0, 1)
    with boxes.one() as box:
        out = box.run({}, MAX_SUITE_S * 4 + 30, cover=True)
    progress("coverage", 1, 1)
    data = out.get("cover")
    if not data or out["timeout"]:
        return None, round(time.monotonic() - t, 2)

    def rel(key: str) -> str:
        return key.removeprefix("/workspace/")
    functions = {rel(k): set(v) & stable for k, v in data["functions"].items()}
    return Coverage(functions, {rel(k) for k in data["outside"]}), round(time.monotonic() - t, 2)


@dataclass
class Caps:
    """How long a check may run: the whole suite's cap (``whole_s``: 4x its slowest baseline
    run + 2 s, at least 5 s), or for selected tests 4x what they took in the baseline plus the
    suite's start-up (collection, imports: the baseline run less its tests' own time) + 2 s,
    at least 3 s. A bug that loops costs its cap, so the cap follows what the check runs."""

    whole_s: float
    baseline_s: float
    durations: dict[str, float]

    def for_tests(self, selected: set[str] | None) -> float:
        if selected is None:
            return self.whole_s
        startup = max(0.0, self.baseline_s - sum(self.durations.values()))
        own = sum(self.durations.get(t, 0.0) for t in selected)
        return min(self.whole_s, max(3.0, 4 * (startup + own) + 2))


def check(box: SuiteBox, cand: Candidate, stable: set[str], caps: Caps | float,
          cover: Coverage | None = None) -> Candidate:
    """One run with the candidate's bug, of the tests that run the changed functions (all
    of them without a map): which of those it makes fail."""
    assert cand.mutation is not None
    cand.selected = cover.tests_for(cand.sites) if cover is not None else None
    if cand.selected is not None and not cand.selected:
        cand.drop = "no test runs the changed function"
        return cand
    cap_s = caps.for_tests(cand.selected) if isinstance(caps, Caps) else caps
    out = box.run(cand.mutation.files, cap_s, select=sorted(cand.selected) if cand.selected is not None else None)
    report = out.get("report")
    if out["timeout"]:
        cand.drop = (f"ran past its cap ({cap_s:.0f} s)" if out["limit"] == "command_timeout"
                     else f"hit a limit: {out['limit']}")
        return cand
    if report is None:
        cand.drop = "the suite gave no report"
        return cand
    if report.get("collection_errors"):
        cand.drop = "collection fails"
        return cand
    tests = _outcomes(report)
    ran = stable if cand.selected is None else cand.selected
    cand.fail_to_pass = sorted(t for t in ran if tests.get(t, {}).get("outcome") != "passed")
    cand.messages = {t: str(tests.get(t, {}).get("message", "not run")) for t in cand.fail_to_pass}
    if not cand.fail_to_pass:
        cand.drop = "no test fails"
    return cand


def confirm(box: SuiteBox, cand: Candidate, stable: set[str], cap_s: float, traces: dict[str, Any]) -> Candidate:
    """The second run, of the whole suite (the same tests must fail), and the replay of the
    failing tests' calls on the bug (one must differ from the pristine project's). Where the
    whole suite fails more tests than the first check's selection held (the map did not link
    them to the function: they run it in another process, or use what an earlier test built
    with it, e.g. a lazily made singleton), a third run of the whole suite must fail exactly
    the same: those failing tests then count."""
    assert cand.mutation is not None
    ids = [t for t in spread(cand.fail_to_pass, MAX_F2P_STORED * 2) if traces.get(t)]
    out = box.run(cand.mutation.files, cap_s, replay_ids=ids, traces=traces)
    tests = _outcomes(out.get("report"))
    again = sorted(t for t in stable if tests.get(t, {}).get("outcome") != "passed")
    if (not out["timeout"] and out.get("report") is not None and cand.selected is not None
            and set(again) - cand.selected and set(cand.fail_to_pass) <= set(again)):
        third = box.run(cand.mutation.files, cap_s)
        tests3 = _outcomes(third.get("report"))
        if third["timeout"] or third.get("report") is None:
            cand.drop = "the third run did not finish"
            return cand
        if sorted(t for t in stable if tests3.get(t, {}).get("outcome") != "passed") != again:
            cand.drop = "flaky: the tests the coverage map did not link fail in one whole run, not the other"
            return cand
        cand.unlinked = len(set(again) - cand.selected)
        cand.fail_to_pass = again
        cand.messages = {t: str(tests.get(t, {}).get("message", "not run")) for t in again}
    if out["timeout"] or out.get("report") is None:
        cand.drop = "the second run did not finish"
    elif again != cand.fail_to_pass:
        cand.drop = f"flaky: the second run failed {len(again)} tests, the first {len(cand.fail_to_pass)}"
    elif not ids:
        cand.drop = "no failing test makes a call into the package that can be replayed"
    else:
        replayed = out.get("replay") or {}
        mismatched = [t for t in ids if (replayed.get(t) or [0, None])[1] is not None]
        # told apart by a value: data, an exception, an object's own repr; an object of the right
        # type with a default repr (<X object at 0x…>) would let any object of that type pass
        cand.discriminating = [t for t in mismatched if replayed[t][1].get("telling", True)]
        if not mismatched:
            cand.drop = "no replayed call tells the bug apart from the fix (the tests see it some other way)"
        elif not cand.discriminating:
            cand.drop = "only an object's type tells the bug apart (its repr is the default one)"
    return cand


def spread(ids: list[str], k: int) -> list[str]:
    """Up to ``k`` of ``ids`` spread over test functions (one of each in turn) and, within one,
    over its parametrisations (evenly spaced), so that replayed calls cover different inputs."""
    groups: dict[str, list[str]] = {}
    for t in ids:
        groups.setdefault(t.partition("[")[0], []).append(t)
    order = []
    for members in groups.values():
        step = max(1, len(members) / max(1, min(len(members), k)))
        picks = [members[int(i * step)] for i in range(min(len(members), k))]
        order.append(picks + [m for m in members if m not in picks])
    out: list[str] = []
    while len(out) < k and any(order):
        for queue_ in order:
            if queue_ and len(out) < k:
                out.append(queue_.pop(0))
    return out


def record_traces(boxes: Boxes, ids: list[str], progress: Progress) -> tuple[dict[str, Any], dict[str, int]]:
    """The calls ``ids`` make into the package on the pristine project, cut where two replays
    on the pristine project do not give what was recorded."""
    with boxes.one() as box:
        progress("traces", 0, 3)
        out = box.run({}, MAX_SUITE_S * 3 + 30, trace_ids=ids)
        traces: dict[str, Any] = out.get("traces") or {}
        cut = Counter[str]()
        for round_ in (1, 2):
            progress("traces", round_, 3)
            present = [t for t in ids if traces.get(t)]
            replayed = ((box.run({}, MAX_SUITE_S * 3 + 30, replay_ids=present, traces=traces).get("replay") or {})
                        if present else {})
            for t in present:
                checked, mismatch = replayed.get(t) or [0, {"why": "missing"}]
                if mismatch is not None:
                    traces[t] = traces[t][: int(checked)]
                    cut["cut" if checked else "unreplayable"] += 1
        progress("traces", 3, 3)
    for t, steps in traces.items():
        size = 0
        for i, step in enumerate(steps):
            size += len(json.dumps(step, separators=(",", ":")))
            if size > MAX_TRACE_BYTES:
                traces[t] = steps[:i]
                cut["capped"] += 1
                break
    return {t: s for t, s in traces.items() if s}, dict(cut)


def combos(kept: list[Candidate], seed: int, count: int) -> list[Candidate]:
    """Up to ``count`` combinations of 2-3 kept bugs in different functions."""
    rng = random.Random(seed + 1)
    singles = [c for c in kept if len(c.sites) == 1 and c.family != "body"]
    out: list[Candidate] = []
    seen: set[frozenset[mutate.Site]] = set()
    for _ in range(count * 20):
        if len(out) >= count or len(singles) < 2:
            break
        k = 2 if rng.random() < 0.7 or len(singles) < 3 else 3
        pick = rng.sample(singles, k)
        functions = {f"{c.sites[0].file}:{c.sites[0].function}" for c in pick}
        key = frozenset(c.sites[0] for c in pick)
        if len(functions) == k and key not in seen:
            seen.add(key)
            out.append(Candidate([c.sites[0] for c in pick]))
    return out


def select(kept: list[Candidate], limit: int) -> list[Candidate]:
    """Up to ``limit`` kept candidates, round-robin over families (in their kept order)."""
    by_family: dict[str, list[Candidate]] = {}
    for c in kept:
        by_family.setdefault(c.family, []).append(c)
    out: list[Candidate] = []
    while len(out) < limit and any(by_family.values()):
        for family in sorted(by_family):
            if by_family[family] and len(out) < limit:
                out.append(by_family[family].pop(0))
    return out


def _task_id(n: int, cand: Candidate) -> str:
    name = re.sub(r"[^a-z0-9]+", "-", cand.sites[0].function.split(".")[-1].lower()).strip("-") or "fn"
    return f"{n:04d}-{cand.family.replace('_', '-')}-{name}"[:64]


def _apis(steps: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for s in steps:
        t = s.get("t")
        if t and t not in out:
            out.append(t)
    return out


def _env_name(project: Project) -> tuple[str, str]:
    name = re.sub(r"[^a-z0-9]+", "-", project.name.lower()).strip("-")
    version = project.version if is_semver(project.version) else "1.0.0"
    return f"synth/{name}", version


def _spec(name: str, version: str, project: Project, source: Source, files: list[str], verifier_timeout: float,
          count: int) -> str:
    description = json.dumps(f"{project.name} {project.version} ({source.kind}, {source.digest[:19]}): "
                             f"{count} bugs made on its code, verified by its own tests")
    command = " ".join(source.spec.split())
    return f'''# Synthesized by `envkit synth {command}` (envkit {__version__}): provenance.json says how.
spec_version = 1

[environment]
name = "{name}"
version = "{version}"
kind = "repo"
description = {description}

[image]
base = "envkit/base"
files = {json.dumps(files)}
python_lock = "python.lock"

[state]
repo = {{ path = "repo", python_path = {json.dumps(project.python_path)} }}

[tasks]
file = "tasks.jsonl"

[verifier]
command = "python3 /opt/envkit/suite_verifier.py --suite /env/suite"
timeout_s = {verifier_timeout:.0f}

[limits]
cpus = 1.0
memory_mb = 1024
pids = 256
disk_mb = 512
command_timeout_s = 120
episode_timeout_s = 1800
max_turns = 50

[tools]
enabled = ["bash"]
'''


def _write_repo(project_dir: Path, dest: Path) -> None:
    shutil.copytree(project_dir, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))


def synth(source_text: str, out: Path, *, max_tasks: int = 40, seed: int = 0, jobs: int = 2, writer: str | None = None,
          progress: Progress = _noop, client: Any | None = None) -> SynthResult:
    """Make ``out`` (a new folder) from the project at ``source_text``. Nothing is left in
    ``out`` when it fails."""
    t_start = time.monotonic()
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out} exists and is not empty", "give a new folder to --out (synth never overwrites one)")
    if max_tasks < 1 or jobs < 1:
        raise UserError("--max-tasks and --jobs must be at least 1", "e.g. --max-tasks 40 --jobs 2")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    work = Path(tempfile.mkdtemp(prefix="envkit-synth-"))
    try:
        result = _synth(source_text, partial, work, max_tasks=max_tasks, seed=seed, jobs=jobs, writer=writer,
                        progress=progress, client=client, t_start=t_start)
        if out.exists():
            out.rmdir()
        os.replace(partial, out)
        result.out = out
        return result
    finally:
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


@dataclass
class _Search:
    """What the sandboxes found: the baseline, the coverage map, every candidate tried and those kept."""

    stable_list: list[str]
    figures: dict[str, Any]
    cap_s: float
    cover: Coverage | None
    sites: int
    cands: list[Candidate]
    kept: list[Candidate]
    untried: int  # drawn but not tried: enough passed the first check before them
    not_confirmed: int  # checked, but enough were confirmed before them: left out of the yields
    traces: dict[str, Any]
    cut: dict[str, int]


def _synth(source_text: str, dest: Path, work: Path, *, max_tasks: int, seed: int, jobs: int, writer: str | None,
           progress: Progress, client: Any | None, t_start: float) -> SynthResult:
    from envkit.runtime import EnvRuntime
    from envkit.spec import load_environment

    timings: dict[str, float] = {}
    t = time.monotonic()
    progress("source", 0, 1)
    project_dir, source = fetch(source_text, work)
    project = analyse(project_dir)
    config_changes = neutralise_config(project_dir)
    _write_repo(project_dir, dest / "repo")
    project.root = dest / "repo"
    timings["source_s"] = round(time.monotonic() - t, 2)

    t = time.monotonic()
    progress("image", 0, 1)
    name, version = _env_name(project)
    staging = load_environment(_staging(dest, project, source, name, version))
    runtime = EnvRuntime(staging, client=client, sandbox_runtime="runc")
    timings["image_s"] = round(time.monotonic() - t, 2)

    sandboxes: list[Any] = []
    try:
        t = time.monotonic()
        progress("sandboxes", 0, jobs)
        for i in range(jobs):
            sandboxes.append(runtime.backend.create())
            progress("sandboxes", i + 1, jobs)
        found = _search(Boxes([SuiteBox(s, project) for s in sandboxes]), project, max_tasks=max_tasks, seed=seed,
                        progress=progress, timings=timings, t_boxes=t)
    finally:
        for s in sandboxes:
            try:
                s.destroy()
            except Exception:  # noqa: BLE001 - cleanup
                pass

    tasks = select(found.kept, max_tasks)
    if not tasks:
        drops = Counter(c.drop for c in found.cands if c.drop)
        raise UserError(f"no candidate bug of {project.name} {project.version} passed the checks "
                        f"({len(found.cands)} tried; {dict(drops.most_common(4))})",
                        "try another --seed, more --max-tasks, or another project")

    t = time.monotonic()
    test_cmd, records, stored, rewrites = _write_tasks(dest, project, source, name, version, tasks, found, writer)
    by_family: dict[str, dict[str, int]] = {}
    for c in found.cands:
        entry = by_family.setdefault(c.family, {"tried": 0, "kept": 0, "tasks": 0})
        entry["tried"] += 1
        entry["kept"] += c.drop is None
    for c in tasks:
        by_family[c.family]["tasks"] += 1
    drops = Counter(re.sub(r"\d+", "N", c.drop) for c in found.cands if c.drop)
    timings["output_s"] = round(time.monotonic() - t, 2)
    seconds = round(time.monotonic() - t_start, 1)
    provenance = _provenance(source_text, max_tasks, seed, jobs, project, source, config_changes, found, tasks,
                             drops, by_family, timings | {"total_s": seconds}, records=records, stored=stored,
                             writer=dict(rewrites) if writer else None)
    (dest / "provenance.json").write_text(json.dumps(provenance, indent=1) + "\n")
    (dest / "README.md").write_text(_readme(project, source, len(tasks), by_family, found.figures, test_cmd))
    load_environment(dest)  # the output is an ordinary environment: it must load as one
    baseline_figures = {k: v for k, v in found.figures.items() if k != "durations"}
    return SynthResult(out=dest, tasks=len(tasks), tried=len(found.cands), kept=len(found.kept), seconds=seconds,
                       drops=dict(drops), by_family=by_family, baseline=baseline_figures)


def _staging(dest: Path, project: Project, source: Source, name: str, version: str) -> Path:
    """The staging environment in ``dest``: the project's image (its locked test dependencies
    and the pristine project) with one no-op task, for the sandboxes the search runs in."""
    from envkit.pylock import resolve, write_lock

    lock = resolve(project.requirements)
    (dest / "python.lock").write_text(write_lock(lock, project.requirements))
    (dest / "staging").mkdir()
    (dest / "staging" / "noop.sh").write_text("true\n")
    staging_task = {"id": "baseline", "instruction": "(staging)", "oracle": "staging/noop.sh"}
    (dest / "tasks.jsonl").write_text(json.dumps(staging_task) + "\n")
    (dest / "envkit.toml").write_text(_spec(name.replace("synth/", "synth-staging/"), version, project, source,
                                            ["staging"], 120, 0))
    return dest


def _search(boxes: Boxes, project: Project, *, max_tasks: int, seed: int, progress: Progress,
            timings: dict[str, float], t_boxes: float) -> _Search:
    """Baseline, coverage map, first checks, traces, confirmation and combinations (steps 3-5)."""
    stable_list, figures = baseline(boxes, project, progress)
    stable = set(stable_list)
    cap_s = max(5.0, 4 * max(figures["runs_s"]) + 2)
    caps = Caps(cap_s, max(figures["runs_s"]), figures["durations"])
    timings["baseline_s"] = round(time.monotonic() - t_boxes, 2)
    cover, timings["coverage_s"] = coverage(boxes, stable, progress)
    done = [0]

    def tick(stage: str, total: int) -> Callable[[], None]:
        def f() -> None:
            done[0] += 1
            progress(stage, done[0], total)
        return f

    # candidates: one suite run each, in their seeded order, until twice the tasks asked for
    # passed (confirmation keeps 60-90% of them); the rest are not tried
    t = time.monotonic()
    all_sites = mutate.sites(project.root, project.source_files())
    chosen = mutate.candidates(all_sites, seed, max_tasks * CANDIDATES_PER_TASK)
    queue_ = [Candidate(sites) for sites in chosen]
    seen: set[tuple[str, ...]] = set()
    passed = [0]

    def first_check(box: SuiteBox, c: Candidate) -> None:
        c.mutation = mutate.apply(project.root, c.sites)
        if c.mutation is None:
            c.drop = INVALID
        else:
            check(box, c, stable, caps, cover)

    def dedupe(c: Candidate) -> None:  # in the seeded order
        if c.drop is None:
            key = (*sorted(c.mutation.functions if c.mutation else []), "|", *c.fail_to_pass)
            if key in seen:
                c.drop = "duplicate (same function, same failing tests)"
            seen.add(key)
        passed[0] += c.drop is None
    counted = boxes.until(first_check, queue_, settle=dedupe, enough=lambda: passed[0] >= 2 * max_tasks,
                          progress=tick("candidates", len(chosen)))
    cands: list[Candidate] = queue_[:counted]
    checked = [c for c in cands if c.drop != INVALID]
    untried = len(queue_) - counted
    timings["candidates_s"] = round(time.monotonic() - t, 2)

    # traces of the failing tests, then confirmation, in the order tasks are chosen (round-robin
    # over families), until there are enough
    t = time.monotonic()
    survivors = select([c for c in checked if c.drop is None], len(checked))
    wanted = sorted({test for c in survivors for test in spread(c.fail_to_pass, MAX_F2P_STORED * 2)})
    traces, cut = record_traces(boxes, wanted, progress) if wanted else ({}, {})
    done[0] = 0
    kept: list[Candidate] = []
    counted = boxes.until(lambda box, c: confirm(box, c, stable, cap_s, traces), survivors,
                          settle=lambda c: kept.append(c) if c.drop is None else None,
                          enough=lambda: len(kept) >= max_tasks, progress=tick("confirm", len(survivors)))
    unconfirmed = {id(c) for c in survivors[counted:]}
    cands = [c for c in cands if id(c) not in unconfirmed]
    extra = combos(kept, seed, max(1, max_tasks // 8))
    for c in extra:
        c.mutation = mutate.apply(project.root, c.sites)
        if c.mutation is None:
            c.drop = INVALID
    extra_todo = [c for c in extra if c.drop is None]
    done[0] = 0
    boxes.map(lambda box, c: check(box, c, stable, caps, cover), extra_todo, tick("combos", len(extra_todo) * 2))
    extra_ok = [c for c in extra_todo if c.drop is None]
    boxes.map(lambda box, c: confirm(box, c, stable, cap_s, traces), extra_ok, tick("combos", len(extra_todo) * 2))
    cands += extra
    kept += [c for c in extra_ok if c.drop is None]
    timings["confirm_s"] = round(time.monotonic() - t, 2)
    return _Search(stable_list=stable_list, figures=figures, cap_s=cap_s, cover=cover, sites=len(all_sites),
                   cands=cands, kept=kept, untried=untried, not_confirmed=len(unconfirmed), traces=traces, cut=cut)


def _write_tasks(dest: Path, project: Project, source: Source, name: str, version: str, tasks: list[Candidate],
                 found: _Search, writer: str | None) -> tuple[str, list[dict[str, Any]], int, Counter[str]]:
    """The environment's files in place of the staging ones (step 6): the suite's command, a
    record per task, how many tests' traces were stored and the writer's outcomes."""
    shutil.rmtree(dest / "staging")
    (dest / "envkit.lock").unlink(missing_ok=True)  # the staging image's
    for folder in ("bugs", "fixes", "suite"):
        (dest / folder).mkdir()
    first = project.package_paths[0]
    pkg_dir = first.rsplit("/", 1)[0] if "/" in first else first
    test_cmd = "python3 -m pytest -q " + " ".join(project.test_dirs)
    traces, figures = found.traces, found.figures
    lines, records, used = [], [], set()
    rewrites = Counter[str]()
    for n, c in enumerate(tasks, start=1):
        assert c.mutation is not None
        task_id = _task_id(n, c)
        f2p = spread(c.discriminating, MAX_F2P_STORED)
        f2p += spread([t for t in c.fail_to_pass if t not in f2p and traces.get(t)], MAX_F2P_STORED - len(f2p))
        used.update(f2p)
        (dest / "bugs" / f"{task_id}.diff").write_text(mutate.unified_diff(project.root, c.mutation))
        (dest / "fixes" / f"{task_id}.diff").write_text(mutate.unified_diff(project.root, c.mutation, reverse=True))
        body_of = None
        if c.family == "body":
            module = c.sites[0].file.removeprefix("src/").removesuffix(".py").removesuffix("/__init__")
            body_of = f"{module.replace('/', '.')}.{c.sites[0].function}"
        apis = [a for t in f2p for a in _apis(traces.get(t, []))]
        words = text.instruction(project=project.name, package_dir=pkg_dir, test_cmd=test_cmd,
                                 failing=[(t, c.messages.get(t, "")) for t in f2p or c.fail_to_pass],
                                 apis=list(dict.fromkeys(apis)), body_of=body_of, total=len(c.fail_to_pass))
        if writer:
            words, error = text.rewrite(words, writer)
            rewrites["template" if error else "rewritten"] += 1
        difficulty = "hard" if c.family in ("combo", "body") else ("easy" if len(c.fail_to_pass) <= 3 else "medium")
        lines.append(json.dumps({"id": task_id, "instruction": words, "difficulty": difficulty,
                                 "oracle": f"fixes/{task_id}.diff", "patch": f"bugs/{task_id}.diff",
                                 "params": {"fail_to_pass": f2p, "family": c.family}}, sort_keys=True))
        records.append({"id": task_id, "family": c.family,
                        "sites": [{"file": s.file, "function": s.function, "family": s.family, "line": s.line}
                                  for s in c.sites],
                        "fail_to_pass": c.fail_to_pass, "fail_to_pass_replayed": f2p,
                        "pass_to_pass": len(found.stable_list) - len(c.fail_to_pass),
                        "baseline_durations_s": {t: figures["durations"].get(t) for t in f2p}})
    (dest / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    suite = {"version": 1, "repo": "repo", "tests": found.stable_list, "files": project.test_files(),
             "pytest_args": project.pytest_args(), "timeout_s": round(found.cap_s + 10)}
    (dest / "suite" / "suite.json").write_text(json.dumps(suite, indent=1, sort_keys=True) + "\n")
    # the recorded calls are most of a task's bytes (tomlkit: 5.3 KB a task as JSON, 0.6 KB gzipped);
    # mtime 0: the same calls give the same bytes
    recorded = json.dumps({t: traces[t] for t in sorted(used)}, sort_keys=True, separators=(",", ":")) + "\n"
    (dest / "suite" / "traces.json.gz").write_bytes(gzip.compress(recorded.encode(), 9, mtime=0))
    verifier_timeout = min(3600.0, 2 * found.cap_s + 60)
    (dest / "envkit.toml").write_text(_spec(name, version, project, source, ["suite", "bugs", "fixes"],
                                            verifier_timeout, len(tasks)))
    return test_cmd, records, len(used), rewrites


def _provenance(source_text: str, max_tasks: int, seed: int, jobs: int, project: Project, source: Source,
                config_changes: Any, found: _Search, tasks: list[Candidate], drops: Counter[str],
                by_family: dict[str, dict[str, int]], timings: dict[str, float], *, records: list[dict[str, Any]],
                stored: int, writer: dict[str, int] | None) -> dict[str, Any]:
    """provenance.json: ``records``, ``stored`` (tests whose calls the tasks keep) and ``writer``
    (the rewriter's outcomes) come from the output step."""
    cands, kept, cover = found.cands, found.kept, found.cover
    selected = [len(c.selected) for c in cands if c.selected]
    return {
        "envkit": __version__,
        "command": f"envkit synth {source_text} --max-tasks {max_tasks} --seed {seed} --jobs {jobs}",
        "source": {"kind": source.kind, "spec": source.spec, "digest": source.digest, "origin": source.origin,
                   "name": project.name, "version": project.version, "license": project.license},
        "layout": {"python_path": project.python_path, "packages": project.packages, "test_dirs": project.test_dirs},
        "config_changes": config_changes, "requirements": project.requirements,
        "baseline": {k: v for k, v in found.figures.items() if k != "durations"},
        "candidates": {"sites": found.sites, "tried": len(cands), "untried": found.untried,
                       "checked_not_confirmed": found.not_confirmed, "kept": len(kept), "tasks": len(tasks),
                       "dropped": dict(drops.most_common()), "by_family": by_family},
        "traces": {"tests": len(found.traces), "stored": stored, "cut": found.cut},
        "coverage": None if cover is None else {
            "functions": len(cover.functions), "outside": len(cover.outside),
            "first_checks_whole_suite": sum(1 for c in cands if c.mutation is not None and c.selected is None
                                            and c.drop != INVALID),
            "tests_per_first_check": round(statistics.fmean(selected), 1) if selected else None,
            "kept_with_unlinked_failures": sum(1 for c in kept if c.unlinked)},
        "writer": writer,
        "timings": timings,
        "tasks": records,
        "drops": [{"candidate": c.label, "reason": c.drop} for c in cands if c.drop],
    }


def _readme(project: Project, source: Source, count: int, by_family: dict[str, dict[str, int]], figures: dict[str, Any],
            test_cmd: str) -> str:
    rows = "\n".join(f"| {f} | {v['tried']} | {v['kept']} | {v['tasks']} |" for f, v in sorted(by_family.items()))
    return f"""# {project.name} {project.version}: {count} synthesized bugs

Made by `envkit synth` from {source.kind} `{source.spec}` ({source.digest}), license {project.license}.
Each task is {project.name} with one bug (or two or three, `combo`) made on its syntax tree; the agent
fixes it in /workspace. The reward is 1 when the calls the failing tests make into the package,
replayed on the agent's code, give what the pristine project gave, and the project's own tests
({figures['stable']} that passed three baseline runs) pass from a pristine copy (`{test_cmd}`).

| family | tried | kept | tasks |
| --- | --- | --- | --- |
{rows}

`provenance.json` lists every candidate that was dropped, with its reason.
"""
