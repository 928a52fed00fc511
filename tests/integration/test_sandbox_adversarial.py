"""One adversarial test per property of the threat model (envkit.sandbox.docker_backend).

Each runs an attack in one sandbox and checks it is contained: the attack's own sandbox
reports the limit it hit, a neighbour sandbox keeps working, and the host is unaffected.
"""

import dataclasses
import shutil
import time

import pytest

from envkit.sandbox import VERIFIER
from envkit.sandbox.docker_backend import DockerBackend
from envkit.sandbox.runtimes import RUNTIMES

from .conftest import TEST_LABEL, TIGHT


@pytest.fixture(scope="module", params=RUNTIMES)
def tight_backend(request, client, pyfix_runtime) -> DockerBackend:
    """The tight sandboxes of conftest, under each runtime: every attack here runs under runc and gVisor."""
    limits = dataclasses.replace(TIGHT, runtime=request.param)
    return DockerBackend(pyfix_runtime.build.image_id, limits, client=client, labels=TEST_LABEL)


def neighbour_ok(neighbour) -> None:
    r = neighbour.exec("echo alive && python3 -c 'print(6*7)'")
    assert r.ok and r.stdout.split() == ["alive", "42"], r


def test_command_timeout(sandbox, neighbour):
    t0 = time.monotonic()
    r = sandbox.exec("sleep 60", timeout_s=1)
    assert r.timed_out and r.limit_hit == "command_timeout"
    assert time.monotonic() - t0 < 10
    assert sandbox.exec("echo next").stdout == "next\n"  # the sandbox is still usable
    neighbour_ok(neighbour)


def test_command_ignoring_sigterm_is_killed(sandbox):
    t0 = time.monotonic()
    r = sandbox.exec("trap '' TERM; while :; do sleep 0.1; done", timeout_s=1)
    assert r.timed_out and r.exit_code == 137
    assert time.monotonic() - t0 < 10
    assert "while" not in sandbox.exec("ps -eo args").stdout


def test_detached_child_does_not_hang_the_exec(sandbox):
    t0 = time.monotonic()
    r = sandbox.exec("setsid sleep 300 & echo started", timeout_s=30)
    assert r.stdout == "started\n" and not r.timed_out
    assert time.monotonic() - t0 < 10  # Docker's stdio grace, not the 30 s timeout
    sandbox.kill_processes()
    assert "sleep 300" not in sandbox.exec("ps -eo args").stdout


def test_fork_bomb(sandbox, neighbour):
    r = sandbox.exec(":(){ :|:& };:", timeout_s=3)
    assert r.pids_limited or r.timed_out, r
    assert r.limit_hit in ("pids_limit", "command_timeout")
    # The bomb is cleared and the sandbox works again.
    sandbox.kill_processes()
    after = sandbox.exec("ps -e --no-headers | wc -l")
    assert after.ok and int(after.stdout) < 10
    neighbour_ok(neighbour)


# A chain of processes, each forking its successor and exiting at once: a listing of /proc may
# miss it, so the reset may skip its kill-as-the-user (kill(-1), which fork cannot race) only on a
# witness that no process of the user can be left (helper.py's _quiet_users), which a live chain
# never gives. A refused fork (the pids limit, while PID 1 has not yet reaped the exited links) is
# retried: the chain must stay alive for the test to mean anything
FORK_CHAIN = ("setsid nohup python3 -c \"import os, time\nwhile True:\n    try:\n        if os.fork(): os._exit(0)\n"
              "    except OSError:\n        time.sleep(0.01)\n\" >/dev/null 2>&1 &")


def test_a_fork_and_exit_chain_does_not_outlive_the_reset(sandbox):
    user = "agent"  # the verifier's processes go the same way (helper.py's EPISODE_UIDS)
    assert sandbox.exec(f"{FORK_CHAIN} echo started", user=user, workdir="/tmp").ok
    count = f"ps -e -o user= | grep -c '^{user}' || true"
    deadline = time.monotonic() + 10  # python3 may take a while to start on a loaded machine
    while int(sandbox.exec(count, user="root", workdir="/").stdout) == 0:
        assert time.monotonic() < deadline, "the chain never ran"
        time.sleep(0.1)
    time.sleep(0.5)
    assert int(sandbox.exec(count, user="root", workdir="/").stdout) >= 1  # and keeps running
    for seed in (1, 2, 3):  # each reset must end it; a chain that slipped through one shows at the next count
        sandbox.reset(seed)
        time.sleep(0.2)
        assert int(sandbox.exec(count, user="root", workdir="/").stdout) == 0, f"alive after reset {seed}"


