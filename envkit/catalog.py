"""Finding environments: a folder path, or a ref resolved against local folders.

``ENVKIT_PATH`` (folders separated by ``:``) lists where to look for environments by
ref; by default ``./environments`` and the bundled ``environments/`` of this checkout.
Registry refs (``envkit pull``) are resolved by the registry client once it exists.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from pathlib import Path

from envkit.errors import EnvNotFoundError, EnvRefError
from envkit.refs import EnvRef, is_prerelease, parse_env_ref, semver_key
from envkit.spec import SPEC_FILE, LoadedEnvironment, load_environment

__all__ = ["local_environments", "resolve_environment", "search_path"]

_BUNDLED = Path(__file__).resolve().parent.parent / "environments"


def search_path() -> list[Path]:
    env = os.environ.get("ENVKIT_PATH")
    if env:
        return [Path(p) for p in env.split(os.pathsep) if p]
    paths = [Path.cwd() / "environments"]
    if _BUNDLED.is_dir() and _BUNDLED.resolve() != paths[0].resolve():
        paths.append(_BUNDLED)
    return paths


def local_environments() -> dict[str, dict[str, Path]]:
    """``{"ns/name": {"1.0.0": folder}}`` for every readable envkit.toml on the search path."""
    found: dict[str, dict[str, Path]] = {}
    for root in search_path():
        if not root.is_dir():
            continue
        for spec in sorted(root.glob(f"*/{SPEC_FILE}")):
            try:
                section = tomllib.loads(spec.read_text(encoding="utf-8")).get("environment", {})
                name, version = section["name"], section["version"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            found.setdefault(str(name), {}).setdefault(str(version), spec.parent)
    return found


def _version_key(v: str) -> tuple[object, ...]:
    try:
        return semver_key(v)  # Semantic Versioning precedence: 1.1.0-rc.1 < 1.1.0
    except ValueError:
        return (-1, 0, 0, 0, ())


def resolve_environment(arg: str) -> LoadedEnvironment:
    """A folder (if ``arg`` names one) or an ``ns/name[@version]`` ref found on the search path."""
    path = Path(arg)
    if path.exists():
        return load_environment(path)
    envs = local_environments()
    try:
        ref = parse_env_ref(arg)
    except EnvRefError:
        ref = None
    if ref is None or ref.full_name not in envs:
        parent = path.parent if str(path.parent) not in ("", ".") and path.parent.is_dir() else None
        siblings = [p.name for p in parent.iterdir() if (p / SPEC_FILE).is_file()] if parent else []
        close_dir = difflib.get_close_matches(path.name, siblings, n=1)
        looks_like_path = arg.startswith((".", "/", "~")) or arg.count("/") > 1 or arg.endswith("/")
        if ref is None or looks_like_path or close_dir:
            hint = (f"did you mean `{parent / close_dir[0]}`?" if parent and close_dir
                    else "give the folder that holds envkit.toml, or a ref ns/name@version")
            raise EnvNotFoundError(f"no environment at `{arg}`: no such folder, and it is not a known environment ref",
                                   hint)
        pulled = _from_registry(ref)
        if pulled is not None:
            return pulled
        close = difflib.get_close_matches(ref.full_name, list(envs), n=1)
        where = ", ".join(str(p) for p in search_path())
        raise EnvNotFoundError(
            f"Environment `{ref.full_name}` doesn't exist." + (f" Did you mean `{close[0]}`?" if close else ""),
            f"looked in {where} (set ENVKIT_PATH to add folders); or give the environment's folder",
        )
    versions = envs[ref.full_name]
    if ref.version is None:  # the newest release; a pre-release only when asked for by its version
        releases = [v for v in versions if not is_prerelease(v)]
        if not releases:
            raise EnvNotFoundError(f"Environment `{ref.full_name}` has only pre-releases here",
                                   "name one: "
                                   f"{', '.join(f'{ref.full_name}@{v}' for v in sorted(versions, key=_version_key))}")
        return load_environment(versions[max(releases, key=_version_key)])
    if ref.version not in versions:
        raise EnvNotFoundError(
            f"Environment `{ref.full_name}` has no version {ref.version}",
            f"available: {', '.join(sorted(versions, key=_version_key))}",
        )
    return load_environment(versions[ref.version])


def _from_registry(ref: EnvRef) -> LoadedEnvironment | None:
    """Pull ``ref`` from the configured registry; None when no registry is configured or it
    has no such environment."""
    from envkit.client import Registry, RegistryAPIError, load_credentials
    from envkit.distribution import pull

    creds = load_credentials()
    if creds is None:
        return None
    with Registry(creds.url, creds.token) as registry:
        try:
            result = pull(ref, registry=registry)
        except RegistryAPIError as e:
            if e.status == 404:
                return None
            raise
    return load_environment(result.folder)
