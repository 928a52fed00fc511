"""Images of a container environment: one per task, built by the engine from the task's own
``environment/Dockerfile`` (the Harbor task layout).

This is a *declared non-reproducible* build: a Dockerfile can run anything (package installs,
downloads, timestamps), so the same folder need not give the same image twice. What envkit
does instead of guaranteeing it:

* records every task's image ID in ``envkit.lock`` (``reproducible: false``, ``task_images``);
* reports the environment as "not reproducible" (``envkit validate``, the registry);
* checks a rebuild against the recorded IDs only when asked (``envkit build --check-recorded``).

``FROM`` lines naming an image that cannot be pulled are rewritten through ``[image]
base_map`` (``envkit import harbor --base-map FROM=LOCAL``) before the build; the task's
Dockerfile on disk is left as written. Images are built with the classic builder through
the docker SDK, so the engine's layer cache makes an unchanged rebuild cheap.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import docker.errors

from envkit.bundle import make_bundle
from envkit.engine import connect
from envkit.errors import BuildError, UserError
from envkit.images import LAYOUT_VERSION, LOCK_FILE, BuildResult, read_lock, write_lock_file
from envkit.spec import LoadedEnvironment, Task
from envkit.version import __version__

__all__ = ["build_container_env", "build_container_images", "image_set_digest", "map_from_lines", "recorded_mismatches",
           "task_image_tag"]

_FROM = re.compile(r"^(\s*FROM\s+(?:--platform=\S+\s+)?)(\S+)(.*)$", re.IGNORECASE)


def task_image_tag(env: LoadedEnvironment, task: Task) -> str:
    return f"envkit-env/{env.spec.environment.name}:{env.spec.environment.version}-{task.id}"


def map_from_lines(dockerfile: str, base_map: dict[str, str]) -> tuple[str, list[str]]:
    """Rewrite ``FROM`` images through ``base_map``; returns the text and the images named."""
    named: list[str] = []
    out = []
    for line in dockerfile.splitlines(keepends=True):
        m = _FROM.match(line.rstrip("\n"))
        if m:
            image = m.group(2)
            named.append(image)
            if image in base_map:
                line = f"{m.group(1)}{base_map[image]}{m.group(3)}\n"
        out.append(line)
    return "".join(out), named


def image_set_digest(task_images: dict[str, str]) -> str:
    """One ID for the environment's images (what a trajectory records as its image)."""
    return "sha256:" + hashlib.sha256(json.dumps(task_images, sort_keys=True).encode()).hexdigest()


def _build_one(client: Any, env: LoadedEnvironment, task: Task) -> str:
    c = task.container
    assert c is not None
    base_map = env.spec.image.base_map
    if c.image is not None:
        name = base_map.get(c.image, c.image)
        try:
            return str(client.images.get(name).id)
        except docker.errors.ImageNotFound:
            raise UserError(f"task {task.id}: the image {name} is not in the local Docker engine "
                            "(images cannot be pulled here)",
                            f"build it, or map it to a local image: --base-map {c.image}=LOCAL") from None
    context = env.root / c.path / "environment"
    text, named = map_from_lines((context / "Dockerfile").read_text(encoding="utf-8"), base_map)
    for image in named:
        mapped = base_map.get(image, image)
        if mapped.lower() == "scratch" or any(mapped == stage for stage in _stage_names(text)):
            continue
        try:
            client.images.get(mapped)
        except docker.errors.ImageNotFound:
            raise UserError(f"task {task.id}: its Dockerfile starts FROM {image}, which is not in the local Docker "
                            "engine (images cannot be pulled here)",
                            f"map it to a local image: `envkit import harbor … --base-map {image}=LOCAL` or add it to "
                            "[image] base_map in envkit.toml, e.g. envkit/base") from None
    with tempfile.NamedTemporaryFile("w", suffix=".Dockerfile", delete=False) as f:
        f.write(text)
        dockerfile = f.name
    labels = {"org.envkit.env": env.ref, "org.envkit.task": task.id, "org.envkit.reproducible": "false"}
    try:
        image, _logs = client.images.build(path=str(context), dockerfile=dockerfile, tag=task_image_tag(env, task),
                                           rm=True, forcerm=True, pull=False, labels=labels,
                                           timeout=int(c.build_timeout_s) + 30)
    except docker.errors.BuildError as e:
        tail = "".join(str(x.get("stream", x.get("error", ""))) for x in list(e.build_log)[-15:])
        raise BuildError(f"task {task.id}: docker build of {c.path}/environment failed: {e.msg}\n"
                         f"{tail[-2000:]}") from None
    except docker.errors.APIError as e:
        raise BuildError(f"task {task.id}: the Docker engine refused the build: {e.explanation or e}") from None
    finally:
        Path(dockerfile).unlink(missing_ok=True)
    return str(image.id)


