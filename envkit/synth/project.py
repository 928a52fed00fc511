"""A real Python project as envkit synth sees it: where its code and tests are, what its tests
need, and its pytest configuration made runnable without plugins it does not ship.

Nothing here runs the project's code: it reads files (``PKG-INFO``, ``pyproject.toml``,
``setup.cfg``, ``tox.ini``, ``pytest.ini``) and rewrites one setting (``addopts``).
"""

from __future__ import annotations

import configparser
import email.parser
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from envkit.errors import UserError

__all__ = ["Project", "analyse", "neutralise_config"]

TEST_DIRS = ("tests", "test", "testing")
NOT_PACKAGES = {"tests", "test", "testing", "docs", "doc", "examples", "example", "benchmarks", "benchmark", "tools",
                "scripts", "build", "dist"}
NOT_MODULES = {"setup.py", "conftest.py", "noxfile.py", "fabfile.py", "tasks.py", "runtests.py", "run_tests.py",
               "setup_helper.py"}
CONFIG_FILES = ("pyproject.toml", "setup.cfg", "tox.ini", "pytest.ini", "conftest.py")
TEST_EXTRAS = {"test", "tests", "testing"}
# What a suite's config asks for that envkit does not install (coverage, parallel runs, reruns,
# linters as tests, reports): dropped from the requirements and, as options, from addopts.
PLUGIN_PACKAGES = {"pytest-cov", "coverage", "pytest-xdist", "pytest-randomly", "pytest-benchmark", "codecov", "tox",
                   "nox", "ruff", "mypy", "black", "flake8", "isort", "pylint", "pre-commit", "pytest-timeout",
                   "pytest-rerunfailures", "pytest-mypy", "pytest-flake8", "pytest-black", "pytest-isort",
                   "pytest-html", "pytest-sugar", "pytest-instafail", "twine", "build", "wheel", "setuptools", "sphinx",
                   "check-manifest", "pytest-codspeed"}
# addopts options to drop, with whether they take a separate value
_DROP_OPTIONS = {"--cov": False, "--cov-report": False, "--cov-config": False, "--cov-append": False,
                 "--cov-branch": False, "--cov-fail-under": False, "--no-cov": False, "--no-cov-on-fail": False,
                 "--doctest-modules": False, "--doctest-glob": False, "--doctest-continue-on-failure": False,
                 "-n": True, "--numprocesses": True, "--dist": True, "--timeout": False, "--reruns": True,
                 "--benchmark-skip": False, "--mypy": False, "--flake8": False, "--black": False, "--isort": False,
                 "--html": False, "--junitxml": False, "--junit-xml": False, "-p": True, "--strict-config": False,
                 "--randomly-seed": False, "-W": True, "--import-mode": False}
_BUILTIN_PLUGINS = {"no:cacheprovider", "no:randomly", "no:xdist"}


@dataclass
class Project:
    """Where things are in a project's source tree (all paths relative to ``root``)."""

    root: Path
    name: str
    version: str
    license: str
    python_path: str  # "." or "src": where its modules import from
    packages: list[str]  # import names of its top-level packages and modules
    package_paths: list[str]  # their paths (folders or .py files)
    test_dirs: list[str]
    requirements: list[str]
    config_changes: list[str] = field(default_factory=list)
    # test files left out: they do not collect here (the reason: provenance)
    ignored: list[str] = field(default_factory=list)
    # tests left out: each took longer than a whole check should (their times: provenance)
    deselected: list[str] = field(default_factory=list)

    def test_files(self) -> list[str]:
        """The pristine test tree the verifier sends: every file under the test folders and the
        root's configuration files."""
        out = [c for c in CONFIG_FILES if (self.root / c).is_file()]
        for d in self.test_dirs:
            for p in sorted((self.root / d).rglob("*")):
                if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith((".pyc", ".pyo")):
                    out.append(p.relative_to(self.root).as_posix())
        return out

    def source_files(self) -> list[str]:
        """The package's Python files (what mutations change)."""
        out = []
        for rel in self.package_paths:
            path = self.root / rel
            if path.is_file():
                out.append(rel)
            else:
                out.extend(p.relative_to(self.root).as_posix() for p in sorted(path.rglob("*.py"))
                           if "__pycache__" not in p.parts
                           and not any(part in NOT_PACKAGES for part in p.relative_to(path).parts))
        return out

    def pytest_args(self) -> list[str]:
        return ["-q", "--tb=short", "-p", "no:randomly", "-p", "no:xdist", "-p", "no:cacheprovider",
                *(f"--ignore={path}" for path in self.ignored), *(f"--deselect={t}" for t in self.deselected),
                *self.test_dirs]


