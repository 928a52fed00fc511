"""envkit in-sandbox helper (runs inside the container with the base image's python3).

    helper.py reset SEED [TASK]  as root: the whole-sandbox reset (kill every process of the agent
                            and verifier users, wipe every place they can write, remove their
                            IPC objects, restore the seeded repository, with TASK's patch
                            applied when the image has one), print JSON
                            {"state_hash", "commit", "seed"} (and "task" when a patch applied)
    helper.py scrub         as root: the same without a repository (service environments)
    helper.py hash          as root: {"state_hash", "commit"} for the sandbox as it is
    helper.py killall       kill every process of the calling user
    helper.py write PATH MODE   write stdin to PATH (atomically) with MODE (octal)
    helper.py service-reset SEED   as the service user: restore the database from its fixture,
                            start the service if it is not running, wait for its health check,
                            print {"state_hash"} (or {"error", "log_tail"} and exit 3)
    helper.py service-hash  the service state's hash as it is now
    helper.py http METHOD PATH  a request to the service (JSON body on stdin), printed as JSON
    helper.py relay         pipe stdin/stdout to the service's TCP port (the host's port forward)
    helper.py serve         the sandbox's command channel: JSON lines in and out (see serve())

Root in the sandbox holds only CAP_KILL, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_CHOWN, CAP_SETUID
and CAP_SETGID, and only these helpers run as root: the agent, verifier and service users have
no capabilities (and no-new-privileges), so no process of theirs can signal, trace or steer a
reset. The state hash covers the workspace (files, modes, links, the commit) and a listing of
whatever is left in the scratch places and IPC namespace after the wipe (normally nothing: a
leftover changes the hash, so the runtime's same-seed-same-state check destroys the sandbox).
Files and IPC objects of the service user are the environment's own and are left alone.

The code is in the helper_*.py modules beside this file (standard library only, like this
one): helper_users (processes, wipes and IPC objects of the episode's users; the gVisor pids
cgroup), helper_repo (seed commit, state hash, reset, patches, writes), helper_service (the
service's database, start, health, requests, relay) and helper_channel (``serve``). sqlite3,
subprocess and threading are imported where they are used: every millisecond of start-up is
paid on each reset (http.client is avoided altogether: its import costs ~25 ms).
"""

import json
import os
import sys

# Run as ``python3 -I`` (no script folder on the path): the modules are found beside this
# file, first, so no folder later on the path (site-packages, or one a .pth file adds) can
# shadow them; the folder is root's and holds only envkit's files, none named like a module of
# the standard library. No bytecode is written, so the image's files stay as they were built.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import helper_users  # noqa: E402
from helper_channel import serve  # noqa: E402
from helper_repo import reset, state, write  # noqa: E402
from helper_service import db_hash, http_request, relay, service_reset  # noqa: E402
from helper_users import killall, leftovers, scrub  # noqa: E402


def main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "reset":
        out = reset(int(argv[2]), *argv[3:4])
    elif cmd == "scrub":
        scrub()
        out = {"leftovers": leftovers()}
    elif cmd == "hash":
        out = state()
    elif cmd == "killall":
        killall()
        out = {}
    elif cmd == "write":
        out = write(argv[2], argv[3], sys.stdin.buffer.read())
    elif cmd == "service-reset":
        out = service_reset(int(argv[2]))
    elif cmd == "serve":
        if argv[2:4] and argv[2] == "--agent-pids":
            helper_users.limit_agent_pids(int(argv[3]))
        return serve()
    elif cmd == "service-hash":
        out = {"state_hash": db_hash()}
    elif cmd == "http":
        return http_request(argv[2], argv[3])
    elif cmd == "relay":
        return relay()
    else:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
