"""Whole-sandbox resets: nothing an earlier episode's processes wrote survives anywhere, and no
user but envkit's root helpers holds a capability. One adversarial test per property."""

import base64
import secrets

import pytest

from envkit.agents import ShellAgent, run_episode
from envkit.sandbox import AGENT, VERIFIER

# helper.py's SCRATCH: what the reset wipes besides the workspace
SCRATCH = ("/tmp", "/home/agent", "/dev/shm", "/dev/mqueue")
SLEEPER = "python3 -c 'import time; time.sleep(3600)'"  # a process whose command line holds the marker
FIND_WRITABLE = (r"find / \( -path /proc -o -path /sys \) -prune -o \( -type d -o -type f \) "
                 r"-writable -print 2>/dev/null")


@pytest.fixture
def sb(pyfix_runtime):
    sandbox = pyfix_runtime.backend.create()
    sandbox.reset(0)
    yield sandbox
    sandbox.destroy()


@pytest.mark.parametrize("user", [AGENT, VERIFIER, "service"])
def test_every_writable_place_is_one_the_reset_wipes(sb, user):
    found = sb.exec(FIND_WRITABLE, user=user, workdir="/").stdout.split()
    allowed = (SCRATCH + ("/workspace",) if user == AGENT
               else SCRATCH[:1] + SCRATCH[2:] + (("/var/lib/envkit",) if user == "service" else ()))
    outside = [p for p in found if not any(p == a or p.startswith(a + "/") for a in allowed)]
    assert found and not outside, outside
    assert any(p.startswith("/tmp") for p in found)


def _scan(sb, marker: str) -> str:
    """Every trace of ``marker`` as root sees it: file names and contents, processes, IPC keys."""
    script = (
        "import glob, os\n"
        "m = os.environ['M'].encode(); hits = []\n"
        "for root in ('/workspace', '/tmp', '/home', '/dev/shm', '/dev/mqueue', '/var/tmp', '/run'):\n"
        "    for d, dirs, files in os.walk(root):\n"
        "        for n in dirs + files:\n"
        "            p = os.path.join(d, n)\n"
        "            if m in n.encode(): hits.append(p)\n"
        "            elif n in files and os.path.isfile(p) and not os.path.islink(p) "
        "and m in open(p, 'rb').read(): hits.append(p)\n"
        "for p in glob.glob('/proc/[0-9]*/cmdline'):\n"
        "    try:\n"
        "        if m in open(p, 'rb').read(): hits.append(p)\n"
        "    except OSError: pass\n"
        "print(' '.join(hits))\n")
    r = sb.exec(f"python3 -I -c \"{script}\"; ipcs -a | grep -c 0x0000abcd || true", user="root", workdir="/",
                env={"M": marker})
    return r.stdout


def test_nothing_an_agent_or_verifier_planted_survives_a_reset(sb):
    clean = sb.reset(1)
    marker = "planted-" + secrets.token_hex(6)
    plant = (
        f"for d in /workspace /workspace/kit /tmp /home/agent /dev/shm; do echo {marker} > $d/.{marker}; done; "
        f"mkdir -p /tmp/{marker}/deep && echo {marker} > /tmp/{marker}/deep/f && chmod 000 /tmp/{marker}; "
        f"mkfifo /tmp/fifo-{marker}; ln -s /env /tmp/link-{marker}; "
        f"printf '#!/bin/sh\\necho {marker}\\n' > .git/hooks/post-commit && chmod +x .git/hooks/post-commit; "
        f"git config user.name {marker}; echo 'echo {marker}' >> ~/.bashrc; "
        f"mkdir -p ~/.local/lib/python3.11/site-packages && echo 'print(\"{marker}\")' "
        "> ~/.local/lib/python3.11/site-packages/usercustomize.py; "
        "python3 -c 'import ctypes; l = ctypes.CDLL(None); l.shmget(0xabcd, 4096, 0o1666); l.msgget(0xabcd, 0o1666); "
        "l.semget(0xabcd, 1, 0o1666)'; "
        f"python3 -c 'import os; fd = os.open(\"/dev/mqueue/{marker}\", os.O_CREAT | os.O_WRONLY, 0o644)' 2>/dev/null; "
        f"(setsid nohup {SLEEPER} {marker} >/dev/null 2>&1 &); "
        f"(nohup {SLEEPER} {marker} >/dev/null 2>&1 &); echo planted"
    )
    assert sb.exec(plant).stdout.strip().endswith("planted")
    assert sb.exec(f"echo {marker} > /tmp/v-{marker}; echo {marker} > /dev/shm/v-{marker}; "
                   f"(setsid {SLEEPER} {marker} >/dev/null 2>&1 &); echo ok", user=VERIFIER, workdir="/").ok
    before = _scan(sb, marker)
    assert before.count(marker) >= 10 and before.strip().endswith("3"), before
    again = sb.reset(1)
    assert _scan(sb, marker).split() == ["0"]
    assert again.state_hash == clean.state_hash and again.commit == clean.commit
    procs = [line.split(None, 1) for line in sb.exec("ps -eo user=,args=").stdout.splitlines()]
    assert all(user == "root" or "ps -eo user=,args=" in args for user, args in procs), procs  # only the ps just run


