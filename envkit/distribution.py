"""Publishing to and pulling from the registry (and, optionally, an OCI registry).

``publish``: build locally (bundle + image), upload the bundle with the image ID; with
``oci``, push the image by digest to a distribution registry and record the reference.

``pull``: fetch the version's metadata and bundle, verify the bundle digest, unpack it into
the cache, and produce the image locally, either by rebuilding it from the bundle or, when
the version has an OCI reference, by pulling that digest. Either way the local image ID must
equal the published one; a mismatch is an error naming both.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import docker.errors

from envkit.base_image import find_base
from envkit.bundle import make_bundle, read_bundle
from envkit.client import Registry
from envkit.engine import connect
from envkit.errors import BuildError, EnvkitError, UserError
from envkit.images import build_from_bundle, image_tag
from envkit.kinds import build, kind_of
from envkit.refs import EnvRef, parse_env_ref
from envkit.spec import PULLED_MARKER, LoadedEnvironment, load_environment
from envkit.staging import staged_folder

__all__ = ["PublishResult", "PullResult", "cache_dir", "publish", "pull"]


class DigestMismatchError(EnvkitError):
    """Downloaded or rebuilt content does not match what the registry published."""


def cache_dir() -> Path:
    base = Path(os.environ.get("ENVKIT_CACHE")
                or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "envkit")
    return base


@dataclass
class PublishResult:
    ref: str
    created: bool
    bundle_digest: str
    image_id: str
    base_image: str
    oci_ref: str | None
    registry: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PullResult:
    ref: str
    folder: str
    bundle_digest: str
    image_id: str
    source: str  # "rebuilt" | "oci" | "cached"
    yanked: bool
    deprecated: bool
    successor: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def push_oci(image_id: str, env: LoadedEnvironment, host: str) -> str:
    """Push the image to a distribution registry at ``host``; returns ``host/ns/name@sha256:…``."""
    client = connect()
    repo = f"{host}/{env.spec.environment.name}"
    version = env.spec.environment.version
    client.images.get(image_id).tag(repo, version)
    digest = None
    try:
        for line in client.images.push(repo, tag=version, stream=True, decode=True):
            if "error" in line:
                raise UserError(f"pushing to {host} failed: {line['error']}",
                                "check that the OCI registry at --oci runs")
            aux = line.get("aux") or {}
            digest = aux.get("Digest", digest)
    except docker.errors.APIError as e:
        raise UserError(f"pushing to {host} failed: {e.explanation or e}",
                        "check that the OCI registry at --oci runs") from None
    if not digest:
        raise BuildError(f"the push to {host} reported no manifest digest")
    return f"{repo}@{digest}"


def publish(env: LoadedEnvironment, *, registry: Registry, oci: str | None = None) -> PublishResult:
    """Build the environment and publish exactly the bundle the image was built from."""
    bundle = make_bundle(env)
    image_id, base_ref = kind_of(env.spec).publish_identity(env, bundle, oci=oci)
    oci_ref = push_oci(image_id, env, oci) if oci else None
    ns, name = env.spec.environment.name.split("/")
    _status, body = registry.api.publish_version(
        ns, name, env.spec.environment.version, bundle=bundle.data, bundle_digest=bundle.digest,
        image_id=image_id, base_image=base_ref, oci_ref=oci_ref,
    )
    return PublishResult(ref=env.ref, created=bool(body["created"]), bundle_digest=bundle.digest, image_id=image_id,
                         base_image=base_ref, oci_ref=oci_ref, registry=registry.url)


def _safe_extract(data: bytes, dest: Path) -> None:
    bundle = read_bundle(data)
    root = dest.resolve()
    for e in bundle.entries:
        target = (dest / e.path).resolve()
        if not target.is_relative_to(root):
            raise DigestMismatchError(f"bundle entry {e.path} points outside the bundle")
        if e.kind == "dir":
            target.mkdir(parents=True, exist_ok=True)
        elif e.kind == "symlink":
            if os.path.isabs(e.target) or not (target.parent / e.target).resolve().is_relative_to(root):
                raise DigestMismatchError(f"bundle symlink {e.path} points outside the bundle")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(e.target)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(e.data)
            target.chmod(e.mode)


def pull(ref: str | EnvRef, *, registry: Registry) -> PullResult:
    r = parse_env_ref(ref) if isinstance(ref, str) else ref
    meta = registry.environments.get(r).attrs
    version_ref = parse_env_ref(meta["ref"])
    assert version_ref.version is not None
    folder = cache_dir() / "envs" / version_ref.namespace / version_ref.name / version_ref.version
    marker = folder / PULLED_MARKER
    if marker.is_file() and json.loads(marker.read_text()).get("bundle_digest") == meta["bundle_digest"]:
        data = None
    else:
        data = _download(registry, version_ref, meta["bundle_digest"])
        with staged_folder(folder, prefix=".pull-") as staging:
            _safe_extract(data, staging)
        marker.write_text(json.dumps({"bundle_digest": meta["bundle_digest"], "image_id": meta["image_id"]}))
    env = load_environment(folder)
    image_id, source = _local_image(env, meta, data)
    return PullResult(ref=meta["ref"], folder=str(folder), bundle_digest=meta["bundle_digest"], image_id=image_id,
                      source=source, yanked=meta["yanked"], deprecated=meta["deprecated"],
                      successor=meta.get("successor"))


def _download(registry: Registry, ref: EnvRef, expected: str) -> bytes:
    assert ref.version is not None
    sha = hashlib.sha256()
    chunks = []
    for chunk in registry.api.download_bundle(ref.namespace, ref.name, ref.version):
        sha.update(chunk)
        chunks.append(chunk)
    got = "sha256:" + sha.hexdigest()
    if got != expected:
        raise DigestMismatchError(f"the downloaded bundle of {ref} has digest {got}, but the registry published "
                                  f"{expected}; nothing was unpacked")
    return b"".join(chunks)


def _local_image(env: LoadedEnvironment, meta: dict[str, Any], data: bytes | None) -> tuple[str, str]:
    """Produce the published image locally and prove it is the same one."""
    client = connect()
    published = meta["image_id"]
    if not kind_of(env.spec).reproducible:  # a container environment: rebuilt from its Dockerfiles, compared
        built = build(env, client=client)
        same = built.image_id == published
        return built.image_id, "rebuilt from Dockerfiles" + (
            "" if same else " (not reproducible: the images differ from the published ones)")
    if meta.get("oci_ref") and not _has_image(client, published):
        try:
            image = client.images.pull(meta["oci_ref"])
        except docker.errors.APIError as e:
            raise UserError(f"pulling {meta['oci_ref']} failed: {e.explanation or e}",
                            "check that the OCI registry runs") from None
        if image.id != published:
            raise DigestMismatchError(f"the image pulled from {meta['oci_ref']} has ID {image.id}, "
                                      f"but the registry published {published}")
        repo, _, version = image_tag(env.spec).rpartition(":")
        image.tag(repo, version)
        return published, "oci"
    # Rebuild from the (verified) bundle: the ID is computed from its content, and the engine
    # load is skipped only when an image with exactly that ID is already there.
    bundle = read_bundle(data) if data is not None else make_bundle(env)
    image_id, _base_ref, cached = build_from_bundle(bundle, env.spec, client=client)
    if image_id != published:
        local_base = find_base(client, env.spec.image.pinned_digest).ref
        raise DigestMismatchError(
            f"the image rebuilt from {meta['ref']} has ID {image_id}, but the registry published {published} "
            f"(published on base {meta.get('base_image') or '?'}; this machine's base is {local_base}). "
            "Rebuild the base from the same Debian packages, or publish with --oci so pulls fetch the exact image."
        )
    return image_id, "rebuilt (already present)" if cached else "rebuilt"


def _has_image(client: Any, image_id: str) -> bool:
    try:
        client.images.get(image_id)
        return True
    except docker.errors.ImageNotFound:
        return False
