"""`envkit serve` spoken to by OpenEnv's own client (``openenv-core``'s GenericEnvClient), on an
imported Harbor environment: concurrent isolated sessions, seeded resets, an episode past its
time limit, idle sessions reaped and a client killed mid-episode (its sandbox released)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import docker.errors
import httpx
import pytest
from openenv.core.generic_client import GenericEnvClient
from websockets.sync.client import connect as ws_connect

from registry_server.pgtemp import free_port

from ..conftest import ROOT
from ..harbor_tasks import write_harbor_tasks
from .test_harbor import envkit, import_tasks

IDLE_S = 6


@pytest.fixture(scope="module")
def served(client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("serve")
    write_harbor_tasks(root / "src")
    assert import_tasks(client, root / "src", root / "env").returncode == 0
    assert envkit("build", str(root / "env")).returncode == 0
    port = free_port()
    log = open(root / "serve.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "envkit.cli.app", "serve", str(root / "env"), "--port", str(port),
                             "--max-sessions", "3", "--idle-timeout", str(IDLE_S)], cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/health", timeout=1).json().get("status") == "healthy":
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, (root / "serve.log").read_text()
            time.sleep(0.1)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    left = client.containers.list(all=True, filters={"label": [f"org.envkit.serve={proc.pid}"]})
    assert not left, f"the server left {len(left)} sandbox(es) behind"


def gone(client: Any, container_id: str, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            client.containers.get(container_id)
        except docker.errors.NotFound:
            return True
        time.sleep(0.25)
    return False


def test_health_and_schema(served):
    assert httpx.get(served + "/health").json()["status"] == "healthy"
    schema = httpx.get(served + "/schema").json()
    assert {"action", "observation", "state"} <= set(schema)
    assert "command" in schema["action"]["properties"] and "text" in schema["observation"]["properties"]


def test_concurrent_sessions_are_isolated_and_seeded_resets_agree(served, client):
    def episode(k: int) -> dict[str, Any]:
        with GenericEnvClient(base_url=served).sync() as env:
            first = env.reset(seed=7)
            state = env.state()
            env.reset(seed=7)
            again = env.state()
            env.step({"tool": "bash", "command": f"echo session-{k} > /tmp/mine"})
            time.sleep(0.5)  # the others write theirs meanwhile
            seen = env.step({"tool": "bash", "command": "cat /tmp/mine"}).observation["text"]
            end = env.step({"tool": "submit"})
            return {"first": first.observation, "hash": state["state_hash"], "hash_again": again["state_hash"],
                    "sandbox": state["sandbox"], "seen": seen, "done": end.done, "reward": end.reward,
                    "tools": [t["function"]["name"] for t in state["tool_schemas"]]}

    with ThreadPoolExecutor(3) as pool:
        runs = list(pool.map(episode, range(3)))
    assert len({r["sandbox"] for r in runs}) == 3  # one sandbox per session
    assert all(f"session-{k}" in r["seen"] for k, r in enumerate(runs))  # nobody sees another's file
    firsts = {(r["first"]["text"], r["first"]["task_id"], r["hash"]) for r in runs}
    assert len(firsts) == 1 and all(r["hash"] == r["hash_again"] for r in runs)  # same seed, same start
    assert all(r["done"] and r["reward"] is not None for r in runs)
    assert all(r["tools"] == ["bash", "answer"] for r in runs)  # the tools as function schemas, in the state
    for r in runs:
        assert gone(client, r["sandbox"], 15), "a closed session's sandbox is removed"


def test_an_episode_past_its_time_limit_then_a_step(served):
    with GenericEnvClient(base_url=served).sync() as env:
        env.reset(seed=0, task="slow-agent")  # the task's agent timeout is 4 s
        late = env.step({"tool": "bash", "command": "sleep 20"})
        assert late.done and late.reward == 0.0 and late.observation["outcome"] == "model_failure:episode_timeout"
        after = env.step({"tool": "bash", "command": "ls"})
        assert after.done and "reset" in after.observation["text"]  # a clear answer, not a crash
        with pytest.raises(Exception, match="(?s)has no task 'no-such-task'.*choose among"):  # noqa: B017 - OpenEnv's client raises RuntimeError
            env.reset(seed=0, task="no-such-task")
        again = env.reset(seed=0, task="slow-agent")  # and the session goes on
        assert not again.done and again.observation["task_id"] == "slow-agent"
        solved = env.step({"tool": "bash", "command": "touch /app/done"})
        assert not solved.done
        assert env.step({"tool": "submit"}).reward == 1.0


def test_more_sessions_than_allowed_are_refused(served):
    clients = [GenericEnvClient(base_url=served).sync() for _ in range(4)]
    try:
        for c in clients[:3]:
            c.connect()
            c.reset(seed=1, task="hello-file")
        with pytest.raises(Exception):  # noqa: B017 - OpenEnv's server closes the socket; its client raises ConnectionClosed
            clients[3].connect()
            clients[3].reset(seed=1, task="hello-file")
        # on the wire the refusal says why (OpenEnv's client closes before it reads it)
        with ws_connect(served.replace("http", "ws", 1) + "/ws", open_timeout=10) as raw:
            refusal = json.loads(raw.recv(timeout=10))
        assert refusal["type"] == "error" and refusal["data"]["code"] == "CAPACITY_REACHED", refusal
        assert refusal["data"]["max_sessions"] == 3 and refusal["data"]["message"], refusal
        clients[0].close()  # a slot frees: a new session is served
        time.sleep(1)
        with GenericEnvClient(base_url=served).sync() as late:
            assert late.reset(seed=1, task="hello-file").observation["task_id"] == "hello-file"
    finally:
        for c in clients:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - the refused one may be half-open
                pass


@pytest.mark.slow
def test_idle_session_is_reaped_and_killed_client_releases_its_sandbox(served, client, tmp_path):
    env = GenericEnvClient(base_url=served).sync()
    env.connect()
    env.reset(seed=2, task="hello-file")
    sandbox = env.state()["sandbox"]
    assert client.containers.get(sandbox).status == "running"
    assert gone(client, sandbox, IDLE_S + 20), "an idle session's sandbox is released"
    answer = env.step({"tool": "bash", "command": "ls"})
    assert answer.done and "reset" in answer.observation["text"]
    env.close()

    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        from openenv.core.generic_client import GenericEnvClient
        env = GenericEnvClient(base_url={served!r}).sync()
        env.connect()
        env.reset(seed=3, task="hello-file")
        env.step({{"tool": "bash", "command": "echo working"}})
        print(env.state()["sandbox"], flush=True)
        time.sleep(600)
    """))
    with subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        sandbox = proc.stdout.readline().strip()
        assert client.containers.get(sandbox).status == "running"
        proc.kill()  # mid-episode, no goodbye
        proc.wait()
    assert gone(client, sandbox, 10), "a disconnected client's sandbox is released (well before the idle timeout)"


def test_serve_refuses_bad_input(tmp_path):
    proc = envkit("serve", str(tmp_path / "nowhere"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    proc = envkit("serve", str(Path(ROOT) / "environments" / "pyfix"), "--task", "no-such-task")
    assert proc.returncode == 2 and "no-such-task" in proc.stderr
