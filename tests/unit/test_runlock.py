"""The run lock (rl_runner/recipes/runlock.py): what a resumed run resolves, and what it refuses."""

from __future__ import annotations

import pytest

from envkit.errors import UserError
from rl_runner.recipes.runlock import LOCK_NAME, check_resume, pinned_ref, read_lock, write_lock

ENTRY = {"ref": "envkit/pyfix", "resolved": "envkit/pyfix@1.1.0", "bundle_digest": "sha256:" + "a" * 64,
         "image_id": "sha256:" + "b" * 64, "task_images": {}, "source": "/cache/envkit/pyfix/1.1.0",
         "runtime": "gvisor", "runtime_why": "default for a pulled environment"}


def test_a_ref_without_a_version_keeps_the_locked_one(tmp_path):
    assert pinned_ref("envkit/pyfix", ENTRY) == "envkit/pyfix@1.1.0"
    assert pinned_ref("envkit/pyfix@1.0.0", {**ENTRY, "ref": "envkit/pyfix@1.0.0"}) == "envkit/pyfix@1.0.0"
    assert pinned_ref("envkit/pyfix", None) == "envkit/pyfix"  # a new run: resolved now
    folder = tmp_path / "envkit" / "pyfix"
    folder.mkdir(parents=True)
    assert pinned_ref(str(folder), {**ENTRY, "ref": str(folder)}) == str(folder)  # a folder is what it holds


def test_a_resume_is_refused_when_anything_resolves_differently(tmp_path):
    path = write_lock(tmp_path, [ENTRY])
    assert path.name == LOCK_NAME
    lock = read_lock(tmp_path)
    assert lock == {"envkit/pyfix": ENTRY}
    check_resume(lock, [dict(ENTRY)], path)  # the same: goes on
    for key, value in (("bundle_digest", "sha256:" + "c" * 64), ("image_id", "sha256:" + "d" * 64),
                       ("resolved", "envkit/pyfix@1.2.0")):
        with pytest.raises(UserError) as e:
            check_resume(lock, [{**ENTRY, key: value}], path)
        assert "envkit/pyfix" in e.value.message and str(ENTRY[key]) in e.value.message and value in e.value.message
    with pytest.raises(UserError, match="environments changed"):
        check_resume(lock, [{**ENTRY, "ref": "envkit/other"}], path)


def test_a_lock_that_cannot_be_read_is_a_clear_error(tmp_path):
    assert read_lock(tmp_path) is None
    (tmp_path / LOCK_NAME).write_text('{"environments": [{"no": "ref"}]')
    with pytest.raises(UserError, match="not a run lock"):
        read_lock(tmp_path)


def test_a_resume_that_would_change_the_runtime_by_default_is_refused(tmp_path):
    path = write_lock(tmp_path, [ENTRY])
    lock = read_lock(tmp_path)
    assert lock is not None
    fallback = {**ENTRY, "runtime": "runc", "runtime_why": "default for a pulled environment; gVisor missing"}
    with pytest.raises(UserError) as e:
        check_resume(lock, [fallback], path)
    assert "ran under gvisor" in e.value.message and "would now run under runc" in e.value.message
    assert "scripts/setup.sh" in e.value.hint and "--runtime runc" in e.value.hint
    for asked in ("--runtime", "ENVKIT_RUNTIME", "/root/.config/envkit/config.toml runtime.pulled"):  # the user's call
        check_resume(lock, [{**fallback, "runtime_why": asked}], path)
    old = {k: v for k, v in ENTRY.items() if not k.startswith("runtime")}  # a lock from before runtimes
    check_resume({"envkit/pyfix": old}, [fallback], path)
