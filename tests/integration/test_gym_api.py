"""The Python API (envkit.make / envkit.check_env) on every bundled environment, with real
sandboxes: Gymnasium's own checker, the contract checks, and each environment's first task
solved by replaying its oracle through ``env.step`` (reward 1.0) and failed by a null answer."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env as gymnasium_check_env

import envkit
from envkit.errors import UserError
from envkit.gym import InvalidAction, ResetNeeded

from ..conftest import ROOT

BUNDLED = sorted(p.name for p in (ROOT / "environments").iterdir() if (p / "envkit.toml").is_file())


def test_every_bundled_environment_is_listed():
    assert set(BUNDLED) >= {"pyfix", "supportdesk", "issuetracker", "shellcmd"}


@pytest.mark.parametrize("name", BUNDLED)
def test_check_env_passes_and_the_oracle_reaches_its_reward_through_step(name: str):
    env = envkit.make(str(ROOT / "environments" / name))
    try:
        assert isinstance(env, gymnasium.Env)
        gymnasium_check_env(env, skip_render_check=True)  # Gymnasium's own checker: spaces, seeding, determinism
        report = envkit.check_env(env)
        assert report["env"] == env.ref and len(report["passed"]) >= 8, report
        assert [s["function"]["name"] for s in env.tool_schemas][-1] == "answer"

        task = env.runtime.env.tasks[0]
        obs, info = env.reset(seed=5, options={"task": task.id})
        assert obs == task.instruction and info["task_id"] == task.id and info["seed"] == 5
        oracle = Path(env.runtime.env.root) / task.oracle
        if oracle.suffix == ".json":  # tool actions: exactly this API's dict form
            actions = json.loads(oracle.read_text())["actions"]
        elif oracle.suffix == ".diff":  # a patch (envkit synth's fixes): applied with git, in one bash action
            actions = [f"cd /workspace && git apply <<'ENVKIT_EOF'\n{oracle.read_text()}ENVKIT_EOF"]
        else:  # a shell script: one bash action
            actions = [oracle.read_text()]
        out: tuple = ()
        for action in actions:
            if isinstance(action, dict):  # an argument the oracle takes from a command's output: that command first
                for key, value in list(action.items()):
                    if isinstance(value, dict) and set(value) == {"from_bash"}:
                        action[key] = env.step(value["from_bash"])[0].split("\n", 1)[1].strip()  # "exit 0\n<stdout>"
            out = env.step(action)
            if out[2] or out[3]:
                break
        if not (out[2] or out[3]):
            out = env.step({"tool": "submit"})
        assert out[1] == 1.0 and out[2] is True and out[4]["outcome"] == "ok", out

        env.reset(seed=5, options={"task": task.id})
        null = env.step({"tool": "answer", "text": "I do not know"})
        assert null[1] == 0.0 and null[2] is True
    finally:
        env.close()


def test_make_by_ref_and_clear_refusals():
    with envkit.make("envkit/shellcmd@1.0.0", task="git-status") as env:
        obs, info = env.reset(seed=0)
        assert info["task_id"] == "git-status" and "git" in obs
        _, reward, terminated, truncated, end = env.step({"name": "answer", "arguments": {"text": "git status"}})
        assert (reward, terminated, truncated, end["outcome"]) == (1.0, True, False, "ok")
        with pytest.raises(ResetNeeded, match="reset"):
            env.step("ls")
        env.reset(seed=1)
        _, reward, terminated, _, end = env.step("ls -la")  # shellcmd offers no bash: a string is the answer
        assert terminated and end["verifier"]["reward"] == reward
        env.reset(seed=1)
        with pytest.raises(InvalidAction, match="string or a dict"):
            env.step(12345)  # nothing runs
        with pytest.raises(InvalidAction, match="needs text"):
            env.step({"tool": "answer"})
        with pytest.raises(UserError, match="no task"):
            env.reset(seed=0, options={"task": "nope"})
        with pytest.raises(UserError, match="non-negative"):
            env.reset(seed=-1)
    with pytest.raises(UserError, match="doesn't exist|no environment"):
        envkit.make("envkit/no-such-env@1.0.0")


def test_a_command_too_long_to_start_is_the_models_failure_not_infra():
    with envkit.make(str(ROOT / "environments" / "pyfix")) as env:
        env.reset(seed=0)
        obs, reward, terminated, truncated, info = env.step("echo " + "x" * 200_000)  # past one exec argument's 128 KiB
        assert ((terminated, truncated, reward) == (True, False, 0.0)
                and info["outcome"] == "model_failure:command_too_long")
        assert "at most 100000" in obs
