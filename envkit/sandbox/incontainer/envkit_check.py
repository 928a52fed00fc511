"""envkit_check: hidden tests that call the agent's code without running it.

A hidden test runs in a trusted process (the verifier user's pytest) that never imports the
workspace. Every call into the agent's code goes to the *call server*, a process of the agent
user that the runtime starts for the verification; the server runs the code in a worker
process (one per test) and sends back the result as typed JSON. What comes back is plain data
built afresh in the trusted process, so no object the agent made can fake equality, patch
pytest or touch the verifier's files. ::

    from envkit_check import function, module, raises, run

    median = function("kit.stats.median")
    stats = module("kit.stats")
    LRUCache = function("kit.lru.LRUCache")      # a non-data result comes back as a Remote

    def test_even_length():
        assert median([1, 2, 3, 4]) == 2.5

    def test_rejects_empty():
        with raises(ValueError):
            stats.percentile([], 50)

    def test_recency():
        c = LRUCache(2)
        c.put("a", 1)
        assert "a" in c                           # __contains__ must return a real bool

    def test_cli():
        r = run(["python3", "-m", "kit.csvtool", "data.csv", "--sum", "amount"], files={"data.csv": "amount\\n1\\n"})
        assert r.returncode == 0 and r.stdout.strip() == "1"

Values that cross: None, bool, int, float, str, bytes, list, tuple, dict, set, frozenset,
datetime.date / datetime / time / timedelta, decimal.Decimal (exact types only: a subclass is
not data). Anything else comes back as a :class:`Remote` handle to the object in the worker:
its methods run there, and it refuses ``==``, ``!=`` and truth tests (so a handle can never
pass an assertion by itself).

A call that raises in the agent's code raises :class:`AgentError` (``kind="exception"``,
``type`` the exception's class name); a call that runs past its timeout (default 10 s,
``ENVKIT_CALL_TIMEOUT_S``), a worker that dies, or a reply that is not data raise
:class:`AgentError` with kind ``timeout`` / ``crash`` / ``not_data``. ``raises(ValueError)``
passes only for a real exception of that name (or a subclass's) from the agent's code.

Where the server is: ``ENVKIT_CALLS`` (set by the envkit runtime; ``unavailable: <why>``
when it could not start, and every call then fails). Without ``ENVKIT_CALLS`` outside an
envkit sandbox (a Harbor export, a local check), this module starts a server itself, as the
workspace's owner when running as root.
"""

import atexit
import base64
import contextlib
import datetime
import decimal
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time

__all__ = ["AgentError", "Completed", "Remote", "attribute", "call", "function", "module", "raises", "read_file", "run",
           "stats"]

MAX_MESSAGE = 32 * 1024 * 1024
_GRACE_S = 5.0
_HERE = os.path.dirname(os.path.abspath(__file__))
_SCALARS = (type(None), bool, int, str)


# -- the codec (both sides use it; the decoder builds fresh objects) -----------------------------

class NotData(Exception):
    """A value that cannot cross as data."""


def encode(value, ref=None, depth=0):
    """``value`` as JSON-able data. ``ref(obj)`` turns a non-data object into a handle's
    JSON (the worker's side); without it such an object raises :class:`NotData`."""
    if depth > 200:
        raise NotData("nested too deeply")
    t = type(value)
    if t in _SCALARS:
        return value
    if t is float:
        return value if math.isfinite(value) else {"$f": repr(value)}
    if t is list:
        return [encode(v, ref, depth + 1) for v in value]
    if t is tuple:
        return {"$t": [encode(v, ref, depth + 1) for v in value]}
    if t is dict:
        return {"$d": [[encode(k, ref, depth + 1), encode(v, ref, depth + 1)] for k, v in value.items()]}
    if t is set or t is frozenset:
        return {"$s" if t is set else "$fs": [encode(v, ref, depth + 1) for v in value]}
    if t is bytes:
        return {"$b": base64.b64encode(value).decode()}
    if t in (datetime.date, datetime.datetime, datetime.time):
        return {"$" + t.__name__: value.isoformat()}
    if t is datetime.timedelta:
        return {"$timedelta": [value.days, value.seconds, value.microseconds]}
    if t is decimal.Decimal:
        return {"$decimal": str(value)}
    if t is Remote:
        return {"$ref": value._ref}
    if ref is not None:
        return ref(value)
    raise NotData(f"a {t.__name__} is not data")


_ISO = {"$date": datetime.date, "$datetime": datetime.datetime, "$time": datetime.time}