def _metadata(root: Path) -> dict[str, list[str]]:
    path = root / "PKG-INFO"
    if not path.is_file():
        return {}
    msg = email.parser.Parser().parsestr(path.read_text(encoding="utf-8", errors="replace"), headersonly=True)
    return {k: msg.get_all(k) or []
            for k in ("Name", "Version", "License", "License-Expression", "Requires-Dist", "Classifier")}


def _pyproject(root: Path) -> dict:
    path = root / "pyproject.toml"
    try:
        return tomllib.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return {}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(req: str) -> str:
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
    return _norm(m.group(1)) if m else ""


def requirements(root: Path, name: str) -> list[str]:
    """The project's runtime dependencies and its test extras/groups, without the plugins and
    tools envkit does not install; pytest always."""
    meta = _metadata(root)
    py = _pyproject(root)
    reqs: list[str] = []
    for line in meta.get("Requires-Dist", []):
        spec, _, marker = line.partition(";")
        extra = re.search(r"""extra\s*==\s*['"]([^'"]+)['"]""", marker)
        if extra is None or extra.group(1) in TEST_EXTRAS:
            rest = re.sub(r"""(and\s+)?extra\s*==\s*['"][^'"]+['"](\s+and)?""", "", marker).strip()
            reqs.append(spec.strip() + (f"; {rest}" if rest else ""))
    if not meta.get("Requires-Dist"):
        project = py.get("project", {})
        reqs.extend(project.get("dependencies", []))
        for extra_name, extra_reqs in project.get("optional-dependencies", {}).items():
            if extra_name in TEST_EXTRAS:
                reqs.extend(extra_reqs)
    for group_name, group in py.get("dependency-groups", {}).items():
        if group_name in TEST_EXTRAS:
            reqs.extend(r for r in group if isinstance(r, str))
    for path in [*root.glob("requirements/test*.txt"), *root.glob("requirements-test*.txt"),
                 *root.glob("test-requirements*.txt")]:
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            line = line.split("#")[0].strip()
            if line and not line.startswith("-"):
                reqs.append(line)
    keep, seen = ["pytest"], {"pytest"}
    for req in reqs:
        n = _requirement_name(req)
        if n and n not in seen and n not in PLUGIN_PACKAGES and n != _norm(name):
            seen.add(n)
            keep.append(req)
    return keep


def _find_packages(root: Path) -> tuple[str, list[str], list[str]]:
    src = root / "src"
    base = src if src.is_dir() and any(p.is_dir() and (p / "__init__.py").is_file() for p in src.iterdir()) else root
    names, paths = [], []
    for p in sorted(base.iterdir()):
        if p.name.startswith((".", "_")) or p.name in NOT_PACKAGES:
            continue
        if p.is_dir() and (p / "__init__.py").is_file() and p.name.isidentifier():
            names.append(p.name)
            paths.append(p.relative_to(root).as_posix())
        elif p.is_file() and p.suffix == ".py" and p.name not in NOT_MODULES and p.stem.isidentifier() \
                and not p.name.startswith("test_"):
            names.append(p.stem)
            paths.append(p.relative_to(root).as_posix())
    return ("src" if base == src else "."), names, paths


def analyse(root: Path) -> Project:
    """Read a project's layout; refuse one envkit synth cannot use, saying why."""
    meta = _metadata(root)
    py = _pyproject(root).get("project", {})
    name = (meta.get("Name") or [py.get("name", root.name)])[0]
    version = (meta.get("Version") or [str(py.get("version", "0"))])[0]
    license_ = (meta.get("License-Expression") or [""])[0]
    if not license_:
        lines = (meta.get("License") or [""])[0].strip().splitlines()
        license_ = lines[0][:100] if lines else ""
    if not license_:
        license_ = next((c.rpartition("::")[2].strip() for c in meta.get("Classifier", [])
                         if c.startswith("License ::")), "")
    if not license_:
        lic = next((p for p in sorted(root.glob("LICEN[CS]E*")) if p.is_file()), None)
        license_ = lic.read_text(encoding="utf-8", errors="replace").strip().splitlines()[0][:100] if lic else "unknown"
    python_path, packages, package_paths = _find_packages(root)
    if not packages:
        raise UserError(f"found no Python package or module in {root}",
                        "give a project whose code is a package (a folder with __init__.py) at its top or under src/")
    tests = [d for d in TEST_DIRS if (root / d).is_dir() and any((root / d).rglob("test*.py"))]
    if not tests:
        raise UserError(f"{name} {version} ships no tests (no tests/, test/ or testing/ folder with test files)",
                        "pick a package whose source distribution includes its test suite, "
                        "or give a local folder or a git checkout that has one")
    return Project(root=root, name=name, version=version, license=license_ or "unknown", python_path=python_path,
                   packages=packages, package_paths=package_paths, test_dirs=tests,
                   requirements=requirements(root, name))


