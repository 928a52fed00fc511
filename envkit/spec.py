"""The environment spec: a strict, versioned pydantic model loaded from ``envkit.toml``.

:func:`load_environment` reads the spec *and* everything it points at (the files the
image holds, the task file, each task's oracle) and reports every problem at once, each
with its field path and the fix, as one :class:`~envkit.errors.SpecError`.
"""

from __future__ import annotations

import ast
import difflib
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from envkit.errors import EnvNotFoundError, Problem, SpecError, TaskNotFoundError
from envkit.refs import NAME_RE, is_semver

__all__ = [
    "SPEC_FILE",
    "SPEC_VERSION",
    "EnvSpec",
    "LoadedEnvironment",
    "Task",
    "load_environment",
]

SPEC_FILE = "envkit.toml"
PULLED_MARKER = ".envkit-pulled.json"  # written by `envkit pull` beside the unpacked bundle
README_FILE = "README.md"  # bundled when present (envkit publish; the registry page renders it)
SPEC_VERSION = 1
BASE_IMAGE_NAME = "envkit/base"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EnvironmentSection(_Strict):
    name: str
    version: str
    kind: Literal["repo", "api", "website", "container"]
    description: str = ""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        parts = v.split("/")
        if len(parts) != 2 or not all(NAME_RE.match(p) for p in parts) or len(parts[0]) < 2:
            raise ValueError(f"`{v}` is not namespace/name")
        return v

    @field_validator("version")
    @classmethod
    def _version(cls, v: str) -> str:
        if not is_semver(v):
            raise ValueError(f"`{v}` is not a semantic version")
        return v


def _inside_environment(v: str) -> str:
    """The one rule for every path the spec names (image files, state folders and fixture, the
    task file, oracles, container task folders): relative to the environment folder and inside
    it, so no absolute path, no `..` part, no backslash; a folder's trailing `/` is dropped."""
    path = v.rstrip("/")
    parts = PurePosixPath(path).parts
    if not path or path.startswith("/") or ".." in parts or "\\" in path or "\0" in path:
        raise ValueError(f"`{v}` must be a relative path inside the environment folder (no leading /, no ..)")
    return path


EnvPath = Annotated[str, AfterValidator(_inside_environment)]


class ImageSection(_Strict):
    base: str = BASE_IMAGE_NAME
    files: list[EnvPath] = Field(default_factory=list)
    # "envkit": one reproducible image assembled on the base (the default). "dockerfile": each
    # task's own Dockerfile (a container environment, e.g. imported Harbor tasks), built by the
    # engine: a declared non-reproducible build whose image IDs envkit.lock records.
    build: Literal["envkit", "dockerfile"] = "envkit"
    # FROM image -> local image, for bases that cannot be pulled (dockerfile builds only).
    base_map: dict[str, str] = Field(default_factory=dict)
    # Python wheels installed into the image's site-packages (a layer of their own): a file of
    # `name==version --hash=sha256:<64 hex>  # file: <wheel file name>` lines (envkit synth
    # writes it). Wheels come from envkit's cache by hash, or are downloaded once.
    python_lock: EnvPath | None = None

    @field_validator("base")
    @classmethod
    def _base(cls, v: str) -> str:
        name, at, digest = v.partition("@")
        if name != BASE_IMAGE_NAME:
            raise ValueError(f"`{v}` is not an envkit base image")
        if at and not (digest.startswith("sha256:") and len(digest) == 71):
            raise ValueError(f"`{digest}` is not a sha256 digest")
        return v

    @property
    def pinned_digest(self) -> str | None:
        return self.base.partition("@")[2] or None


