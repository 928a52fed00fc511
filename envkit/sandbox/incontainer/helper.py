"""envkit in-sandbox helper (runs inside the container with the base image's python3).

    helper.py reset SEED    as the agent user: kill the agent's processes, wipe the
                            writable places, restore the seeded state, print JSON
                            {"state_hash", "commit"}
    helper.py hash          print {"state_hash", "commit"} for the workspace as it is
    helper.py killall       kill every process of the calling user
    helper.py write PATH MODE   write stdin to PATH (atomically) with MODE (octal)
    helper.py service-reset SEED   as the service user: restore the database from its fixture,
                            start the service if it is not running, wait for its health check,
                            print {"state_hash"} (or {"error", "log_tail"} and exit 3)
    helper.py service-hash  the service state's hash as it is now
    helper.py http METHOD PATH  a request to the service (JSON body on stdin), printed as JSON
    helper.py relay         pipe stdin/stdout to the service's TCP port (the host's port forward)
"""

import hashlib
import json
import os
import shutil
import signal
import socket
import stat
import sys
import time

# sqlite3, subprocess and threading are imported where they are used: every millisecond of
# start-up is paid on each reset (http.client is avoided altogether: its import costs ~25 ms).

WORKSPACE = "/workspace"
SEED_REPO = "/seed/repo"
SCRATCH = ("/tmp", "/home/agent")
GIT_ENV = {
    "GIT_AUTHOR_NAME": "envkit", "GIT_AUTHOR_EMAIL": "seed@envkit.invalid",
    "GIT_COMMITTER_NAME": "envkit", "GIT_COMMITTER_EMAIL": "seed@envkit.invalid",
    "GIT_AUTHOR_DATE": "1970-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "1970-01-01T00:00:00Z",
    "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent",
}


def killall():
    try:
        os.kill(-1, signal.SIGKILL)  # every process of this user but ourselves
    except ProcessLookupError:
        pass


def wipe(path):
    if not os.path.isdir(path):
        return
    # The agent may have left folders it cannot enter (chmod 000): open them up first.
    for dirpath, dirnames, _ in os.walk(path):
        for d in dirnames:
            p = os.path.join(dirpath, d)
            if not os.path.islink(p):
                try:
                    os.chmod(p, 0o700)
                except OSError:
                    pass
    for name in os.listdir(path):
        p = os.path.join(path, name)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            try:
                os.unlink(p)
            except OSError:
                pass


def git(*args):
    import subprocess

    env = dict(os.environ, **GIT_ENV)
    return subprocess.run(["git", *args], cwd=WORKSPACE, env=env, check=True,
                          capture_output=True, text=True).stdout.strip()


def state():
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(WORKSPACE):
        dirnames[:] = sorted(d for d in dirnames if not (dirpath == WORKSPACE and d == ".git"))
        rel_dir = os.path.relpath(dirpath, WORKSPACE)
        h.update(f"D {rel_dir}\n".encode())
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if stat.S_ISLNK(st.st_mode):
                h.update(f"L {rel} {os.readlink(p)}\n".encode())
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                h.update(f"F {rel} {st.st_mode & 0o777:o} {digest}\n".encode())
    commit = ""
    if os.path.isdir(os.path.join(WORKSPACE, ".git")):
        try:
            commit = git("rev-parse", "HEAD")
        except Exception:  # noqa: BLE001 - a broken repository hashes as having no commit
            commit = ""
    h.update(f"C {commit}\n".encode())
    return {"state_hash": "sha256:" + h.hexdigest(), "commit": commit}


def reset(seed):
    killall()
    for p in (WORKSPACE, *SCRATCH):
        wipe(p)
    if os.path.isdir(SEED_REPO):
        for name in os.listdir(SEED_REPO):
            src, dst = os.path.join(SEED_REPO, name), os.path.join(WORKSPACE, name)
            if os.path.isdir(src) and not os.path.islink(src):
                shutil.copytree(src, dst, symlinks=True)
            else:
                shutil.copy2(src, dst, follow_symlinks=False)
        git("init", "-q", "-b", "main")
        git("add", "-A")
        git("commit", "-q", "--no-gpg-sign", "-m", "envkit seed")
    out = state()
    out["seed"] = seed
    return out


def write(path, mode):
    data = sys.stdin.buffer.read()
    tmp = f"{path}.envkit-tmp"
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(tmp, "wb") as f:
        f.write(data)
    os.chmod(tmp, int(mode, 8))
    os.replace(tmp, path)
    return {"written": len(data)}


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


def serve():
    """Answer JSON-line requests on stdin, one JSON line each on stdout: one long-lived exec
    per sandbox instead of one exec (~55 ms) per reset."""
    commands = {"service-reset": lambda args: service_reset(int(args[0])), "service-hash": lambda args: {"state_hash": db_hash()}}
    for line in sys.stdin:
        try:
            req = json.loads(line)
            out = commands[req["cmd"]](req.get("args", []))
        except Exception as e:  # noqa: BLE001 - reported to the host, which raises it as an infra failure
            out = {"error": "helper_failed", "message": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
        sys.stdout.flush()
    return 0


def main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "reset":
        out = reset(int(argv[2]))
    elif cmd == "hash":
        out = state()
    elif cmd == "killall":
        killall()
        out = {}
    elif cmd == "write":
        out = write(argv[2], argv[3])
    elif cmd == "service-reset":
        out = service_reset(int(argv[2]))
    elif cmd == "serve":
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
