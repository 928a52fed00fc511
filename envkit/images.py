"""Environment images: one layer assembled from the source bundle on the pinned base.

The image is a pure function of (bundle, base image, envkit's layout version): envkit
writes the layer tar and the image config itself, with every varying field pinned, and
loads them through the docker SDK. The same bundle therefore always gives the same image
ID (the sha256 of the config), and one changed byte in one file changes it.

Layout inside the image::

    /env/        the whole bundle, owned by the verifier user (uid 1001), mode 0700:
                 tasks, oracles and hidden tests are invisible to the agent (uid 1000)
    /seed/repo/  the repository's files (world-readable): reset copies them to /workspace;
                 root's only (0700) when tasks carry patches: then it is the pristine project
    /seed/patches/<task>.diff  each task's patch, applied by the reset (root's only)
    /seed/repo.json  {"seed_file": PATH} when each reset writes the seed into the workspace
    /usr/local/lib/python3.11/dist-packages/envkit-workspace.pth  with [state] repo.python_path:
                 the workspace's import folder on the path of the agent user's Python processes
    /seed/app/   the service's files; /seed/service.json how to run it; /seed/db/fixture.sql
    /opt/envkit/ the in-sandbox helpers (exec wrapper, reset/state-hash helper)
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import docker.errors

from envkit.base_image import (
    AGENT_UID,
    VERIFIER_UID,
    BaseImage,
    docker_archive,
    find_base,
    image_config_bytes,
    load_archive,
)
from envkit.bundle import Bundle, BundleEntry, make_bundle, tar_info
from envkit.engine import connect
from envkit.errors import BuildError
from envkit.pylock import IMAGE_SITE
from envkit.spec import EnvSpec, LoadedEnvironment
from envkit.version import __version__

__all__ = ["LAYOUT_VERSION", "LOCK_FILE", "BuildResult", "build_from_bundle", "build_image", "image_tag", "read_lock",
           "write_lock_file"]

LAYOUT_VERSION = 1
LOCK_FILE = "envkit.lock"
# The sandbox's command channel: helper.py and the modules it loads from beside itself
CHANNEL_FILES = ("helper.py", "helper_users.py", "helper_repo.py", "helper_service.py", "helper_channel.py")
HELPERS = ("exec.sh", *CHANNEL_FILES, "pytest_verifier.py", "state_verifier.py", "envkit_check.py", "callserver.py",
           "calltrace.py", "suite_runner.py", "suite_verifier.py")


@dataclass(frozen=True)
class BuildResult:
    env: str
    bundle_digest: str
    bundle_size: int
    base_image: str
    image_id: str
    tag: str
    cached: bool
    seconds: float
    lock_file: str | None
    reproducible: bool = True
    task_images: dict[str, str] = field(default_factory=dict)  # container environments: task -> image ID

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def image_tag(spec: EnvSpec) -> str:
    return f"envkit-env/{spec.environment.name}:{spec.environment.version}"


def _helper_files() -> list[tuple[str, bytes, int]]:
    pkg = resources.files("envkit.sandbox") / "incontainer"
    out = []
    for name in HELPERS:
        data = (pkg / name).read_bytes()
        out.append((f"opt/envkit/{name}", data, 0o755 if name.endswith(".sh") else 0o644))
    return out


def _layer(bundle: Bundle, spec: EnvSpec) -> bytes:
    items: dict[str, tuple[BundleEntry, int]] = {}

    def put(entry: BundleEntry, uid: int) -> None:
        items[entry.path] = (entry, uid)

    put(BundleEntry("env", "dir", 0o700), VERIFIER_UID)
    for e in bundle.entries:
        put(BundleEntry(f"env/{e.path}", e.kind, e.mode, e.data, e.target), VERIFIER_UID)
    for d in ("opt", "opt/envkit", "seed", "seed/repo"):
        put(BundleEntry(d, "dir", 0o755), 0)
    for path, data, mode in _helper_files():
        put(BundleEntry(path, "file", mode, data), 0)
    def publish_folder(src: str, dest: str) -> None:
        prefix = src.rstrip("/") + "/"
        put(BundleEntry(dest, "dir", 0o755), 0)
        for e in bundle.entries:
            if e.path.startswith(prefix):
                put(BundleEntry(f"{dest}/{e.path[len(prefix):]}", e.kind, e.mode, e.data, e.target), 0)

    state = spec.state
    patches = _task_patches(bundle, spec)
    if state.repo is not None:
        publish_folder(state.repo.path, "seed/repo")
        if patches:  # the pristine project is the fix of every task: root's only
            put(BundleEntry("seed/repo", "dir", 0o700), 0)
            put(BundleEntry("seed/patches", "dir", 0o700), 0)
            for task_id, data in patches.items():
                put(BundleEntry(f"seed/patches/{task_id}.diff", "file", 0o600, data), 0)
        if state.repo.python_path is not None:
            put(BundleEntry(WORKSPACE_PTH, "file", 0o644, _workspace_pth(state.repo.python_path)), 0)
        if state.repo.seed_file is not None:
            seeded = json.dumps({"seed_file": state.repo.seed_file}, sort_keys=True).encode()
            put(BundleEntry("seed/repo.json", "file", 0o644, seeded), 0)
    if state.service is not None:
        publish_folder(state.service.path, "seed/app")
        conf = {"command": state.service.command, "port": state.service.port, "health": state.service.health,
                "startup_timeout_s": state.service.startup_timeout_s, "database": state.database is not None,
                "restart_on_reset": False}
        put(BundleEntry("seed/service.json", "file", 0o644, json.dumps(conf, sort_keys=True).encode()), 0)
    if state.database is not None:
        put(BundleEntry("seed/db", "dir", 0o755), 0)
        put(BundleEntry("seed/db/fixture.sql", "file", 0o644, bundle.file(state.database.fixture)), 0)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(items):
            e, uid = items[path]
            ti = tar_info(path, e.kind, e.mode, len(e.data), e.target, uid=uid, gid=uid)
            tar.addfile(ti, io.BytesIO(e.data) if e.kind == "file" else None)
    return buf.getvalue()


WORKSPACE_PTH = f"{IMAGE_SITE}/envkit-workspace.pth"


def _workspace_pth(python_path: str) -> bytes:
    """A .pth line that puts the workspace's import folder on sys.path for the agent user's
    processes only: the verifier's and root's Python must never import from a folder the
    agent writes (a module named like one they import would run as them)."""
    folder = "/workspace" if python_path == "." else f"/workspace/{python_path}"
    return f"import os, sys; os.getuid() == {AGENT_UID} and sys.path.append({folder!r})\n".encode()


def _task_patches(bundle: Bundle, spec: EnvSpec) -> dict[str, bytes]:
    """Each task's patch (tasks that have one), read from the bundle's task file."""
    out: dict[str, bytes] = {}
    try:
        lines = bundle.file(spec.tasks.file).decode().splitlines()
    except KeyError:
        return out
    for line in lines:
        if line.strip():
            task = json.loads(line)
            if task.get("patch"):
                out[str(task["id"])] = bundle.file(str(task["patch"]))
    return out


def _python_layer(bundle: Bundle, spec: EnvSpec) -> bytes | None:
    """The layer of locked wheels ([image] python_lock), or None."""
    if spec.image.python_lock is None:
        return None
    from envkit.pylock import cached_layer

    return cached_layer(bundle.file(spec.image.python_lock).decode(), spec.image.python_lock)


def _config(bundle: Bundle, spec: EnvSpec, base: BaseImage, layer_diff_id: str,
            extra: tuple[str, ...] = ()) -> bytes:
    ref = f"{spec.environment.name}@{spec.environment.version}"
    labels = {
        "org.envkit.env": ref,
        "org.envkit.kind": spec.environment.kind,
        "org.envkit.bundle": bundle.digest,
        "org.envkit.base": base.id,
        "org.envkit.layout": str(LAYOUT_VERSION),
    }
    return image_config_bytes(
        diff_ids=[*base.diff_ids, *extra, layer_diff_id],
        env=[*base.env, f"ENVKIT_ENV={ref}"],
        cmd=["sleep", "infinity"],
        labels=labels,
        history=[*(f"base layer {i}" for i in range(len(base.diff_ids))), *(f"python wheels {d}" for d in extra),
                 f"envkit bundle {bundle.digest}"],
        working_dir="/workspace",
    )


def build_from_bundle(bundle: Bundle, spec: EnvSpec, *, client: Any | None = None) -> tuple[str, str, bool]:
    """Assemble (or find) the image for ``bundle``. Returns ``(image_id, base_ref, cached)``."""
    client = client or connect()
    base = find_base(client, spec.image.pinned_digest)
    layer = _layer(bundle, spec)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    wheels = _python_layer(bundle, spec)
    wheels_id: tuple[str, ...] = ("sha256:" + hashlib.sha256(wheels).hexdigest(),) if wheels is not None else ()
    config = _config(bundle, spec, base, diff_id, wheels_id)
    expected = "sha256:" + hashlib.sha256(config).hexdigest()
    tag = image_tag(spec)
    repo, _, version = tag.rpartition(":")
    try:
        image = client.images.get(expected)
        if tag not in image.tags:
            image.tag(repo, version)
        return expected, base.ref, True
    except docker.errors.ImageNotFound:
        pass
    with tempfile.TemporaryDirectory(prefix="envkit-image-") as tmp:
        archive = Path(tmp) / "image.tar"
        layers: list[tuple[str, Path | bytes | None]] = [(d, None) for d in base.diff_ids]
        if wheels is not None:
            layers.append((wheels_id[0], wheels))
        layers.append((diff_id, layer))
        docker_archive(archive, config=config, layers=layers, tags=[tag])
        try:
            image_id = load_archive(client, archive)
        except docker.errors.APIError as e:
            raise BuildError(f"the Docker engine refused the image: {e.explanation or e}") from None
    if image_id != expected:
        raise BuildError(f"the engine gave image ID {image_id}, expected {expected} "
                         "(is it using the containerd image store?)")
    return image_id, base.ref, False


def build_image(env: LoadedEnvironment, *, client: Any | None = None, write_lock: bool = True) -> BuildResult:
    """Bundle a repo, api or website environment, assemble its image and write ``envkit.lock``
    (:func:`envkit.kinds.build` builds any kind)."""
    t0 = time.perf_counter()
    bundle = make_bundle(env)
    image_id, base_ref, cached = build_from_bundle(bundle, env.spec, client=client)
    lock_path = env.root / LOCK_FILE
    if write_lock:
        lock = {
            "lock_version": 1,
            "env": env.ref,
            "bundle_digest": bundle.digest,
            "bundle_size": bundle.size,
            "base_image": base_ref,
            "image_id": image_id,
            "layout_version": LAYOUT_VERSION,
            "envkit_version": __version__,
        }
        write_lock_file(lock_path, lock)
    return BuildResult(
        env=env.ref, bundle_digest=bundle.digest, bundle_size=bundle.size, base_image=base_ref,
        image_id=image_id, tag=image_tag(env.spec), cached=cached, seconds=round(time.perf_counter() - t0, 3),
        lock_file=str(lock_path) if write_lock else None,
    )


def write_lock_file(path: Path, lock: dict[str, Any]) -> None:
    """Write ``envkit.lock`` unless it already says exactly this (its mtime stays put)."""
    text = json.dumps(lock, indent=2, sort_keys=True) + "\n"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def read_lock(env: LoadedEnvironment) -> dict[str, Any] | None:
    path = env.root / LOCK_FILE
    if not path.is_file():
        return None
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except json.JSONDecodeError:
        return None