def decode(data, remote=None, depth=0):
    """The inverse of :func:`encode`, strict: anything unexpected raises ValueError.
    ``remote(d)`` makes a handle of ``{"$ref": …}`` (None: handles are refused)."""
    if depth > 200:
        raise ValueError("nested too deeply")
    t = type(data)
    if t in _SCALARS or t is float:
        return data
    if t is list:
        return [decode(v, remote, depth + 1) for v in data]
    if t is not dict or len(data) not in (1, 3) or not all(type(k) is str for k in data):
        raise ValueError(f"not an encoded value: {str(data)[:80]}")
    if "$ref" in data:
        if remote is None or type(data["$ref"]) is not int:
            raise ValueError("unexpected object reference")
        return remote(data)
    (tag, body), = data.items()
    if tag == "$t" and type(body) is list:
        return tuple(decode(v, remote, depth + 1) for v in body)
    if tag == "$d" and type(body) is list and all(type(p) is list and len(p) == 2 for p in body):
        return {decode(k, remote, depth + 1): decode(v, remote, depth + 1) for k, v in body}
    if tag in ("$s", "$fs") and type(body) is list:
        items = [decode(v, remote, depth + 1) for v in body]
        return set(items) if tag == "$s" else frozenset(items)
    if tag == "$f" and body in ("nan", "inf", "-inf"):
        return float(body)
    if type(body) is str:
        if tag == "$b":
            return base64.b64decode(body.encode(), validate=True)
        if tag in _ISO:
            return _ISO[tag].fromisoformat(body)
        if tag == "$decimal":
            return decimal.Decimal(body)
    if tag == "$timedelta" and type(body) is list and len(body) == 3 and all(type(x) is int for x in body):
        return datetime.timedelta(days=body[0], seconds=body[1], microseconds=body[2])
    raise ValueError(f"unknown tag {tag!r}")


def send_line(sock, message):
    sock.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")


# -- errors and results --------------------------------------------------------------------------

class AgentError(Exception):
    """The agent's code did not give a value: it raised (``kind="exception"``, ``type`` and
    ``types`` name the exception's class and its bases), ran past its time (``timeout``), its
    process died (``crash``), it gave something that is not data (``not_data``), or its call
    server could not be reached (``unreachable``)."""

    def __init__(self, kind, message, type_name="", types=()):
        super().__init__(f"{kind}: {type_name + ': ' if type_name else ''}{message}")
        self.kind = kind
        self.type = type_name
        self.types = tuple(types)
        self.message = message


class Completed:
    """What :func:`run` gives: ``returncode``, ``stdout``, ``stderr`` (text)."""

    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr

    def __repr__(self):
        return f"Completed(returncode={self.returncode!r}, stdout={self.stdout[:200]!r}, stderr={self.stderr[:200]!r})"


class Remote:
    """An object that lives in the agent's worker process. Calls and methods run there;
    ``==``, ``!=`` and ``bool()`` refuse (an answer must be data to be checked)."""

    __slots__ = ("_ref", "_session", "_generation", "_desc", "_type", "_repr")

    def __init__(self, session, data):
        self._session, self._generation = session, session.generation
        self._type, self._repr = str(data.get("type", "?"))[:200], str(data.get("repr", ""))[:200]
        self._ref, self._desc = data["$ref"], f"{self._type[:100]}: {self._repr}"

    def __repr__(self):
        return f"<Remote {self._desc}>"

    def _call(self, attr, args, kwargs):
        return self._session.request({"op": "call", "ref": self._ref, "attr": attr, "args": list(args),
                                      "kwargs": kwargs}, generation=self._generation)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args, **kwargs: self._call(name, args, kwargs)

    def __call__(self, *args, **kwargs):
        return self._call(None, args, kwargs)

    def __contains__(self, item):
        return _typed(self._call("__contains__", (item,), {}), bool, "__contains__")

    def __len__(self):
        return _typed(self._call("__len__", (), {}), int, "__len__")

    def __getitem__(self, key):
        return self._call("__getitem__", (key,), {})

    def __iter__(self):
        return iter(self._session.request({"op": "list", "ref": self._ref}, generation=self._generation))

    def __eq__(self, other):
        raise AgentError("not_data", f"the agent's code gave {self!r}, not data, so it cannot be compared")

    __ne__ = __eq__

    def __bool__(self):
        raise AgentError("not_data", f"the agent's code gave {self!r}, not data, so it has no truth value")

    def __hash__(self):
        return id(self)


def _typed(value, kind, what):
    if type(value) is not kind:
        raise AgentError("not_data", f"{what} gave a {type(value).__name__}, not a {kind.__name__}")
    return value


def attribute(remote, name):
    """The value of an attribute of a :class:`Remote` (data, or another handle)."""
    return remote._session.request({"op": "getattr", "ref": remote._ref, "attr": name}, generation=remote._generation)


# -- the connection to the call server -------------------------------------------------------------

