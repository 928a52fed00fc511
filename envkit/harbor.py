"""Harbor / Terminal-Bench task folders in and out of envkit.

A Harbor task is a folder::

    task.toml            metadata, agent / verifier / environment settings
    instruction.md       the prompt
    environment/         the Dockerfile (and its build context) of the task's container
    tests/test.sh        run after the agent; writes /logs/verifier/reward.txt or reward.json
    solution/solve.sh    the reference solution (envkit's oracle)

:func:`import_harbor` turns several into one *container* environment (``kind =
"container"``, ``[image] build = "dockerfile"``): the folders are copied verbatim under
``tasks/<id>/`` and ``tasks.jsonl`` carries each task's mapped settings in its ``container``
field; what does not map is listed in the returned report (and ``harbor-import.json``), never
dropped silently. :func:`export_harbor` writes the folders back. How envkit runs such tasks
(their sandboxes, Harbor's verifier phase, the oracle) is the container kind's
(:class:`envkit.kinds.ContainerKind`). The field mapping is in docs/harbor.md.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import shutil
import tomllib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from envkit.errors import UserError
from envkit.refs import NAME_RE, is_semver
from envkit.spec import SOLVE, SPEC_FILE, LoadedEnvironment, load_environment
from envkit.staging import staged_folder

__all__ = ["ImportReport", "TaskImport", "export_harbor", "import_harbor", "parse_base_map"]

REPORT_FILE = "harbor-import.json"
VERIFIER_COMMAND = "bash /tests/test.sh"
_DIFFICULTIES = ("easy", "medium", "hard")
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)


@dataclass
class TaskImport:
    id: str
    source: str
    image: str  # "Dockerfile" or the named image
    mapped: dict[str, Any]
    unsupported: list[str] = field(default_factory=list)
    carried: list[str] = field(default_factory=list)  # kept in params (and written back by export), not used


@dataclass
class ImportReport:
    env: str
    out: str
    tasks: list[TaskImport]
    base_map: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return {"env": self.env, "out": self.out, "base_map": self.base_map, "tasks": [asdict(t) for t in self.tasks]}


def parse_base_map(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        src, eq, dst = item.partition("=")
        if not eq or not src.strip() or not dst.strip():
            raise UserError(f"`--base-map {item}` is not FROM=LOCAL",
                            "write e.g. --base-map python:3.12-slim=envkit/base")
        out[src.strip()] = dst.strip()
    return out


def _task_dirs(paths: list[Path]) -> list[Path]:
    found: list[Path] = []
    for p in paths:
        if not p.is_dir():
            raise UserError(f"`{p}` is not a folder",
                            "give Harbor task folders (each with task.toml) or a folder of them")
        if (p / "task.toml").is_file():
            found.append(p)
            continue
        inner = sorted(d for d in p.iterdir() if d.is_dir() and (d / "task.toml").is_file())
        if not inner:
            raise UserError(f"`{p}` holds no Harbor task (no task.toml in it or in its subfolders)",
                            "give the task folders themselves, or the dataset folder that holds them")
        found.extend(inner)
    return found


def _task_id(folder: Path) -> str:
    tid = re.sub(r"[^a-z0-9._-]+", "-", folder.name.lower()).strip("-._")[:64] or "task"
    if not NAME_RE.match(tid):
        tid = "t-" + tid
    return tid


def _memory_mb(value: Any) -> int:
    if isinstance(value, (int, float)):
        return int(value)
    m = _MEMORY.match(str(value))
    if not m:
        raise ValueError(f"`{value}` is not a memory size")
    unit = (m.group(2) or "m").lower()[0]
    scale = {"b": 1 / 2**20, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}[unit]
    return int(float(m.group(1)) * scale)


def _positive(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ValueError("is not a positive number", "fix the value")
    return float(v)


def _memory(v: Any) -> int:
    try:
        return max(64, _memory_mb(v))
    except ValueError:
        raise ValueError("is not a memory size", 'write e.g. 2048 or "2G"') from None


def _typed(kind: type) -> Callable[[Any], Any]:
    def read(v: Any) -> Any:
        if not isinstance(v, kind):
            raise TypeError(kind.__name__)
        return v
    return read


def _str_map(v: Any) -> dict[str, str]:
    return {str(a): str(b) for a, b in _typed(dict)(v).items()}


@dataclass(frozen=True)
class _Field:
    """One ``task.toml`` setting and the ``container`` field it maps to, both ways."""

    table: str
    key: str
    attr: str
    read: Callable[[Any], Any]  # Harbor value -> envkit value (ValueError: bad value; TypeError: not this field)
    write: Callable[[Any], Any] = lambda v: v  # envkit value -> Harbor value


_FIELDS = {(f.table, f.key): f for f in (
    _Field("verifier", "timeout_sec", "verifier_timeout_s", _positive),
    _Field("verifier", "env", "verifier_env", _str_map, dict),
    _Field("verifier", "user", "verifier_user", _typed(str)),
    _Field("agent", "timeout_sec", "agent_timeout_s", _positive),
    _Field("agent", "user", "agent_user", _typed(str)),
    _Field("environment", "build_timeout_sec", "build_timeout_s", _positive),
    _Field("environment", "cpus", "cpus", _positive),
    _Field("environment", "memory_mb", "memory_mb", _memory),
    _Field("environment", "allow_internet", "network", lambda v: "bridge" if _typed(bool)(v) else "none",
           lambda network: network == "bridge"),
    _Field("environment", "docker_image", "image", _typed(str)),
)}
_TABLES = {table for table, _ in _FIELDS}
_ALIASES: dict[tuple[str, str], str] = {("environment", "memory"): "memory_mb"}  # Harbor's deprecated spelling ("2G")


def _map_task(folder: Path, tid: str) -> tuple[dict[str, Any], dict[str, Any], TaskImport]:
    """(task line, its container field, the report row) for one Harbor task folder."""
    where = folder / "task.toml"
    try:
        conf = tomllib.loads(where.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{where}: not valid TOML: {e}", "fix the file, or leave this task out") from None
    instruction_path = folder / "instruction.md"
    instruction = instruction_path.read_text(encoding="utf-8").strip() if instruction_path.is_file() else ""
    problems = []
    if not instruction:
        problems.append("instruction.md is missing or empty")
    if not (folder / "tests" / "test.sh").is_file():
        problems.append("tests/test.sh is missing")
    if not (folder / "solution" / SOLVE).is_file():
        problems.append("solution/solve.sh is missing (envkit validates every task with it as the oracle)")
    env_dir = folder / "environment"
    has_dockerfile = (env_dir / "Dockerfile").is_file()
    compose = [p.name for p in (env_dir.glob("docker-compose.y*ml") if env_dir.is_dir() else []) if p.is_file()]
    environment = dict(conf.get("environment") or {})
    if not has_dockerfile and not environment.get("docker_image"):
        problems.append("environment/Dockerfile is missing and [environment] docker_image names no image"
                        + (" (compose-only environments are not supported yet)" if compose else ""))
    if problems:
        raise UserError(f"{folder} is not an importable Harbor task: " + "; ".join(problems),
                        "fix the task folder, or leave it out of the import")

    unsupported: list[str] = []
    carried: list[str] = []
    container: dict[str, Any] = {"path": f"tasks/{tid}"}
    task: dict[str, Any] = {"id": tid, "instruction": instruction, "oracle": f"tasks/{tid}/solution/{SOLVE}"}
    params: dict[str, Any] = {}
    if folder.name != tid:
        params["harbor_name"] = folder.name

    for key, value in conf.items():
        if key in ("version", "schema_version") and not isinstance(value, dict):
            continue  # the task format's version
        if key == "metadata" and isinstance(value, dict):
            meta = dict(value)
            difficulty = meta.get("difficulty")
            if difficulty in _DIFFICULTIES:
                task["difficulty"] = difficulty
            elif difficulty is not None:
                unsupported.append(f"metadata.difficulty = {difficulty!r} "
                                   "(envkit knows easy, medium, hard; medium used)")
            if meta:
                params["harbor_metadata"] = meta
                carried += [f"metadata.{k}" for k in meta if k != "difficulty"]
        elif key in _TABLES and isinstance(value, dict):
            for k, v in value.items():
                spec = _FIELDS.get((key, _ALIASES.get((key, str(k))) or str(k)))
                if spec is None:
                    if not (key == "environment" and k == "gpus" and v in (0, None)):
                        unsupported.append(f"{key}.{k}" + (" (not enforced: the container's disk is not capped)"
                                                           if k in ("storage_mb", "storage") else ""))
                elif spec.attr == "image" and has_dockerfile:
                    unsupported.append("environment.docker_image (the task's Dockerfile is built instead)")
                else:
                    try:
                        container[spec.attr] = spec.read(v)
                    except TypeError:  # not this field's type: listed, not guessed
                        unsupported.append(f"{key}.{k}")
                    except ValueError as e:
                        raise UserError(f"{where}: [{key}] {k} = {v!r} {e.args[0]}", e.args[1]) from None
        elif isinstance(value, dict):
            unsupported += [f"{key}.{k}" for k in value] or [f"{key} (an empty table)"]
        else:
            unsupported.append(key)
    if compose:
        unsupported.append(f"environment/{compose[0]} (only the Dockerfile's container runs; other services do not)")
    # No allow_internet: Harbor's default allows the internet; envkit's sandboxes run without a
    # network unless allow_internet = true (docs/harbor.md), so the field stays unset.
    if params:
        task["params"] = params
    row = TaskImport(id=tid, source=str(folder), image="Dockerfile" if has_dockerfile else str(container.get("image")),
                     mapped={k: v for k, v in container.items() if k != "path"}, unsupported=unsupported,
                     carried=carried)
    return task, container, row


def _spec_text(name: str, version: str, description: str, base_map: dict[str, str],
               containers: list[dict[str, Any]]) -> str:
    agent = max((c.get("agent_timeout_s", 600.0) for c in containers), default=600.0)
    verifier = min(max((c.get("verifier_timeout_s", 120.0) for c in containers), default=120.0), 3600.0)
    lines = [
        "# Written by `envkit import harbor`: one container environment whose tasks are Harbor task folders.",
        "spec_version = 1", "", "[environment]", f"name = {json.dumps(name)}", f"version = {json.dumps(version)}",
        'kind = "container"', f"description = {json.dumps(description)}", "", "[image]",
        'build = "dockerfile"  # each task\'s environment/Dockerfile: not reproducible '
        '(image IDs recorded in envkit.lock)',
        'files = ["tasks"]',
    ]
    if base_map:
        lines.append("base_map = { "
                     + ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in sorted(base_map.items())) + " }")
    lines += ["", "[verifier]",
              f"command = {json.dumps(VERIFIER_COMMAND)}  # after /tests is copied in; each task's own timeout applies",
              f"timeout_s = {verifier:g}", "", "[limits]", "cpus = 1.0", "memory_mb = 2048", "pids = 1024",
              f"command_timeout_s = {agent:g}  # each task's agent timeout bounds its episode",
              f"episode_timeout_s = {agent:g}", 'network = "none"', "", "[tools]", 'enabled = ["bash"]', ""]
    return "\n".join(lines)


def import_harbor(paths: list[Path], out: Path, *, name: str, version: str = "1.0.0",
                  base_map: dict[str, str] | None = None) -> ImportReport:
    """Write one container environment at ``out`` from Harbor task folders (or folders of them).
    Nothing is written unless every task maps; ``out`` must not exist or be empty."""
    base_map = dict(base_map or {})
    parts = name.split("/")
    if len(parts) != 2 or not all(NAME_RE.match(p) for p in parts) or len(parts[0]) < 2:
        raise UserError(f"`{name}` is not namespace/name", "give --name like harbor/my-tasks (lowercase)")
    if not is_semver(version):
        raise UserError(f"`{version}` is not a semantic version", "give --version like 1.0.0")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"`{out}` exists and is not empty", "choose a new folder for --out (nothing was written)")
    folders = _task_dirs(paths)
    ids: dict[str, Path] = {}
    lines, containers, rows = [], [], []
    for folder in folders:
        tid = _task_id(folder)
        if tid in ids:
            raise UserError(f"two tasks map to the id `{tid}`: {ids[tid]} and {folder}", "rename one of the folders")
        ids[tid] = folder
        task, container, row = _map_task(folder, tid)
        task["container"] = container
        lines.append(json.dumps(task, sort_keys=True))
        containers.append(container)
        rows.append(row)
    with staged_folder(out, prefix=".envkit-import-") as staging:  # out is absent or empty (checked above)
        for tid, folder in ids.items():
            shutil.copytree(folder, staging / "tasks" / tid, symlinks=True)
        (staging / "tasks.jsonl").write_text("\n".join(lines) + "\n")
        description = f"{len(rows)} Harbor task(s) imported by envkit"
        (staging / SPEC_FILE).write_text(_spec_text(name, version, description, base_map, containers))
        report = ImportReport(env=f"{name}@{version}", out=str(out), tasks=rows, base_map=base_map)
        (staging / REPORT_FILE).write_text(json.dumps(report.to_dict(), indent=2, sort_keys=True) + "\n")
        load_environment(staging)  # the result must load; a mapping bug fails here, before anything is in place
    return report


# -- export ---------------------------------------------------------------------------

def _toml_key(k: str) -> str:
    return k if re.match(r"^[A-Za-z0-9_-]+$", k) else json.dumps(k)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (dt.datetime, dt.date, dt.time)):
        return v.isoformat()
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_toml_key(str(k))} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise ValueError(f"cannot write {type(v).__name__} to TOML")


def _dump_toml(data: dict[str, Any]) -> str:
    lines = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for k, v in data.items():
        if isinstance(v, dict):
            lines += ["", f"[{_toml_key(k)}]"] + [f"{_toml_key(str(a))} = {_toml_value(b)}" for a, b in v.items()]
    return "\n".join(lines).lstrip("\n") + "\n"


def export_harbor(env: LoadedEnvironment, out: Path) -> list[str]:
    """Write every task of a container environment as a Harbor task folder under ``out``.
    ``task.toml`` keeps what the task folder held and takes the mapped settings from
    tasks.jsonl (so edits there carry over); instruction.md is the task's instruction."""
    kind = env.spec.environment.kind
    if kind not in ("container", "repo"):
        raise UserError(f"{env.ref} is an {kind} environment; "
                        "`envkit export harbor` writes container and repo environments",
                        "exporting api and website environments (their services) is not supported yet")
    if kind == "repo":
        bad = [t.id for t in env.tasks if not t.oracle.endswith(".sh")]
        if bad:
            raise UserError(f"tasks {', '.join(bad)} have oracles that are not shell scripts",
                            "Harbor's solve.sh is a shell script")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"`{out}` exists and is not empty", "choose a new folder for --out (nothing was written)")
    written = []
    with staged_folder(out, prefix=".envkit-export-") as staging:
        for task in env.tasks:
            if kind == "repo":
                _export_repo_task(env, task, staging / task.id)
                written.append(task.id)
                continue
            c = task.container
            assert c is not None
            name = str(task.params.get("harbor_name") or task.id)
            dest = staging / name
            shutil.copytree(env.root / c.path, dest, symlinks=True)
            toml_path = dest / "task.toml"
            conf = tomllib.loads(toml_path.read_text(encoding="utf-8")) if toml_path.is_file() else {}
            meta = dict(task.params.get("harbor_metadata") or conf.get("metadata") or {})
            if task.difficulty != "medium" or "difficulty" in meta:
                meta["difficulty"] = task.difficulty
            conf["metadata"] = meta
            # Settings the task states (defaults stay implicit, so import -> export -> import is stable).
            (conf.get("environment") or {}).pop("memory", None)  # the deprecated spelling comes back as memory_mb
            for field_ in _FIELDS.values():
                section = conf.setdefault(field_.table, {})
                if field_.attr in c.model_fields_set:
                    section[field_.key] = field_.write(getattr(c, field_.attr))
                else:
                    section.pop(field_.key, None)
            conf = {k: v for k, v in conf.items() if v != {}}
            toml_path.write_text(_dump_toml(conf))
            (dest / "instruction.md").write_text(task.instruction + "\n")
            written.append(name)
    return written


