"""Episodes end to end through the CLI and the library, with each outcome class."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import docker.errors
import pytest

from envkit.agents import NullAgent, OracleAgent, ShellAgent, run_episode
from envkit.errors import ModelFailure
from envkit.runtime import EnvRuntime, KeptSandbox
from envkit.spec import load_environment

from ..conftest import ROOT, envkit
from .conftest import TEST_LABEL


def edit_spec(env_dir: Path, old: str, new: str) -> None:
    spec = env_dir / "envkit.toml"
    text = spec.read_text()
    assert old in text
    spec.write_text(text.replace(old, new))


def runtime_for(path: Path, client) -> EnvRuntime:
    rt = EnvRuntime(load_environment(path), client=client)
    rt.backend.labels.update(TEST_LABEL)
    return rt


def test_run_oracle_and_null_via_cli(pyfix_runtime):
    proc = envkit("run", "environments/pyfix", "--task", "fix-lru-recency", "--agent", "oracle", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["reward"] == 1.0 and result["outcome"] == "ok"
    assert result["image_id"] == pyfix_runtime.build.image_id
    assert result["state_hash"].startswith("sha256:")
    proc = envkit("run", "envkit/pyfix@1.0.0", "--task", "fix-lru-recency", "--agent", "null")
    assert proc.returncode == 0, proc.stderr
    assert "reward 0" in proc.stdout and "outcome ok" in proc.stdout


def _processes(container) -> list[list[str]]:
    try:
        return container.top().get("Processes") or []
    except docker.errors.APIError:  # gone meanwhile (another test's)
        return []


def test_sigterm_ends_a_run_and_removes_its_sandbox(pyfix_runtime, client):
    """A scheduler's SIGTERM (or a closed terminal's SIGHUP) unwinds like Ctrl-C: the episode's
    sandbox is removed and the exit status says which signal (128 + 15)."""
    label = {"label": "org.envkit.sandbox=1"}
    before = {c.id for c in client.containers.list(all=True, filters=label)}
    proc = subprocess.Popen([sys.executable, "-m", "envkit.cli.app", "run", "environments/pyfix", "--task",
                             "fix-median", "--agent", "shell:sleep 45"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    running: list = []  # the run's sandbox, once the agent's command runs in it
    try:
        deadline = time.monotonic() + 60
        while not running:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
            new = [c for c in client.containers.list(filters=label) if c.id not in before]
            running = [c for c in new if any("sleep 45" in " ".join(p) for p in _processes(c))]
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        left = [c.id for c in client.containers.list(all=True, filters=label) if c.id in {r.id for r in running}]
        for cid in left:  # the test's own leftovers, whatever it asserts
            client.containers.get(cid).remove(force=True)
    assert proc.returncode == 128 + signal.SIGTERM and "terminated (SIGTERM)" in err, err
    assert left == []


def test_shell_agent_partial_credit(pyfix_runtime):
    # Fixes only the even-length median formula: all three hidden tests pass.
    task = pyfix_runtime.env.task("fix-median")
    fix = "sed -i 's/ordered\\[mid\\] + ordered\\[mid + 1\\]/ordered[mid - 1] + ordered[mid]/' kit/stats.py"
    assert run_episode(pyfix_runtime, task, 0, ShellAgent(fix)).reward == 1.0
    # A truncate fix that is right for the default ellipsis only: partial credit.
    task = pyfix_runtime.env.task("fix-truncate")
    half = "sed -i 's/return text\\[:width\\] + ellipsis/return text[:width - 3] + ellipsis/' kit/text.py"
    result = run_episode(pyfix_runtime, task, 0, ShellAgent(half))
    assert result.outcome == "ok" and 0.0 < result.reward < 1.0, result


def test_command_timeout_is_a_model_failure_with_reward(pyfix_copy, client):
    edit_spec(pyfix_copy, "command_timeout_s = 60", "command_timeout_s = 1")
    rt = runtime_for(pyfix_copy, client)
    result = run_episode(rt, rt.env.task("fix-median"), 0, ShellAgent("sleep 30"))
    assert result.outcome == "model_failure:command_timeout"
    assert result.reward == 0.0  # the verifier still ran: the model keeps its reward


def test_oom_is_a_model_failure(pyfix_copy, client):
    edit_spec(pyfix_copy, "memory_mb = 512", "memory_mb = 128")
    rt = runtime_for(pyfix_copy, client)
    result = run_episode(rt, rt.env.task("fix-median"), 0, ShellAgent("python3 -c 'b = bytearray(1 << 30)'"))
    assert result.outcome == "model_failure:oom" and result.reward == 0.0


def test_episode_timeout(pyfix_copy, client):
    edit_spec(pyfix_copy, "episode_timeout_s = 600", "episode_timeout_s = 1")
    rt = runtime_for(pyfix_copy, client)
    result = run_episode(rt, rt.env.task("fix-median"), 0, ShellAgent("sleep 5"))
    assert result.outcome == "model_failure:episode_timeout"
    assert result.reward == 0.0


@pytest.mark.parametrize(
    ("command", "outcome"),
    [
        ("python3 -c 'import sys; sys.exit(3)'", "verifier_failure:verifier_crash"),
        ("echo no reward here", "verifier_failure:bad_output"),
        ("echo '{\"reward\": 7}'", "verifier_failure:bad_output"),
    ],
)
def test_broken_verifier(pyfix_copy, client, command, outcome):
    edit_spec(pyfix_copy, 'command = "python3 /opt/envkit/pytest_verifier.py --tests /env/verify/tests"',
              f"command = {json.dumps(command)}")
    rt = runtime_for(pyfix_copy, client)
    result = run_episode(rt, rt.env.task("fix-median"), 0, OracleAgent())
    assert result.outcome == outcome and result.reward is None


def test_container_lost_mid_episode_is_infra(pyfix_runtime, client):
    class Saboteur:
        name = "saboteur"

        def act(self, episode):
            client.containers.get(episode.sandbox.id).kill()
            episode.step("echo after")

    result = run_episode(pyfix_runtime, pyfix_runtime.env.task("fix-median"), 0, Saboteur())
    assert result.outcome == "infra_failure:container_lost", result
    assert result.reward is None


def test_reset_is_checked_against_the_pinned_commit(pyfix_copy, client, pyfix_runtime):
    sb = pyfix_runtime.backend.create()
    try:
        commit = sb.reset(0).commit
    finally:
        sb.destroy()
    edit_spec(pyfix_copy, 'repo = { path = "repo" }', f'repo = {{ path = "repo", commit = "{commit}" }}')
    rt = runtime_for(pyfix_copy, client)
    assert run_episode(rt, rt.env.task("fix-median"), 0, NullAgent()).outcome == "ok"
    # Same files, other pin: the reset lands elsewhere, which is infra's fault, not the model's.
    edit_spec(pyfix_copy, commit, "0" * 40)
    rt = runtime_for(pyfix_copy, client)
    result = run_episode(rt, rt.env.task("fix-median"), 0, NullAgent())
    assert result.outcome == "infra_failure:nondeterministic_reset"
    assert result.evidence["got_commit"] == commit and result.evidence["expected_commit"] == "0" * 40


def test_reset_restores_state_exactly(pyfix_runtime):
    sb = pyfix_runtime.backend.create()
    try:
        clean = sb.reset(3)
        sb.exec("rm -rf kit && echo x > new.txt && mkdir -p locked/deep && chmod 000 locked "
                "&& git commit -qam wip || true")
        sb.exec("sleep 100 &", timeout_s=2)
        again = sb.reset(3)
        assert again.state_hash == clean.state_hash and again.commit == clean.commit
        assert "sleep 100" not in sb.exec("ps -eo args").stdout
    finally:
        sb.destroy()


@pytest.mark.slow
def test_validate_pyfix_via_cli(pyfix_runtime):
    # a seeded 6 of the 13 tasks (the suite's time budget): every task's oracle and null agent run in
    # the Harbor round trip (tests/integration/test_harbor.py), and scripts/demo.sh validates all 13
    proc = envkit("validate", "environments/pyfix", "--sample", "6", "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] and len(report["tasks"]) == 6
    assert all(t["oracle_reward"] == 1.0 and t["null_reward"] == 0.0 for t in report["tasks"])
    det = report["determinism"]
    assert det["ok"] and len(det["hashes"]) == 2 and det["hashes"][0] == det["hashes"][1]
    probes = report["probes"]  # the default set, played on every task: none beat any
    assert probes["set"] == "quick" and probes["beaten"] == {} and len(probes["run"]) >= 10
    assert set(probes["skipped"]) == {"path-escape", "off-origin"}
    assert all(not p["beaten"] for t in report["tasks"] for p in t["probes"])


def test_validate_fails_when_an_oracle_is_wrong(pyfix_copy):
    oracle = pyfix_copy / "oracle" / "fix-median.sh"
    oracle.write_text("#!/bin/bash\ntrue\n")
    proc = envkit("validate", str(pyfix_copy), "--task", "fix-median", "--task", "fix-slugify", "--probes", "none")
    assert proc.returncode == 1
    assert "FAIL" in proc.stdout and "fix-median" in proc.stdout


def test_validate_fails_when_the_verifier_prints_no_reward_on_the_seeded_state(pyfix_copy):
    edit_spec(pyfix_copy, 'command = "python3 /opt/envkit/pytest_verifier.py --tests /env/verify/tests"',
              'command = "echo done"')
    proc = envkit("validate", str(pyfix_copy), "--task", "fix-median", "--probes", "none", "--json")
    assert proc.returncode == 1
    [task] = json.loads(proc.stdout)["tasks"]
    assert task["null_outcome"] == task["oracle_outcome"] == "verifier_failure:bad_output"
    assert any("null: reward None (verifier_failure:bad_output)" in p and "seeded state" in p
               for p in task["problems"]), task


@pytest.mark.slow
def test_scaffold_builds_and_validates(tmp_path):
    folder = tmp_path / "starter"
    assert envkit("init", str(folder), "--kind", "repo").returncode == 0
    first = envkit("build", str(folder), "--json")
    assert first.returncode == 0, first.stderr
    second = envkit("build", str(folder), "--json")
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert {"bundle_digest", "base_image", "image_id"} <= set(a)
    assert a["image_id"] == b["image_id"] and b["cached"]
    proc = envkit("validate", str(folder))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS: 2/2 tasks" in proc.stdout


def test_container_killed_during_a_command_is_infra(pyfix_runtime, client):
    import threading

    class KillMidCommand:
        name = "kill-mid-command"

        def act(self, episode):
            timer = threading.Timer(1.0, lambda: client.containers.get(episode.sandbox.id).kill())
            timer.start()
            try:
                episode.step("sleep 20")
            finally:
                timer.cancel()

    result = run_episode(pyfix_runtime, pyfix_runtime.env.task("fix-median"), 0, KillMidCommand())
    assert result.outcome == "infra_failure:container_lost", result
    assert result.reward is None


def test_an_answer_with_any_bytes_reaches_the_verifier(client):
    """A model's reply can hold any byte; a NUL in the answer once made the verifier's exec
    fail, and the model's output was taken for an infra failure. It is dropped instead."""
    runtime = EnvRuntime(load_environment(ROOT / "environments" / "shellcmd"), client=client)
    runtime.backend.labels.update(TEST_LABEL)
    task = runtime.env.task("system-info")
    sandbox = runtime.backend.create()
    try:
        episode = runtime.episode(task, 0, sandbox, "test")
        episode.reset()
        episode.answer("uname\x00 -a\n\x01junk")
        result = episode.verify()
        assert result.reward == 1.0 and result.details["given"] == "uname -a"
    finally:
        sandbox.destroy()


