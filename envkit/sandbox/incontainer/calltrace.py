"""Call traces: what a project's own tests ask of its code, recorded as data and replayed.

A real project's tests import its code and run it in their own process, so whatever they
report can be forged by that code. A call trace is the part of a test that can be checked
without trusting it: while the test runs on the pristine project, the calls its code makes
*into the package* are recorded (target, arguments, and what came back), as long as the
arguments are data or objects that earlier recorded calls returned. At verification the
calls are made again on the agent's code, in a worker process of the agent user
(``envkit_check``), and what comes back is compared *in the verifier's process*, as fresh
data: an answer the agent's code cannot forge without knowing the recorded one.

A step is one of::

    {"t": "pkg.mod.func", "args": [...], "kwargs": {...}, "out": OUT}   a function, class or static method
    {"ref": N, "attr": "name", "args": [...], "kwargs": {...}, "out": OUT}   a method of an object
                                                                            an earlier step returned
    {"ref": N, "get": "name", "out": OUT}                                  a property of such an object

``args`` and ``kwargs`` are envkit_check's encoding, with ``{"$ref": N}`` for those objects;
``OUT`` is the encoded value (objects as ``{"$ref": N, "type", "repr"}``), ``{"exc": [names]}``
for an exception, or ``{"$gen": N}`` for a generator (its values are ``__next__`` steps).
What is compared: data exactly (type included), objects by type and repr (addresses
blanked), exceptions by class name.

Standard library only: it runs inside the sandbox (the recorder in the tests' process, the
local replay as the agent during synthesis, :func:`replay` in the verifier).
"""

import dis
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from envkit_check import NotData, decode, encode  # noqa: E402

__all__ = ["MAX_STEPS", "Recorder", "canon", "replay", "same", "telling"]

MAX_STEPS = 200  # recorded steps per test
MAX_STEP_BYTES = 4096  # a step whose encoding is larger is not recorded
MAX_REPR = 200
_GENERATOR = 0x20  # CO_GENERATOR
_VARARGS, _VARKEYWORDS = 0x04, 0x08
_YIELD = dis.opmap["YIELD_VALUE"]
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


class _Unreplayable(Exception):
    pass


def describe(obj):
    """An object's type and repr as envkit_check's worker reports them."""
    try:
        text = repr(obj)[:MAX_REPR]
    except Exception:  # noqa: BLE001 - the project's __repr__
        text = "?"
    return f"{type(obj).__module__}.{type(obj).__qualname__}", text


# -- recording ----------------------------------------------------------------------------------

