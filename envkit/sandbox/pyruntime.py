"""The command channel's Python, for sandbox images that have none (container environments).

A container environment's tasks run in their own images (any Dockerfile: no Python is
promised), so their sandboxes' command channel (``helper.py serve``, the same program as in
envkit images) runs on a Python carried in from the envkit base image: its interpreter,
standard library, dynamic loader and the C libraries they link, copied once per engine into a
Docker volume (``envkit-pyruntime-<digest>``, made from the base image by one short-lived
container) and mounted read-only at :data:`MOUNT` in each sandbox. The channel is started
through that copy's own loader (``ld.so --library-path``), so none of the task image's
libraries is used, and nothing leaks into the commands it starts: no ``LD_LIBRARY_PATH`` and no
``PYTHONHOME`` (the interpreter finds its library beside itself).

The digest covers the base image, the channel's files (helper.py and its modules) and the copy
script, so a new helper gets a new volume; old ones stay until removed
(``docker volume ls -f label=org.envkit.pyruntime``).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import tarfile
import threading
from importlib import resources
from typing import Any

import docker.errors

from envkit.base_image import find_base
from envkit.engine import TRANSPORT_ERRORS
from envkit.errors import EnvkitError
from envkit.images import CHANNEL_FILES

__all__ = ["MOUNT", "channel_command", "ensure_volume"]

MOUNT = "/opt/envkit/rt"
_LABEL = "org.envkit.pyruntime"
# Copies the interpreter, its library (with the compiled caches Debian made at install), every
# shared library it and its extension modules link, and the loader, into /rt/v: first into a
# temporary folder, then renamed, so a sandbox never sees a half-made copy (two engines' users
# making it at once: one rename wins, the other copy is removed).
_COPY = r"""
set -eu
[ -d /rt/v ] && exit 0
t=/rt/.tmp-$(cat /proc/sys/kernel/random/uuid)
py=$(readlink -f /usr/bin/python3)
ver=$(basename "$py")
mkdir -p "$t/lib" "$t/usr/bin" "$t/usr/lib"
cp -a "$py" "$t/usr/bin/python3"
cp -a "/usr/lib/$ver" "$t/usr/lib/$ver"
rm -rf "$t/usr/lib/$ver/test" "$t/usr/lib/$ver/idlelib" "$t/usr/lib/$ver/tkinter" "$t/usr/lib/$ver/ensurepip"
for f in "$py" "/usr/lib/$ver"/lib-dynload/*.so; do ldd "$f"; done | \
  awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u | \
  while read -r lib; do cp -L "$lib" "$t/lib/"; done
cp -L "$(ldd "$py" | awk '$1 ~ /ld-linux/ {print $1}')" "$t/lib/ld.so"
for f in /src/*.py; do
  cp "$f" "$t/"
  "$py" -I -c "import py_compile, sys; py_compile.compile(sys.argv[1], doraise=True)" "$t/${f##*/}" >/dev/null
done
mv -T "$t" /rt/v 2>/dev/null || rm -rf "$t"
[ -x /rt/v/lib/ld.so ]
"""
_ready: set[tuple[str, str]] = set()
_lock = threading.Lock()


def channel_command() -> list[str]:
    """The sandbox's main process: helper.py's channel on the carried Python."""
    v = f"{MOUNT}/v"
    return [f"{v}/lib/ld.so", "--library-path", f"{v}/lib", f"{v}/usr/bin/python3", "-I", f"{v}/helper.py", "serve"]


def _helper() -> dict[str, bytes]:
    pkg = resources.files("envkit.sandbox") / "incontainer"
    return {name: (pkg / name).read_bytes() for name in CHANNEL_FILES}


def ensure_volume(client: Any) -> str:
    """The volume's name, made (once per engine and process) if missing. Raises
    :class:`envkit.errors.EnvkitError` when it cannot be made (no base image, a failed copy)."""
    base = find_base(client)
    helper = _helper()
    files = [part for name in sorted(helper) for part in (name.encode(), helper[name])]
    digest = hashlib.sha256(b"\0".join([base.id.encode(), *files, _COPY.encode()])).hexdigest()[:16]
    name = f"envkit-pyruntime-{digest}"
    key = (str(client.api.base_url), name)
    with _lock:
        if key in _ready:
            return name
        _populate(client, base.tag, name, helper)
        _ready.add(key)
    return name


def _populate(client: Any, image: str, name: str, helper: dict[str, bytes]) -> None:
    """Run the copy in a short-lived container of the base image (a no-op when done before)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for file, data in sorted(helper.items()):
            info = tarfile.TarInfo(f"src/{file}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    made = None
    try:
        client.volumes.create(name, labels={_LABEL: "1"})
        made = client.containers.create(image, ["/bin/sh", "-c", _COPY], user="0:0", network_disabled=True,
                                        network_mode="none", volumes={name: {"bind": "/rt", "mode": "rw"}},
                                        labels={_LABEL: "1"})
        made.put_archive("/", buf.getvalue())
        made.start()
        status = made.wait(timeout=300)
        if status.get("StatusCode") != 0:
            tail = made.logs(tail=20).decode(errors="replace")
            raise EnvkitError(f"copying the channel's Python into the volume {name} failed: {tail}")
    except (docker.errors.DockerException, *TRANSPORT_ERRORS) as e:
        raise EnvkitError(f"could not make the channel's Python volume {name}: "
                          f"{type(e).__name__}: {str(e)[:300]}") from None
    finally:
        if made is not None:
            with contextlib.suppress(docker.errors.DockerException, *TRANSPORT_ERRORS):
                made.remove(force=True)
