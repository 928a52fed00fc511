import json
from pathlib import Path

import pytest

from envkit.errors import EnvNotFoundError, SpecError, TaskNotFoundError
from envkit.spec import load_environment

from ..conftest import PYFIX


def test_bundled_pyfix_is_valid():
    env = load_environment(PYFIX)
    assert env.ref == "envkit/pyfix@1.0.0"
    assert len(env.tasks) >= 12
    assert {t.difficulty for t in env.tasks} == {"easy", "medium", "hard"}
    assert env.spec.limits.network == "none"


def _problems(path: Path) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        load_environment(path)
    return {p.path: f"{p.message} | {p.fix}" for p in info.value.problems}


def test_every_problem_reported_at_once_with_path_and_fix(pyfix_copy: Path):
    spec = pyfix_copy / "envkit.toml"
    text = spec.read_text()
    text = text.replace('version = "1.0.0"', 'version = "1.0"').replace('kind = "repo"', 'kind = "rpeo"')
    text = text.replace("memory_mb = 512", "memory_mb = 8").replace('network = "none"', 'network = "internet"')
    text = text.replace("cpus = 1.0", "cpus = 1.0\ncpu = 2")
    spec.write_text(text)
    problems = _problems(pyfix_copy)
    assert set(problems) == {"environment.version", "environment.kind", "limits.memory_mb", "limits.network",
                             "limits.cpu"}
    assert "semantic version" in problems["environment.version"]
    assert "did you mean `cpus`?" in problems["limits.cpu"]
    assert '"none"' in problems["limits.network"]


def test_malformed_toml(pyfix_copy: Path):
    (pyfix_copy / "envkit.toml").write_text("spec_version = 1\n[environment\nname = 'x'\n")
    problems = _problems(pyfix_copy)
    assert list(problems) == ["(file)"]
    assert "not valid TOML" in problems["(file)"] and "line 2" in problems["(file)"]


def test_unsupported_spec_version(pyfix_copy: Path):
    spec = pyfix_copy / "envkit.toml"
    spec.write_text(spec.read_text().replace("spec_version = 1", "spec_version = 7"))
    assert "not supported" in _problems(pyfix_copy)["spec_version"]