class Recorder:
    """Records the calls that code under ``test_roots`` makes into code under ``package_roots``
    (file path prefixes), with ``sys.settrace``: the global hook costs one check per Python
    call; only the recorded calls' own frames are traced line by line."""

    def __init__(self, package_roots, test_roots):
        self.pkg = tuple(os.path.join(os.path.realpath(p), "") if os.path.isdir(p) else os.path.realpath(p)
                         for p in package_roots)
        self.tests = tuple(os.path.join(os.path.realpath(p), "") for p in test_roots)
        self.steps, self.known, self.keep, self.gens = [], {}, [], {}
        self.active = None

    def start(self):
        self.steps, self.known, self.keep, self.gens, self.active = [], {}, [], {}, None
        sys.settrace(self._call)

    def stop(self):
        sys.settrace(None)
        self.keep, self.known, self.gens = [], {}, {}
        # a generator's call whose first value was not recorded says nothing: the trace ends before it
        for i, step in enumerate(self.steps):
            out = step.get("out")
            if type(out) is dict and "$gen" in out and not (i + 1 < len(self.steps)
                                                            and self.steps[i + 1].get("ref") == out["$gen"]):
                del self.steps[i:]
                break
        return self.steps

    # refs: objects earlier steps returned (kept alive so that their ids stay theirs)
    def _new_ref(self, obj):
        n = len(self.keep) + 1
        self.keep.append(obj)
        self.known[id(obj)] = n
        if getattr(obj, "gi_frame", None) is not None and obj.gi_code.co_flags & _GENERATOR:
            self.gens[id(obj.gi_frame)] = n
        kind, text = describe(obj)
        return {"$ref": n, "type": kind, "repr": text}

    def _arg_ref(self, obj):
        n = self.known.get(id(obj))
        if n is None:
            raise _Unreplayable("an argument the recorded calls did not make")
        return {"$ref": n}

    def _out_ref(self, obj):
        return self._new_ref(obj)

    def _call(self, frame, event, arg):
        code = frame.f_code
        if self.active is not None or len(self.steps) >= MAX_STEPS:
            return None
        back = frame.f_back
        if back is None or not self._test_code(back.f_code.co_filename):
            return None
        if not code.co_filename.startswith(self.pkg) and (self._test_code(code.co_filename)
                                                          or not self._inherited(frame, code)):
            return None
        try:
            step, after = self._step(frame, code)
        except (_Unreplayable, NotData, RecursionError):
            return None
        if step is None:
            return None
        self.active = (frame, step, after, [None])
        return self._local

    def _test_code(self, filename):
        return filename.startswith(self.tests) and not filename.startswith(self.pkg)

    def _inherited(self, frame, code):
        """A method defined outside the package (e.g. MutableMapping.update) called on an object
        the recorded calls made: it changes that object, so it is a step too."""
        if code.co_argcount == 0 or "." not in code.co_qualname:
            return False
        return id(frame.f_locals.get(code.co_varnames[0])) in self.known

    def _step(self, frame, code):
        """The step a new call into the package makes, and what its result will be."""
        if code.co_flags & _GENERATOR:
            n = self.gens.get(id(frame))
            if n is not None:  # a generator the test resumes: one __next__ step
                return {"ref": n, "attr": "__next__", "args": [], "kwargs": {"$d": []}}, "next"
            if frame.f_lasti > 8:  # not its first resume, and not a generator an earlier step returned
                return None, None
        module = frame.f_globals.get("__name__", "")
        qual = code.co_qualname
        if "<" in qual or not module:
            return None, None  # a lambda, a nested function or a comprehension: nothing to call by name
        parts = qual.split(".")
        values = frame.f_locals
        names = code.co_varnames
        params = list(names[: code.co_argcount + code.co_kwonlyargcount])
        first = values.get(params[0]) if params else None
        if not code.co_filename.startswith(self.pkg):  # an inherited method of a recorded object
            if code.co_flags & _GENERATOR:
                return None, None
            name = parts[-1]
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{parts[-2].lstrip('_')}{name}"
            raw = next((k.__dict__[name] for k in type(first).__mro__ if name in k.__dict__), None)
            if getattr(raw, "__code__", None) is not code:
                return None, None
            args, kwargs = self._arguments(code, values, params[1:], raw)
            step = {"ref": self.known[id(first)], "attr": name, "args": encode(args, self._arg_ref),
                    "kwargs": encode(kwargs, self._arg_ref)}
            return step, "value"
        if len(parts) == 1:
            function = frame.f_globals.get(qual)
            target, recv = f"{module}.{qual}", None
        else:
            cls = frame.f_globals.get(parts[0])
            for p in parts[1:-1]:
                cls = getattr(cls, p, None)
            if not isinstance(cls, type):
                return None, None
            attr = parts[-1]
            if attr.startswith("__") and not attr.endswith("__"):  # name-mangled: _Class__name
                attr = f"_{parts[-2].lstrip('_')}{attr}"
            raw = next((k.__dict__[attr] for k in cls.__mro__ if attr in k.__dict__), None)
            function = getattr(raw, "__func__", raw)
            if isinstance(raw, property):  # an attribute read: replayed as one
                if raw.fget is None or raw.fget.__code__ is not code or not isinstance(first, cls):
                    return None, None  # a setter or deleter: not replayable
                return {"ref": self._arg_ref(first)["$ref"], "get": attr}, "value"
            if parts[-1] == "__init__":
                if type(first) is not cls or id(first) in self.known:
                    return None, None  # a subclass's constructor, or a second __init__: not replayable as a call
                target, recv = f"{module}.{'.'.join(parts[:-1])}", "init"
                params = params[1:]
            elif isinstance(raw, staticmethod) or not params:
                target, recv = f"{module}.{qual}", None
            elif isinstance(raw, classmethod):
                if first is not cls:
                    return None, None
                target, recv = f"{module}.{qual}", None
                params = params[1:]
            else:
                if not isinstance(first, cls):
                    return None, None
                target, recv = None, {"ref": self._arg_ref(first)["$ref"], "attr": attr}
                params = params[1:]
        if getattr(function, "__code__", None) is not code:
            function = None
        args, kwargs = self._arguments(code, values, params, function)
        step = {"t": target} if target is not None else dict(recv)
        step["args"] = encode(args, self._arg_ref)
        step["kwargs"] = encode(kwargs, self._arg_ref)
        if len(json.dumps(step)) > MAX_STEP_BYTES:
            raise _Unreplayable("too large")
        if code.co_flags & _GENERATOR:
            return step, "generator"
        return step, ("init" if recv == "init" else "value")

    @staticmethod
    def _arguments(code, values, params, function):
        """The call, rebuilt from the frame's parameters: defaults left out, positional-only
        parameters by position, the rest by keyword (all by position when *args is used)."""
        defaults = {}
        if function is not None:
            positional = code.co_varnames[: code.co_argcount]
            given = function.__defaults__ or ()
            for name, value in zip(positional[len(positional) - len(given):], given, strict=True):
                defaults[name] = value
            defaults.update(function.__kwdefaults__ or {})
        i = code.co_argcount + code.co_kwonlyargcount
        star = values.get(code.co_varnames[i], ()) if code.co_flags & _VARARGS else ()
        if code.co_flags & _VARARGS:
            i += 1
        starstar = values.get(code.co_varnames[i], {}) if code.co_flags & _VARKEYWORDS else {}
        positional_names = set(code.co_varnames[: code.co_argcount])
        posonly = set(code.co_varnames[: code.co_posonlyargcount])
        args, kwargs = [], {}
        for name in params:
            value = values.get(name)
            if name in posonly or (star and name in positional_names):
                args.append(value)
            elif not (name in defaults and defaults[name] is value):
                kwargs[name] = value
        args.extend(star)
        kwargs.update(starstar)
        if set(kwargs) & set(code.co_varnames[: code.co_posonlyargcount]):
            raise _Unreplayable("keyword arguments named like positional-only parameters")
        return list(args), dict(kwargs)

    def _local(self, frame, event, arg):
        if self.active is None or frame is not self.active[0]:
            return None
        pending = self.active[3]
        if event == "exception":
            pending[0] = arg[0]
        elif event == "line":
            pending[0] = None
        elif event == "return":
            self._finish(frame, arg, pending[0])
        return self._local

    def _finish(self, frame, value, raised):
        _, step, after, _ = self.active
        self.active = None
        try:
            if raised is not None and value is None:
                step["out"] = {"exc": [c.__name__ for c in raised.__mro__][:8]}
            elif after == "init":
                step["out"] = self._new_ref(frame.f_locals.get(frame.f_code.co_varnames[0]))
            elif after in ("next", "generator"):
                yielded = frame.f_lasti >= 0 and frame.f_code.co_code[frame.f_lasti] == _YIELD
                if after == "generator":  # its first resume: the call that made it, then its first value
                    n = len(self.keep) + 1
                    self.keep.append(frame)
                    self.gens[id(frame)] = n
                    self.steps.append(dict(step, out={"$gen": n}))
                    step = {"ref": n, "attr": "__next__", "args": [], "kwargs": {"$d": []}}
                step["out"] = encode(value, self._out_ref) if yielded else {"exc": ["StopIteration", "Exception"]}
            else:
                step["out"] = encode(value, self._out_ref)
        except (NotData, RecursionError):
            return
        if len(json.dumps(step)) <= MAX_STEP_BYTES:
            self.steps.append(step)


