"""`envkit init DIR --kind repo|api|website`: a small environment that builds and validates as is."""

from __future__ import annotations

import json
import re
from pathlib import Path

from envkit.errors import UserError
from envkit.refs import NAME_RE

__all__ = ["KINDS", "init_environment"]

KINDS = ("repo", "api", "website")

_SPEC = '''# {name}: scaffolded by `envkit init`. Reference: docs/spec.md
spec_version = 1

[environment]
name = "{name}"
version = "0.1.0"
kind = "repo"
description = "A starter repo environment: fix a bug, add a function."

[image]
base = "envkit/base"
files = ["verify", "oracle"]   # hidden from the agent (owned by the verifier user)

[state]
repo = {{ path = "repo" }}      # the agent starts in /workspace with these files, committed

[tasks]
file = "tasks.jsonl"

[verifier]
# Runs verify/tests/<task id>.py against /workspace; reward = share of tests passed.
command = "python3 /opt/envkit/pytest_verifier.py --tests /env/verify/tests"
timeout_s = 60

[limits]
cpus = 1.0
memory_mb = 512
pids = 128
disk_mb = 128
command_timeout_s = 30
episode_timeout_s = 300
network = "none"
'''

_FILES = {
    "tasks.jsonl": (
        '{"id": "fix-clamp", "difficulty": "easy", "oracle": "oracle/fix-clamp.sh", '
        '"instruction": "`calc.clamp(x, lo, hi)` returns values above `hi` unchanged. Fix it. '
        'The project is in /workspace."}\n'
        '{"id": "add-mean", "difficulty": "easy", "oracle": "oracle/add-mean.sh", '
        '"instruction": "Add `calc.mean(values)` returning the arithmetic mean; raise ValueError for an empty list. '
        'The project is in /workspace."}\n'
    ),
    "repo/calc.py": '''"""A tiny calculator module."""


def clamp(x, lo, hi):
    """x limited to the range [lo, hi]."""
    if x < lo:
        return lo
    return x
''',
    "repo/README.md": "# calc\n\nA tiny calculator module. Run `python3 -c 'import calc'`.\n",
    "verify/tests/fix-clamp.py": '''\
# Hidden tests never import the workspace: envkit_check runs the agent's code in its own
# process, as the agent, and brings back plain data (docs/spec.md, "Verifiers").
from envkit_check import function

clamp = function("calc.clamp")


def test_above_range():
    assert clamp(15, 0, 10) == 10


def test_far_above_range():
    assert clamp(1e9, -1, 1) == 1
''',
    "verify/tests/add-mean.py": '''from envkit_check import module, raises

calc = module("calc")


def test_mean():
    assert calc.mean([1, 2, 3, 4]) == 2.5


def test_empty():
    with raises(ValueError):
        calc.mean([])
''',
    "oracle/fix-clamp.sh": '''#!/bin/bash
# Reference solution for fix-clamp: runs as the agent, in /workspace.
set -euo pipefail
python3 - <<'PY'
import pathlib
p = pathlib.Path("calc.py")
p.write_text(p.read_text().replace("        return lo\\n    return x", \
"        return lo\\n    if x > hi:\\n        return hi\\n    return x"))
PY
''',
    "oracle/add-mean.sh": '''#!/bin/bash
# Reference solution for add-mean: runs as the agent, in /workspace.
set -euo pipefail
cat >> calc.py <<'PY'


def mean(values):
    """The arithmetic mean of a non-empty list."""
    if not values:
        raise ValueError("mean of an empty list")
    return sum(values) / len(values)
PY
''',
}


_API_SPEC = '''# {name}: scaffolded by `envkit init --kind api`. Reference: docs/spec.md
spec_version = 1

[environment]
name = "{name}"
version = "0.1.0"
kind = "api"
description = "A starter API environment: a notes service over SQLite."

[image]
base = "envkit/base"
files = ["oracle"]

[state]
# Runs as the `service` user in /seed/app; listens on 127.0.0.1:8080 inside the sandbox.
service = {{ path = "app", command = "python3 server.py", port = 8080, health = "/health" }}
# Restored at every reset; the service finds the database at $ENVKIT_DB.
database = {{ fixture = "fixtures/notes.sql" }}

[tasks]
file = "tasks.jsonl"

[verifier]
# Grades by SQL checks on the final database and by the answer (see each task's params).
command = "python3 /opt/envkit/state_verifier.py"
timeout_s = 60

[limits]
memory_mb = 256
pids = 128
disk_mb = 64
command_timeout_s = 30
episode_timeout_s = 300
network = "none"

[tools]
enabled = ["http"]
'''