class RepoState(_Strict):
    path: EnvPath
    commit: str | None = None
    # A file of the workspace that each reset writes the episode's seed into (before the commit):
    # state that differs from seed to seed, the same for the same seed (e.g. a value the agent
    # has to look up, derived from it by a script of the repository).
    seed_file: EnvPath | None = None
    # Where the project's modules import from, relative to the repository ("." or e.g. "src"):
    # put on the path of every Python process of the agent user (an install from /workspace,
    # not a second copy), never on the verifier's or root's.
    python_path: str | None = None

    @field_validator("python_path")
    @classmethod
    def _python_path(cls, v: str | None) -> str | None:
        return v if v in (None, ".") else _inside_environment(v)

    @field_validator("commit")
    @classmethod
    def _commit(cls, v: str | None) -> str | None:
        if v is not None and (len(v) != 40 or any(c not in "0123456789abcdef" for c in v)):
            raise ValueError(f"`{v}` is not a full 40-hex git commit id")
        return v


class ServiceState(_Strict):
    """A service the environment runs inside the sandbox (as the `service` user)."""

    path: EnvPath  # folder with the service's files, copied to /seed/app
    command: str = Field(min_length=1)  # run in /seed/app, e.g. "python3 server.py"
    port: int = Field(ge=1024, le=65535)  # it listens on 127.0.0.1:port inside the sandbox
    health: str = Field(default="/health", pattern=r"^/")
    startup_timeout_s: float = Field(default=20, gt=0, le=300)


class DatabaseState(_Strict):
    """A SQLite database restored from a SQL fixture at every reset; the service finds it
    at $ENVKIT_DB."""

    fixture: EnvPath

    @field_validator("fixture")
    @classmethod
    def _fixture(cls, v: str) -> str:
        if not v.endswith(".sql"):
            raise ValueError(f"`{v}` is not a .sql file")
        return v


class StateSection(_Strict):
    repo: RepoState | None = None
    service: ServiceState | None = None
    database: DatabaseState | None = None


class TasksSection(_Strict):
    file: EnvPath = "tasks.jsonl"


class VerifierSection(_Strict):
    command: str = Field(min_length=1)
    timeout_s: float = Field(default=120, gt=0, le=3600)
    # Start the agent's call server for each verification (repository environments), through
    # which hidden tests call the agent's code (envkit_check). False for a verifier that never
    # runs it (one that grades the answer): saves one exec per episode.
    calls: bool = True


class LimitsSection(_Strict):
    cpus: float = Field(default=1.0, gt=0, le=64)
    memory_mb: int = Field(default=1024, ge=64, le=262144)
    pids: int = Field(default=256, ge=16, le=65536)
    disk_mb: int = Field(default=512, ge=16, le=65536)
    command_timeout_s: float = Field(default=60, gt=0, le=86400)
    episode_timeout_s: float = Field(default=600, gt=0, le=86400)
    output_limit_bytes: int = Field(default=65536, ge=1024, le=16 * 1024 * 1024)
    network: Literal["none", "bridge"] = "none"
    max_turns: int = Field(default=20, ge=1, le=1000)  # model turns per episode (agent loop)
    max_generated_tokens: int = Field(default=4096, ge=16, le=1_000_000)  # model tokens per episode
    # The OCI runtime its sandboxes ask for (envkit.sandbox.runtimes decides: the user's choice
    # wins, and a pulled environment may ask for gvisor, never lower itself to runc)
    runtime: Literal["runc", "gvisor"] | None = None


# The tools envkit implements (envkit/runtime.py's TOOL_ARGUMENTS); the agent edits files with bash.
ToolName = Literal["bash", "http", "browser"]


def _default_tools() -> list[ToolName]:
    return ["bash"]


class ToolsSection(_Strict):
    enabled: list[ToolName] = Field(default_factory=_default_tools)


class EnvSpec(_Strict):
    """Version 1 of the envkit.toml schema."""

    spec_version: Literal[1]
    environment: EnvironmentSection
    image: ImageSection = Field(default_factory=ImageSection)
    state: StateSection = Field(default_factory=StateSection)
    tasks: TasksSection = Field(default_factory=TasksSection)
    verifier: VerifierSection
    limits: LimitsSection = Field(default_factory=LimitsSection)
    tools: ToolsSection = Field(default_factory=ToolsSection)