# -- comparison and replay ------------------------------------------------------------------------

def canon(out):
    """The comparable form of a step's result: data exactly, objects by type and repr."""
    if type(out) is dict:
        if "exc" in out:
            return {"exc": str(out["exc"][0]) if out["exc"] else "?"}
        if "$gen" in out:
            return {"gen": True}
        if "$ref" in out:
            return {"obj": str(out.get("type", "")), "repr": _ADDRESS.sub(" at 0x?", str(out.get("repr", "")))}
        if "$d" in out:
            pairs = [[canon(k), canon(v)] for k, v in out["$d"]]
            return {"$d": sorted(pairs, key=lambda p: json.dumps(p[0], sort_keys=True))}
        if "$s" in out or "$fs" in out:
            tag = "$s" if "$s" in out else "$fs"
            return {tag: sorted((canon(v) for v in out[tag]), key=lambda v: json.dumps(v, sort_keys=True))}
        return {k: canon(v) for k, v in out.items()}
    if type(out) is list:
        return [canon(v) for v in out]
    if type(out) is float:
        return {"$f": repr(out)}  # 1 and 1.0 differ; so do 0.1 + 0.2 and 0.3
    return out


def telling(out):
    """Whether a recorded result pins the code down beyond its type: data, an exception, or an
    object whose repr is its own (not ``<X object at 0x…>``, which any object of X has)."""
    if type(out) is dict and "$ref" in out:
        text = str(out.get("repr", ""))
        return not (text.startswith("<") and _ADDRESS.search(text)) and text != "?"
    if type(out) is dict and "$gen" in out:
        return False
    return True