def test_code_the_verifier_called_leaves_nothing_for_the_next_episode(pyfix_runtime, sb):
    """The agent's code runs during verification (as the agent, through the call server): what
    it writes and starts then must be gone after the next reset too."""
    marker = "during-verify-" + secrets.token_hex(6)
    payload = (f"\nimport os, subprocess\nfor d in ('/tmp', '/dev/shm', '/home/agent'):\n"
               f"    open(d + '/{marker}', 'w').write('x')\n"
               f"subprocess.Popen(['python3', '-c', 'import time; time.sleep(3600)', '{marker}'], "
               "start_new_session=True)\n")
    agent = ShellAgent(f"echo {base64.b64encode(payload.encode()).decode()} | base64 -d >> kit/stats.py")
    task = pyfix_runtime.env.task("fix-median")
    result = run_episode(pyfix_runtime, task, 1, agent, sb)
    assert result.outcome == "ok" and result.reward == 0.0 and result.verifier["agent_code"]["calls"] >= 1, result
    found = _scan(sb, marker).split()
    # it ran while verified
    assert {f"/tmp/{marker}", f"/dev/shm/{marker}", f"/home/agent/{marker}"} <= set(found), found
    assert any(p.startswith("/proc/") for p in found), found  # and its process outlived the verification
    sb.reset(1)
    assert _scan(sb, marker).split() == ["0"]


@pytest.mark.parametrize("user", [AGENT, VERIFIER, "service"])
def test_no_user_but_root_holds_a_capability(sb, user):
    caps = dict(line.split(":")
                for line in sb.exec("grep ^Cap /proc/self/status", user=user, workdir="/").stdout.splitlines())
    assert all(int(caps[k], 16) == 0 for k in ("CapInh", "CapPrm", "CapEff", "CapAmb")), caps
    assert sb.exec("grep NoNewPrivs /proc/self/status", user=user, workdir="/").stdout.split()[-1] == "1"


def test_root_holds_only_what_the_reset_needs(sb):
    eff = int(sb.exec("grep CapEff /proc/self/status", user="root", workdir="/").stdout.split()[-1], 16)
    names = {0: "CHOWN", 1: "DAC_OVERRIDE", 3: "FOWNER", 5: "KILL", 6: "SETGID", 7: "SETUID"}
    assert {names.get(bit, str(bit)) for bit in range(64) if eff >> bit & 1} == set(names.values())


def test_the_verifier_cannot_read_the_agents_files(sb):
    sb.exec("echo secret > /workspace/mine.py; mkdir -p ~/x && echo s > ~/x/f")
    for path in ("/workspace", "/workspace/mine.py", "/home/agent/x/f"):
        r = sb.exec(f"ls {path} || cat {path}", user=VERIFIER, workdir="/")
        assert r.exit_code != 0 and "Permission denied" in r.stderr, (path, r)