def _stage_names(dockerfile: str) -> set[str]:
    return {m.group(1).lower() for m in re.finditer(r"^\s*FROM\s+\S+\s+AS\s+(\S+)", dockerfile,
                                                    re.IGNORECASE | re.MULTILINE)}


def build_container_images(env: LoadedEnvironment, *, client: Any | None = None) -> dict[str, str]:
    """Build (or find in the engine's cache) every task's image: ``{task: image ID}``."""
    client = client or connect()
    return {task.id: _build_one(client, env, task) for task in env.tasks}


def recorded_mismatches(recorded: dict[str, str], built: dict[str, str]) -> list[str]:
    """Tasks whose rebuilt image differs from the lock's (or that the lock lacks)."""
    return sorted(t for t in set(recorded) | set(built) if recorded.get(t) != built.get(t))


def build_container_env(env: LoadedEnvironment, *, client: Any | None = None, write_lock: bool = True,
                        check_recorded: bool = False) -> BuildResult:
    """Bundle a container environment, build every task's image from its Dockerfile and record
    their IDs in ``envkit.lock``; ``check_recorded`` fails when a rebuilt image differs from
    the lock's (the lock is then left as it was)."""
    t0 = time.perf_counter()
    bundle = make_bundle(env)
    lock_path = env.root / LOCK_FILE
    old = read_lock(env) or {}
    task_images = build_container_images(env, client=client)
    if check_recorded:
        recorded = old.get("task_images")
        if not isinstance(recorded, dict):
            raise UserError(f"{lock_path} records no task images to check against",
                            "run `envkit build` once to record them")
        differ = recorded_mismatches(recorded, task_images)
        if differ:
            raise UserError(
                f"the rebuilt images differ from the recorded ones for {len(differ)} task(s): "
                + ", ".join(f"{t} (recorded {str(recorded.get(t, '-'))[:19]}, built {task_images.get(t, '-')[:19]})"
                            for t in differ),
                "this environment's images are built from Dockerfiles and are not reproducible; the lock was left as "
                "it was. Run `envkit build` without --check-recorded to record the new images")
    image_id = image_set_digest(task_images)
    if write_lock:
        lock = {
            "lock_version": 1, "env": env.ref, "bundle_digest": bundle.digest, "bundle_size": bundle.size,
            "base_image": "dockerfile", "image_id": image_id, "reproducible": False, "task_images": task_images,
            "layout_version": LAYOUT_VERSION, "envkit_version": __version__,
        }
        write_lock_file(lock_path, lock)
    cached = old.get("image_id") == image_id
    return BuildResult(
        env=env.ref, bundle_digest=bundle.digest, bundle_size=bundle.size, base_image="dockerfile", image_id=image_id,
        tag=f"envkit-env/{env.spec.environment.name}:{env.spec.environment.version}-<task>", cached=cached,
        seconds=round(time.perf_counter() - t0, 3), lock_file=str(lock_path) if write_lock else None,
        reproducible=False, task_images=task_images,
    )
