"""envkit synth's parts that run on the host (no Docker): the mutation families, the project's
layout and configuration, call traces recorded and replayed against the fixture project, the
comparison the verifier makes, the patch the reset applies, the wheel lock and its layer, and
the spec's refusal of hidden tests that import the workspace."""

from __future__ import annotations

import difflib
import gzip
import hashlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envkit.errors import SpecError, UserError
from envkit.spec import load_environment
from envkit.synth import mutate
from envkit.synth.project import analyse, filter_addopts, neutralise_config
from envkit.synth.source import parse_source

from ..conftest import ROOT, envkit
from .test_cli_errors import assert_user_error

MINICALC = ROOT / "tests" / "fixtures" / "minicalc"
INCONTAINER = ROOT / "envkit" / "sandbox" / "incontainer"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"envkit_{name}", INCONTAINER / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(INCONTAINER))
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    finally:
        sys.path.remove(str(INCONTAINER))
    return module


helper = _load("helper_repo")  # the reset's patches (helper.py's module)
calltrace = _load("calltrace")


@pytest.fixture
def minicalc(tmp_path: Path) -> Path:
    dest = tmp_path / "minicalc"
    shutil.copytree(MINICALC, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


# -- mutations --------------------------------------------------------------------------------------

SOURCE = '''def f(xs, n, flag=True):
    """Doc."""
    total = 0  # keep this comment
    for i in range(0, n):
        if xs[i] < 3 and not flag:
            total += xs[i] * 2
        elif xs[i] == 0:
            total = total - 1
        else:
            pass
    g(xs, n)
    return xs[1:n]
'''


def _changed_lines(old: str, new: str) -> list[str]:
    return [line for line in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def test_every_family_changes_one_place_and_keeps_the_rest_byte_for_byte(tmp_path: Path):
    (tmp_path / "m.py").write_text(SOURCE)
    sites = mutate.sites(tmp_path, ["m.py"])
    families = {s.family for s in sites}
    assert families == set(mutate.FAMILIES) - {"combo"}
    expected = {  # one example change per family (the first site of it)
        "comparison": ("        if xs[i] < 3 and not flag:", "        if xs[i] <= 3 and not flag:"),
        "boolean": ("        if xs[i] < 3 and not flag:", "        if xs[i] < 3 or not flag:"),
        "swap_args": ("    g(xs, n)", "    g(n, xs)"),
        "none_return": ("    return xs[1:n]", "    return None"),
    }
    for s in sites:
        mutation = mutate.apply(tmp_path, [s])
        assert mutation is not None, s
        new = mutation.files["m.py"]
        compile(new, "m.py", "exec")
        changed = _changed_lines(SOURCE, new)
        assert changed, s
        if s.family not in ("remove_statement", "remove_branch", "body"):  # one line changed, comments and all kept
            assert (len(changed) == 2
                    and ("# keep this comment" in changed[1]) == ("# keep this comment" in changed[0])), changed
        if s.family in expected and s == next(x for x in sites if x.family == s.family):
            old_line, new_line = expected[s.family]
            assert changed == [f"-{old_line}", f"+{new_line}"], (s, changed)
    body = mutate.apply(tmp_path, [next(s for s in sites if s.family == "body")])
    assert (body is not None
            and body.files["m.py"] == 'def f(xs, n, flag=True):\n    """Doc."""\n    raise NotImplementedError\n')


def test_candidates_are_seeded_and_spread_over_families(tmp_path: Path):
    (tmp_path / "m.py").write_text(SOURCE)
    sites = mutate.sites(tmp_path, ["m.py"])
    a, b = mutate.candidates(sites, 7, 10), mutate.candidates(sites, 7, 10)
    assert a == b
    assert mutate.candidates(sites, 8, 10) != a
    assert len({c[0].family for c in a}) == 10  # round-robin: ten families before any repeats


def test_a_bug_as_a_patch_the_reset_applies_and_its_fix_undoes(minicalc: Path):
    project = analyse(minicalc)
    sites = mutate.sites(minicalc, project.source_files())
    picks = [next(s for s in sites if s.family == f) for f in ("comparison", "remove_statement")]
    mutation = mutate.apply(minicalc, picks)
    assert mutation is not None and mutation.family == "combo"
    bug, fix = mutate.unified_diff(minicalc, mutation), mutate.unified_diff(minicalc, mutation, reverse=True)
    pristine = {rel: (minicalc / rel).read_text() for rel in mutation.files}
    helper.apply_patch(str(minicalc), bug.encode())
    assert {rel: (minicalc / rel).read_text() for rel in mutation.files} == mutation.files
    helper.apply_patch(str(minicalc), fix.encode())
    assert {rel: (minicalc / rel).read_text() for rel in mutation.files} == pristine
    with pytest.raises(ValueError, match="does not apply"):
        helper.apply_patch(str(minicalc), fix.encode())  # strict: the context is no longer there


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(["a\n", "--- x\n", "+++ y\n", "@@ z\n", "-\n", " b\n"]), min_size=1, max_size=25),
       st.lists(st.tuples(st.integers(0, 30), st.sampled_from(["del", "ins", "set"])), max_size=5),
       st.sampled_from([0, 1, 3]))