SOLVE = "solve.sh"  # a container task's reference solution, in its solution/ folder (its oracle)


class ContainerTask(_Strict):
    """How a task of a container environment runs (the Harbor task layout): the agent works
    in the image built from ``<path>/environment`` as its own user; ``<path>/tests`` is copied
    to /tests after the agent's phase and ``tests/test.sh`` writes /logs/verifier/reward.txt
    or reward.json; ``<path>/solution/solve.sh`` is the oracle."""

    path: EnvPath  # the task's folder inside the environment
    image: str | None = None  # a prebuilt local image instead of environment/Dockerfile
    agent_timeout_s: float = Field(default=600, gt=0, le=86400)
    verifier_timeout_s: float = Field(default=120, gt=0, le=86400)
    build_timeout_s: float = Field(default=600, gt=0, le=86400)
    cpus: float | None = Field(default=None, gt=0, le=64)
    memory_mb: int | None = Field(default=None, ge=64, le=262144)
    network: Literal["none", "bridge"] | None = None
    verifier_env: dict[str, str] = Field(default_factory=dict)
    agent_user: str = "root"
    verifier_user: str = "root"


class Task(_Strict):
    """One line of the task file."""

    id: str
    instruction: str = Field(min_length=1)
    difficulty: Literal["easy", "medium", "hard"] = "medium"
    oracle: EnvPath
    params: dict[str, Any] = Field(default_factory=dict)
    container: ContainerTask | None = None  # container environments only
    # The task's own state: the repository with this unified diff applied at every reset (a
    # synthesized bug). The pristine repository is then readable by root only.
    patch: EnvPath | None = None

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not NAME_RE.match(v) or len(v) > 64:
            raise ValueError(f"`{v}` is not a task id")
        return v


# Fixes for the fields users get wrong most; the rest fall back to the type's hint.
_FIXES: dict[str, str] = {
    "spec_version": f"set spec_version = {SPEC_VERSION} at the top of envkit.toml",
    "environment": 'add an [environment] table with name = "ns/name", version = "1.0.0", kind = "repo"',
    "environment.name": 'write it as namespace/name in lowercase, e.g. name = "envkit/pyfix"',
    "environment.version": 'use a semantic version, e.g. version = "1.0.0"',
    "environment.kind": 'use kind = "repo", "api" or "website"',
    "image.base": f'use base = "{BASE_IMAGE_NAME}" or pin it: base = "{BASE_IMAGE_NAME}@sha256:<64 hex>"',
    "image.files": "list paths relative to the environment folder, e.g. files = [\"repo\", \"verify\"]",
    "image.build": 'use build = "envkit" (the default) or, for kind = "container", build = "dockerfile"',
    "state.repo.path": "name the folder that holds the repository, relative to envkit.toml",
    "state.service.path": "name the folder that holds the service's files, relative to envkit.toml",
    "tasks.file": 'give the task file\'s path relative to envkit.toml, e.g. file = "tasks.jsonl"',
    "container.path": "give the task's folder relative to envkit.toml, e.g. \"tasks/<id>\"",
    "state.repo.commit": "give the full 40-hex id of the commit a reset makes "
                         "(`envkit run ENV -t TASK --agent 'shell:git rev-parse HEAD'` "
                         "prints it), or remove the line",
    "state.repo.seed_file": 'name a file of the workspace, relative to it, e.g. seed_file = ".seed"',
    "verifier": 'add a [verifier] table with command = "python3 /env/verify/verify.py"',
    "verifier.command": "give the command that prints {\"reward\": <0..1>} as its last stdout line",
    "limits.network": 'use network = "none" (default) or "bridge"',
    "tools.enabled": 'choose among "bash", "http" and "browser" '
                     '(there is no edit_file tool: the agent edits files with bash)',
    "state.service.port": "use a port from 1024 to 65535 that the service listens on (127.0.0.1 inside the sandbox)",
    "state.database.fixture": "give the .sql file that creates and fills the database, relative to envkit.toml",
    "id": "use lowercase letters, digits, '-', '_' or '.', e.g. \"fix-median\"",
    "oracle": "give the path of the task's oracle script, relative to envkit.toml",
    "patch": "give the path of the task's patch (a unified diff against the repository), relative to envkit.toml",
    "image.python_lock": "give the lock file's path relative to envkit.toml (envkit synth writes python.lock)",
    "state.repo.python_path": 'use "." or the folder the project imports from, e.g. "src"',
}

