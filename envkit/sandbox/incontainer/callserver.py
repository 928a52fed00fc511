"""envkit call server: the agent's side of verification (runs as the agent user).

    callserver.py start DIR     start a server on DIR/sock in the background; print
                                {"socket", "pid"} once it listens
    callserver.py worker LOG    (started by the server) one worker: imports and runs the
                                agent's code, JSON lines on stdin/stdout

The verifier's tests (envkit_check, in a trusted process of another user) connect to the
socket; each connection gets its own worker process, started on its first call, in its own
process group. The server never imports the agent's code: it enforces each call's timeout
by killing the worker's process group, reports a worker that died, and runs commands
(``run``) and reads files (``read``) as the agent. Everything here is the agent's side of the
boundary: it may be tampered with by the agent's code and is trusted for nothing but carrying
data (envkit_check decodes every reply into fresh objects).
"""

import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from envkit_check import MAX_MESSAGE, NotData, decode, encode, send_line  # noqa: E402

WORKSPACE = os.environ.get("ENVKIT_WORKSPACE", "/workspace")
OUTPUT_CAP = 64 * 1024
READ_CAP = 16 * 1024 * 1024
IDLE_EXIT_S = 300.0
# The whole environment of the agent's code, set here (nothing inherited). PYTHONHASHSEED as where
# synth recorded the calls (suite_runner.CLEAN_ENV): a set of strings iterates in the order it
# had then, so a replayed call that yields its members gives the recorded sequence (pathspec,
# 2026-12-07: the task's own fix scored 0 on 3 of 6 tasks, its generator's order drawn anew)
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
       "HOME": os.environ.get("HOME", "/home/agent"), "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
       "ENVKIT_WORKSPACE": WORKSPACE}


# -- the server -------------------------------------------------------------------------------------

class Server:
    def __init__(self, folder):
        self.folder = folder
        self.last_active = time.monotonic()
        self.active = 0
        self.hung_imports = set()  # modules whose import ran past a call's timeout: later imports fail at once
        self.lock = threading.Lock()

    def serve(self, listener):
        listener.settimeout(5.0)
        while True:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                with self.lock:
                    if self.active == 0 and time.monotonic() - self.last_active > IDLE_EXIT_S:
                        return
                continue
            with self.lock:
                self.active += 1
            threading.Thread(target=self.session, args=(conn,), daemon=True).start()

    def session(self, conn):
        worker = Worker(self)
        buf = b""
        try:
            while True:
                chunk = conn.recv(1 << 20)
                if not chunk:
                    break
                buf += chunk
                if len(buf) > MAX_MESSAGE:
                    break
                while b"\n" in buf:
                    line, _, buf = buf.partition(b"\n")
                    send_line(conn, self.handle(worker, line))
        except OSError:
            pass
        finally:
            worker.stop()
            conn.close()
            with self.lock:
                self.active -= 1
                self.last_active = time.monotonic()

    def handle(self, worker, line):
        try:
            req = json.loads(line)
            timeout = float(req.get("timeout", 10))
            op = req.get("op")
        except (ValueError, TypeError, AttributeError):
            return _error("crash", "bad request")
        if op == "run":
            return run_command(req, timeout, self.folder)
        if op == "read":
            return read_file(str(req.get("path", "")))
        parts = str(req.get("target", "")).split(".")
        hung = next((m for m in (".".join(parts[: i + 1]) for i in range(len(parts))) if m in self.hung_imports), None)
        if hung:
            return _error("timeout", f"importing {hung} ran past the time limit before")
        reply, importing = worker.ask(line, timeout)
        if reply.get("error", {}).get("kind") == "timeout" and importing:
            self.hung_imports.add(importing)
        return reply


def _error(kind, message, **extra):
    return {"error": {"kind": kind, "message": message, **extra}}


