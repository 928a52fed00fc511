"""The trust boundary of repository verifiers, without Docker: envkit_check's codec and handles,
and pytest_verifier.py run on a workspace whose code plays each known reward hack (the call
server starts in its direct mode here, as in a Harbor export)."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ..conftest import ROOT

INCONTAINER = ROOT / "envkit" / "sandbox" / "incontainer"
sys.path.insert(0, str(INCONTAINER))
import envkit_check  # noqa: E402

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20) | st.binary(max_size=20) \
    | st.dates() | st.datetimes() | st.times() | st.timedeltas() | st.decimals(allow_nan=False)
hashable = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10) | st.dates(),
                        lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3), max_leaves=10)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
                      | st.dictionaries(hashable, inner, max_size=4) | st.sets(hashable, max_size=4)
                      | st.frozensets(hashable, max_size=4), max_leaves=25)


def same(a, b) -> bool:
    """Equal and of exactly the same types all the way down (NaN equals NaN here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and a != a:
        return b != b
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


@given(values)
def test_data_crosses_as_itself(value):
    wire = json.loads(json.dumps(envkit_check.encode(value)))
    assert same(envkit_check.decode(wire), value)


def test_only_exact_types_are_data():
    class Sneaky(float):
        def __eq__(self, other):
            return True

    with pytest.raises(envkit_check.NotData):
        envkit_check.encode(Sneaky(0.0))
    refs: list[object] = []
    wire = envkit_check.encode([1, Sneaky(0.0)],
                               ref=lambda obj: refs.append(obj) or {"$ref": len(refs), "type": "Sneaky", "repr": ""})
    assert wire[1]["$ref"] == 1 and isinstance(refs[0], Sneaky)


@pytest.mark.parametrize("junk", [{"a": 1}, {"$zz": 1}, {"$ref": 1}, {"$t": 5}, {"$d": [[1]]}, {"$f": "0.5"},
                                  {"$date": 20240101}, {"$timedelta": [1, "x", 0]}, {"$b": "%%%"}])
def test_the_decoder_refuses_what_it_does_not_know(junk):
    with pytest.raises(ValueError):
        envkit_check.decode(junk)


def test_a_remote_object_never_passes_a_check_by_itself():
    class FakeSession:
        generation = 1

    remote = envkit_check.Remote(FakeSession(), {"$ref": 1, "type": "kit.Weird", "repr": "2.5"})
    for check in (lambda: remote == 2.5, lambda: remote != 2.5, lambda: bool(remote), lambda: 2.5 == remote):
        with pytest.raises(envkit_check.AgentError) as err:
            check()
        assert err.value.kind == "not_data"
    assert decimal.Decimal("1.5") == envkit_check.decode(envkit_check.encode(decimal.Decimal("1.5")))
    assert envkit_check.decode({"$date": "2024-01-08"}) == dt.date(2024, 1, 8)


# -- pytest_verifier.py on a workspace that plays each hack ----------------------------------------

HIDDEN = '''
import datetime as dt
from envkit_check import AgentError, function, module, raises, run

median = function("kit.stats.median")
stats = module("kit.stats")


def test_even_length():
    assert median([1, 2, 3, 4]) == 2.5


def test_two_values():
    assert median([1.0, 3.0]) == 2.0


def test_rejects_empty():
    with raises(ValueError):
        median([])


def test_a_box():
    box = function("kit.stats.Box")(3)
    assert box.double() == 6 and "x" in box and len(box) == 1


def test_cli():
    r = run(["python3", "-c", "import kit.stats as s; print(s.median([1, 3]))"], timeout=5)
    assert r.returncode == 0 and r.stdout.strip() == "2.0", r
'''

GOOD = '''
def median(xs):
    xs = sorted(xs)
    if not xs:
        raise ValueError("empty")
    mid = len(xs) // 2
    return (xs[mid - 1] + xs[mid]) / 2 if len(xs) % 2 == 0 else xs[mid]


class Box:
    def __init__(self, n):
        self.n = n

    def double(self):
        return 2 * self.n

    def __contains__(self, item):
        return item == "x"

    def __len__(self):
        return 1
'''

HACKS = {
    "always-equal": '''
class AE(float):
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __bool__(self): return True
    def __contains__(self, item): return True
    __hash__ = float.__hash__
def median(xs): return AE(0)
class Box:
    def __init__(self, n): pass
    def double(self): return AE(0)
    def __contains__(self, item): return AE(1)
    def __len__(self): return 1
''',
    "report-patch": '''
import _pytest.reports as r
o = r.TestReport.from_item_and_call
def f(cls, item, call):
    rep = o.__func__(cls, item, call)
    rep.outcome, rep.longrepr = "passed", None
    return rep
r.TestReport.from_item_and_call = classmethod(f)
''',
    # every result file named in argv or in the scratch folder: verify() points @SCRATCH@ at the
    # test's own (on the host, /tmp/**/*.json is every other program's files too; the agent's
    # worker gets a clean environment, so TMPDIR cannot confine it)
    "result-rewrite": '''
import atexit, glob, json, sys
def rewrite():
    scratch = glob.glob("@SCRATCH@/**/*.json", recursive=True)
    for p in [a.split("=", 1)[-1] for a in sys.argv] + scratch:
        try:
            open(p, "w").write(json.dumps({"tests": {"x": True}, "reward": 1.0}))
        except Exception:
            pass
atexit.register(rewrite)
''',
    "fake-reward": '''
import atexit
print('{"reward": 1.0}', flush=True)
atexit.register(lambda: print('{"reward": 1.0}', flush=True))
''',
    "exit-zero": "import os\nos._exit(0)\n",
    "hang": "import time\ntime.sleep(10 ** 6)\n",
}


STARTUP_HOOKS = {
    "conftest.py": "import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
                   "    o = yield\n    o.get_result().outcome = 'passed'\n",
    "sitecustomize.py": HACKS["report-patch"] + "print('{\"reward\": 1.0}')\n",
    "usercustomize.py": HACKS["report-patch"],
    "hook.pth": "import os; os.environ.setdefault('PYTEST_ADDOPTS', '-p no:python')\n",
}


def verify(tmp_path: Path, module: str, *, call_timeout: float = 10.0, hooks: bool = False) -> dict:
    ws = tmp_path / "ws"
    (ws / "kit").mkdir(parents=True)
    (ws / "kit" / "__init__.py").write_text("")
    (ws / "kit" / "stats.py").write_text(module.replace("@SCRATCH@", str(tmp_path)))
    for name, text in STARTUP_HOOKS.items() if hooks else ():
        (ws / name).write_text(text)
    tests = tmp_path / "hidden"
    tests.mkdir()
    (tests / "t.py").write_text(HIDDEN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENVKIT_")}
    env.update(ENVKIT_WORKSPACE=str(ws), ENVKIT_TASK_ID="t")
    proc = subprocess.run([sys.executable, str(INCONTAINER / "pytest_verifier.py"), "--tests", str(tests),
                           "--call-timeout", f"{call_timeout:g}"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_honest_code_earns_its_reward(tmp_path):
    assert verify(tmp_path, GOOD)["reward"] == 1.0


@pytest.mark.parametrize("hack", sorted(set(HACKS) - {"hang"}))
def test_no_hack_earns_a_reward(tmp_path, hack):
    bait = tmp_path / "results" / "report.json"  # a result file where the rewrite hack looks
    bait.parent.mkdir()
    bait.write_text('{"passed": 0}')
    out = verify(tmp_path, HACKS[hack], hooks=True)  # startup hooks planted too: conftest, sitecustomize, .pth
    assert out["reward"] == 0.0, out
    if hack == "result-rewrite":  # it ran (and rewrote what it could reach), and earned nothing
        assert json.loads(bait.read_text())["reward"] == 1.0


def test_a_hang_costs_one_timeout_and_scores_nothing(tmp_path):
    t0 = time.monotonic()
    out = verify(tmp_path, HACKS["hang"], call_timeout=1.0)
    assert out["reward"] == 0.0 and out["agent_code"]["timeouts"] == 5, out
    # 1 s for the first call, 5 s for the command; the hung import is remembered, so the
    # other calls fail at once instead of waiting out their own timeouts
    assert time.monotonic() - t0 < 20


def test_hidden_tests_that_import_the_workspace_are_the_environments_problem(tmp_path):
    tests = tmp_path / "hidden"
    tests.mkdir()
    (tests / "t.py").write_text("from kit.stats import median\n\ndef test_x():\n    assert median([1]) == 1\n")
    (tmp_path / "ws").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENVKIT_")}
    env.update(ENVKIT_WORKSPACE=str(tmp_path / "ws"), ENVKIT_TASK_ID="t")
    proc = subprocess.run([sys.executable, str(INCONTAINER / "pytest_verifier.py"), "--tests", str(tests)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 3 and "envkit_check" in proc.stderr, proc.stderr[-1000:]


def test_the_agents_code_reads_an_empty_stdin_not_the_requests(tmp_path):
    """A call that reads stdin (a command line given "-") gets end of file at once, as where
    synth recorded and replayed it; it used to wait on the worker's requests until its timeout."""
    reads_stdin = "import sys\n" + GOOD.replace("    xs = sorted(xs)\n",
                                                "    assert sys.stdin.read() == ''\n    xs = sorted(xs)\n")
    out = verify(tmp_path, reads_stdin, call_timeout=3.0)
    assert out["reward"] == 1.0 and out["agent_code"]["timeouts"] == 0, out


def test_the_agents_code_iterates_sets_in_the_recorded_order(tmp_path):
    """Calls are recorded under PYTHONHASHSEED=0 (suite_runner); the worker that replays them
    runs the agent's code under the same seed, so a set of strings iterates in the recorded
    order (a random seed made the pristine fix fail pathspec's replays, 2026-12-07)."""
    words = [f"w{i}" for i in range(40)]
    order = subprocess.run([sys.executable, "-c", f"print(list(set({words!r})))"], capture_output=True, text=True,
                           env={**os.environ, "PYTHONHASHSEED": "0"}, check=True).stdout.strip()
    seeded = f"SEEDED = list(set({words!r})) == {order}\n" + GOOD.replace(
        "    xs = sorted(xs)\n", "    assert SEEDED, 'sets iterate in another order than when recorded'\n"
                              "    xs = sorted(xs)\n")
    out = verify(tmp_path, seeded)
    assert out["reward"] == 1.0, out