# Starts processes that stay until one cannot start (no shell: bash retries a refused fork for 31 s,
# and short-lived children make the outcome depend on how fast the machine forks)
FILL_PIDS = "python3 -c \"import subprocess; [subprocess.Popen(['sleep', '300']) for _ in range(200)]\""


def test_pids_limit_is_reported(sandbox):
    r = sandbox.exec(FILL_PIDS, timeout_s=30)
    assert r.pids_limited and r.limit_hit == "pids_limit", r
    assert "Resource temporarily unavailable" in r.stderr
    sandbox.kill_processes()
    assert "sleep 300" not in sandbox.exec("ps -eo args").stdout


# Forks until one is refused and reaps none of its children, then waits: the limit is held by
# zombies. gVisor counts a task against RLIMIT_NPROC until it is reaped but takes it out of its
# pids cgroup as it exits (a fork bomb's dying processes do the same), so pids.current alone
# misses this hit
UNREAPED = ("python3 -c \"import os, time\nn = 0\ntry:\n    while n < 500:\n        if os.fork() == 0: os._exit(0)\n"
            "        n += 1\nexcept OSError as e: print('refused after', n, e.errno)\ntime.sleep(1)\n\"")


def test_a_limit_held_by_unreaped_children_is_reported(sandbox):
    r = sandbox.exec(UNREAPED, timeout_s=30)
    assert r.stdout.startswith("refused after") and r.pids_limited and r.limit_hit == "pids_limit", r
    assert sandbox.exec("echo next").ok


def test_memory_bomb(sandbox, neighbour):
    from envkit.errors import ModelFailure

    if sandbox.limits.runtime == "gvisor":
        # The host's OOM killer picks a guest process's stub or the sentry: either way the model's doing
        try:
            r = sandbox.exec("python3 -c 'a = bytearray(1024 * 1024 * 1024)'")
            assert r.oom_killed and r.limit_hit == "oom" and sandbox.alive(), r
        except ModelFailure as e:
            assert e.kind == "oom" and not sandbox.alive()
        neighbour_ok(neighbour)
        return
    r = sandbox.exec("python3 -c 'a = bytearray(1024 * 1024 * 1024)'")
    assert r.oom_killed and r.limit_hit == "oom" and r.exit_code == 137
    assert sandbox.alive()
    neighbour_ok(neighbour)


def test_a_process_over_the_memory_limit_is_killed_and_the_sandbox_lives(sandbox):
    """Memory taken a step at a time: the host's OOM killer takes the process (under gVisor, its stub)."""
    r = sandbox.exec("python3 -c 'x = [bytearray(8 << 20) for _ in range(64)]'; echo after $?")
    assert r.oom_killed and r.limit_hit == "oom", r
    assert sandbox.alive() and sandbox.exec("echo alive").stdout == "alive\n"


def test_disk_fill(sandbox, neighbour):
    host_free = shutil.disk_usage("/").free
    r = sandbox.exec("dd if=/dev/zero of=/workspace/fill bs=1M count=200; df -m /workspace | tail -1")
    assert "No space left on device" in r.stderr
    assert int(sandbox.exec("stat -c %s /workspace/fill").stdout) <= 32 * 1024 * 1024
    for target in ("/var/tmp/fill", "/fill", "/usr/fill"):
        r = sandbox.exec(f"dd if=/dev/zero of={target} bs=1M count=1")
        assert r.exit_code != 0 and ("Read-only file system" in r.stderr or "Permission denied" in r.stderr), r
    assert abs(shutil.disk_usage("/").free - host_free) < 100 * 1024 * 1024
    neighbour_ok(neighbour)


def test_network_egress_is_impossible(sandbox, neighbour):
    probe = (
        "import socket\n"
        "for host, port in [('1.1.1.1', 80), ('8.8.8.8', 53), ('172.17.0.1', 2375), ('127.0.0.1', 9)]:\n"
        "    try:\n"
        "        socket.create_connection((host, port), timeout=2); print('OPEN', host)\n"
        "    except OSError as e:\n"
        "        print('blocked', host, e.errno)\n"
    )
    sandbox.put_file("/tmp/probe.py", probe.encode())
    r = sandbox.exec("python3 /tmp/probe.py; echo interfaces; tail -n +3 /proc/net/dev | cut -d: -f1")
    assert "OPEN" not in r.stdout
    assert r.stdout.count("blocked") == 4
    assert r.stdout.split("interfaces")[-1].split() == ["lo"]  # loopback is the only interface
    # ... and it works, by name too (the engine writes no /etc/hosts for a sandbox without a network)
    loop = sandbox.exec("python3 -c \"import socket; s = socket.socket(); s.bind(('localhost', 0)); s.listen(); "
                        "socket.create_connection(('localhost', s.getsockname()[1]), timeout=2); "
                        "print('loopback ok')\"")
    assert loop.stdout == "loopback ok\n", loop
    neighbour_ok(neighbour)