class Worker:
    """One worker process (the agent's code runs there), started on the first request."""

    def __init__(self, server):
        self.server = server
        self.proc = None
        self.log = None
        self.out = b""

    def start(self):
        fd, self.log = tempfile.mkstemp(prefix="worker-", suffix=".log", dir=self.server.folder)
        os.close(fd)
        # -s -P (and ENV, built above) rather than -I, which would also ignore PYTHONHASHSEED
        # (-P, no script folder on the path, is Python 3.11's; this one's folder is put there anyway)
        flags = ["-s", "-B", *(["-P"] if sys.version_info >= (3, 11) else [])]
        self.proc = subprocess.Popen([sys.executable, *flags, os.path.abspath(__file__), "worker", self.log],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     cwd=WORKSPACE if os.path.isdir(WORKSPACE) else "/", env=ENV,
                                     start_new_session=True)
        self.out = b""

    def stop(self):
        if self.proc is not None:
            _kill_group(self.proc)
            self.proc = None

    def log_tail(self):
        try:
            with open(self.log, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log) - 2000))
                return f.read().decode(errors="replace")
        except (OSError, TypeError):
            return ""

    def ask(self, line, timeout):
        """Send one request; returns (reply, module being imported when it timed out)."""
        if self.proc is None:
            try:
                self.start()
            except OSError as e:
                return _error("crash", f"could not start a worker: {e}"), None
        importing = None
        deadline = time.monotonic() + timeout
        try:
            self._write(line + b"\n", deadline)
            fd = self.proc.stdout.fileno()
            while True:
                while b"\n" in self.out:
                    msg, _, self.out = self.out.partition(b"\n")
                    try:
                        reply = json.loads(msg)
                    except ValueError:
                        continue  # the agent's code wrote to the protocol stream: ignore what is not JSON
                    if not isinstance(reply, dict):
                        continue
                    if "importing" in reply:
                        importing = str(reply["importing"]) or None
                        continue
                    if "imported" in reply:
                        importing = None
                        continue
                    return reply, None
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    self.stop()
                    return self._timeout(timeout, importing), importing
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise EOFError
                self.out += chunk
                if len(self.out) > MAX_MESSAGE:
                    self.stop()
                    return _error("not_data", "the reply is too large"), None
        except TimeoutError:
            self.stop()
            return self._timeout(timeout, importing), importing
        except (OSError, EOFError, ValueError):
            proc = self.proc
            self.stop()
            code = proc.returncode if proc is not None else None
            return _error("crash", f"the worker process died (exit {code})", output_tail=self.log_tail()), None

    @staticmethod
    def _timeout(timeout, importing):
        what = f" (importing {importing})" if importing else ""
        return _error("timeout", f"the call ran past {timeout:g} s{what}")

    def _write(self, data, deadline):
        """Write a request without blocking past the deadline (a stuck worker stops reading)."""
        fd = self.proc.stdin.fileno()
        os.set_blocking(fd, False)
        view = memoryview(data)
        while view:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [fd], [], left)[1]:
                raise TimeoutError
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                continue


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def run_command(req, timeout, folder):
    argv = req.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        return _error("crash", "run needs a non-empty list of strings")
    scratch = tempfile.mkdtemp(prefix="run-", dir=folder)
    try:
        for name, text in dict(req.get("files") or {}).items():
            path = os.path.normpath(os.path.join(scratch, str(name)))
            if not path.startswith(scratch + os.sep):
                return _error("crash", f"file name outside the run folder: {name}")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(decode(text) if isinstance(text, dict) else str(text).encode())
    except (OSError, ValueError, TypeError) as e:
        return _error("crash", f"could not write the command's files: {e}")
    cwd = WORKSPACE if req.get("cwd") == "." else (os.path.join(WORKSPACE, req["cwd"]) if req.get("cwd") else scratch)
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=dict(ENV, PYTHONPATH=WORKSPACE), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as e:
        return {"value": encode({"returncode": 127, "stdout": "", "stderr": f"{type(e).__name__}: {e}"})}
    try:
        out, err = proc.communicate(str(req.get("stdin", "")).encode(), timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return _error("timeout", f"the command ran past {timeout:g} s")
    finally:
        _kill_group(proc)  # what it left running in its group
    return {"value": encode({"returncode": proc.returncode, "stdout": out[:OUTPUT_CAP].decode(errors="replace"),
                             "stderr": err[:OUTPUT_CAP].decode(errors="replace")})}


def read_file(path):
    full = os.path.join(WORKSPACE, path)
    try:
        with open(full, "rb") as f:
            data = f.read(READ_CAP + 1)
    except OSError as e:
        return _error("exception", str(e), type=type(e).__name__, types=[type(e).__name__, "OSError", "Exception"])
    if len(data) > READ_CAP:
        return _error("not_data", f"{path} is larger than {READ_CAP} bytes")
    return {"value": encode(data)}


def start(folder):
    """Listen on FOLDER/sock, then go to the background; print where once it listens."""
    os.mkdir(folder, 0o711)
    os.chmod(folder, 0o711)
    path = os.path.join(folder, "sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o666)  # the verifier user connects to it
    listener.listen(64)
    pid = os.fork()
    if pid:
        print(json.dumps({"socket": path, "pid": pid}), flush=True)
        return 0
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    try:
        with open(f"/proc/{os.getpid()}/oom_score_adj", "w") as f:
            f.write("1000")  # the OOM killer takes the agent's side first
    except OSError:
        pass
    Server(folder).serve(listener)
    os._exit(0)


# -- the worker ---------------------------------------------------------------------------------------

def worker(log):
    """Runs in the agent's code's process: requests on stdin, replies on a private copy of
    stdout; the agent's own prints go to LOG."""
    proto = os.fdopen(os.dup(1), "w")
    requests = os.fdopen(os.dup(0), "r")
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    # the agent's code reads an empty stdin, as where synth recorded and replayed its calls (a
    # call that reads stdin, e.g. a command line's "-", would otherwise wait on the requests)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    sys.path.insert(0, WORKSPACE)
    refs = {}

    def make_ref(obj):
        refs[len(refs) + 1] = obj
        try:
            text = repr(obj)[:200]
        except Exception:  # noqa: BLE001 - the agent's __repr__
            text = "?"
        return {"$ref": len(refs), "type": f"{type(obj).__module__}.{type(obj).__qualname__}", "repr": text}

    def reply(message):
        proto.write(json.dumps(message, separators=(",", ":")) + "\n")
        proto.flush()

    import importlib

    def resolve(target):
        """Import the longest module prefix of ``target`` (parents first, so that a hang is
        seen at the package that hangs), then follow the attributes."""
        parts = target.split(".")
        obj, i = None, 0
        while i < len(parts):
            name = ".".join(parts[: i + 1])
            reply({"importing": name})
            try:
                obj = importlib.import_module(name)
            except ModuleNotFoundError as e:
                if e.name != name or i == 0:
                    raise
                break
            finally:
                reply({"imported": name})
            i += 1
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj

    for line in requests:
        try:
            req = json.loads(line)
            args = decode(req.get("args", []), lambda d: refs[d["$ref"]])
            kwargs = decode(req.get("kwargs", {"$d": []}), lambda d: refs[d["$ref"]])
            op = req["op"]
            if "ref" in req:
                obj = refs[req["ref"]]
            else:
                obj = resolve(str(req["target"]))
            if op == "list":
                value = list(obj)
            elif op == "getattr":
                value = getattr(obj, str(req["attr"]))
            else:
                if req.get("attr"):
                    obj = getattr(obj, str(req["attr"]))
                value = obj(*args, **kwargs)
            out = {"value": encode(value, make_ref)}
        except NotData as e:
            out = _error("not_data", str(e))
        except BaseException as e:  # noqa: BLE001 - SystemExit included: the agent's code decides what it raises
            try:
                message = str(e)[:2000]
            except Exception:  # noqa: BLE001
                message = "?"
            out = _error("exception", message, type=type(e).__name__, types=[c.__name__ for c in type(e).__mro__])
        reply(out)
    return 0


def main(argv):
    if len(argv) == 3 and argv[1] == "start":
        return start(argv[2])
    if len(argv) == 3 and argv[1] == "worker":
        return worker(argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
