"""Service environments (kind api): exact resets, health checks, the http tool, the port
forward, and network isolation, with a real Docker engine."""

from __future__ import annotations

import json
import shutil
import socket
import urllib.request
from pathlib import Path

import pytest

from envkit.agents import NullAgent, OracleAgent, run_episode
from envkit.runtime import EnvRuntime
from envkit.sandbox.forward import PortForward
from envkit.spec import load_environment

from ..conftest import ROOT, envkit
from .conftest import TEST_LABEL

SUPPORTDESK = ROOT / "environments" / "supportdesk"


@pytest.fixture(scope="module")
def desk(client) -> EnvRuntime:
    rt = EnvRuntime(load_environment(SUPPORTDESK), client=client)
    rt.backend.labels.update(TEST_LABEL)
    return rt


@pytest.fixture
def desk_copy(tmp_path: Path) -> Path:
    dest = tmp_path / "supportdesk"
    shutil.copytree(SUPPORTDESK, dest, ignore=shutil.ignore_patterns("envkit.lock"))
    return dest


def runtime_for(path: Path, client) -> EnvRuntime:
    rt = EnvRuntime(load_environment(path), client=client)
    rt.backend.labels.update(TEST_LABEL)
    return rt


@pytest.mark.slow
def test_validate_supportdesk_via_cli():
    proc = envkit("validate", "environments/supportdesk", "--json", timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] and len(report["tasks"]) >= 15 and report["determinism"]["ok"]
    probes = report["probes"]  # the default set, played on every task: none beat any
    assert probes["set"] == "quick" and probes["beaten"] == {} and "path-escape" in probes["run"]
    assert probes["skipped"]["always-equal"] == "the environment offers no bash tool"
    assert all(len(t["probes"]) == len(probes["run"]) for t in report["tasks"])


def test_reset_restores_the_database_exactly_without_a_new_container(desk):
    sb = desk.backend.create()
    try:
        clean = sb.reset(0)
        container_id = sb.id
        assert sb.http("PATCH", "/orders/1030", {"status": "delivered"})["status"] == 200
        created = sb.http("POST", "/refunds", {"order_id": 1008, "amount_cents": 100, "reason": "test"})
        assert created["status"] == 201
        assert sb.state_hash() != clean.state_hash
        again = sb.reset(0)
        assert again.state_hash == clean.state_hash and sb.id == container_id
        order = json.loads(sb.http("GET", "/orders/1030")["body"])
        assert order["status"] == "shipped"
        refunds = json.loads(sb.http("GET", "/refunds?order_id=1008")["body"])
        assert [r["id"] for r in refunds] == [6]  # the test refund is gone; ids restart
    finally:
        sb.destroy()


def test_same_seed_same_hash_on_fresh_containers(desk):
    hashes = []
    for _ in range(2):
        sb = desk.backend.create()
        try:
            hashes.append(sb.reset(7).state_hash)
        finally:
            sb.destroy()
    assert hashes[0] == hashes[1]


def test_agent_cannot_touch_the_database_directly(desk):
    sb = desk.backend.create()
    try:
        sb.reset(0)
        for cmd in ("cat /var/lib/envkit/db.sqlite", "ls /var/lib/envkit", "echo x >> /var/lib/envkit/db.sqlite"):
            assert sb.exec(cmd).exit_code != 0, cmd
        assert sb.exec("ls /var/lib/envkit", user="verifier").ok  # graders can read it
    finally:
        sb.destroy()


def test_http_tool_mistakes_are_observations(desk):
    sb = desk.backend.create()
    try:
        sb.reset(0)
        bad = sb.http("GET", "/customers?name=Dana Kim")  # a space: the agent's mistake
        assert bad["status"] == 0 and "spaces" in bad["error"]
        missing = sb.http("GET", "/nope")
        assert missing["status"] == 404
        conflict = sb.http("PATCH", "/orders/1001", {"status": "cancelled"})
        assert conflict["status"] == 409 and "cannot become" in conflict["body"]
    finally:
        sb.destroy()


def test_oracle_and_null_on_one_task(desk):
    task = desk.env.task("refund-gold-window")
    assert run_episode(desk, task, 0, OracleAgent()).reward == 1.0
    assert run_episode(desk, task, 0, NullAgent()).reward == 0.0