def test_writes_outside_the_workspace(sandbox, neighbour):
    for target in ("/etc/passwd", "/usr/bin/python3", "/opt/envkit/helper.py", "/env/x", "/seed/repo/x", "/root/x"):
        r = sandbox.exec(f"echo pwned >> {target}")
        assert r.exit_code != 0, target
    assert sandbox.exec("echo ok > /workspace/mine && cat /workspace/mine").stdout == "ok\n"
    r = sandbox.exec("grep -c pwned /etc/passwd || true")
    assert r.stdout.strip() == "0"
    neighbour_ok(neighbour)


def test_hidden_files_and_privileges(sandbox, client):
    assert "Permission denied" in sandbox.exec("ls /env").stderr  # tasks, oracles, tests
    assert sandbox.exec("id -u").stdout.strip() == "1000"
    caps = sandbox.exec("grep CapEff /proc/self/status").stdout.split()[-1]
    assert int(caps, 16) == 0
    # PR_GET_NO_NEW_PRIVS (gVisor's /proc/self/status has no NoNewPrivs line)
    assert sandbox.exec("python3 -c 'import ctypes; print(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))'").stdout == "1\n"
    assert sandbox.exec("test -e /var/run/docker.sock || test -e /run/docker.sock").exit_code != 0
    mounts = client.api.inspect_container(sandbox.id)["Mounts"]
    assert mounts == []  # nothing from the host (tmpfs mounts are not host mounts)
    # the verifier user can read the hidden files; the agent cannot escalate to it
    assert sandbox.exec("ls /env/verify/tests | head -1", user=VERIFIER).ok
    assert sandbox.exec("su verifier -c true").exit_code != 0


def test_sandboxes_cannot_see_each_other(sandbox, neighbour):
    sandbox.exec("echo hidden > /workspace/mine.txt; sleep 31 &", timeout_s=2)
    assert sandbox.exec("test -e /workspace/mine.txt").ok
    assert neighbour.exec("test -e /workspace/mine.txt").exit_code == 1
    assert "sleep 31" not in neighbour.exec("ps -e -o args").stdout
    assert "sleep 31" in sandbox.exec("ps -e -o args").stdout


def test_output_is_capped(sandbox):
    r = sandbox.exec("head -c 10000000 /dev/zero | tr '\\0' 'x'")
    assert r.ok and r.truncated and r.stdout_bytes == 10_000_000
    assert len(r.stdout) < 9000


def test_a_saturated_sandbox_is_the_models_doing_not_infra(sandbox):
    from envkit.errors import ModelFailure

    sandbox.exec(":(){ :|:& };:", timeout_s=3)
    # The bomb may still fill the pids limit: the next command either runs, is reported as
    # hitting a limit, or cannot start and is attributed to the model. Never infra.
    try:
        r = sandbox.exec("echo hi", timeout_s=5)
        assert r.ok or r.limit_hit in ("pids_limit", "command_timeout"), r
    except ModelFailure as e:
        assert e.kind == "pids_limit"
    sandbox.kill_processes()
    assert sandbox.exec("echo hi").stdout == "hi\n"


# -- the command channel (helper.py serve, as root): what the agent can do to it, what happens when it breaks


def _channel_pid(sandbox) -> int:
    pids = sandbox.exec("pgrep -u 0 -f '^python3 -I /opt/envkit/helper.py serve'").stdout.split()
    assert len(pids) == 1, pids
    return int(pids[0])


