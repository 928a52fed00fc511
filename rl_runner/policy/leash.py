"""Run a command as the child of a small watcher that ends it once envkit's process is gone.

    python -m rl_runner.policy.leash PARENT_PID [--cpus 0,1] -- COMMAND...

A vLLM server runs in a session of its own (Ctrl-C in envkit's terminal must not reach it
before envkit has stopped using it), so when envkit dies without unwinding (SIGKILL, the OOM
killer) nothing stops it: it keeps its memory, on a GPU too, and the next run cannot start.
The watcher checks every second that PARENT_PID is still its parent; once it is not, it sends
SIGTERM to its own process group (the command and whatever it started), and SIGKILL 20 s later.
A SIGTERM sent to the watcher alone is passed on to the command. ``--cpus`` holds the watcher,
and so the command and everything it starts, to those cores before the command starts. The
exit status is the command's (128 + N when signal N ended it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

GRACE_S = 20.0


def main(argv: list[str]) -> int:
    parent, rest = int(argv[0]), argv[1:]
    if rest[:1] == ["--cpus"]:
        os.sched_setaffinity(0, {int(c) for c in rest[1].split(",")})
        rest = rest[2:]
    if rest[:1] != ["--"] or len(rest) < 2:
        print("usage: python -m rl_runner.policy.leash PARENT_PID [--cpus 0,1] -- COMMAND...", file=sys.stderr)
        return 2
    child = subprocess.Popen(rest[1:])

    def pass_on(_signum: int, _frame: object) -> None:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)

    # a handler, not SIG_IGN: the command starts with the default (a handler does not survive exec)
    signal.signal(signal.SIGTERM, pass_on)
    given_up: float | None = None
    while True:
        try:
            code = child.wait(timeout=1.0)
            return code if code >= 0 else 128 - code
        except subprocess.TimeoutExpired:
            pass
        if given_up is None and os.getppid() != parent:  # envkit is gone: this process was re-parented
            given_up = time.monotonic()
            os.killpg(0, signal.SIGTERM)
        elif given_up is not None and time.monotonic() - given_up > GRACE_S:
            os.killpg(0, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