def test_guards_zero_the_reward_on_collateral_damage(desk):
    class Overeager:
        name = "overeager"

        def act(self, episode):
            for t in (6, 8, 13, 2):  # closes the duplicates, and one more ticket it was not asked to
                episode.http("PATCH", f"/tickets/{t}", {"status": "closed"})

    result = run_episode(desk, desk.env.task("close-duplicates"), 0, Overeager())
    assert result.outcome == "ok" and result.reward == 0.0
    assert result.verifier["guards_ok"] is False


def test_service_that_crashes_is_infra_with_its_log(desk_copy, client):
    spec = desk_copy / "envkit.toml"
    spec.write_text(spec.read_text().replace('command = "python3 server.py"',
                                             'command = "python3 -c \'import sys; '
                                             'print(\\"boom: no config\\"); sys.exit(3)\'"'))
    rt = runtime_for(desk_copy, client)
    result = run_episode(rt, rt.env.task("lookup-tier"), 0, OracleAgent())
    assert result.outcome == "infra_failure:service_unhealthy"
    assert "exited with 3" in result.evidence["message"] and "boom: no config" in result.evidence["log_tail"]


def test_service_that_never_gets_healthy_is_infra(desk_copy, client):
    spec = desk_copy / "envkit.toml"
    spec.write_text(spec.read_text().replace('command = "python3 server.py"', 'command = "sleep 600"')
                    .replace('health = "/health" }', 'health = "/health", startup_timeout_s = 2 }'))
    rt = runtime_for(desk_copy, client)
    result = run_episode(rt, rt.env.task("lookup-tier"), 0, NullAgent())
    assert result.outcome == "infra_failure:service_unhealthy"
    assert "never answered its health check" in result.evidence["message"]


def test_port_forward_is_loopback_only_and_reaches_the_service(desk):
    sb = desk.backend.create()
    try:
        sb.reset(0)
        with PortForward(sb) as fwd:
            assert fwd.host == "127.0.0.1"
            with urllib.request.urlopen(f"{fwd.url}/health", timeout=10) as r:
                assert json.loads(r.read()) == {"status": "ok"}
            with urllib.request.urlopen(f"{fwd.url}/customers/4", timeout=10) as r:
                assert json.loads(r.read())["tier"] == "gold"
            # Not reachable on any other address of this host.
            others = {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)} - {"127.0.0.1"}
            for addr in others:
                with pytest.raises(OSError):
                    socket.create_connection((addr, fwd.port), timeout=2).close()
        # Inside the sandbox, the service listens on 127.0.0.1 only.
        listening = sb.exec("cat /proc/net/tcp").stdout.splitlines()[1:]
        local = [ln.split()[1] for ln in listening if ln.split()[3] == "0A"]
        assert local == ["0100007F:1F90"]  # 127.0.0.1:8080
    finally:
        sb.destroy()


def test_sandbox_reaches_neither_internet_nor_host_nor_other_sandboxes(desk):
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))
    listener.listen(1)
    host_port = listener.getsockname()[1]
    a, b = desk.backend.create(), desk.backend.create()
    try:
        a.reset(0)
        b.reset(0)
        with PortForward(b) as fwd:
            probe = (
                "import socket\n"
                f"targets = [('1.1.1.1', 443), ('172.17.0.1', {host_port}), ('127.0.0.1', {host_port}),"
                f" ('127.0.0.1', {fwd.port}), ('172.17.0.2', 8080), ('169.254.169.254', 80)]\n"
                "for host, port in targets:\n"
                "    try:\n"
                "        socket.create_connection((host, port), timeout=2); print('OPEN', host, port)\n"
                "    except OSError:\n"
                "        print('blocked', host, port)\n"
            )
            r = a.exec(f"python3 -c \"{probe}\"", user="verifier")
            assert "OPEN" not in r.stdout and r.stdout.count("blocked") == 6, r
            assert a.exec("ls /sys/class/net", user="verifier").stdout.split() == ["lo"]
    finally:
        a.destroy()
        b.destroy()
        listener.close()


def test_init_api_scaffold_builds_and_validates(tmp_path):
    folder = tmp_path / "notes"
    assert envkit("init", str(folder), "--kind", "api").returncode == 0
    proc = envkit("validate", str(folder))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS: 2/2 tasks" in proc.stdout


def test_bench_reset_reports_each_kind():
    proc = envkit("bench", "reset", "-n", "5", "--json", timeout=600)
    rows = {r["kind"]: r for r in json.loads(proc.stdout)["rows"]}
    assert {"repo", "api", "website"} <= set(rows)
    assert all(r["same_hash"] and r["p50_ms"] > 0 for r in rows.values())
    assert rows["api"]["target"] == "p50 <= 100 ms"
