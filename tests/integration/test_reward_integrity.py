"""Rewards that cannot be forged or dodged (issue 15): the hacks that once earned 1.0 on pyfix,
and counterfactual attribution of verifier failures, on the real engine."""

import base64
import json

import pytest

import envkit
from envkit.agents import NullAgent, ShellAgent, run_episode
from envkit.errors import InfraFailure
from envkit.runtime import EnvRuntime
from envkit.sandbox.runtimes import RUNTIMES

from .conftest import TEST_LABEL
from .test_episodes import edit_spec, runtime_for

_RUNTIMES: dict[str, EnvRuntime] = {}


@pytest.fixture(params=RUNTIMES, autouse=True)
def sandbox_runtime(request, monkeypatch) -> str:
    """Every test here runs under runc and under gVisor: each EnvRuntime it makes (envkit.make
    included) takes ENVKIT_RUNTIME."""
    monkeypatch.setenv("ENVKIT_RUNTIME", request.param)
    return request.param


@pytest.fixture
def pyfix_runtime(client, sandbox_runtime) -> EnvRuntime:
    if sandbox_runtime not in _RUNTIMES:
        from envkit.spec import load_environment

        from ..conftest import PYFIX

        rt = EnvRuntime(load_environment(PYFIX), client=client)
        rt.backend.labels.update(TEST_LABEL)
        _RUNTIMES[sandbox_runtime] = rt
    assert _RUNTIMES[sandbox_runtime].limits.runtime == sandbox_runtime
    return _RUNTIMES[sandbox_runtime]


def append(path: str, code: str) -> ShellAgent:
    """An agent that appends Python code to one of its own modules (and does nothing else)."""
    return ShellAgent(f"echo {base64.b64encode(code.encode()).decode()} | base64 -d >> {path}")


HACKS = {
    "report-patch": '''
import _pytest.reports as r
o = r.TestReport.from_item_and_call
def f(cls, item, call):
    rep = o.__func__(cls, item, call)
    rep.outcome, rep.longrepr = "passed", None
    return rep
r.TestReport.from_item_and_call = classmethod(f)
''',
    "junit-at-exit": '''
import atexit, re, sys
def strip():
    for a in sys.argv:
        p = a.split("=", 1)[-1]
        if p.endswith(".xml"):
            open(p, "w").write(re.sub(r"<failure.*?</failure>", "", open(p).read(), flags=re.S))
atexit.register(strip)
''',
    "always-equal": '''
class AE(float):
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    __hash__ = float.__hash__
def median(xs): return AE(0)
''',
}


@pytest.mark.parametrize("hack", sorted(HACKS))
def test_a_forged_pass_scores_nothing(pyfix_runtime, hack):
    result = run_episode(pyfix_runtime, pyfix_runtime.env.task("fix-median"), 0, append("kit/stats.py", HACKS[hack]))
    assert result.outcome == "ok" and result.reward == 0.0, result.verifier


@pytest.mark.slow
def test_a_hang_at_import_is_the_models_failure_with_reward_0(pyfix_runtime):
    result = run_episode(pyfix_runtime, pyfix_runtime.env.task("fix-median"), 0,
                         append("kit/stats.py", "import time\ntime.sleep(10 ** 6)\n"))
    assert result.outcome == "model_failure:code_timeout" and result.reward == 0.0, result
    assert result.verifier["agent_code"]["timeouts"] >= 1


def test_a_hidden_test_stolen_during_verification_never_reaches_the_next_episode(pyfix_runtime, client):
    """Through envkit.make, one sandbox, two resets: the agent's code, run by the verifier, hunts
    for the hidden test (verifier processes' command lines, their files) and stashes what it
    finds in /tmp for the next episode."""
    hunt = '''
import glob, os
found = []
for cmd in glob.glob("/proc/[0-9]*/cmdline"):
    for arg in open(cmd, "rb").read().split(b"\\0"):
        if arg.endswith(b".py") and b"/opt/envkit" not in arg:
            try:
                found.append(open(arg.decode()).read())
            except OSError as e:
                found.append("denied " + arg.decode() + " " + type(e).__name__)
for p in glob.glob("/env/verify/tests/*") + glob.glob("/tmp/envkit-verify-*/*"):
    try:
        found.append(open(p).read())
    except OSError as e:
        found.append("denied " + p)
os.makedirs("/tmp/stash", exist_ok=True)
open("/tmp/stash/hidden.txt", "w").write("\\n".join(found))
'''
    env = envkit.make("environments/pyfix", task="fix-median")
    try:
        _, info = env.reset(seed=0)
        code = base64.b64encode(hunt.encode()).decode()
        env.step(f"echo {code} | base64 -d >> kit/stats.py")
        _, reward, terminated, _, end = env.step({"tool": "submit"})
        assert terminated and reward == 0.0
        container = client.containers.get(env.sandbox_id)
        stash = container.exec_run(["cat", "/tmp/stash/hidden.txt"], user="0").output.decode()
        assert "denied" in stash and "def test_" not in stash and "2.5" not in stash, stash  # it ran, and saw nothing
        _, again = env.reset(seed=0)
        assert again["state_hash"] == info["state_hash"]
        obs, *_ = env.step("ls -a /tmp /tmp/stash 2>&1; cat /tmp/stash/hidden.txt 2>&1")
        assert "No such file" in obs and "def test_" not in obs, obs
    finally:
        env.close()