_stats = {"calls": 0, "timeouts": 0, "crashes": 0, "exceptions": 0, "not_data": 0, "unreachable": 0}


def stats():
    """How the agent's code fared in this process: calls, timeouts, crashes, …"""
    return dict(_stats)


def default_timeout():
    try:
        return max(0.1, float(os.environ.get("ENVKIT_CALL_TIMEOUT_S", "10")))
    except ValueError:
        return 10.0


class _Session:
    """One connection to the call server: one worker process, created on the first call."""

    def __init__(self, address):
        self.address = address
        self.sock = None
        self.buf = b""
        self.generation = 0

    def _connect(self):
        if self.address.startswith("unavailable"):
            raise AgentError("unreachable", f"the call server is {self.address}")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(10)
            sock.connect(self.address)
        except OSError as e:
            sock.close()
            raise AgentError("unreachable", f"the call server at {self.address} does not answer: {e}") from None
        self.sock, self.buf = sock, b""
        self.generation += 1

    def close(self):
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.sock = None

    def _read_line(self, deadline):
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self.sock.settimeout(left)
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("the call server closed the connection")
            self.buf += chunk
            if len(self.buf) > MAX_MESSAGE:
                raise ValueError("the reply is too large")
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def request(self, message, *, timeout=None, generation=None):
        timeout = default_timeout() if timeout is None else float(timeout)
        _stats["calls"] += 1
        if generation is not None and (self.sock is None or generation != self.generation):
            raise AgentError("crash", "this object was lost when the agent's worker process was restarted")
        try:
            if self.sock is None:
                self._connect()
            message = dict(message, timeout=timeout)
            for key in ("args", "kwargs"):
                if key in message:
                    message[key] = encode(message[key])
            send_line(self.sock, message)
            line = self._read_line(time.monotonic() + timeout + _GRACE_S)
        except AgentError as e:
            _stats[e.kind] = _stats.get(e.kind, 0) + 1
            raise
        except TimeoutError:
            self.close()  # the server kills the worker when its connection closes
            _stats["timeouts"] += 1
            raise AgentError("timeout", f"no answer within {timeout:g} s (the call server itself is stuck)") from None
        except NotData as e:
            raise TypeError(f"envkit_check can only pass data to the agent's code: {e}") from None
        except (OSError, ValueError) as e:
            self.close()
            _stats["crashes"] += 1
            raise AgentError("crash", f"the agent's side failed: {type(e).__name__}: {e}") from None
        return self._answer(line)

    def _answer(self, line):
        try:
            reply = json.loads(line)
            if type(reply) is not dict:
                raise ValueError("not an object")
            if "error" in reply:
                err = reply["error"]
                kind = str(err.get("kind", "crash"))
                if kind not in ("exception", "timeout", "crash", "not_data"):
                    kind = "crash"
                _stats[{"exception": "exceptions", "timeout": "timeouts", "crash": "crashes"}.get(kind, kind)] += 1
                if kind in ("timeout", "crash"):
                    self.generation += 1  # the worker was replaced: its objects are gone
                types = err.get("types") if type(err.get("types")) is list else []
                raise AgentError(kind, str(err.get("message", ""))[:4000], str(err.get("type", ""))[:200],
                                 [str(t)[:200] for t in types[:50]])
            return decode(reply["value"], lambda d: Remote(self, d))
        except AgentError:
            raise
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            _stats["not_data"] += 1
            raise AgentError("not_data",
                             f"the agent's side answered something that is not data: {type(e).__name__}") from None


_current = None
_direct_server = None


def session():
    """The session of the running test (one agent worker); made on first use."""
    global _current
    if _current is None:
        _current = _Session(_address())
    return _current


def end_session():
    """End the current session: its worker process is killed, its objects are gone."""
    global _current
    if _current is not None:
        _current.close()
        _current = None


def _address():
    addr = os.environ.get("ENVKIT_CALLS")
    if addr:
        return addr
    if os.environ.get("ENVKIT_ENV"):  # inside an envkit sandbox the runtime must say where the server is
        return "unavailable: ENVKIT_CALLS is not set (this verifier was not started by the envkit runtime)"
    return _start_direct()