_TYPE_FIXES = {
    "missing": "add this field",
    "extra_forbidden": "remove this field or check its spelling",
    "literal_error": "use one of the allowed values",
    "greater_than": "use a larger value",
    "greater_than_equal": "use a larger value",
    "less_than_equal": "use a smaller value",
}


def _problems_from(err: ValidationError, prefix: str = "") -> list[Problem]:
    problems = []
    known_fields: list[str] = []
    for e in err.errors():
        loc = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in e["loc"]).removeprefix(".")  # image.files[2]
        key = ".".join(str(x) for x in e["loc"] if not isinstance(x, int))
        fix = _FIXES.get(key) or _TYPE_FIXES.get(e["type"], "see docs/spec.md for the allowed values")
        if e["type"] == "extra_forbidden":
            leaf = str(e["loc"][-1])
            known_fields = _fields_at(e["loc"][:-1])
            close = difflib.get_close_matches(leaf, known_fields, n=1)
            if close:
                fix = f"did you mean `{close[0]}`?"
            elif key in _FIXES:
                fix = "remove this field; it is not part of spec_version 1"
        msg = e["msg"].removeprefix("Value error, ")
        problems.append(Problem(f"{prefix}{loc}", msg, fix))
    return problems


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    model: Any = EnvSpec
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        ann = field.annotation
        model = next((a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)),
                     ann)
    return list(getattr(model, "model_fields", {}))


@dataclass(frozen=True)
class LoadedEnvironment:
    """A validated environment folder: its spec, tasks and root."""

    root: Path
    spec: EnvSpec
    tasks: tuple[Task, ...]

    @property
    def name(self) -> str:
        return self.spec.environment.name

    @property
    def ref(self) -> str:
        return f"{self.spec.environment.name}@{self.spec.environment.version}"

    @property
    def pulled(self) -> bool:
        """Whether this folder was pulled from a registry (someone else's environment)."""
        return (self.root / PULLED_MARKER).is_file()

    def bundle_paths(self) -> list[str]:
        """Relative paths the source bundle holds (folders expand to their files)."""
        paths = {SPEC_FILE, self.spec.tasks.file}
        if (self.root / README_FILE).is_file():  # what the environment is, for people: the registry's page shows it
            paths.add(README_FILE)
        paths.update(p.rstrip("/") for p in self.spec.image.files)
        if self.spec.image.python_lock is not None:
            paths.add(self.spec.image.python_lock)
        state = self.spec.state
        if state.repo is not None:
            paths.add(state.repo.path)
        if state.service is not None:
            paths.add(state.service.path)
        if state.database is not None:
            paths.add(state.database.fixture)
        return sorted(paths)

    def task(self, task_id: str) -> Task:
        for t in self.tasks:
            if t.id == task_id:
                return t
        ids = [t.id for t in self.tasks]
        raise TaskNotFoundError(task_id, ids, difflib.get_close_matches(task_id, ids, n=1, cutoff=0.5))


def _covered(rel: str, roots: list[str]) -> bool:
    return any(rel == r or rel.startswith(r + "/") for r in roots)


