"""The Gymnasium-shaped Python API (envkit.make / envkit.check_env) on every bundled
environment, with real sandboxes: the contract checks, and each environment's first task
solved by replaying its oracle through ``env.step`` (reward 1.0) and failed by a null answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
        report = envkit.check_env(env)
        assert report["env"] == env.ref and len(report["passed"]) >= 8, report

        task = env.runtime.env.tasks[0]
        obs, info = env.reset(seed=5, options={"task": task.id})
        assert obs == task.instruction and info["task_id"] == task.id and info["seed"] == 5
        oracle = Path(env.runtime.env.root) / task.oracle
        if oracle.suffix == ".json":  # tool actions: exactly this API's dict form
            actions = json.loads(oracle.read_text())["actions"]
        else:  # a shell script: one bash action
            actions = [oracle.read_text()]
        out: tuple = ()
        for action in actions:
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
        with pytest.raises(InvalidAction, match="no bash tool"):
            env.step("ls")  # shellcmd offers no bash: a string action is refused, nothing runs
        with pytest.raises(InvalidAction, match="needs text"):
            env.step({"tool": "answer"})
        with pytest.raises(UserError, match="no task"):
            env.reset(seed=0, options={"task": "nope"})
        with pytest.raises(UserError, match="non-negative"):
            env.reset(seed=-1)
    with pytest.raises(UserError, match="doesn't exist|no environment"):
        envkit.make("envkit/no-such-env@1.0.0")