def test_the_engine_owns_an_episode_from_its_sandbox_to_its_result(client):
    """runtime.start → act → finish: the turn budget ends the episode (recorded, reward still
    from the verifier), acting after the end raises, a kept sandbox serves the next episode;
    and the sandbox contract's tree copy and verifier preparation on an image sandbox."""
    runtime = EnvRuntime(load_environment(ROOT / "environments" / "shellcmd"), client=client)
    runtime.backend.labels.update(TEST_LABEL)
    task = runtime.env.task("system-info")
    kept = KeptSandbox(runtime.backend)
    try:
        episode = runtime.start(task, 0, kept, agent="test", max_turns=2)
        first = episode.act("bash", {"command": "echo hi"})
        assert first.text.startswith("exit 0") and "hi" in first.text and not first.over
        last = episode.act("bash", {"command": "true"})
        assert last.truncated and not last.terminated  # the second of two turns
        with pytest.raises(ModelFailure):
            episode.act("bash", {"command": "true"})  # the episode is over
        result = episode.finish()
        assert (result.outcome, result.reward) == ("model_failure:turn_limit", 0.0)
        assert result.timings["sandbox_acquire_s"] >= 0 and result.timings["verifier_commands_s"] > 0
        sandbox = kept.sandbox
        assert sandbox is not None and sandbox.alive()  # kept for the next episode

        sandbox.put_tree("/tmp/tree", [("a", None, 0o755), ("a/b.txt", b"x", 0o644)])
        assert sandbox.exec("cat /tmp/tree/a/b.txt", user="root").stdout == "x"
        assert sandbox.prepare_verifier(("/tmp/tree",)) is True
        assert sandbox.exec("test -e /tmp/tree", user="root").exit_code == 1

        again = runtime.start(task, 0, kept, agent="test")
        assert again.sandbox is sandbox
        answered = again.act("answer", {"text": "uname -a"})
        assert answered.terminated and not answered.truncated
        final = again.finish()
        assert (final.outcome, final.reward) == ("ok", 1.0)
    finally:
        kept.close()