_API_FILES = {
    "app/server.py": '''"""A tiny notes API: GET /notes, GET/PATCH /notes/{id}. Opens the database per request."""

import json
import os
import re
import sqlite3
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DB = os.environ["ENVKIT_DB"]
PORT = int(os.environ["ENVKIT_PORT"])


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            return self.reply(200, {"status": "ok"})
        conn = sqlite3.connect(DB)
        conn.row_factory = sqlite3.Row
        try:
            if self.path == "/notes":
                return self.reply(200, [dict(r) for r in conn.execute("SELECT * FROM notes ORDER BY id")])
            m = re.fullmatch(r"/notes/(\\d+)", self.path)
            row = conn.execute("SELECT * FROM notes WHERE id = ?", (int(m[1]),)).fetchone() if m else None
            return self.reply(200, dict(row)) if row else self.reply(404, {"error": "not found"})
        finally:
            conn.close()

    def do_PATCH(self):
        m = re.fullmatch(r"/notes/(\\d+)", self.path)
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if not m or not isinstance(body.get("done"), bool):
            return self.reply(400, {"error": "PATCH /notes/{id} with {\\"done\\": true|false}"})
        conn = sqlite3.connect(DB)
        try:
            changed = conn.execute("UPDATE notes SET done = ? WHERE id = ?", (int(body["done"]), int(m[1]))).rowcount
            conn.commit()
        finally:
            conn.close()
        return self.reply(200 if changed else 404, {"id": int(m[1]), "done": body["done"]} if changed else \
{"error": "not found"})


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
''',
    "fixtures/notes.sql": (
        "CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT NOT NULL, done INTEGER NOT NULL);\n"
        "INSERT INTO notes VALUES (1, 'Buy milk', 1);\n"
        "INSERT INTO notes VALUES (2, 'Call the bank', 0);\n"
        "INSERT INTO notes VALUES (3, 'Book flights', 0);\n"
    ),
    "tasks.jsonl": (
        '{"id": "finish-note", "difficulty": "easy", "oracle": "oracle/finish-note.json", '
        '"instruction": "Mark the note titled Call the bank as done.", '
        '"params": {"checks": [{"sql": "SELECT done FROM notes WHERE id = 2", "expect": [[1]]}], '
        '"guards": [{"sql": "SELECT group_concat(done) FROM notes WHERE id != 2", "expect": [["1,0"]]}]}}\n'
        '{"id": "count-open", "difficulty": "easy", "oracle": "oracle/count-open.json", '
        '"instruction": "How many notes are not done yet? Answer with a number.", '
        '"params": {"answer": {"expect": "2", "type": "number"}}}\n'
    ),
    "oracle/finish-note.json": '{"actions": [{"tool": "http", "method": "GET", "path": "/notes"}, '
                               '{"tool": "http", "method": "PATCH", "path": "/notes/2", "body": {"done": true}}]}\n',
    "oracle/count-open.json": '{"actions": [{"tool": "http", "method": "GET", "path": "/notes"}, '
                              '{"tool": "answer", "text": "2"}]}\n',
}


_WEB_SPEC = _API_SPEC.replace("`envkit init --kind api`", "`envkit init --kind website`").replace(
    'kind = "api"', 'kind = "website"').replace("a notes service over SQLite", "a guestbook web page").replace(
    "fixtures/notes.sql", "fixtures/guestbook.sql").replace('enabled = ["http"]', 'enabled = ["browser"]')

