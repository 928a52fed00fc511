"""envkit in-sandbox helper (runs inside the container with the base image's python3).

    helper.py reset SEED    as the agent user: kill the agent's processes, wipe the
                            writable places, restore the seeded state, print JSON
                            {"state_hash", "commit"}
    helper.py hash          print {"state_hash", "commit"} for the workspace as it is
    helper.py killall       kill every process of the calling user
    helper.py write PATH MODE   write stdin to PATH (atomically) with MODE (octal)
"""

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys

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
        except subprocess.CalledProcessError:
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
    else:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