def _start_direct():
    """No runtime started a call server (a Harbor export, a local run): start one here, as the
    workspace's owner when we are root (else as ourselves: no privilege separation then)."""
    global _direct_server
    if _direct_server is None:
        workspace = os.environ.get("ENVKIT_WORKSPACE", "/workspace")
        # In /tmp, not $TMPDIR: the server's user must reach it (the verifier's TMPDIR is private).
        folder = tempfile.mkdtemp(prefix="envkit-calls-", dir="/tmp" if os.path.isdir("/tmp") else None)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "ENVKIT_WORKSPACE": workspace,
               "HOME": os.environ.get("HOME", "/")}
        kwargs = {}
        try:
            st = os.stat(workspace)
        except OSError:
            st = None
        if os.geteuid() == 0 and st is not None and st.st_uid != 0:
            kwargs = {"user": st.st_uid, "group": st.st_gid, "extra_groups": []}
            env["HOME"] = folder
        os.rmdir(folder)  # the server makes it again, as its own user
        proc = subprocess.run([sys.executable, "-I", os.path.join(_HERE, "callserver.py"), "start", folder],
                              capture_output=True, text=True, timeout=60, cwd="/", env=env, **kwargs)
        try:
            _direct_server = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return f"unavailable: the call server did not start: {proc.stderr[-500:]}"
        atexit.register(_stop_direct)
    return _direct_server["socket"]


def _stop_direct():
    with contextlib.suppress(OSError, KeyError, TypeError):
        os.killpg(int(_direct_server["pid"]), 9)


# -- the API for tests -----------------------------------------------------------------------------

def call(target, *args, timeout=None, **kwargs):
    """Call ``target`` ("package.module.name", or a class to make an instance) in the agent's
    worker with data arguments; returns data or a :class:`Remote`."""
    return session().request({"op": "call", "target": str(target), "args": list(args), "kwargs": kwargs},
                             timeout=timeout)


class _Function:
    def __init__(self, target):
        self.target = target

    def __call__(self, *args, **kwargs):
        return call(self.target, *args, **kwargs)

    def __repr__(self):
        return f"<agent's {self.target}>"


def function(target):
    """A callable that runs ``target`` in the agent's worker on each call."""
    return _Function(target)


class _Module:
    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Function(f"{self._name}.{attr}")

    def __repr__(self):
        return f"<agent's module {self._name}>"


def module(name):
    """``module("kit.stats").median(...)`` calls ``kit.stats.median`` in the agent's worker."""
    return _Module(name)


def run(argv, *, files=None, stdin="", timeout=30, cwd=None):
    """Run a command as the agent (in a fresh folder holding ``files``, text or bytes, with the
    workspace on ``PYTHONPATH``; ``cwd="."`` runs it in the workspace). Returns
    :class:`Completed`; a command that runs past ``timeout`` raises :class:`AgentError`
    (``timeout``)."""
    if not isinstance(argv, (list, tuple)) or not all(isinstance(a, str) for a in argv):
        raise TypeError("run() takes the command as a list of strings")
    files = {str(k): encode(v) if type(v) is bytes else str(v) for k, v in (files or {}).items()}
    out = session().request({"op": "run", "argv": list(argv), "files": files, "stdin": str(stdin), "cwd": cwd},
                            timeout=timeout)
    return Completed(out["returncode"], out["stdout"], out["stderr"])


def read_file(path, *, timeout=None):
    """The bytes of a workspace file, read as the agent (a symlink leads where the agent can go)."""
    return session().request({"op": "read", "path": str(path)}, timeout=timeout)


class raises:  # noqa: N801 - used like pytest.raises
    """``with raises(ValueError):`` passes only if the agent's code raised an exception of that
    name (or a subclass's); a timeout, crash or anything else fails the test."""

    def __init__(self, exc, match=None):
        self.name = exc if isinstance(exc, str) else exc.__name__
        self.match = match
        self.value = None

    def __enter__(self):
        return self

    def __exit__(self, etype, exc, tb):
        if exc is None:
            raise AssertionError(f"the agent's code did not raise {self.name}")
        if not isinstance(exc, AgentError) or exc.kind != "exception" or self.name not in (exc.type, *exc.types):
            return False  # not what was expected: the original error fails the test
        if self.match is not None:
            import re

            if not re.search(self.match, exc.message):
                raise AssertionError(f"{self.name} raised, but {exc.message!r} does not match {self.match!r}")
        self.value = exc
        return True


# -- the pytest plugin (pytest_verifier.py loads it) --------------------------------------------------

class Plugin:
    """Records each test's outcome in the trusted process and gives every test its own worker."""

    def __init__(self, results_path):
        self.results_path = results_path
        self.outcomes = {}

    def pytest_runtest_logreport(self, report):
        ok = report.passed if report.when == "call" else not report.failed
        prev = self.outcomes.get(report.nodeid, True)
        self.outcomes[report.nodeid] = prev and ok and not (report.when == "call" and report.skipped)
        if report.when == "setup" and report.skipped:
            self.outcomes[report.nodeid] = False

    def pytest_runtest_logfinish(self, nodeid, location):
        end_session()

    def pytest_sessionfinish(self, session, exitstatus):
        with open(self.results_path, "w") as f:
            json.dump({"tests": self.outcomes, "agent_code": stats(), "exitstatus": int(exitstatus)}, f)
