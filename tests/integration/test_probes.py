"""Hack probes in `envkit validate`: they hold on the bundled environments, they catch a weak
verifier, and what does not apply is skipped with its reason."""

import json

import pytest

from envkit.runtime import EnvRuntime
from envkit.sandbox.runtimes import RUNTIMES
from envkit.spec import load_environment
from envkit.validate import validate

from ..conftest import ROOT
from .conftest import TEST_LABEL
from .test_episodes import envkit


@pytest.fixture(params=RUNTIMES)
def sandbox_runtime(request, monkeypatch) -> str:
    """The probes played under runc and under gVisor (the CLI's subprocess takes ENVKIT_RUNTIME too)."""
    monkeypatch.setenv("ENVKIT_RUNTIME", request.param)
    return request.param


# A verifier written the weak way: it runs the agent's code as the agent (good) but believes
# the process's exit status (bad: the agent's code decides it).
WEAK_TEST = '''from envkit_check import run


def test_median_of_even_length():
    r = run(["python3", "-c", "from kit.stats import median; assert median([1, 2, 3, 4]) == 2.5"])
    assert r.returncode == 0
'''


@pytest.mark.slow
def test_shellcmd_passes_the_default_probes(client):
    runtime = EnvRuntime(load_environment(ROOT / "environments" / "shellcmd"), client=client)
    runtime.backend.labels.update(TEST_LABEL)
    report = validate(runtime, jobs=2)
    assert report.ok, [(t.task_id, t.problems) for t in report.tasks if not t.ok]
    assert report.probes_run == ["fake-reward-answer", "answer-stuffing", "disabled-tools"]
    assert report.probes_skipped["report-patch"] == "the environment offers no bash tool"
    assert report.health_figures()["probes"]["beaten"] == {}


@pytest.mark.slow
def test_the_probes_catch_a_verifier_that_trusts_the_agents_exit_status(pyfix_copy, sandbox_runtime):
    """Every probe, under both runtimes (the bundled environment's default probes run under runc
    above: under gVisor they cost 33 s more of the suite's budget and exercise the same code)."""
    (pyfix_copy / "verify" / "tests" / "fix-median.py").write_text(WEAK_TEST)
    proc = envkit("validate", str(pyfix_copy), "--task", "fix-median", "--json")
    assert proc.returncode == 1, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["runtime"] == sandbox_runtime
    beaten = report["probes"]["beaten"]
    assert {"exit-zero", "always-equal"} <= set(beaten) and beaten["exit-zero"] == ["fix-median"], report["probes"]
    [task] = report["tasks"]
    assert task["oracle_reward"] == 1.0 and task["null_reward"] == 0.0  # oracle and null alone would pass it
    exit_zero = next(p for p in task["probes"] if p["probe"] == "exit-zero")
    assert exit_zero["reward"] == 1.0 and "above the null agent's" in exit_zero["why"]
    assert any("probe exit-zero beat it" in p for p in task["problems"])