def test_the_reset_applies_any_unified_diff_exactly(tmp_path_factory, lines, edits, context):
    root = tmp_path_factory.mktemp("patch")
    old = "".join(lines)
    new_lines = list(lines)
    for at, op in edits:
        at = at % (len(new_lines) + 1)
        if op == "ins":
            new_lines.insert(at, "--- inserted\n")
        elif new_lines and at < len(new_lines):
            if op == "del":
                del new_lines[at]
            else:
                new_lines[at] = "changed\n"
    new = "".join(new_lines)
    for name in ("one.py", "two.py"):
        (root / name).write_text(old)
    patch = "".join("".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{n}", f"b/{n}",
                                                 n=context))
                    for n in ("one.py", "two.py"))
    helper.apply_patch(str(root), patch.encode())
    assert (root / "one.py").read_text() == new and (root / "two.py").read_text() == new


def test_a_patch_cannot_reach_outside_the_repository(tmp_path: Path):
    (tmp_path / "repo").mkdir()
    (tmp_path / "secret").write_text("x\n")
    with pytest.raises(ValueError, match="outside"):
        helper.apply_patch(str(tmp_path / "repo"), b"--- a/../secret\n+++ b/../secret\n@@ -1 +1 @@\n-x\n+y\n")
    assert (tmp_path / "secret").read_text() == "x\n"


# -- the project ------------------------------------------------------------------------------------

def test_layout_requirements_and_config_of_the_fixture_project(minicalc: Path):
    project = analyse(minicalc)
    assert (project.name, project.version, project.python_path) == ("minicalc", "1.2.0", "src")
    assert project.packages == ["minicalc"] and project.test_dirs == ["tests"]
    assert project.requirements == ["pytest"]  # pytest-cov is a plugin envkit does not install
    assert "tests/test_core.py" in project.test_files() and "pyproject.toml" in project.test_files()
    assert project.source_files() == ["src/minicalc/__init__.py", "src/minicalc/core.py"]
    changes = neutralise_config(minicalc)
    assert changes == ["pyproject.toml addopts: '--cov=minicalc --cov-report=term-missing -ra' -> '-ra'"]
    assert 'addopts = "-ra"' in (minicalc / "pyproject.toml").read_text()
    assert neutralise_config(minicalc) == []


def test_a_test_file_that_does_not_collect_is_left_out_with_its_error(minicalc: Path):
    """pytest stops the whole run at a collection error (pyparsing's tests/test_diagram.py needs
    a diagram library its test requirements do not list): the file is left out (--ignore, the
    verifier's arguments too) and the baseline runs again."""
    from envkit.synth.pipeline import Boxes, baseline

    project = analyse(minicalc)
    seen: list[list[str]] = []

    class Box:
        def run(self, files: dict, timeout_s: float) -> dict:
            args = project.pytest_args()
            seen.append(args)
            if "--ignore=tests/test_extra.py" not in args:
                report = {"collected": 0, "seconds": 0.1, "tests": {},
                          "collection_errors": [{"node": "tests/test_extra.py",
                                                 "message": "No module named 'railroad'"}]}
            else:
                report = {"collected": 2, "seconds": 0.2, "collection_errors": [],
                          "tests": {t: {"outcome": "passed", "duration": 0.01}
                                    for t in ("tests/a.py::x", "tests/a.py::y")}}
            return {"timeout": False, "report": report}
    stable, figures = baseline(Boxes([Box(), Box()]), project, lambda *_: None)  # type: ignore[list-item]
    assert stable == ["tests/a.py::x", "tests/a.py::y"] and project.ignored == ["tests/test_extra.py"]
    assert figures["ignored_files"] == {"tests/test_extra.py": "No module named 'railroad'"} and len(seen) == 6
    assert project.pytest_args()[-2:] == ["--ignore=tests/test_extra.py", "tests"]


def test_tests_slower_than_the_limit_are_left_out_and_the_baseline_runs_again(minicalc: Path):
    """A test that takes seconds (more-itertools' prime sieve: 17 s of a 40-s suite) would cost
    every check and every verification that: it is deselected, for the verifier too, with its
    time in the provenance; an id pytest cannot be given back (``argname#``) stays."""
    from envkit.synth.pipeline import Boxes, baseline

    project = analyse(minicalc)
    seen: list[list[str]] = []
    times = {"tests/a.py::fast": 0.01, "tests/a.py::slow": 9.0, "tests/a.py::p[x#]": 3.0}

    class Box:
        def run(self, files: dict, timeout_s: float) -> dict:
            args = project.pytest_args()
            seen.append(args)
            tests = {t: {"outcome": "passed", "duration": d} for t, d in times.items()
                     if f"--deselect={t}" not in args}
            return {"timeout": False, "report": {"collected": len(tests), "seconds": sum(d["duration"] for d in
                                                                                          tests.values()),
                                                 "collection_errors": [], "tests": tests}}
    stable, figures = baseline(Boxes([Box(), Box()]), project, lambda *_: None)  # type: ignore[list-item]
    assert stable == ["tests/a.py::fast", "tests/a.py::p[x#]"] and project.deselected == ["tests/a.py::slow"]
    assert figures["slow_tests_s"] == {"tests/a.py::slow": 9.0} and len(seen) == 6
    assert "--deselect=tests/a.py::slow" in project.pytest_args() and max(figures["runs_s"]) == 3.01


