"""Bugs made on the syntax tree: procedural families over a project's functions (libcst keeps
every byte of formatting that a mutation does not touch).

=================  ====================================================================
family             what it changes (one site inside one function)
=================  ====================================================================
comparison         ``<`` <-> ``<=``, ``>`` <-> ``>=``, ``==`` <-> ``!=``, ``in`` <-> ``not in``, ``is`` <-> ``is not``
arithmetic         ``+`` <-> ``-``, ``*`` <-> ``/``, ``//`` -> ``/``, ``%`` -> ``//``, shifts, bit operators
                   (and ``+=``...)
boolean            ``and`` <-> ``or``; ``not x`` -> ``x``
off_by_one         a slice bound or a ``range()`` argument one more or one less
constant           a number changed (0 <-> 1, n -> n + 1), ``True`` <-> ``False``
swap_args          a call's first two positional arguments swapped
remove_statement   one statement of a block removed (not a docstring, return or raise)
remove_branch      an ``else`` / ``elif`` branch removed
none_return        ``return X`` -> ``return None``
body               the function's body removed, its docstring kept ("implement this")
combo              two or three bugs above, in different functions (made by the pipeline)
=================  ====================================================================

Sites are enumerated per function in a fixed order; :func:`candidates` picks among them with
a seeded random generator, spread over families and functions, so the same project and seed
always give the same candidates in the same order.
"""

from __future__ import annotations

import difflib
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

__all__ = ["FAMILIES", "Mutation", "Site", "apply", "candidates", "sites", "unified_diff"]

FAMILIES = ("comparison", "arithmetic", "boolean", "off_by_one", "constant", "swap_args", "remove_statement",
            "remove_branch", "none_return", "body", "combo")

_CMP = {cst.LessThan: cst.LessThanEqual, cst.LessThanEqual: cst.LessThan, cst.GreaterThan: cst.GreaterThanEqual,
        cst.GreaterThanEqual: cst.GreaterThan, cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal, cst.In: cst.NotIn,
        cst.NotIn: cst.In, cst.Is: cst.IsNot, cst.IsNot: cst.Is}
_BIN = {cst.Add: cst.Subtract, cst.Subtract: cst.Add, cst.Multiply: cst.Divide, cst.Divide: cst.Multiply,
        cst.FloorDivide: cst.Divide, cst.Modulo: cst.FloorDivide, cst.LeftShift: cst.RightShift,
        cst.RightShift: cst.LeftShift, cst.BitAnd: cst.BitOr, cst.BitOr: cst.BitAnd, cst.BitXor: cst.BitOr,
        cst.Power: cst.Multiply}
_AUG = {cst.AddAssign: cst.SubtractAssign, cst.SubtractAssign: cst.AddAssign, cst.MultiplyAssign: cst.DivideAssign,
        cst.DivideAssign: cst.MultiplyAssign, cst.FloorDivideAssign: cst.DivideAssign,
        cst.BitOrAssign: cst.BitAndAssign, cst.BitAndAssign: cst.BitOrAssign}
_STRINGS = (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)


@dataclass(frozen=True)
class Site:
    """One place one family can change: in ``file``, inside ``function`` (its qualified name)."""

    file: str
    function: str
    family: str
    line: int
    index: int  # its place among the sites of the file, in enumeration order


@dataclass
class Mutation:
    """One or more sites changed together, and the result."""

    sites: list[Site]
    files: dict[str, str] = field(default_factory=dict)  # file -> mutated text

    @property
    def family(self) -> str:
        return self.sites[0].family if len(self.sites) == 1 else "combo"

    @property
    def functions(self) -> list[str]:
        return sorted({f"{s.file}:{s.function}" for s in self.sites})


def _op(old: cst.CSTNode, new_cls: type) -> cst.CSTNode:
    kwargs = {k: getattr(old, k) for k in ("whitespace_before", "whitespace_after") if hasattr(old, k) and
              k in new_cls.__dataclass_fields__}  # type: ignore[attr-defined]
    return new_cls(**kwargs)


