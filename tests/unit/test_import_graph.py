"""The package's import graph has no cycle, counting imports made inside functions too (only
``if TYPE_CHECKING:`` imports are left out): a cycle is two modules that each need the other,
which is how a second path for one thing starts."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from ..conftest import ROOT

PACKAGES = ("envkit", "registry_server", "rl_runner")


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            if "incontainer" in path.parts:  # run inside sandboxes, by the base image's python3
                continue
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            mods[name] = path
    return mods


def _graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in mods.items():
        tree = ast.parse(path.read_text())
        type_only = {id(n) for top in ast.walk(tree)
                     if isinstance(top, ast.If) and "TYPE_CHECKING" in ast.unparse(top.test)
                     for n in ast.walk(top)}
        for node in ast.walk(tree):
            if id(node) in type_only:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            for target in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def _cycle(graph: dict[str, set[str]], nodes: list[str]) -> list[str] | None:
    """One cycle, as the path that closes it, or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in nodes:
        if start in state:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_no_module_imports_one_that_imports_it_back():
    mods = _modules()
    assert len(mods) > 50
    assert _cycle(_graph(mods), sorted(mods)) is None


def test_the_check_finds_a_cycle_when_there_is_one():
    graph: dict[str, set[str]] = defaultdict(set, {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert _cycle(graph, ["d", "a", "b", "c"]) == ["a", "b", "c", "a"]


def test_no_in_container_file_is_named_like_a_standard_library_module():
    """helper.py puts its own folder first on the path (so nothing later can shadow its
    modules): a file there named like a standard-library module would shadow that one."""
    import sys

    folder = ROOT / "envkit" / "sandbox" / "incontainer"
    names = {p.stem for p in folder.iterdir() if p.suffix == ".py" or p.is_dir()} - {"__pycache__"}
    assert names and not names & set(sys.stdlib_module_names)