def same(a, b):
    return json.dumps(canon(a), sort_keys=True) == json.dumps(canon(b), sort_keys=True)


def replay(steps, invoke):
    """Make ``steps`` again through ``invoke(step, args, kwargs, refs) -> (out, obj)`` (``out``
    encoded like a recorded result; ``obj`` what later steps may call, for objects).
    Returns ``(checked, mismatch)``: the number of steps that matched, and the first that did
    not (``None`` when all did)."""
    refs = {}
    for i, step in enumerate(steps):
        try:
            args = decode(step.get("args", []), lambda d: refs[d["$ref"]])
            kwargs = decode(step.get("kwargs", {"$d": []}), lambda d: refs[d["$ref"]])
        except (KeyError, ValueError):
            return i, {"step": i, "call": _label(step), "why": "an object an earlier step should have made is missing"}
        out, objects = invoke(step, args, kwargs, refs)
        if not same(out, step["out"]):
            return i, {"step": i, "call": _label(step), "got": _short(canon(out)), "telling": telling(step["out"])}
        expected = step["out"]
        for n, obj in zip(_refs_in(expected), objects, strict=False):
            refs[n] = obj
    return len(steps), None


def _refs_in(out):
    """The ref numbers a recorded result names, in encoding order."""
    found = []

    def walk(v):
        if type(v) is dict:
            if "$ref" in v:
                found.append(v["$ref"])
            elif "$gen" in v:
                found.append(v["$gen"])
            else:
                for x in v.values():
                    walk(x)
        elif type(v) is list:
            for x in v:
                walk(x)
    walk(out)
    return found


def _label(step):
    what = step.get("t") or f"<object {step.get('ref')}>.{step.get('attr') or step.get('get')}"
    return str(what)[:200]


def _short(value):
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 300 else text[:300] + "…"


# -- the local backend (the agent's side, during synthesis) -------------------------------------

def resolve(target):
    """Import the longest module prefix of ``target``, then follow attributes."""
    import importlib

    parts = target.split(".")
    obj, i = None, 0
    while i < len(parts):
        try:
            obj = importlib.import_module(".".join(parts[: i + 1]))
        except ModuleNotFoundError as e:
            if e.name != ".".join(parts[: i + 1]) or i == 0:
                raise
            break
        i += 1
    for attr in parts[i:]:
        obj = getattr(obj, attr)
    return obj


def invoke_local(step, args, kwargs, refs):
    """Run one step in this process (the code under test's own process: synthesis only)."""
    made = []

    def ref(obj):
        made.append(obj)
        kind, text = describe(obj)
        return {"$ref": len(made), "type": kind, "repr": text}

    try:
        if "t" in step:
            value = resolve(step["t"])(*args, **kwargs)
        elif "get" in step:
            value = getattr(refs[step["ref"]], step["get"])
        else:
            value = getattr(refs[step["ref"]], step["attr"])(*args, **kwargs)
    except BaseException as e:  # noqa: BLE001 - the code under test decides what it raises
        return {"exc": [c.__name__ for c in type(e).__mro__][:8]}, []
    if type(step.get("out")) is dict and "$gen" in step["out"]:
        try:
            return encode(value), []  # data is never the generator the recording saw
        except (NotData, RecursionError):
            return {"$gen": 1}, [value]
    try:
        return encode(value, ref), made
    except (NotData, RecursionError):
        return {"exc": ["NotData"]}, []


def replay_local(traces, ids):
    """Replay each test's steps in a fresh forked process; ``{id: [checked, mismatch]}``."""
    results = {}
    for test in ids:
        steps = traces.get(test) or []
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            try:
                checked, mismatch = replay(steps, invoke_local)
                data = json.dumps([checked, mismatch]).encode()
            except BaseException as e:  # noqa: BLE001
                data = json.dumps([0, {"step": 0, "why": f"replay failed: {type(e).__name__}"}]).encode()
            os.write(write, data)
            os._exit(0)
        os.close(write)
        chunks = []
        while True:
            chunk = os.read(read, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(read)
        os.waitpid(pid, 0)
        try:
            results[test] = json.loads(b"".join(chunks))
        except ValueError:
            results[test] = [0, {"step": 0, "why": "the replay process died"}]
    return results
