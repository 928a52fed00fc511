"""The envkit base image, built locally and reproducibly from Debian packages.

No image can be pulled on the machines envkit targets, so the base is made here:
``mmdebstrap`` (with ``SOURCE_DATE_EPOCH`` fixed, which makes its tarball bit-for-bit
reproducible for the same package versions) writes the root filesystem as one tar layer;
envkit writes the image config itself (fixed ``created`` time, sorted keys) and loads the
pair as a docker-archive through the SDK. The image ID is the sha256 of that config, so
building twice from the same packages gives the same ID.

What is *not* fixed: Debian updates packages (security fixes) and the mirror serves only
the newest. A rebuild after such an update gives another base digest; every environment's
``envkit.lock`` records the digest it was built on, and ``[image] base`` can pin one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker.errors

from envkit.engine import connect
from envkit.errors import BaseImageMissingError, BuildError

__all__ = [
    "AGENT_UID",
    "SERVICE_UID",
    "BASE_REPO",
    "BaseImage",
    "RECIPE",
    "VERIFIER_UID",
    "build_base",
    "docker_archive",
    "find_base",
    "image_config_bytes",
    "recipe_digest",
]

BASE_REPO = "envkit/base"
AGENT_UID = 1000
VERIFIER_UID = 1001
SERVICE_UID = 1002  # primary group: the verifier's, so graders can read service data (mode 0640)
EPOCH = 1700000000  # SOURCE_DATE_EPOCH for the rootfs; image configs use 1970-01-01.
CREATED = "1970-01-01T00:00:00Z"
LABEL_RECIPE = "org.envkit.base.recipe"

# Users are written straight into the files (no useradd: it stamps today's date in /etc/shadow).
# The adjacent raw strings below are one script, split only to keep source lines short (its bytes feed recipe_digest).
_HOOK = (r"""
set -e
r="$1"
printf 'agent:x:1000:1000:envkit agent:/home/agent:/bin/bash\n' >> "$r/etc/passwd"
printf 'verifier:x:1001:1001:envkit verifier:/home/verifier:/bin/bash\n' >> "$r/etc/passwd"
printf 'service:x:1002:1001:envkit service:/nonexistent:/usr/sbin/nologin\n' >> "$r/etc/passwd"
printf 'agent:x:1000:\nverifier:x:1001:\n' >> "$r/etc/group"
printf 'agent:!*::::::\nverifier:!*::::::\nservice:!*::::::\n' >> "$r/etc/shadow"
printf 'agent:!::\nverifier:!::\n' >> "$r/etc/gshadow"
install -d -o 1000 -g 1000 -m 0755 "$r/home/agent" "$r/workspace"
install -d -o 1001 -g 1001 -m 0700 "$r/home/verifier"
printf '[user]\n\tname = envkit agent\n\temail = agent@envkit.invalid\n[safe]\n\tdirectory = *\n"""
         r"""[init]\n\tdefaultBranch = main\n' > "$r/etc/gitconfig"
sed -i 's/^hosts:.*/hosts:          files myhostname dns/' "$r/etc/nsswitch.conf"
rm -rf "$r"/var/cache/apt/* "$r"/var/lib/apt/lists/* "$r"/var/log/* "$r"/etc/machine-id "$r"/var/cache/"""
         r"""ldconfig/aux-cache
: > "$r/etc/machine-id"
""")

RECIPE: dict[str, Any] = {
    "recipe_version": 1,
    "suite": "bookworm",
    "variant": "minbase",
    # libnss-myhostname: "localhost" resolves without /etc/hosts, which the engine writes only
    # for containers with networking (sandboxes without a network have it disabled: a faster start)
    "packages": sorted(["python3", "python3-pytest", "git", "procps", "ca-certificates", "libnss-myhostname"]),
    "source_date_epoch": EPOCH,
    "hook": _HOOK,
    "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8",
            "PYTHONDONTWRITEBYTECODE=1"],
}


def recipe_digest() -> str:
    return hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class BaseImage:
    id: str  # sha256:<hex>, the config digest
    diff_ids: tuple[str, ...]
    env: tuple[str, ...]
    recipe: str

    @property
    def ref(self) -> str:
        return f"{BASE_REPO}@{self.id}"

    @property
    def tag(self) -> str:
        return f"{BASE_REPO}:{self.recipe[:12]}"