# -- pytest configuration ---------------------------------------------------------------------------

def filter_addopts(opts: list[str]) -> list[str]:
    out, skip = [], False
    for tok in opts:
        if skip:
            skip = False
            if tok in _BUILTIN_PLUGINS:  # "-p no:cacheprovider" is pytest's own
                out.extend(["-p", tok])
            continue
        key = tok.split("=", 1)[0]
        if key in _DROP_OPTIONS or any(key.startswith(k) for k in ("--cov", "--benchmark", "--reruns", "--doctest")):
            skip = _DROP_OPTIONS.get(key, False) and "=" not in tok
            continue
        if tok.startswith("-p") and len(tok) > 2:  # -pxdist
            continue
        out.append(tok)
    return out


def _ini_sections(root: Path) -> list[tuple[str, str]]:
    return [("pytest.ini", "pytest"), ("tox.ini", "pytest"), ("setup.cfg", "tool:pytest")]


def neutralise_config(root: Path) -> list[str]:
    """Rewrite the pytest configuration so that it needs no plugin envkit does not install:
    ``addopts`` loses coverage, parallelism, doctest-of-the-package and similar options;
    ``required_plugins`` goes. Returns what changed, one line each (for the provenance)."""
    changes: list[str] = []
    path = root / "pyproject.toml"
    if path.is_file():
        text = path.read_text(encoding="utf-8")
        try:
            ini = tomllib.loads(text).get("tool", {}).get("pytest", {}).get("ini_options", {})
        except tomllib.TOMLDecodeError:
            ini = {}
        new_text = text
        if "addopts" in ini:
            old = ini["addopts"]
            tokens = shlex.split(old) if isinstance(old, str) else [str(t) for t in old]
            kept = filter_addopts(tokens)
            if kept != tokens:
                new_text = _replace_toml_value(new_text, "addopts", '"' + " ".join(kept).replace('"', '\\"') + '"')
                changes.append(f"pyproject.toml addopts: {' '.join(tokens)!r} -> {' '.join(kept)!r}")
        if "required_plugins" in ini:
            new_text = _replace_toml_value(new_text, "required_plugins", "[]")
            changes.append("pyproject.toml required_plugins removed")
        if new_text != text:
            path.write_text(new_text, encoding="utf-8")
    for name, section in _ini_sections(root):
        path = root / name
        if not path.is_file():
            continue
        parser = configparser.RawConfigParser()
        try:
            parser.read_string(path.read_text(encoding="utf-8", errors="replace"))
        except configparser.Error:
            continue
        if not parser.has_section(section):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for key in ("addopts", "required_plugins"):
            if not parser.has_option(section, key):
                continue
            tokens = shlex.split(parser.get(section, key))
            kept = filter_addopts(tokens) if key == "addopts" else []
            if kept != tokens:
                text = _replace_ini_value(text, section, key, " ".join(kept))
                changes.append(f"{name} [{section}] {key}: {' '.join(tokens)!r} -> {' '.join(kept)!r}")
        path.write_text(text, encoding="utf-8")
    return changes


def _replace_toml_value(text: str, key: str, value: str) -> str:
    """Replace ``key = <value>`` inside [tool.pytest.ini_options] (a string or an array over
    several lines)."""
    section = re.search(r"^\[tool\.pytest\.ini_options\]\s*$", text, re.M)
    if section is None:
        return text
    m = re.compile(rf"^{key}\s*=\s*", re.M).search(text, section.end())
    if m is None:
        return text
    i = m.end()
    if text[i] == "[":
        depth, j = 0, i
        while j < len(text):
            depth += {"[": 1, "]": -1}.get(text[j], 0)
            if depth == 0:
                break
            j += 1
        end = j + 1
    elif text.startswith(('"""', "'''"), i):
        end = text.index(text[i:i + 3], i + 3) + 3
    else:
        end = text.find("\n", i)
        end = len(text) if end < 0 else end
    return text[:m.start()] + f"{key} = {value}" + text[end:]


def _replace_ini_value(text: str, section: str, key: str, value: str) -> str:
    lines = text.splitlines(keepends=True)
    out, in_section, skipping = [], False, False
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("[") and stripped.endswith("]"):
            in_section, skipping = stripped[1:-1].strip() == section, False
        elif skipping and (line[:1] in (" ", "\t")) and stripped:
            continue
        else:
            skipping = False
        if in_section and re.match(rf"\s*{key}\s*[=:]", line):
            out.append(f"{key} = {value}\n")
            skipping = True
            continue
        out.append(line)
    return "".join(out)
