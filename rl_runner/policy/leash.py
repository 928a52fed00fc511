"""Run a command as the child of a small watcher that ends it once envkit's process is gone.

    python -m rl_runner.policy.leash PARENT_PID [--cpus 0,1] -- COMMAND...

A vLLM server runs in a session of its own (Ctrl-C in envkit's terminal must not reach it
before envkit has stopped using it), so when envkit dies without unwinding (SIGKILL, the OOM
killer) nothing stops it: it keeps its memory, on a GPU too, and the next run cannot start.
The watcher leads a process group of its own (made at start if it was not started as one) and
owns it: the command and whatever the command starts.

* every second it checks that PARENT_PID is still its parent; once it is not, it stops the group;
* a SIGTERM to the watcher (``VLLMServer.stop``) stops the group;
* stopping the group: one SIGTERM to every process in it, SIGKILL to whatever is left 20 s later;
* when the command exits, whatever else of the group is left gets the same, and the watcher
  exits only when the group is empty, with the command's status (128 + N when signal N ended it).

``--cpus`` holds the watcher, and so the command and everything it starts, to those cores
before the command starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

GRACE_S = 20.0


def group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (zombies are gone)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, _ppid, pgrp = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError, ValueError):
            continue  # exited while being read
        if int(pgrp) == pgid and state != "Z":
            out.append(int(entry.name))
    return out


def _others() -> list[int]:
    """This process group's live processes but this one."""
    return [pid for pid in group_members(os.getpgrp()) if pid != os.getpid()]


def _kill(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


class _Group:
    def __init__(self) -> None:
        self.stopping_since: float | None = None

    def stop(self, *_: object) -> None:
        if self.stopping_since is None:  # once: a second SIGTERM could cut the server's own shutdown short
            self.stopping_since = time.monotonic()
            _kill(_others(), signal.SIGTERM)

    def overdue(self) -> bool:
        return self.stopping_since is not None and time.monotonic() - self.stopping_since > GRACE_S


def main(argv: list[str]) -> int:
    parent, rest = int(argv[0]), argv[1:]
    if rest[:1] == ["--cpus"]:
        os.sched_setaffinity(0, {int(c) for c in rest[1].split(",")})
        rest = rest[2:]
    if rest[:1] != ["--"] or len(rest) < 2:
        print("usage: python -m rl_runner.policy.leash PARENT_PID [--cpus 0,1] -- COMMAND...", file=sys.stderr)
        return 2
    if os.getpgrp() != os.getpid():  # a group of its own: the one it stops is the command's, never its starter's
        os.setpgid(0, 0)
    group = _Group()
    # a handler, not SIG_IGN: the command starts with the default (a handler does not survive exec)
    signal.signal(signal.SIGTERM, group.stop)
    child = subprocess.Popen(rest[1:])
    code: int | None = None
    while True:
        if code is None:
            try:
                code = child.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                if os.getppid() != parent:  # envkit is gone: this process was re-parented
                    group.stop()
        else:
            if not _others():
                return code if code >= 0 else 128 - code
            group.stop()  # the command is gone: the rest of its group goes too
            time.sleep(0.2)
        if group.overdue():
            _kill(_others(), signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
