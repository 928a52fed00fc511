"""Harbor mapping pieces that need no Docker: FROM rewriting, sizes, the reward rule, the
import's refusals and the container environment's spec rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envkit.container_images import image_set_digest, map_from_lines, recorded_mismatches
from envkit.errors import SpecError, UserError
from envkit.harbor import _memory_mb, import_harbor, parse_base_map
from envkit.kinds import harbor_reward as _reward
from envkit.spec import load_environment

from ..harbor_tasks import write_harbor_tasks


def test_from_lines_are_mapped_and_listed():
    text = "FROM python:3.12-slim AS build\nRUN true\nfrom --platform=linux/amd64 ubuntu:24.04\nFROM build\n"
    out, named = map_from_lines(text, {"python:3.12-slim": "envkit/base", "ubuntu:24.04": "local/u"})
    assert named == ["python:3.12-slim", "ubuntu:24.04", "build"]
    assert out.splitlines() == ["FROM envkit/base AS build", "RUN true", "from --platform=linux/amd64 local/u",
                                "FROM build"]


def test_memory_sizes_and_base_map_parsing():
    assert [_memory_mb(v) for v in (2048, "4G", "512M", "512m", "1.5g", "1024MiB")] == [
        2048, 4096, 512, 512, 1536, 1024]
    with pytest.raises(ValueError):
        _memory_mb("lots")
    assert parse_base_map(["a:1=b", " c = d "]) == {"a:1": "b", "c": "d"}
    with pytest.raises(UserError, match="FROM=LOCAL"):
        parse_base_map(["nonsense"])


def test_reward_rule_and_image_set():
    assert _reward({"reward": 0.25, "style": 1.0}) == 0.25  # an explicit reward key wins
    assert _reward({"a": 1.0, "b": 0.0}) == 0.5  # else the mean of the keys
    assert image_set_digest({"a": "x", "b": "y"}) == image_set_digest({"b": "y", "a": "x"})
    assert recorded_mismatches({"a": "1", "b": "2"}, {"a": "1", "b": "3", "c": "4"}) == ["b", "c"]


def test_import_refuses_duplicates_and_bad_names(tmp_path: Path):
    src = tmp_path / "src"
    write_harbor_tasks(src)
    with pytest.raises(UserError, match="namespace/name"):
        import_harbor([src], tmp_path / "o", name="nonamespace")
    with pytest.raises(UserError, match="semantic version"):
        import_harbor([src], tmp_path / "o", name="a-b/c", version="1")
    with pytest.raises(UserError, match="map to the id `hello-file`"):
        import_harbor([src / "hello-file", src / "hello-file"], tmp_path / "o", name="ab/c")
    (src / "hello-file" / "task.toml").write_text("[agent\n")
    with pytest.raises(UserError, match="not valid TOML"):
        import_harbor([src / "hello-file"], tmp_path / "o", name="ab/c")
    assert not (tmp_path / "o").exists()


def test_container_spec_rules(tmp_path: Path):
    write_harbor_tasks(tmp_path / "src")
    env_dir = tmp_path / "env"
    import_harbor([tmp_path / "src"], env_dir, name="ab/c")
    assert load_environment(env_dir).spec.environment.kind == "container"
    spec = env_dir / "envkit.toml"
    good = spec.read_text()
    spec.write_text(good.replace('build = "dockerfile"', 'build = "envkit"'))
    with pytest.raises(SpecError, match="image.build"):
        load_environment(env_dir)
    spec.write_text(good.replace('enabled = ["bash"]', 'enabled = ["bash", "http"]'))
    with pytest.raises(SpecError, match="bash tool only"):
        load_environment(env_dir)
    spec.write_text(good)
    lines = (env_dir / "tasks.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    del first["container"]
    (env_dir / "tasks.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    with pytest.raises(SpecError, match="needs a container field"):
        load_environment(env_dir)


def test_task_toml_is_written_back_losslessly():
    import tomllib

    from envkit.harbor import _dump_toml

    text = ('version = "1.0"\n"odd.key" = 1\n[metadata]\ncreated = 2026-01-02T03:04:05Z\nday = 2026-01-02\n'
            'tags = ["a", "b"]\n[environment]\nextra = { nested = { x = 1 } }\n[[steps]]\nname = "one"\n')
    data = tomllib.loads(text)
    assert tomllib.loads(_dump_toml(data)) == data