def _plus_minus(expr: cst.BaseExpression, delta: int) -> cst.BaseExpression | None:
    if isinstance(expr, cst.Integer):
        try:
            value = int(expr.value.replace("_", ""), 0)
        except ValueError:
            return None
        return cst.Integer(str(max(value + delta, 0))) if value + delta >= 0 else None
    if isinstance(expr, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) or (
            isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, (cst.Add, cst.Subtract))
            and not expr.lpar):
        return cst.BinaryOperation(left=expr, operator=cst.Add() if delta > 0 else cst.Subtract(),
                                   right=cst.Integer("1"))
    if (isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus)
            and isinstance(expr.expression, cst.Integer)):
        return cst.UnaryOperation(operator=cst.Minus(), expression=cst.Integer(str(int(expr.expression.value) + 1)))
    return None


def _is_docstring(stmt: cst.CSTNode) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, _STRINGS))


class _Collector(cst.CSTVisitor):
    """Every site of every family, with the replacement it makes."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, file: str) -> None:
        self.file = file
        self.names: list[str] = []
        self.functions = 0
        self.skip = 0
        self.found: list[tuple[str, str, int, cst.CSTNode, Callable[[], cst.CSTNode | cst.RemovalSentinel | None]]] = []

    def _add(self, family: str, node: cst.CSTNode,
             make: Callable[[], cst.CSTNode | cst.RemovalSentinel | None]) -> None:
        if self.functions and not self.skip:
            line = int(self.get_metadata(PositionProvider, node).start.line)
            self.found.append((family, ".".join(self.names), line, node, make))

    # where we are
    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.names.append(node.name.value)

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self.names.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.names.append(node.name.value)
        self.functions += 1
        if self.functions == 1 and isinstance(node.body, cst.IndentedBlock):
            body = list(node.body.body)
            doc = body[:1] if body and _is_docstring(body[0]) else []
            if len(body) - len(doc) >= 2:
                raise_stmt = cst.parse_statement("raise NotImplementedError\n")
                self._add("body", node, lambda: node.with_changes(body=node.body.with_changes(body=[*doc, raise_stmt])))

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.names.pop()
        self.functions -= 1

    def visit_Annotation(self, node: cst.Annotation) -> None:
        self.skip += 1

    def leave_Annotation(self, node: cst.Annotation) -> None:
        self.skip -= 1

    def visit_Decorator(self, node: cst.Decorator) -> None:
        self.skip += 1

    def leave_Decorator(self, node: cst.Decorator) -> None:
        self.skip -= 1

    # the families
    def visit_Comparison(self, node: cst.Comparison) -> None:
        for i, target in enumerate(node.comparisons):
            new_cls = _CMP.get(type(target.operator))
            if new_cls is not None:
                def make(i: int = i, target: cst.ComparisonTarget = target, new_cls: type = new_cls) -> cst.CSTNode:
                    targets = list(node.comparisons)
                    targets[i] = target.with_changes(operator=_op(target.operator, new_cls))
                    return node.with_changes(comparisons=targets)
                self._add("comparison", node, make)

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        new_cls = _BIN.get(type(node.operator))
        if new_cls is None or (isinstance(node.operator, cst.Modulo) and isinstance(node.left, _STRINGS)):
            return
        self._add("arithmetic", node, lambda: node.with_changes(operator=_op(node.operator, new_cls)))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        new_cls = _AUG.get(type(node.operator))
        if new_cls is not None:
            self._add("arithmetic", node, lambda: node.with_changes(operator=_op(node.operator, new_cls)))

    def visit_BooleanOperation(self, node: cst.BooleanOperation) -> None:
        new_cls = cst.Or if isinstance(node.operator, cst.And) else cst.And
        self._add("boolean", node, lambda: node.with_changes(operator=_op(node.operator, new_cls)))

    def visit_UnaryOperation(self, node: cst.UnaryOperation) -> None:
        if isinstance(node.operator, cst.Not):
            self._add("boolean", node, lambda: node.expression.with_changes(lpar=node.lpar, rpar=node.rpar)
                      if not node.expression.lpar else node.expression)

    def visit_Slice(self, node: cst.Slice) -> None:
        for part in ("lower", "upper"):
            bound = getattr(node, part)
            if bound is not None:
                for delta in (1, -1):
                    new = _plus_minus(bound, delta)
                    if new is not None:
                        self._add("off_by_one", node, self._slice_change(node, part, new))

    @staticmethod
    def _slice_change(node: cst.Slice, part: str, new: cst.BaseExpression) -> Callable[[], cst.CSTNode]:
        return lambda: node.with_changes(**{part: new})

    def visit_Call(self, node: cst.Call) -> None:
        positional = [i for i, a in enumerate(node.args) if a.keyword is None and not a.star]
        if isinstance(node.func, cst.Name) and node.func.value == "range":
            for i in positional:
                new = _plus_minus(node.args[i].value, 1 if i == positional[-1] else -1)
                if new is not None:
                    def make(i: int = i, new: cst.BaseExpression = new) -> cst.CSTNode:
                        args = list(node.args)
                        args[i] = args[i].with_changes(value=new)
                        return node.with_changes(args=args)
                    self._add("off_by_one", node, make)
        elif len(positional) >= 2 and positional[:2] == [0, 1]:
            a, b = node.args[0], node.args[1]
            if cst.Module([]).code_for_node(a.value) != cst.Module([]).code_for_node(b.value):
                self._add("swap_args", node, lambda: node.with_changes(
                    args=[a.with_changes(value=b.value), b.with_changes(value=a.value), *node.args[2:]]))

    def visit_Integer(self, node: cst.Integer) -> None:
        try:
            value = int(node.value.replace("_", ""), 0)
        except ValueError:
            return
        new = {0: 1, 1: 0}.get(value, value + 1)
        self._add("constant", node, lambda: node.with_changes(value=str(new)))

    def visit_Float(self, node: cst.Float) -> None:
        try:
            value = float(node.value.replace("_", ""))
        except ValueError:
            return
        self._add("constant", node, lambda: node.with_changes(value=repr(value * 2 if value else 1.0)))

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in ("True", "False"):
            self._add("constant", node, lambda: node.with_changes(value="False" if node.value == "True" else "True"))

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        body = list(node.body)
        if len(body) < 2:
            return
        for stmt in body:
            if _is_docstring(stmt) or isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
                continue
            if isinstance(stmt, cst.SimpleStatementLine) and any(isinstance(s, (cst.Return, cst.Raise, cst.Pass,
                                                                                 cst.Import, cst.ImportFrom,
                                                                                 cst.Global, cst.Nonlocal))
                                                                 for s in stmt.body):
                continue
            self._add("remove_statement", stmt,
                      lambda stmt=stmt: cst.RemoveFromParent())  # type: ignore[misc]

    def visit_If(self, node: cst.If) -> None:
        if node.orelse is not None:
            self._add("remove_branch", node, lambda: node.with_changes(orelse=None))

    def visit_Return(self, node: cst.Return) -> None:
        if node.value is not None and not (isinstance(node.value, cst.Name) and node.value.value == "None"):
            self._add("none_return", node, lambda: node.with_changes(value=cst.Name("None")))


class _Replace(cst.CSTTransformer):
    def __init__(self, changes: dict[int, cst.CSTNode | cst.RemovalSentinel]) -> None:
        self.changes = changes

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> cst.CSTNode | cst.RemovalSentinel:  # type: ignore[override]
        new = self.changes.get(id(original_node))
        return updated_node if new is None else new


@dataclass
class _File:
    path: str
    text: str
    module: cst.Module
    found: list[tuple[Site, cst.CSTNode, Callable[[], cst.CSTNode | cst.RemovalSentinel | None]]]


_cache: dict[tuple[str, str], _File] = {}


def _parse(root: Path, rel: str) -> _File | None:
    text = (root / rel).read_text(encoding="utf-8")
    key = (rel, text)
    if key in _cache:
        return _cache[key]
    if not text.endswith("\n"):
        return None  # a unified diff of it would need "no newline" markers
    try:
        wrapper = MetadataWrapper(cst.parse_module(text))
    except (cst.ParserSyntaxError, RecursionError):
        return None
    collector = _Collector(rel)
    wrapper.visit(collector)
    found = [(Site(rel, function, family, line, i), node, make)
             for i, (family, function, line, node, make) in enumerate(collector.found)]
    parsed = _File(rel, text, wrapper.module, found)
    _cache[key] = parsed
    return parsed


def sites(root: Path, files: list[str]) -> list[Site]:
    """Every site in ``files`` (relative to ``root``), in a fixed order."""
    out: list[Site] = []
    for rel in files:
        parsed = _parse(root, rel)
        if parsed is not None:
            out.extend(s for s, _, _ in parsed.found)
    return out


def apply(root: Path, chosen: list[Site]) -> Mutation | None:
    """The files with every site in ``chosen`` changed (None when a change does not make a
    different, valid module)."""
    by_file: dict[str, list[Site]] = {}
    for s in chosen:
        by_file.setdefault(s.file, []).append(s)
    mutation = Mutation(sites=list(chosen))
    for rel, file_sites in by_file.items():
        parsed = _parse(root, rel)
        if parsed is None:
            return None
        changes: dict[int, cst.CSTNode | cst.RemovalSentinel] = {}
        for s in file_sites:
            _, node, make = parsed.found[s.index]
            if id(node) in changes:
                return None  # two bugs on one node
            new = make()
            if new is None:
                return None
            changes[id(node)] = new
        try:
            code = parsed.module.visit(_Replace(changes)).code
            compile(code, rel, "exec")
        except (SyntaxError, ValueError, TypeError, cst.CSTValidationError):
            return None
        if code == parsed.text:
            return None
        mutation.files[rel] = code
    return mutation


def candidates(all_sites: list[Site], seed: int, limit: int) -> list[list[Site]]:
    """Up to ``limit`` single-site candidates, spread round-robin over families and then
    functions, in a seeded order (combinations are made later from kept ones)."""
    rng = random.Random(seed)
    groups: dict[str, dict[str, list[Site]]] = {}
    for s in all_sites:
        groups.setdefault(s.family, {}).setdefault(f"{s.file}:{s.function}", []).append(s)
    queues: list[list[list[Site]]] = []
    for family in sorted(groups):
        functions = sorted(groups[family])
        rng.shuffle(functions)
        per_function = [list(groups[family][f]) for f in functions]
        for q in per_function:
            rng.shuffle(q)
        queues.append(per_function)
    rng.shuffle(queues)
    out: list[list[Site]] = []
    while len(out) < limit and any(any(q) for q in queues):
        for family_queue in queues:
            for q in family_queue:  # the next function of this family that has a site left
                if q:
                    out.append([q.pop()])
                    family_queue.append(family_queue.pop(family_queue.index(q)))
                    break
            if len(out) >= limit:
                break
    return out


def unified_diff(root: Path, mutation: Mutation, *, reverse: bool = False) -> str:
    """The mutation as a patch against the pristine files (``reverse``: the fix)."""
    parts = []
    for rel in sorted(mutation.files):
        old = (root / rel).read_text(encoding="utf-8").splitlines(keepends=True)
        new = mutation.files[rel].splitlines(keepends=True)
        a, b = (new, old) if reverse else (old, new)
        parts.append("".join(difflib.unified_diff(a, b, f"a/{rel}", f"b/{rel}", n=2)))
    return "".join(parts)