@pytest.mark.parametrize("slow_s, refused", [(30.0, False), (0.0, True)])
def test_the_suite_time_limit_is_on_the_suite_without_its_slow_tests(minicalc: Path, slow_s: float, refused: bool):
    """pyparsing's suite took 60-70 s, 27 s of it in six tests over 2 s: the limit (60 s) is on
    the suite every check runs, with those left out; a suite slow without them is refused."""
    from envkit.synth.pipeline import MAX_SUITE_S, Boxes, baseline

    project = analyse(minicalc)
    times = {f"tests/a.py::t{i}": 1.5 for i in range(27)} | {"tests/a.py::slow": slow_s}
    if not slow_s:
        times = {f"tests/a.py::t{i}": 1.5 for i in range(45)}  # 67.5 s, every test under the 2-s line

    class Box:
        def run(self, files: dict, timeout_s: float) -> dict:
            tests = {t: {"outcome": "passed", "duration": d} for t, d in times.items()
                     if f"--deselect={t}" not in project.pytest_args()}
            return {"timeout": False, "report": {"collected": len(tests), "seconds": sum(d["duration"] for d in
                                                                                          tests.values()),
                                                 "collection_errors": [], "tests": tests}}
    boxes = Boxes([Box(), Box()])  # type: ignore[list-item]
    if refused:
        with pytest.raises(UserError, match=r"takes 67\.5 s \(limit 60 s\)"):
            baseline(boxes, project, lambda *_: None)
    else:
        stable, figures = baseline(boxes, project, lambda *_: None)
        assert len(stable) == 27 and max(figures["runs_s"]) == 40.5 < MAX_SUITE_S
        assert figures["slow_tests_s"] == {"tests/a.py::slow": 30.0}


def test_addopts_lose_plugins_and_keep_the_rest():
    assert filter_addopts(["-n", "4", "--cov", "-p", "pytest_cov", "-p", "no:cacheprovider", "--strict-markers", "-x",
                           "--doctest-modules", "--timeout=30", "-ra"]) == ["-p", "no:cacheprovider",
                                                                            "--strict-markers", "-x", "-ra"]


def test_ini_style_configuration_is_rewritten(tmp_path: Path):
    (tmp_path / "setup.cfg").write_text("[metadata]\nname = x\n\n[tool:pytest]\naddopts =\n    --cov=x\n    -ra\n"
                                        "required_plugins = pytest-cov\nmarkers = slow\n")
    assert len(neutralise_config(tmp_path)) == 2
    text = (tmp_path / "setup.cfg").read_text()
    assert ("addopts = -ra\n" in text and "--cov" not in text and "required_plugins = \n" in text
            and "markers = slow" in text)


def test_a_project_without_tests_is_refused(minicalc: Path):
    shutil.rmtree(minicalc / "tests")
    with pytest.raises(UserError, match="ships no tests"):
        analyse(minicalc)


@pytest.mark.parametrize("text, why", [("pypi:isodate", "pin one version"), ("git:/x@zz", "git:PATH@COMMIT")])
def test_malformed_sources_are_refused(text: str, why: str):
    with pytest.raises(UserError) as e:
        parse_source(text)
    assert why in e.value.hint or why in e.value.message