_SEED_COMMIT = ("git init -q -b main && git add -A && GIT_AUTHOR_NAME=envkit GIT_AUTHOR_EMAIL=seed@envkit.invalid "
                "GIT_COMMITTER_NAME=envkit GIT_COMMITTER_EMAIL=seed@envkit.invalid "
                "GIT_AUTHOR_DATE=1970-01-01T00:00:00Z GIT_COMMITTER_DATE=1970-01-01T00:00:00Z "
                "git commit -q --no-gpg-sign -m 'envkit seed'")

_REPO_TEST = """#!/bin/bash
# Written by `envkit export harbor` from {ref}: runs the envkit verifier and writes its reward.
mkdir -p /env /opt/envkit /logs/verifier
cp -r /tests/env/. /env/ && cp -r /tests/opt/. /opt/envkit/
cd /env
export ENVKIT_TASK_ID={task_id} ENVKIT_TASK_PARAMS={params} ENVKIT_SEED=0 ENVKIT_WORKSPACE=/workspace
out=$({command})
echo "$out" >&2
echo "$out" | tail -n 1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["reward"])' \
> /logs/verifier/reward.txt
"""


def _shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _export_repo_task(env: LoadedEnvironment, task: Any, dest: Path) -> None:
    """One task of a repo environment as a Harbor folder: the repository baked into the image
    at /workspace (committed as envkit seeds it), the bundle's hidden files and envkit's
    in-container verifiers under tests/ (they reach the container only for grading)."""
    from importlib import resources

    spec = env.spec
    assert spec.state.repo is not None
    (dest / "environment").mkdir(parents=True)
    shutil.copytree(env.root / spec.state.repo.path, dest / "environment" / "workspace",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".git"))
    (dest / "environment" / "Dockerfile").write_text(
        f"# Written by `envkit export harbor` from {env.ref}: the envkit base (build it with `envkit base build`,\n"
        "# or map it to an image with python3, pytest and git).\n"
        f"FROM {spec.image.base.partition('@')[0]}\n"
        "COPY workspace/ /workspace/\n"
        "WORKDIR /workspace\n"
        f"RUN {_SEED_COMMIT} && chown -R 1000:1000 /workspace\n")
    tests = dest / "tests"
    for rel in sorted({p.rstrip("/") for p in spec.image.files} | {spec.tasks.file, SPEC_FILE}):
        src = env.root / rel
        if src.is_dir():
            shutil.copytree(src, tests / "env" / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            (tests / "env" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, tests / "env" / rel)
    helpers = resources.files("envkit.sandbox") / "incontainer"
    (tests / "opt").mkdir()
    for name in ("pytest_verifier.py", "state_verifier.py", "envkit_check.py", "callserver.py"):
        (tests / "opt" / name).write_bytes((helpers / name).read_bytes())
    test = tests / "test.sh"
    test.write_text(_REPO_TEST.format(ref=env.ref, task_id=_shell_quote(task.id),
                                      params=_shell_quote(json.dumps(task.params, sort_keys=True)),
                                      command=spec.verifier.command))
    test.chmod(0o755)
    (dest / "solution").mkdir()
    shutil.copyfile(env.root / task.oracle, dest / "solution" / SOLVE)
    (dest / "instruction.md").write_text(task.instruction + "\n")
    lim = spec.limits
    conf = {"version": "1.0", "metadata": {"difficulty": task.difficulty, "source": env.ref},
            "verifier": {"timeout_sec": float(spec.verifier.timeout_s)},
            "agent": {"timeout_sec": float(lim.episode_timeout_s), "user": "agent"},
            "environment": {"cpus": lim.cpus, "memory_mb": lim.memory_mb, "allow_internet": lim.network == "bridge"}}
    (dest / "task.toml").write_text(_dump_toml(conf))