def image_config_bytes(*, diff_ids: list[str], env: list[str], cmd: list[str], labels: dict[str, str],
                       history: list[str], working_dir: str = "/", user: str = "") -> bytes:
    """A docker image config with every varying field pinned; its sha256 is the image ID."""
    config = {
        "architecture": _arch(),
        "os": "linux",
        "created": CREATED,
        "config": {"Env": env, "Cmd": cmd, "Labels": labels, "WorkingDir": working_dir, "User": user},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created": CREATED, "created_by": h} for h in history],
    }
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def _arch() -> str:
    machine = os.uname().machine
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def docker_archive(path: Path, *, config: bytes, layers: list[tuple[str, Path | bytes | None]],
                   tags: list[str]) -> None:
    """Write a docker-archive (the `docker save` layout) to ``path``.

    A layer given as ``None`` is left out of the archive: the engine skips reading layers
    whose chain it already holds (the base's), which keeps an environment load ~0.1 s.
    """
    import io
    import tarfile

    config_name = hashlib.sha256(config).hexdigest() + ".json"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        def add(name: str, data: bytes) -> None:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))

        add(config_name, config)
        names = []
        for diff_id, content in layers:
            name = diff_id.removeprefix("sha256:") + "/layer.tar"
            names.append(name)
            if isinstance(content, Path):
                tar.add(str(content), arcname=name)
            elif content is not None:
                add(name, content)
        add("manifest.json", json.dumps([{"Config": config_name, "RepoTags": tags, "Layers": names}]).encode())


def load_archive(client: Any, path: Path) -> str:
    with open(path, "rb") as f:
        images = client.images.load(f)
    ids = {image.id for image in images}
    if len(ids) != 1:
        raise BuildError(f"the engine loaded {len(ids)} images from one archive, expected 1")
    return str(ids.pop())


def _base_from_attrs(attrs: dict[str, Any]) -> BaseImage:
    labels = (attrs.get("Config") or {}).get("Labels") or {}
    return BaseImage(
        id=attrs["Id"],
        diff_ids=tuple(attrs["RootFS"]["Layers"]),
        env=tuple((attrs.get("Config") or {}).get("Env") or ()),
        recipe=labels.get(LABEL_RECIPE, ""),
    )


def find_base(client: Any | None = None, pinned: str | None = None) -> BaseImage:
    """The local base image for this envkit's recipe (or the pinned digest)."""
    client = client or connect()
    ref = pinned or f"{BASE_REPO}:{recipe_digest()[:12]}"
    try:
        return _base_from_attrs(client.images.get(ref).attrs)
    except docker.errors.ImageNotFound:
        if pinned:
            raise BaseImageMissingError(
                f"the pinned base image {BASE_REPO}@{pinned} is not in the local Docker engine",
                "build the base with `envkit base build` (the digest it prints must match), or "
                f"change [image] base to `{BASE_REPO}` to use the local one",
            ) from None
        raise BaseImageMissingError(
            f"the envkit base image ({ref}) is not in the local Docker engine",
            "build it with `envkit base build` (about 30 s; `bash scripts/setup.sh` does it too)",
        ) from None


def build_base(*, force: bool = False, client: Any | None = None,
               keep_tar: Path | None = None) -> tuple[BaseImage, bool]:
    """Build (or find) the base image. Returns ``(base, built_now)``."""
    client = client or connect()
    if not force:
        try:
            return find_base(client), False
        except BaseImageMissingError:
            pass
    if shutil.which("mmdebstrap") is None:
        raise BaseImageMissingError("mmdebstrap is not installed",
                                    "install it: `apt-get install -y mmdebstrap` (or run `bash scripts/setup.sh`)")
    digest = recipe_digest()
    with tempfile.TemporaryDirectory(prefix="envkit-base-") as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        cmd = ["mmdebstrap", f"--variant={RECIPE['variant']}", "--mode=root", "--quiet",
               f"--include={','.join(RECIPE['packages'])}", f"--customize-hook={RECIPE['hook']}",
               RECIPE["suite"], str(rootfs)]
        mirror = _host_mirror()
        if mirror:
            cmd.append(mirror)
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(EPOCH)}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"mmdebstrap failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
        h = hashlib.sha256()
        with open(rootfs, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        diff_id = "sha256:" + h.hexdigest()
        config = image_config_bytes(
            diff_ids=[diff_id], env=list(RECIPE["env"]), cmd=["/bin/bash"],
            labels={LABEL_RECIPE: digest}, history=[f"envkit base recipe {digest}"],
        )
        archive = Path(tmp) / "image.tar"
        tag = f"{BASE_REPO}:{digest[:12]}"
        docker_archive(archive, config=config, layers=[(diff_id, rootfs)], tags=[tag, f"{BASE_REPO}:latest"])
        image_id = load_archive(client, archive)
        if keep_tar is not None:
            shutil.copyfile(rootfs, keep_tar)
    expected = "sha256:" + hashlib.sha256(config).hexdigest()
    if image_id != expected:
        raise BuildError(f"the engine gave the base image ID {image_id}, expected {expected}")
    return find_base(client), True


def _host_mirror() -> str | None:
    """Use the host's own Debian sources (whatever mirror this machine is set up for)."""
    for candidate in ("/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list"):
        p = Path(candidate)
        if p.is_file() and p.read_text().strip():
            return candidate
    return None