def test_missing_files_and_bad_tasks(pyfix_copy: Path):
    spec = pyfix_copy / "envkit.toml"
    spec.write_text(spec.read_text().replace('files = ["verify", "oracle"]', 'files = ["verify", "oracle", "nothere"]'))
    lines = (pyfix_copy / "tasks.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    lines.append(json.dumps(first))  # duplicate id
    lines.append("{not json")
    lines.append(json.dumps({"id": "Bad Id", "instruction": "x", "oracle": "oracle/missing.sh", "extra": 1}))
    (pyfix_copy / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    problems = _problems(pyfix_copy)
    n = len(lines)
    assert "image.files[2]" in problems
    assert f"tasks.jsonl:{n - 2}.id" in problems and "used twice" in problems[f"tasks.jsonl:{n - 2}.id"]
    assert f"tasks.jsonl:{n - 1}" in problems and "not valid JSON" in problems[f"tasks.jsonl:{n - 1}"]
    assert f"tasks.jsonl:{n}.id" in problems
    assert f"tasks.jsonl:{n}.extra" in problems


def test_repo_with_git_folder_is_rejected(pyfix_copy: Path):
    (pyfix_copy / "repo" / ".git").mkdir()
    assert "contains a .git folder" in _problems(pyfix_copy)["state.repo.path"]


def test_oracle_outside_bundle(pyfix_copy: Path):
    spec = pyfix_copy / "envkit.toml"
    spec.write_text(spec.read_text().replace('files = ["verify", "oracle"]', 'files = ["verify"]'))
    problems = _problems(pyfix_copy)
    assert any(k.endswith(".oracle") and "not in the bundle" in v for k, v in problems.items())


def test_not_an_environment(tmp_path: Path):
    with pytest.raises(EnvNotFoundError, match="no envkit.toml"):
        load_environment(tmp_path)
    with pytest.raises(EnvNotFoundError, match="does not exist"):
        load_environment(tmp_path / "nope")


def test_unknown_task_suggests_close_one():
    env = load_environment(PYFIX)
    with pytest.raises(TaskNotFoundError) as info:
        env.task("fix-medain")
    assert "Did you mean `fix-median`?" in info.value.message


ESCAPES = ["../../etc/passwd.sql", "/etc/passwd.sql", "oracle/../../outside.sql", "oracle\\..\\x.sql", "/"]


def _with_spec(pyfix_copy: Path, old: str, new: str) -> Path:
    spec = pyfix_copy / "envkit.toml"
    text = spec.read_text()
    assert old in text
    spec.write_text(text.replace(old, new))
    return pyfix_copy


def _with_task(pyfix_copy: Path, **fields: object) -> Path:
    path = pyfix_copy / "tasks.jsonl"
    lines = path.read_text().splitlines()
    lines[0] = json.dumps({**json.loads(lines[0]), **fields})
    path.write_text("\n".join(lines) + "\n")
    return pyfix_copy


# Every path field of the spec, and how to put a value into it (the field path the problem names).
PATH_FIELDS = {
    "image.files[2]": lambda env, bad: _with_spec(env, 'files = ["verify", "oracle"]',
                                                  f'files = ["verify", "oracle", {json.dumps(bad)}]'),
    "state.repo.path": lambda env, bad: _with_spec(env, 'repo = { path = "repo" }',
                                                   f"repo = {{ path = {json.dumps(bad)} }}"),
    "state.service.path": lambda env, bad: _with_spec(
        env, 'repo = { path = "repo" }',
        f'repo = {{ path = "repo" }}\nservice = {{ path = {json.dumps(bad)}, command = "x", port = 8080 }}'),
    "state.database.fixture": lambda env, bad: _with_spec(env, 'repo = { path = "repo" }',
                                                          'repo = { path = "repo" }\n'
                                                          f'database = {{ fixture = {json.dumps(bad)} }}'),
    "tasks.file": lambda env, bad: _with_spec(env, 'file = "tasks.jsonl"', f"file = {json.dumps(bad)}"),
    "tasks.jsonl:1.oracle": lambda env, bad: _with_task(env, oracle=bad),
    "tasks.jsonl:1.container.path": lambda env, bad: _with_task(env, container={"path": bad}),
}


@pytest.mark.parametrize("bad", ESCAPES)
@pytest.mark.parametrize("field", sorted(PATH_FIELDS))
def test_every_path_field_must_stay_inside_the_environment_folder(pyfix_copy: Path, field: str, bad: str):
    problems = _problems(PATH_FIELDS[field](pyfix_copy, bad))
    assert field in problems, problems
    assert "must be a relative path inside the environment folder" in problems[field]


def test_path_fields_accept_folders_with_a_trailing_slash(pyfix_copy: Path):
    _with_spec(pyfix_copy, 'files = ["verify", "oracle"]', 'files = ["verify/", "oracle/"]')
    env = load_environment(_with_spec(pyfix_copy, 'repo = { path = "repo" }', 'repo = { path = "repo/" }'))
    assert (env.spec.image.files == ["verify", "oracle"] and env.spec.state.repo is not None
            and env.spec.state.repo.path == "repo")


def test_a_tool_envkit_does_not_implement_is_refused_with_the_ones_it_does(pyfix_copy: Path):
    problems = _problems(_with_spec(pyfix_copy, 'enabled = ["bash"]', 'enabled = ["bash", "edit_file"]'))
    assert set(problems) == {"tools.enabled[1]"}
    assert ("'bash', 'http' or 'browser'" in problems["tools.enabled[1]"]
            and "no edit_file tool" in problems["tools.enabled[1]"])


def test_the_spec_offers_exactly_the_tools_the_runtime_implements():
    from typing import get_args

    from envkit.runtime import TOOL_ARGUMENTS
    from envkit.spec import ToolName, ToolsSection

    assert set(get_args(ToolName)) == set(TOOL_ARGUMENTS) - {"answer"}  # answer is always offered, never enabled
    assert ToolsSection().enabled == ["bash"]