def test_synth_refuses_a_missing_folder_and_a_full_out_and_leaves_nothing(tmp_path: Path):
    assert_user_error(envkit("synth", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")), "is neither")
    assert not (tmp_path / "o").exists() and not list(tmp_path.glob(".o.partial-*"))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    assert_user_error(envkit("synth", str(MINICALC), "--out", str(tmp_path / "full")), "not empty")
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]


# -- call traces: recorded on the pristine project, replayed on a changed one --------------------------

def _suite(project_src: Path, tests: Path, *args: str) -> None:
    proc = subprocess.run([sys.executable, str(INCONTAINER / "suite_runner.py"), "--path", str(project_src), *args],
                          cwd=tests, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_traces_replay_on_the_pristine_code_and_tell_a_bug_apart(minicalc: Path, tmp_path: Path):
    src = minicalc / "src"
    out, traces = tmp_path / "out.json", tmp_path / "traces.json"
    _suite(src, minicalc, "run", "--out", str(out), "--trace", str(traces), "--package", str(src / "minicalc"), "--",
           "-q", "-p", "no:cacheprovider", "-o", "addopts=", "tests")
    report, recorded = json.loads(out.read_text()), json.loads(traces.read_text())
    assert report["collected"] == 22 and all(t["outcome"] == "passed" for t in report["tests"].values())
    stack = recorded["tests/test_core.py::test_stack"]
    assert stack[0] == {"t": "minicalc.core.Stack", "args": [], "kwargs": {"$d": [["items", [1]]]},
                        "out": {"$ref": 1, "type": "minicalc.core.Stack", "repr": "Stack([1])"}}
    assert [s.get("attr") for s in stack[1:]] == ["push", "peek", "pop", "__len__", "__repr__"]
    chunked = recorded["tests/test_core.py::test_chunks_one_by_one"]  # a generator: the call, then each value
    assert [s.get("attr") for s in chunked] == [None, "__next__", "__next__"] and chunked[2]["out"] == ["b"]
    ids = tmp_path / "ids.txt"
    ids.write_text("\n".join(recorded))
    replayed = tmp_path / "replayed.json"
    _suite(src, minicalc, "replay", "--traces", str(traces), "--ids", str(ids), "--out", str(replayed))
    assert all(mismatch is None for _, mismatch in json.loads(replayed.read_text()).values())

    core = src / "minicalc" / "core.py"
    core.write_text(core.read_text().replace("return self._items[-1]", "return self._items[0]"))
    _suite(src, minicalc, "replay", "--traces", str(traces), "--ids", str(ids), "--out", str(replayed))
    failed = {t: m for t, m in json.loads(replayed.read_text()).items() if m[1] is not None}
    assert list(failed) == ["tests/test_core.py::test_stack"]
    assert failed["tests/test_core.py::test_stack"][1]["call"] == "<object 1>.peek"


def test_the_coverage_map_links_each_test_to_the_functions_its_call_runs(minicalc: Path, tmp_path: Path):
    src = minicalc / "src"
    out, cover = tmp_path / "out.json", tmp_path / "cover.json"
    args = ("--", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "tests")
    _suite(src, minicalc, "run", "--out", str(out), "--cover", str(cover), "--package", str(src / "minicalc"), *args)
    functions = json.loads(cover.read_text())["functions"]
    core = str(src / "minicalc" / "core.py")
    assert functions[f"{core}:mean"] == ["tests/test_core.py::test_mean", "tests/test_core.py::test_mean_of_nothing"]
    assert "tests/test_core.py::test_stack" in functions[f"{core}:Stack.peek"]
    assert not any(t.endswith("test_mean") for t in functions[f"{core}:Stack.peek"])
    assert all(t.startswith("tests/test_core.py::test_chunks") for t in functions[f"{core}:chunks"])  # a generator
    assert json.loads(out.read_text())["collected"] == 22  # the map does not change the outcomes

    # --select runs the listed tests only
    chosen = tmp_path / "select.txt"
    chosen.write_text("tests/test_core.py::test_mean\ntests/test_core.py::test_stack\n")
    _suite(src, minicalc, "run", "--out", str(out), "--select", str(chosen), *args)
    assert sorted(json.loads(out.read_text())["tests"]) == ["tests/test_core.py::test_mean",
                                                            "tests/test_core.py::test_stack"]


def test_a_check_runs_the_tests_that_run_the_changed_functions_or_all_of_them():
    from envkit.synth.mutate import Mutation, Site
    from envkit.synth.pipeline import Candidate, Coverage, check

    cover = Coverage({"src/m.py:f": {"t::a", "t::b"}, "src/m.py:K.g": {"t::c"}, "src/m.py:h": {"t::d"}}, {"src/m.py:h"})
    stable = {"t::a", "t::b", "t::c", "t::d"}

    def site(function: str) -> Site:
        return Site("src/m.py", function, "comparison", 1, 0)

    def cand(function: str) -> Candidate:
        return Candidate([site(function)], mutation=Mutation([site(function)], {"src/m.py": "changed"}))
    assert cover.tests_for([site("f")]) == {"t::a", "t::b"}
    assert cover.tests_for([site("f"), site("K.g")]) == {"t::a", "t::b", "t::c"}  # a combination: the union
    assert cover.tests_for([site("f"), site("h")]) is None  # h also runs outside a test's call: every test
    assert cover.tests_for([site("never")]) == set()

    runs: list[list[str] | None] = []

    class Box:  # t::b fails, every other test that runs passes
        def run(self, files: dict[str, str], cap_s: float, select: list[str] | None = None) -> dict:
            runs.append(select)
            tests = {t: {"outcome": "failed" if t == "t::b" else "passed"} for t in (select or sorted(stable))}
            return {"timeout": False, "limit": None, "report": {"tests": tests}}
    box: Any = Box()
    assert check(box, cand("never"), stable, 5, cover).drop == "no test runs the changed function" and runs == []
    ran = check(box, cand("f"), stable, 5, cover)
    assert runs == [["t::a", "t::b"]] and ran.fail_to_pass == ["t::b"] and ran.drop is None
    whole = check(box, cand("h"), stable, 5, cover)
    assert runs[-1] is None and whole.selected is None and whole.fail_to_pass == ["t::b"]
    assert check(box, cand("K.g"), stable, 5, cover).drop == "no test fails" and runs[-1] == ["t::c"]
    assert check(box, cand("f"), stable, 5).selected is None and runs[-1] is None  # no map: the whole suite


def test_checks_start_as_boxes_free_and_what_counts_is_a_prefix_of_the_seeded_order():
    import random
    import time as time_

    from envkit.synth.pipeline import Boxes, Caps

    def run_once(delays: list[float]) -> tuple[int, list[int]]:
        settled: list[int] = []
        counted = Boxes([object(), object()]).until(  # type: ignore[list-item]
            lambda _box, i: time_.sleep(delays[i]), list(range(12)), settle=settled.append,
            enough=lambda: sum(1 for i in settled if i % 3 == 0) >= 2, progress=lambda: None)
        return counted, settled
    rng = random.Random(0)
    for _ in range(5):  # 0 and 3 pass: enough after the 4th item, whichever run finished first
        assert run_once([rng.uniform(0, 0.02) for _ in range(12)]) == (4, [0, 1, 2, 3])

    caps = Caps(whole_s=22.0, baseline_s=5.0, durations={"a": 0.1, "b": 0.2, "c": 3.0})
    assert caps.for_tests(None) == 22.0
    assert caps.for_tests({"a"}) == pytest.approx(4 * (5.0 - 3.3 + 0.1) + 2)  # start-up + its own time, x4, + 2 s
    assert caps.for_tests({"a", "b", "c"}) == 22.0 and Caps(6.0, 0.2, {"a": 0.05}).for_tests({"a"}) == 3.0


def test_failures_the_coverage_map_missed_join_the_task_when_two_whole_runs_agree():
    from envkit.synth.mutate import Mutation, Site
    from envkit.synth.pipeline import Candidate, confirm

    stable = {"t::a", "t::b", "t::c"}
    site = Site("src/m.py", "f", "comparison", 1, 0)

    class Box:  # whole runs fail a and b (b uses what an earlier test built with f); the replay tells a apart
        def __init__(self, third_fails: set[str]) -> None:
            self.runs = 0
            self.third_fails = third_fails

        def run(self, files: dict, cap_s: float, replay_ids: list[str] | None = None,
                traces: dict | None = None) -> dict:
            self.runs += 1
            failing = {"t::a", "t::b"} if self.runs == 1 else self.third_fails
            tests = {t: {"outcome": "failed" if t in failing else "passed", "message": "boom"} for t in stable}
            return {"timeout": False, "report": {"tests": tests},
                    "replay": {"t::a": [1, {"telling": True}]} if replay_ids else None}

    def cand() -> Candidate:
        c = Candidate([site], mutation=Mutation([site], {"src/m.py": "changed"}), fail_to_pass=["t::a"])
        c.selected = {"t::a"}  # the map linked only t::a to f
        return c
    traces = {"t::a": [{"t": "m.f"}]}
    box: Any = Box({"t::a", "t::b"})
    kept = confirm(box, cand(), stable, 5, traces)
    # the second and third runs
    assert kept.drop is None and kept.fail_to_pass == ["t::a", "t::b"] and kept.unlinked == 1 and box.runs == 2
    flaky = confirm(Box({"t::a"}), cand(), stable, 5, traces)  # type: ignore[arg-type]
    assert flaky.drop is not None and flaky.drop.startswith("flaky")


def test_the_comparison_is_strict_about_types_and_blind_to_order_and_addresses():
    same = calltrace.same
    assert not same(1, 1.0) and not same(True, 1) and not same({"$t": [1]}, [1])
    assert same({"$d": [["a", 1], ["b", 2]]}, {"$d": [["b", 2], ["a", 1]]})
    assert same({"$s": [1, 2]}, {"$s": [2, 1]})
    assert same({"$ref": 3, "type": "m.C", "repr": "<m.C object at 0x7f00>"},
                {"$ref": 9, "type": "m.C", "repr": "<m.C object at 0x1>"})
    assert not same({"$ref": 3, "type": "m.C", "repr": "C(1)"}, {"$ref": 3, "type": "m.C", "repr": "C(2)"})
    assert same({"exc": ["ValueError", "Exception"]}, {"exc": ["ValueError"]})
    assert not same({"exc": ["ValueError"]}, {"exc": ["TypeError"]}) and not same({"exc": ["ValueError"]}, None)


# -- the wheel lock and its layer -----------------------------------------------------------------------

def _wheel(path: Path) -> Path:
    whl = path / "tinytool-1.0-py3-none-any.whl"
    files = {"tinytool/__init__.py": b"def main():\n    print('hi')\n",
             "tinytool-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinytool\nVersion: 1.0\n",
             "tinytool-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
                                             b"Root-Is-Purelib: true\nTag: py3-none-any\n",
             "tinytool-1.0.dist-info/entry_points.txt": b"[console_scripts]\ntinytool = tinytool:main\n"}
    record = "".join(f"{n},,\n" for n in files) + "tinytool-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(whl, "w") as z:
        for n, data in files.items():
            z.writestr(n, data)
        z.writestr("tinytool-1.0.dist-info/RECORD", record)
    return whl


def test_a_lock_gives_the_same_layer_from_the_cache_with_no_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from envkit import pylock

    monkeypatch.setenv("ENVKIT_WHEEL_CACHE", str(tmp_path / "cache"))
    whl = _wheel(tmp_path)
    sha = hashlib.sha256(whl.read_bytes()).hexdigest()
    cached = pylock.cache_dir() / sha / whl.name
    cached.parent.mkdir(parents=True)
    shutil.copyfile(whl, cached)
    entries = [pylock.LockEntry("tinytool", "1.0", sha, whl.name)]
    text = pylock.write_lock(entries, ["tinytool"])
    assert pylock.parse_lock(text) == entries
    monkeypatch.setattr(pylock, "_pip", lambda *a: pytest.fail("no download when the wheel is cached"))
    first, second = pylock.layer(entries), pylock.layer(entries)
    assert first == second
    with tarfile.open(fileobj=io.BytesIO(first)) as t:
        names = {m.name: m for m in t.getmembers()}
        assert all(m.mtime == 0 and m.uid == 0 for m in names.values())
        assert "usr/local/lib/python3.11/dist-packages/tinytool/__init__.py" in names
        script = t.extractfile(names["usr/local/bin/tinytool"]).read()  # type: ignore[union-attr]
        assert script.startswith(b"#!/usr/bin/python3") and names["usr/local/bin/tinytool"].mode == 0o755
        assert not any(n.endswith(".pyc") for n in names)
    assert pylock.cached_layer(text) == first


def test_a_missing_wheel_without_network_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from envkit import pylock

    monkeypatch.setenv("ENVKIT_WHEEL_CACHE", str(tmp_path / "cache"))

    def offline(args, what):
        raise UserError(f"pip could not download {what}: Network is unreachable", "")
    monkeypatch.setattr(pylock, "_pip", offline)
    with pytest.raises(UserError) as e:
        pylock.wheel_path(pylock.LockEntry("tinytool", "1.0", "0" * 64, "tinytool-1.0-py3-none-any.whl"))
    assert "is not in envkit's cache" in e.value.message and "copy the cache" in e.value.hint
    with pytest.raises(UserError, match="not a locked wheel"):
        pylock.parse_lock("pytest>=8\n")


# -- hidden tests that import the workspace ------------------------------------------------------------

def test_hidden_tests_that_import_the_workspace_are_refused_up_front(pyfix_copy: Path):
    (pyfix_copy / "verify" / "tests" / "fix-median.py").write_text(
        "from kit.stats import median\nimport kit.text as t\n\n"
        "def test_m():\n    assert median([1, 2]) == 1.5\n")
    with pytest.raises(SpecError) as e:
        load_environment(pyfix_copy)
    problem = e.value.problems[0]
    assert problem.path == "verify/tests/fix-median.py:1"
    assert "trust boundary" in problem.message
    assert 'median = function("kit.stats.median")' in problem.fix and "envkit synth" in problem.fix


# -- task text ------------------------------------------------------------------------------------------

def test_the_template_names_tests_and_api_never_the_patch():
    from envkit.synth.text import instruction

    words = instruction(project="minicalc", package_dir="src", test_cmd="python3 -m pytest -q tests",
                        failing=[("tests/test_core.py::test_mean",
                                  "assert 2.0 == 2.5\n +  where 2.0 = mean([1, 2, 3, 4])")],
                        apis=["minicalc.core.mean", "minicalc.core._helper"])
    assert "`minicalc.core.mean`" in words and "_helper" not in words
    assert "`tests/test_core.py::test_mean`: assert 2.0 == 2.5 + where 2.0 = mean([1, 2, 3, 4])" in words
    assert "/workspace" in words and "python3 -m pytest -q tests" in words
    body = instruction(project="minicalc", package_dir="src", test_cmd="t", failing=[("a::b", "NotImplementedError")],
                       apis=[], body_of="minicalc.core.Stack.peek")
    assert body.startswith("`minicalc.core.Stack.peek` in minicalc has no implementation")
    # a default repr's address differs from run to run: the same seed gives the same text
    a, b = (instruction(project="m", package_dir="src", test_cmd="t", apis=[],
                        failing=[("a::b", f"assert <m.Box object at {addr}> == 3")])
            for addr in ("0x7fa9024d6c10", "0x7f1"))
    assert "<m.Box object at 0x…> == 3" in a and "0x7f1" in b


def test_the_writer_endpoint_rewrites_and_its_failures_keep_the_template():
    """The writer is a declared seam (an OpenAI-compatible URL): a loopback server stands in."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from envkit.synth.text import rewrite

    replies = {"text": "Hi, `tests/t.py::test_a` fails for me since upgrading."}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, body: dict, status: int = 200) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._send({"data": [{"id": "tiny"}]})

        def do_POST(self):
            asked = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            assert asked["model"] == "tiny" and "tests/t.py::test_a" in asked["messages"][0]["content"]
            if replies["text"] is None:
                self._send({"error": "down"}, 500)
            else:
                self._send({"choices": [{"message": {"content": replies["text"]}}]})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    template = "A bug makes 1 test fail.\n- `tests/t.py::test_a`: assert 1 == 2"
    try:
        text, error = rewrite(template, url)
        assert error is None and text.startswith("Hi, `tests/t.py::test_a` fails") and "/workspace" in text
        replies["text"] = "Something is broken."  # the test's name dropped: not taken
        assert rewrite(template, url) == (template, "the rewritten text dropped a test name")
        replies["text"] = None  # the endpoint fails
        text, error = rewrite(template, url)
        assert text == template and error and "500" in error
    finally:
        server.shutdown()
        server.server_close()
    text, error = rewrite(template, "http://127.0.0.1:9", timeout_s=2)  # nothing listens
    assert text == template and error


def test_replayed_tests_are_spread_over_functions_and_inputs():
    from envkit.synth.pipeline import spread

    ids = [f"t.py::test_a[{i}]" for i in range(20)] + ["t.py::test_b[x]", "t.py::test_b[y]", "t.py::test_c"]
    picked = spread(ids, 6)
    assert picked[:3] == ["t.py::test_a[0]", "t.py::test_b[x]", "t.py::test_c"]
    assert picked[3:] == ["t.py::test_a[3]", "t.py::test_b[y]", "t.py::test_a[6]"]
    assert sorted(spread(ids, 100)) == sorted(ids)  # all of them when there is room


def test_a_bug_told_apart_only_by_an_objects_type_does_not_count():
    assert calltrace.telling(5) and calltrace.telling({"exc": ["ValueError"]})
    assert calltrace.telling({"$ref": 1, "type": "m.Duration", "repr": "Duration(days=1)"})
    assert not calltrace.telling({"$ref": 1, "type": "m.Utc", "repr": "<m.Utc object at 0x7f3e>"})
    assert not calltrace.telling({"$gen": 2})


def test_the_patch_leaves_file_times_as_the_seed_had_them(minicalc: Path):
    core = minicalc / "src" / "minicalc" / "core.py"
    os.utime(core, (0, 0))
    old = core.read_text()
    patch = "".join(difflib.unified_diff(old.splitlines(True), old.replace("x > hi", "x >= hi").splitlines(True),
                                         "a/src/minicalc/core.py", "b/src/minicalc/core.py"))
    helper.apply_patch(str(minicalc), patch.encode())
    # which files a bug touched is not in their times
    assert "x >= hi" in core.read_text() and core.stat().st_mtime == 0


def test_the_verifier_replays_keywords_named_like_calls_own_and_refuses_data_for_a_generator(monkeypatch):
    verifier = _load("suite_verifier")
    sent = []

    class Session:
        def request(self, message, **kw):
            sent.append(message)
            return [1, 2]

    monkeypatch.setattr(verifier.envkit_check, "session", lambda: Session())
    out, _ = verifier.invoke({"t": "pkg.f", "out": 5}, [1], {"timeout": 7, "target": "x"}, {})
    assert sent[0]["kwargs"] == {"timeout": 7, "target": "x"} and sent[0]["target"] == "pkg.f" and out == [1, 2]
    out, objects = verifier.invoke({"t": "pkg.gen", "out": {"$gen": 1}}, [], {}, {})
    assert out == [1, 2] and objects == [] and not calltrace.same(out, {"$gen": 1})


def test_the_suite_verifier_stops_at_the_first_differing_call_and_runs_no_suite_then(monkeypatch, tmp_path, capsys):
    """A replayed call that differs decides the reward (0): the rest of the replay and the
    project's suite (minutes for a large one) are not run."""
    verifier = _load("suite_verifier")
    (tmp_path / "suite.json").write_text(json.dumps({"tests": ["t::a", "t::b", "t::c", "t::p"], "files": []}))
    recorded = {t: [{"t": "pkg.f"}] for t in ("t::a", "t::b", "t::c")}
    (tmp_path / "traces.json.gz").write_bytes(gzip.compress(json.dumps(recorded).encode()))  # what synth writes
    (tmp_path / "traces.json").write_text("{}")  # an older environment's file: the .gz one wins
    assert verifier.read_traces(str(tmp_path)) == recorded
    replayed, suites = [], []

    def replay(steps, invoke):
        replayed.append(steps)
        return (1, None) if len(replayed) == 1 else (0, {"step": 0, "why": "value"})

    monkeypatch.setattr(verifier, "replay", replay)
    monkeypatch.setattr(verifier, "run_suite", lambda *a: suites.append(a) or (set(), None))
    monkeypatch.setattr(verifier.envkit_check, "end_session", lambda: None)
    monkeypatch.setattr(verifier.envkit_check, "stats", lambda: {})
    monkeypatch.setenv("ENVKIT_TASK_PARAMS", json.dumps({"fail_to_pass": ["t::a", "t::b", "t::c"]}))
    monkeypatch.setattr(sys, "argv", ["suite_verifier", "--suite", str(tmp_path)])
    assert verifier.main() == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["reward"] == 0.0 and len(replayed) == 2 and suites == []
    assert out["replay"]["replayed"] == 2
    assert out["replay"]["mismatches"] == [{"test": "t::b", "step": 0, "why": "value"}]
    assert out["pass_to_pass"] == {"total": 1, "failed": None} and out["suite"].startswith("not run")

    replayed.clear()  # every call matches: the suite decides
    monkeypatch.setattr(verifier, "replay", lambda steps, invoke: replayed.append(steps) or (1, None))
    assert verifier.main() == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["reward"] == 1.0 and len(replayed) == 3 and len(suites) == 1
    assert suites[0][2] == ["t::a", "t::b", "t::c", "t::p"]


def test_the_suite_verifier_runs_under_the_hash_seed_the_calls_were_recorded_with(monkeypatch):
    """calltrace.replay rebuilds a recorded set in the verifier's process and sends it on in that
    process's order: under a random seed a generator over it yielded another sequence and the
    task's own fix scored 0 at random (pathspec, 2 of 6 tasks). The verifier starts itself again
    under PYTHONHASHSEED=0 (suite_runner.CLEAN_ENV) when its hashing is randomised."""
    import runpy

    path = ROOT / "envkit" / "sandbox" / "incontainer" / "suite_verifier.py"
    calls = []

    def execve(exe, argv, env):
        calls.append((argv, env))
        raise SystemExit(0)

    monkeypatch.setattr(os, "execve", execve)
    monkeypatch.setattr(sys, "argv", [str(path), "--suite", "/nonexistent"])
    with pytest.raises(SystemExit):
        runpy.run_path(str(path), run_name="__main__")
    if sys.flags.hash_randomization:
        assert calls and calls[0][0][1:] == [str(path), "--suite", "/nonexistent"], calls
        assert calls[0][1]["PYTHONHASHSEED"] == "0"
    else:  # this test process already runs under a fixed seed: nothing to do
        assert calls == []


def test_every_file_of_the_bundled_environments_is_in_git():
    """A project's own .gitignore (isodate's ignores its generated version.py) must not drop a file
    from a bundled environment: a clean clone would hold a project that does not import."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    proc = subprocess.run(["git", "ls-files", "--others", "--ignored", "--exclude-standard", "environments"], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    left_out = [p for p in proc.stdout.splitlines()
                if not p.endswith(("envkit.lock", ".pyc")) and "__pycache__" not in p]
    assert left_out == [], f"ignored by git, so missing from a clone (git add -f them): {left_out}"


def test_bench_json_keeps_the_rows_of_packages_an_earlier_run_measured(tmp_path: Path):
    from envkit.synth.synth_bench import write_rows

    path = tmp_path / "bench.json"
    write_rows(path, [{"package": "a==1", "tasks": 50}, {"package": "b==1", "tasks": 40}])
    write_rows(path, [{"package": "b==1", "refused": "slow"}, {"package": "c==2", "tasks": 30}])
    assert json.loads(path.read_text()) == [{"package": "a==1", "tasks": 50}, {"package": "b==1", "refused": "slow"},
                                            {"package": "c==2", "tasks": 30}]
    path.write_text("not json")
    write_rows(path, [{"package": "d==1", "tasks": 1}])
    assert json.loads(path.read_text()) == [{"package": "d==1", "tasks": 1}]


@pytest.mark.parametrize("how", ["map", "until"])
def test_an_interrupt_ends_the_suite_runs_at_once(how: str):
    """Ctrl-C (or SIGTERM) while the sandboxes run a suite: their sandboxes go at once, so the
    command stops in moments, not when the runs reach their cap (minutes for a slow suite), and
    no queued check starts."""
    import signal
    import threading
    import time

    from envkit.synth.pipeline import Boxes

    class Sandbox:
        def __init__(self) -> None:
            self.gone = threading.Event()

        def destroy(self) -> None:
            self.gone.set()

    class Box:
        def __init__(self) -> None:
            self.sandbox = Sandbox()

        def run(self) -> None:
            started.append(1)
            if not self.sandbox.gone.wait(60):  # a suite run that ends when its sandbox goes
                raise AssertionError("the run was left to its cap")
            raise ConnectionError("the sandbox is gone")

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    started: list[int] = []
    boxes = Boxes([Box(), Box()])  # type: ignore[list-item]
    before = signal.signal(signal.SIGALRM, interrupt)
    t0 = time.monotonic()
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        with pytest.raises(KeyboardInterrupt):
            if how == "map":
                boxes.map(lambda box, _: box.run(), list(range(6)), lambda: None)
            else:
                boxes.until(lambda box, _: box.run(), list(range(6)), settle=lambda _: None, enough=lambda: False,
                            progress=lambda: None)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
        if old_delay:  # pytest-timeout's own alarm (its signal method): resumed with what was left of it
            signal.setitimer(signal.ITIMER_REAL, max(0.001, old_delay - (time.monotonic() - t0)), old_interval)
    assert time.monotonic() - t0 < 5
    assert all(b.sandbox.gone.is_set() for b in boxes.all) and len(started) == 2  # the queued four never started
