"""Bundles for registry tests, made from copies of pyfix (no Docker needed)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from envkit.bundle import Bundle, make_bundle
from envkit.spec import load_environment

from ..conftest import PYFIX

FAKE_IMAGE = "sha256:" + "ab" * 32


def make_pyfix_bundle(tmp_path: Path, *, name: str = "envkit/pyfix", version: str = "1.0.0", salt: str = "",
                      description: str | None = None, readme: bytes | None = None) -> Bundle:
    key = f"{name}{version}{salt}{description}{hashlib.sha1(readme).hexdigest() if readme is not None else ''}"
    folder = tmp_path / f"src-{hashlib.sha1(key.encode()).hexdigest()[:10]}"
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(PYFIX, folder, ignore=shutil.ignore_patterns("envkit.lock"))
    spec = folder / "envkit.toml"
    text = spec.read_text().replace('name = "envkit/pyfix"', f'name = "{name}"').replace('version = "1.0.0"',
                                                                                        f'version = "{version}"')
    if description is not None:
        text = text.replace('description = "Fix bugs', f'description = "{description} Fix bugs')
    spec.write_text(text)
    if salt:
        (folder / "repo" / "SALT").write_text(salt)
    if readme is not None:
        (folder / "README.md").write_bytes(readme)
    return make_bundle(load_environment(folder))


def make_many_tasks_bundle(tmp_path: Path, count: int, *, name: str = "envkit/many") -> Bundle:
    """A pyfix copy with ``count`` tasks (its 13 repeated under new ids): the size envkit synth makes."""
    folder = tmp_path / f"many-{count}"
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(PYFIX, folder, ignore=shutil.ignore_patterns("envkit.lock"))
    spec = folder / "envkit.toml"
    spec.write_text(spec.read_text().replace('name = "envkit/pyfix"', f'name = "{name}"'))
    base = [json.loads(line) for line in (folder / "tasks.jsonl").read_text().splitlines() if line.strip()]
    lines = [json.dumps({**base[i % len(base)], "id": f"task-{i:04d}",
                         "instruction": f"Task number {i}. " + base[i % len(base)]["instruction"]})
             for i in range(count)]
    (folder / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    return make_bundle(load_environment(folder))


def image_for(bundle: Bundle) -> str:
    """A stand-in image ID that differs with the content (the server cannot check it)."""
    return "sha256:" + hashlib.sha256(bundle.digest.encode()).hexdigest()


def put(client, bundle: Bundle, *, ns: str = "envkit", name: str = "pyfix", version: str = "1.0.0",
        digest: str | None = None, image: str | None = None, content: bytes | None = None, headers: dict | None = None):
    params = {"bundle_digest": digest or bundle.digest, "image_id": image or image_for(bundle)}
    return client.put(f"/environments/{ns}/{name}/versions/{version}", params=params,
                      content=bundle.data if content is None else content,
                      headers={"Content-Type": "application/x-tar", **(headers or {})})