_WEB_FILES = {
    "app/server.py": '''"""A guestbook: GET / lists the entries and shows a form; POST /sign adds one."""

import html
import os
import sqlite3
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

DB = os.environ["ENVKIT_DB"]
PORT = int(os.environ["ENVKIT_PORT"])


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def page(self, status, text, location=None):
        data = text.encode()
        self.send_response(status)
        if location:
            self.send_header("Location", location)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            return self.page(200, "ok")
        conn = sqlite3.connect(DB)
        entries = conn.execute("SELECT name, message FROM entries ORDER BY id").fetchall()
        conn.close()
        items = "".join(f"<li><b>{html.escape(n)}</b>: {html.escape(m)}</li>" for n, m in entries)
        self.page(200, f"""<!doctype html><html><head><title>Guestbook</title></head><body><h1>Guestbook</h1>
<p>{len(entries)} entries</p><ul>{items}</ul>
<form method="post" action="/sign"><label>Name <input name="name"></label>
<label>Message <input name="message"></label><button type="submit">Sign</button></form></body></html>""")

    def do_POST(self):
        form = {k: v[-1] for k, v in \
parse_qs(self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()).items()}
        if self.path == "/sign" and form.get("name") and form.get("message"):
            conn = sqlite3.connect(DB)
            conn.execute("INSERT INTO entries (name, message) VALUES (?, ?)", (form["name"], form["message"]))
            conn.commit()
            conn.close()
        self.page(303, "", "/")


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
''',
    "fixtures/guestbook.sql": (
        "CREATE TABLE entries (id INTEGER PRIMARY KEY, name TEXT NOT NULL, message TEXT NOT NULL);\n"
        "INSERT INTO entries VALUES (1, 'Ada', 'Lovely site');\n"
        "INSERT INTO entries VALUES (2, 'Linus', 'Works for me');\n"
    ),
    "tasks.jsonl": "".join(json.dumps(task) + "\n" for task in [
        {"id": "sign", "difficulty": "easy", "oracle": "oracle/sign.json",
         "instruction": "Sign the guestbook as Grace with the message: Hello from the agent.",
         "params": {"checks": [{"sql": "SELECT COUNT(*) FROM entries "
                                       "WHERE name = 'Grace' AND message = 'Hello from the agent.'",
                                "expect": [[1]]}],
                    "guards": [{"sql": "SELECT COUNT(*) FROM entries WHERE id <= 2", "expect": [[2]]}]}},
        {"id": "count-entries", "difficulty": "easy", "oracle": "oracle/count-entries.json",
         "instruction": "How many entries does the guestbook have? Answer with a number.",
         "params": {"answer": {"expect": "2", "type": "number"}}},
    ]),
    "oracle/sign.json": '{"actions": [{"tool": "browser", "action": "type", "field": "name", "text": "Grace"}, '
                        '{"tool": "browser", "action": "type", "field": "message", "text": "Hello from the agent."}, '
                        '{"tool": "browser", "action": "click", "text": "Sign"}]}\n',
    "oracle/count-entries.json": '{"actions": [{"tool": "browser", "action": "read"}, '
                                 '{"tool": "answer", "text": "2"}]}\n',
}


def _default_name(folder: Path) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", folder.resolve().name.lower()).strip("-") or "env"
    return f"local/{slug}"


def init_environment(folder: str | Path, *, kind: str = "repo", name: str | None = None) -> list[Path]:
    """Write a working environment into ``folder`` (which must be new or empty)."""
    root = Path(folder)
    if kind not in KINDS:
        raise UserError(f"`{kind}` is not a kind envkit can scaffold yet", f"use --kind {' | '.join(KINDS)}")
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise UserError(f"`{folder}` already exists and is not empty; nothing was written",
                        "choose a new folder, or empty this one first")
    name = name or _default_name(root)
    parts = name.split("/")
    if len(parts) != 2 or not all(NAME_RE.match(p) for p in parts) or len(parts[0]) < 2:
        raise UserError(f"`{name}` is not an environment name",
                        "use namespace/name in lowercase, e.g. --name myteam/bugfix")
    written = []
    if kind == "api":
        files = {"envkit.toml": _API_SPEC.format(name=name), **_API_FILES}
    elif kind == "website":
        files = {"envkit.toml": _WEB_SPEC.format(name=name), **_WEB_FILES}
    else:
        files = {"envkit.toml": _SPEC.format(name=name), **_FILES}
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if rel.endswith(".sh"):
            path.chmod(0o755)
        written.append(path)
    return written