def test_the_agent_cannot_reach_the_command_channel(sandbox):
    assert sandbox._root is not None  # commands go through the channel, not one exec each
    chan = sandbox._root
    pid = _channel_pid(sandbox)
    attacks = [f"kill -9 {pid}", f"kill -STOP {pid}", f"cat /proc/{pid}/fd/0",
               f"echo '{{\"stdout\": 1}}' > /proc/{pid}/fd/1",
               f"python3 -c 'import ctypes, sys; sys.exit(ctypes.CDLL(None).ptrace(16, {pid}, 0, 0) != 0)'"]
    # gVisor lets any user list another's fds and read its environ (docs: Sandboxes)
    if sandbox.limits.runtime == "runc":
        attacks += [f"ls /proc/{pid}/fd", f"cat /proc/{pid}/environ"]
    for attack in attacks:
        r = sandbox.exec(attack)  # PTRACE_ATTACH included
        assert r.exit_code != 0, (attack, r)
    # the verifier's commands go through the same root-owned channel; it cannot reach it either
    assert sandbox.exec(f"kill -9 {pid}", user=VERIFIER).exit_code != 0
    assert sandbox.exec("echo still here").stdout == "still here\n"
    assert sandbox._root is chan and _channel_pid(sandbox) == pid


def test_a_broken_channel_connection_is_infra_and_the_next_command_attaches_again(sandbox):
    import threading

    from envkit.errors import InfraFailure

    pid = _channel_pid(sandbox)
    failure: list[BaseException] = []

    def slow() -> None:
        try:
            sandbox.exec("sleep 2; echo late", timeout_s=10)
        except BaseException as e:  # noqa: BLE001 - inspected below
            failure.append(e)

    worker = threading.Thread(target=slow)
    worker.start()
    time.sleep(1.0)
    sandbox._root.raw.shutdown(2)  # the host's connection breaks mid-command (SHUT_RDWR); the helper lives on
    worker.join(30)
    assert len(failure) == 1 and isinstance(failure[0], InfraFailure), failure
    assert failure[0].kind == "channel_lost" and failure[0].evidence.get("container") == sandbox.id
    time.sleep(1.5)  # the abandoned command ends and the helper writes its reply while nobody listens
    # The next command attaches to the same helper again; its reply is its own, not the late one.
    for word in ("first", "second"):
        assert sandbox.exec(f"echo {word}").stdout == f"{word}\n"
    assert _channel_pid(sandbox) == pid


def test_a_channel_killed_from_outside_is_the_containers_loss_with_evidence(sandbox):
    import threading

    import pytest

    from envkit.errors import InfraFailure

    pid = _channel_pid(sandbox)
    failure: list[BaseException] = []

    def slow() -> None:
        try:
            sandbox.exec("sleep 5", timeout_s=10)
        except BaseException as e:  # noqa: BLE001 - inspected below
            failure.append(e)

    worker = threading.Thread(target=slow)
    worker.start()
    time.sleep(1.0)
    sandbox.container.exec_run(["kill", "-9", str(pid)], user="0:0")  # from outside: nothing inside can
    worker.join(30)
    # The channel is the container's main process: its death ends the sandbox (never the model's doing).
    assert len(failure) == 1 and isinstance(failure[0], InfraFailure), failure
    assert failure[0].kind == "container_lost" and failure[0].evidence.get("container") == sandbox.id
    assert "helper_stderr" in failure[0].evidence
    with pytest.raises(InfraFailure) as again:
        sandbox.exec("echo gone")
    assert again.value.kind == "container_lost"


def test_without_a_channel_commands_fall_back_to_docker_exec(tight_backend, monkeypatch):
    from envkit.sandbox import docker_backend

    monkeypatch.setattr(docker_backend, "CHANNEL_PROTOCOL", 99)  # as an image built with an older helper
    sb = tight_backend.create()
    try:
        assert sb.exec("id -u").stdout == "1000\n"
        assert "another channel protocol" in sb.channel_off and sb._root is None
        # the exec path keeps its guarantees: timeout, detached child, output cap, pids limit, kill
        r = sb.exec("sleep 60", timeout_s=1)
        assert r.timed_out and r.limit_hit == "command_timeout"
        t0 = time.monotonic()
        assert sb.exec("setsid sleep 300 & echo started", timeout_s=30).stdout == "started\n"
        assert time.monotonic() - t0 < 10
        r = sb.exec("head -c 100000 /dev/zero | tr '\\0' 'x'")
        assert r.truncated and r.stdout_bytes == 100_000
        r = sb.exec(FILL_PIDS, timeout_s=30)
        assert "Resource temporarily unavailable" in r.stderr, r
        # runc counts the hit (pids.events); gVisor's RLIMIT_NPROC on this path contains it uncounted
        assert r.pids_limited or sb.limits.runtime == "gvisor"
        sb.kill_processes()
        assert "sleep 300" not in sb.exec("ps -eo args").stdout
    finally:
        sb.destroy()
