"""Service environments: the service's database restored from its fixture, its start and
health check, requests to it and the relay of the host's port forward."""

import hashlib
import json
import os
import shutil
import signal
import socket
import sys
import time

SERVICE_CONF = "/seed/service.json"
STATE_DIR = "/var/lib/envkit"
DB = os.path.join(STATE_DIR, "db.sqlite")
FIXTURE_SQL = "/seed/db/fixture.sql"
FIXTURE_DB = os.path.join(STATE_DIR, "fixture.sqlite")
PIDFILE = os.path.join(STATE_DIR, "service.pid")
LOG = os.path.join(STATE_DIR, "service.log")
HTTP_BODY_CAP = 64 * 1024


def service_conf():
    with open(SERVICE_CONF) as f:
        return json.load(f)


def _service_running():
    try:
        with open(PIDFILE) as f:
            pid = int(f.read().strip())
        os.kill(pid, 0)
        return True
    except (OSError, ValueError):
        return False


def _request(port, method, path, body=b"", timeout=30.0):
    """A minimal HTTP/1.0 client: (status, content type, body bytes up to the cap)."""
    if not path.startswith("/") or any(c.isspace() for c in path):
        raise ValueError(f"the path must start with / and contain no spaces: {path!r}")
    head = f"{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
    if body:
        head += "Content-Type: application/json\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head.encode() + b"\r\n" + body)
        chunks, size = [], 0
        while size <= HTTP_BODY_CAP + 65536:
            data = sock.recv(65536)
            if not data:
                break
            chunks.append(data)
            size += len(data)
    raw = b"".join(chunks)
    header, _, payload = raw.partition(b"\r\n\r\n")
    lines = header.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise ValueError("the service's answer is not HTTP")
    ctype = next((ln.split(":", 1)[1].strip() for ln in lines[1:] if ln.lower().startswith("content-type:")), "")
    return int(parts[1]), ctype, payload


def _healthy(conf, timeout=1.0):
    try:
        return _request(conf["port"], "GET", conf["health"], timeout=timeout)[0] == 200
    except (OSError, ValueError):
        return False


def _restore_db():
    import sqlite3

    if not os.path.exists(FIXTURE_DB):
        tmp = FIXTURE_DB + ".tmp"
        if os.path.exists(tmp):
            os.unlink(tmp)
        with open(FIXTURE_SQL) as f:
            script = f.read()
        conn = sqlite3.connect(tmp)
        conn.executescript(script)
        conn.commit()
        conn.close()
        os.replace(tmp, FIXTURE_DB)
    for suffix in ("-journal", "-wal", "-shm"):
        try:
            os.unlink(DB + suffix)
        except FileNotFoundError:
            pass
    tmp = DB + ".restore"
    shutil.copyfile(FIXTURE_DB, tmp)
    os.chmod(tmp, 0o640)
    os.replace(tmp, DB)


def db_hash():
    """sha256 over every table's rows, in a canonical order (independent of page layout)."""
    import sqlite3

    h = hashlib.sha256()
    if not os.path.exists(DB):
        return "sha256:" + h.hexdigest()
    conn = sqlite3.connect(f"file:{DB}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        for table in tables:
            h.update(f"T {table}\n".encode())
            rows = [json.dumps(list(r), default=repr) for r in conn.execute(f'SELECT * FROM "{table}"')]
            for row in sorted(rows):
                h.update(row.encode() + b"\n")
    finally:
        conn.close()
    return "sha256:" + h.hexdigest()


def service_reset(seed):
    conf = service_conf()
    if conf.get("database"):
        _restore_db()
    if conf.get("restart_on_reset") and _service_running():
        with open(PIDFILE) as f:
            os.killpg(int(f.read().strip()), signal.SIGKILL)
    if not _service_running() or not _healthy(conf):
        import subprocess

        env = dict(os.environ, ENVKIT_DB=DB, ENVKIT_PORT=str(conf["port"]), ENVKIT_SEED=str(seed), HOME=STATE_DIR)
        with open(LOG, "ab") as log:
            proc = subprocess.Popen(["/bin/sh", "-c", "exec " + conf["command"]], cwd="/seed/app", env=env,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        with open(PIDFILE, "w") as f:
            f.write(str(proc.pid))
        deadline = time.monotonic() + conf["startup_timeout_s"]
        while not _healthy(conf, timeout=0.5):
            if proc.poll() is not None or time.monotonic() > deadline:
                try:
                    with open(LOG, "rb") as f:
                        tail = f.read()[-3000:].decode(errors="replace")
                except OSError:
                    tail = ""
                why = f"exited with {proc.returncode}" if proc.poll() is not None else "never answered its health check"
                return {"error": "service_unhealthy", "message": f"the service {why}", "log_tail": tail}
            time.sleep(0.02)
    return {"state_hash": db_hash(), "seed": seed}


def http_request(method, path):
    conf = service_conf()
    body = sys.stdin.buffer.read()
    try:
        status, ctype, data = _request(conf["port"], method, path, body)
        out = {"status": status, "content_type": ctype, "body": data[:HTTP_BODY_CAP].decode(errors="replace"),
               "truncated": len(data) > HTTP_BODY_CAP}
    except (OSError, ValueError) as e:
        # e.g. a path with spaces (the agent's mistake): an observation, not a crash
        out = {"status": 0, "error": f"{type(e).__name__}: {e}"}
    print(json.dumps(out))
    return 0


def relay():
    import threading

    conf = service_conf()
    sock = socket.create_connection(("127.0.0.1", conf["port"]), timeout=30)
    sock.settimeout(None)

    def upstream():
        try:
            while True:
                data = os.read(0, 65536)
                if not data:
                    break
                sock.sendall(data)
        except OSError:
            pass
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    threading.Thread(target=upstream, daemon=True).start()
    out = sys.stdout.buffer
    while True:
        data = sock.recv(65536)
        if not data:
            break
        out.write(data)
        out.flush()
    return 0

