"""The run lockfile, ``RUN/envkit-run.lock``: every environment of a run as the recipe names it
(``ref``), what that resolved to when the run started (``resolved``: ns/name@version), its
content (``bundle_digest``, ``image_id``, per-task images of a container environment) and the
sandbox runtime it ran under (``runtime``, and why: ``runtime_why``).

Refs without a version are resolved once, at the start of a run; a resumed run resolves them
to the locked version again (:func:`pinned_ref`) and refuses to go on when any environment's
content differs from the lock (:func:`check_resume`): training on from a checkpoint against a
different verifier or task set would mix two environments in one run without saying so. So it
does when the runtime changed by default (e.g. gVisor no longer registered, so a pulled
environment would fall back to runc); a runtime asked for (``--runtime``, ENVKIT_RUNTIME, the
user's config file) is the user's call, and each trajectory records its runtime."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from envkit.errors import EnvRefError, UserError
from envkit.refs import parse_env_ref

__all__ = ["LOCK_NAME", "check_resume", "lock_entry", "pinned_ref", "read_lock", "write_lock"]

LOCK_NAME = "envkit-run.lock"
_FORMAT = 1


def lock_entry(ref: str, runtime: Any) -> dict[str, Any]:
    """One environment's line of the lock, from its loaded runtime."""
    build = runtime.build
    return {"ref": ref, "resolved": runtime.env.ref, "bundle_digest": build.bundle_digest, "image_id": build.image_id,
            "task_images": dict(sorted(build.task_images.items())), "source": str(runtime.env.root),
            "runtime": runtime.sandbox_runtime.runtime, "runtime_why": runtime.sandbox_runtime.why}


# How a runtime is chosen by no one's call for this run (envkit.sandbox.runtimes.choose_runtime's
# reasons): the default for a pulled environment or a local folder (a change of the spec's own
# runtime changes the bundle digest, refused above). --runtime, ENVKIT_RUNTIME and the user's
# config file are the user's choices.
_DEFAULT = "default"


def write_lock(run_dir: Path, entries: list[dict[str, Any]]) -> Path:
    path = run_dir / LOCK_NAME
    path.write_text(json.dumps({"format": _FORMAT, "environments": entries}, indent=2, sort_keys=True) + "\n")
    return path


def read_lock(run_dir: Path) -> dict[str, dict[str, Any]] | None:
    """The lock's entries by ``ref``; None when the run has no lock (a run from before it)."""
    path = run_dir / LOCK_NAME
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        return {e["ref"]: e for e in data["environments"]}
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path} is not a run lock envkit can read ({type(e).__name__}: {e})",
                        "restore it from the run's backup, or start a new run (a new run_dir)") from None


def pinned_ref(ref: str, locked: dict[str, Any] | None) -> str:
    """What to resolve for ``ref`` in a resumed run: a ref without a version (``envkit/pyfix``)
    is pinned to the version it resolved to at the start; a folder or an exact ref stays."""
    if locked is None or Path(ref).exists():
        return ref
    try:
        parsed = parse_env_ref(ref)
    except EnvRefError:
        return ref
    if parsed.version is not None:
        return ref
    resolved = parse_env_ref(locked["resolved"])
    return f"{parsed.full_name}@{resolved.version}" if resolved.full_name == parsed.full_name else ref


def check_resume(lock: dict[str, dict[str, Any]], entries: list[dict[str, Any]], lock_path: Path) -> None:
    """Refuse (exit 2) a resume whose environments are not the ones the run started on."""
    now = {e["ref"]: e for e in entries}
    if set(now) != set(lock):
        raise UserError(f"this run's environments changed: {sorted(lock)} when it started ({lock_path}), "
                        f"{sorted(now)} in the recipe now",
                        "resume with the recipe's original envs, or start a new run (a new run_dir)")
    for ref, was in lock.items():
        cur = now[ref]
        for key, what in (("resolved", "version"), ("bundle_digest", "bundle digest"), ("image_id", "image ID"),
                          ("task_images", "task images")):
            if was.get(key) != cur.get(key):
                raise UserError(
                    f"environment `{ref}` resolves differently than when this run started: {what} {was.get(key)} "
                    f"then ({lock_path}), {cur.get(key)} now (from {cur['source']})",
                    f"restore {was['resolved']} as it was (e.g. `envkit pull {was['resolved']}`), or start a new run "
                    "(a new run_dir) to train on the environment as it is now")
        if ("runtime" in was and was["runtime"] != cur.get("runtime")
                and str(cur.get("runtime_why")).startswith(_DEFAULT)):
            raise UserError(
                f"environment `{ref}` ran under {was['runtime']} when this run started ({was.get('runtime_why')}; "
                f"{lock_path}), and would now run under {cur.get('runtime')} ({cur.get('runtime_why')})",
                f"make {was['runtime']} available again (gVisor: `bash scripts/setup.sh`), or pass "
                f"--runtime {cur.get('runtime')} to resume under it knowingly (each trajectory records its runtime)")