def load_environment(path: str | Path) -> LoadedEnvironment:
    """Load and validate an environment folder (or its envkit.toml)."""
    root = Path(path)
    if root.name == SPEC_FILE and root.is_file():
        root = root.parent
    if not root.exists():
        raise EnvNotFoundError(
            f"no environment at `{path}`: the path does not exist",
            "give the folder that holds envkit.toml (e.g. environments/pyfix), or create one with `envkit init DIR`",
        )
    spec_path = root / SPEC_FILE
    if not spec_path.is_file():
        raise EnvNotFoundError(
            f"`{path}` is not an environment: it has no {SPEC_FILE}",
            f"give the folder that holds {SPEC_FILE}, or create one with `envkit init {path}`",
        )
    source = str(spec_path)
    try:
        raw = tomllib.loads(spec_path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise SpecError(source, [Problem("(file)", f"not valid TOML: {e}",
                                         "fix the TOML syntax at that line")]) from None
    except UnicodeDecodeError:
        raise SpecError(source, [Problem("(file)", "not UTF-8 text", "save envkit.toml as UTF-8")]) from None

    problems: list[Problem] = []
    version = raw.get("spec_version")
    if version is not None and version != SPEC_VERSION:
        raise SpecError(
            source,
            [Problem("spec_version", f"spec_version {version!r} is not supported by this envkit "
                                     f"(it reads {SPEC_VERSION})",
                     f"set spec_version = {SPEC_VERSION}, or upgrade envkit")],
        )
    try:
        spec = EnvSpec.model_validate(raw)
    except ValidationError as e:
        problems.extend(_problems_from(e))
        spec = None

    tasks: list[Task] = []
    if spec is not None:
        roots = [p.rstrip("/") for p in spec.image.files]
        for i, rel in enumerate(spec.image.files):
            if not (root / rel).exists():
                problems.append(Problem(f"image.files[{i}]", f"`{rel}` does not exist in {root}",
                                        "create it or remove it from the list"))
        if spec.state.repo is not None:
            repo = root / spec.state.repo.path
            if not repo.is_dir():
                problems.append(Problem("state.repo.path", f"`{spec.state.repo.path}` is not a folder in {root}",
                                        "create the folder that holds the repository's files"))
            elif (repo / ".git").exists():
                problems.append(Problem("state.repo.path", f"`{spec.state.repo.path}` contains a .git folder",
                                        "ship the files only; envkit makes the commit itself, reproducibly, at reset"))
            seed_file = spec.state.repo.seed_file
            if seed_file is not None and spec.state.repo.commit is not None:
                problems.append(Problem("state.repo.commit", "a seed file makes the commit differ from seed to seed",
                                        "remove the pinned commit (the state hash still checks same seed, same state)"))
            if seed_file is not None and (seed_file.split("/")[0] == ".git" or (repo / seed_file).is_dir()):
                problems.append(Problem("state.repo.seed_file", f"`{seed_file}` cannot hold the seed",
                                        "name a file of the workspace outside .git, e.g. seed_file = \".seed\""))
        elif spec.environment.kind == "repo":
            problems.append(Problem("state.repo", "a repo environment needs a repository",
                                    'add [state] repo = { path = "repo" }'))
        service, database = spec.state.service, spec.state.database
        if spec.environment.kind in ("api", "website") and service is None:
            problems.append(Problem("state.service", f"an {spec.environment.kind} environment needs a service",
                                    'add [state] service = { path = "app", command = "python3 server.py", '
                                    'port = 8080 }'))
        if service is not None and not (root / service.path).is_dir():
            problems.append(Problem("state.service.path", f"`{service.path}` is not a folder in {root}",
                                    "create the folder that holds the service's files"))
        if database is not None:
            if service is None:
                problems.append(Problem("state.database", "a database needs a service to serve it",
                                        "add [state] service = {…}, or remove [state] database"))
            if not (root / database.fixture).is_file():
                problems.append(Problem("state.database.fixture", f"`{database.fixture}` does not exist in {root}",
                                        "create the SQL fixture or fix the path"))
        tools = set(spec.tools.enabled)
        if tools & {"http", "browser"} and service is None:
            problems.append(Problem("tools.enabled", "the http and browser tools need a service",
                                    "add [state] service = {…}, or remove them from the list"))
        container = spec.environment.kind == "container"
        if container != (spec.image.build == "dockerfile"):
            problems.append(Problem("image.build",
                                    f"a {spec.environment.kind} environment cannot use build = {spec.image.build!r}",
                                    'use kind = "container" with build = "dockerfile" '
                                    '(images from each task\'s Dockerfile), '
                                    'or the default build = "envkit" for repo, api and website environments'))
        if spec.image.base_map and spec.image.build != "dockerfile":
            problems.append(Problem("image.base_map", "base_map applies to Dockerfile builds only", "remove it"))
        if container:
            if spec.state.repo or spec.state.service or spec.state.database:
                problems.append(Problem("state", "a container environment's state is each task's image",
                                        "remove the [state] table"))
            if set(spec.tools.enabled) != {"bash"}:
                problems.append(Problem("tools.enabled", "a container environment offers the bash tool only",
                                        'use tools.enabled = ["bash"]'))
        elif "bash" in tools and spec.state.repo is None:
            problems.append(Problem("tools.enabled", "the bash tool works in a repository",
                                    'add [state] repo = {…}, or use tools.enabled = ["http"] / ["browser"]'))
        lock = spec.image.python_lock
        if lock is not None and not (root / lock).is_file():
            problems.append(Problem("image.python_lock", f"`{lock}` does not exist in {root}",
                                    "create it (envkit synth writes one) or remove the line"))
        tasks_path = root / spec.tasks.file
        if not tasks_path.is_file():
            problems.append(Problem("tasks.file", f"`{spec.tasks.file}` does not exist in {root}",
                                    "create the task file (one JSON object per line) or fix the path"))
        else:
            tasks = _load_tasks(tasks_path, spec.tasks.file, root, roots, problems)
            for task in tasks:
                _check_container_task(task, container, root, roots, problems)
            _check_hidden_test_imports(spec, root, problems)
            if spec.state.repo is None and any(t.patch for t in tasks):
                problems.append(Problem("tasks", "a task's patch changes a repository, and this environment has none",
                                        'add [state] repo = { path = "repo" } or remove the tasks\' patch field'))
    if problems:
        raise SpecError(source, problems)
    assert spec is not None
    return LoadedEnvironment(root=root.resolve(), spec=spec, tasks=tuple(tasks))


_PYTEST_VERIFIER = re.compile(r"pytest_verifier\.py\s+--tests\s+/env/(\S+)")


def _workspace_modules(repo: Path, python_path: str | None) -> set[str]:
    base = repo if python_path in (None, ".") else repo / python_path
    names = set()
    for p in base.iterdir() if base.is_dir() else ():
        if p.is_dir() and (p / "__init__.py").is_file():
            names.add(p.name)
        elif p.suffix == ".py" and p.stem not in ("conftest", "setup"):
            names.add(p.stem)
    return names


def _check_hidden_test_imports(spec: EnvSpec, root: Path, problems: list[Problem]) -> None:
    """pytest_verifier's hidden tests run in the verifier's own process, which never imports
    the agent's code: a test that imports a workspace module would fail at collection on every
    episode. Refuse it here, with the two ways that work."""
    m = _PYTEST_VERIFIER.search(spec.verifier.command)
    if m is None or spec.state.repo is None:
        return
    tests, repo = root / m.group(1), root / spec.state.repo.path
    ours = _workspace_modules(repo, spec.state.repo.python_path)
    if not tests.is_dir() or not ours:
        return
    for path in sorted(tests.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                hits = [(a.name, f"{a.asname or a.name.partition('.')[0]} = module(\"{a.name}\")") for a in node.names]
                use = "module"
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                hits = [(node.module, f"{a.asname or a.name} = function(\"{node.module}.{a.name}\")")
                        for a in node.names]
                use = "function"
            else:
                continue
            hit = next(((name, example) for name, example in hits if name.partition(".")[0] in ours), None)
            if hit:
                rel = path.relative_to(root).as_posix()
                problems.append(Problem(
                    f"{rel}:{node.lineno}",
                    f"the hidden test imports `{hit[0]}` from the workspace, but hidden tests run in the verifier's "
                    "process, which cannot read the agent's code (the trust boundary: the agent's code never runs as "
                    "the verifier)",
                    f"call it through envkit_check: `from envkit_check import {use}; {hit[1]}` (docs/spec.md, "
                    "Verifiers); or, for a project with its own test suite, `envkit synth FOLDER --out ENV` makes an "
                    "environment verified by that suite"))
                break


def _check_container_task(task: Task, container: bool, root: Path, roots: list[str], problems: list[Problem]) -> None:
    where = f"task {task.id}.container"
    if not container:
        if task.container is not None:
            problems.append(Problem(where, "only container environments have per-task containers",
                                    "remove the task's container field"))
        return
    c = task.container
    if c is None:
        problems.append(Problem(where, "a container environment's task needs a container field",
                                'add "container": {"path": "tasks/<id>"} (envkit import harbor writes it)'))
        return
    folder = root / c.path
    if not folder.is_dir():
        problems.append(Problem(f"{where}.path", f"`{c.path}` is not a folder in {root}",
                                "fix the path or re-import the task"))
        return
    if not _covered(c.path, roots):
        problems.append(Problem(f"{where}.path", f"`{c.path}` is not in the bundle", "add its folder to [image] files"))
    if not (folder / "tests" / "test.sh").is_file():
        problems.append(Problem(f"{where}.path", f"`{c.path}/tests/test.sh` does not exist",
                                "add the verifier script that writes /logs/verifier/reward.txt or reward.json"))
    if c.image is None and not (folder / "environment" / "Dockerfile").is_file():
        problems.append(Problem(f"{where}.path",
                                f"`{c.path}/environment/Dockerfile` does not exist and no image is named",
                                "add the task's Dockerfile, or name a local image in the task's container.image"))


def _load_tasks(path: Path, rel: str, root: Path, roots: list[str], problems: list[Problem]) -> list[Task]:
    tasks: list[Task] = []
    seen: set[str] = set()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        problems.append(Problem(rel, "not UTF-8 text", "save the task file as UTF-8"))
        return tasks
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{rel}:{n}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(Problem(where, f"not valid JSON: {e.msg}", "write one JSON object per line"))
            continue
        try:
            task = Task.model_validate(data)
        except ValidationError as e:
            problems.extend(_problems_from(e, prefix=f"{where}."))
            continue
        if task.id in seen:
            problems.append(Problem(f"{where}.id", f"task id `{task.id}` is used twice", "give every task its own id"))
        seen.add(task.id)
        if task.patch is not None:
            if not (root / task.patch).is_file():
                problems.append(Problem(f"{where}.patch", f"`{task.patch}` does not exist",
                                        "create the patch or fix the path"))
            elif not _covered(task.patch, roots):
                problems.append(Problem(f"{where}.patch", f"`{task.patch}` is not in the bundle",
                                        "add its folder to [image] files"))
        if not (root / task.oracle).is_file():
            problems.append(Problem(f"{where}.oracle", f"`{task.oracle}` does not exist",
                                    "create the oracle script or fix the path"))
        elif not _covered(task.oracle, roots):
            problems.append(Problem(f"{where}.oracle", f"`{task.oracle}` is not in the bundle",
                                    "add its folder to [image] files"))
        tasks.append(task)
    if not tasks and not any(p.path.startswith(rel) for p in problems):
        problems.append(Problem(rel, "the task file holds no tasks", "add at least one task, one JSON object per line"))
    return tasks