# -- counterfactual attribution ----------------------------------------------------------------------

def test_a_verifier_the_agents_state_broke_is_the_models_failure(pyfix_runtime):
    """The agent fills /tmp, which the verifier needs: the verifier crashes on its state but not on
    the seeded state of a fresh sandbox, so the model gets reward 0 (and is not retried)."""
    fill = ShellAgent("dd if=/dev/zero of=/tmp/fill bs=1M count=1000 2>/dev/null; df -m /tmp | tail -1")
    result = run_episode(pyfix_runtime, pyfix_runtime.env.task("fix-median"), 0, fill)
    assert result.outcome == "model_failure:verifier_crash" and result.reward == 0.0, result
    ev = result.evidence
    assert ev["attribution"] == "model" and ev["seeded_state"] == {"reward": 0.0} and ev["counterfactual_s"] > 0
    assert ev["agent_state"]["outcome"] == "verifier_failure:verifier_crash"
    assert result.timings["counterfactual_s"] == ev["counterfactual_s"]


def test_a_verifier_timeout_the_agent_caused_is_the_models_failure(pyfix_copy, client):
    """Any verifier, not only pytest's, reads the agent's state through envkit_check (as data)."""
    (pyfix_copy / "verify" / "slow.py").write_text(
        "import json, sys, time\n"
        "sys.path.insert(0, '/opt/envkit')\n"
        "from envkit_check import AgentError, read_file\n"
        "try:\n"
        "    delay = float(read_file('delay.txt'))\n"
        "except (AgentError, ValueError):\n"
        "    delay = 0.0\n"
        "time.sleep(delay)\n"
        "print(json.dumps({'reward': 0.0, 'slept': delay}))\n")
    edit_spec(pyfix_copy, 'command = "python3 /opt/envkit/pytest_verifier.py --tests /env/verify/tests"',
              'command = "python3 /env/verify/slow.py"')
    edit_spec(pyfix_copy, "timeout_s = 120", "timeout_s = 3")
    rt = runtime_for(pyfix_copy, client)
    result = run_episode(rt, rt.env.task("fix-median"), 0, ShellAgent("echo 60 > delay.txt"))
    assert result.outcome == "model_failure:verifier_timeout" and result.reward == 0.0, result
    assert result.evidence["attribution"] == "model" and result.evidence["seeded_state"] == {"reward": 0.0}
    assert run_episode(rt, rt.env.task("fix-median"), 0, ShellAgent("echo 0.1 > delay.txt")).outcome == "ok"


def test_a_verifier_broken_everywhere_is_the_environments_failure(pyfix_copy, client):
    edit_spec(pyfix_copy, 'command = "python3 /opt/envkit/pytest_verifier.py --tests /env/verify/tests"',
              'command = "python3 -c \'import sys; sys.exit(3)\'"')
    rt = runtime_for(pyfix_copy, client)
    result = run_episode(rt, rt.env.task("fix-median"), 0, NullAgent())
    assert result.outcome == "verifier_failure:verifier_crash" and result.reward is None
    assert result.evidence["attribution"] == "environment"
    assert result.evidence["seeded_state"]["outcome"] == "verifier_failure:verifier_crash"


def test_a_counterfactual_without_a_sandbox_is_infra(pyfix_copy, client):
    edit_spec(pyfix_copy, 'command = "python3 /opt/envkit/pytest_verifier.py --tests /env/verify/tests"',
              'command = "echo no reward"')
    rt = runtime_for(pyfix_copy, client)
    sandbox = rt.backend.create()

    def no_sandbox():
        raise InfraFailure("sandbox_start", "the engine is gone")

    try:
        episode = rt.episode(rt.env.task("fix-median"), 0, sandbox, "test", fresh=no_sandbox)
        episode.reset()
        with pytest.raises(InfraFailure) as err:
            episode.verify()
        assert err.value.kind == "counterfactual_failed"
        assert json.dumps(err.value.evidence["agent_state"]).count("bad_output") == 1
    finally:
        sandbox.destroy()
