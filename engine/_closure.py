"""The closure rule: inside a loop body, everything except DDS is read-only.

A body runs on many nodes and threads, and may be re-run by reconnaissance, replay
or a dual test; a write to a captured Python variable would be lost or applied a
different number of times on each of them.  So a body that assigns to a captured
non-DDS variable is rejected before it runs.

The check reads the body's source (``ast``) when it is available, which catches
``nonlocal``/``global`` rebinding and item/attribute assignment through a captured
object (``counts[k] += 1`` on a captured list).  Without source it falls back to the
bytecode, which still catches rebinding.  Mutating method calls (``lst.append``) are
not detected.
"""

from __future__ import annotations

import ast
import builtins
import dis
import inspect
import textwrap
from collections.abc import Callable
from typing import Any

from ._dds import _DDS
from ._errors import ClosureRuleError

_checked: dict[Any, None] = {}


def _where(fn: Callable[..., Any], lineno: int | None = None) -> str:
    code = fn.__code__
    return f"{code.co_filename}:{lineno or code.co_firstlineno}"


def _lookup(fn: Callable[..., Any], name: str) -> Any:
    code = fn.__code__
    if name in code.co_freevars and fn.__closure__ is not None:
        cell = fn.__closure__[code.co_freevars.index(name)]
        try:
            return cell.cell_contents
        except ValueError:
            return None
    if name in fn.__globals__:
        return fn.__globals__[name]
    return getattr(builtins, name, None)


def _fail(op: str, fn: Callable[..., Any], name: str, value: Any, lineno: int | None) -> None:
    what = type(value).__name__ if value is not None else "variable"
    raise ClosureRuleError(
        f"{op!r}: the loop body assigns to captured variable {name!r} ({what}) at "
        f"{_where(fn, lineno)}; inside a loop body only DDS elements may be written "
        f"(closure rule). Make {name!r} a DDS, or compute it after the loop with ap.reduce"
    )


def _holds_only_dds(value: Any) -> bool:
    items = value.values() if isinstance(value, dict) else value
    if not isinstance(value, (tuple, list, dict)) or not items:
        return False
    return all(isinstance(v, _DDS) for v in items)


def _base_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _check_ast(op: str, fn: Callable[..., Any], tree: ast.AST, line0: int) -> bool:
    func = next(
        (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.Lambda))),
        None,
    )
    if func is None:
        return False
    if isinstance(func, ast.Lambda):
        return True  # a lambda cannot assign (a walrus binds a lambda-local name)
    declared: set[str] = set()
    local: set[str] = {a.arg for a in ast.walk(func.args) if isinstance(a, ast.arg)}
    for node in ast.walk(func):
        if isinstance(node, (ast.Nonlocal, ast.Global)):
            declared.update(node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            local.add(node.id)
    local -= declared
    for node in ast.walk(func):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        flat: list[ast.AST] = []
        while targets:
            t = targets.pop()
            if isinstance(t, (ast.Tuple, ast.List)):
                targets.extend(t.elts)
            elif isinstance(t, ast.Starred):
                targets.append(t.value)
            else:
                flat.append(t)
        for t in flat:
            lineno = line0 + getattr(t, "lineno", 1) - 1
            if isinstance(t, ast.Name):
                if t.id in declared:
                    _fail(op, fn, t.id, _lookup(fn, t.id), lineno)
                continue
            name = _base_name(t)
            if name is None or name in local:
                continue
            value = _lookup(fn, name)
            if isinstance(t, ast.Subscript):
                if isinstance(t.value, ast.Name) and isinstance(value, _DDS):
                    continue
                if isinstance(t.value, ast.Subscript) and _holds_only_dds(value):
                    continue  # D[k][i] = v where D is a tuple/list/dict of DDS
            _fail(op, fn, name, value, lineno)
    return True


def _check_bytecode(op: str, fn: Callable[..., Any]) -> None:
    code = fn.__code__
    for ins in dis.get_instructions(code):
        if ins.opname == "STORE_GLOBAL" or (
            ins.opname == "STORE_DEREF" and ins.argval in code.co_freevars
        ):
            _fail(op, fn, ins.argval, _lookup(fn, ins.argval), ins.positions.lineno)


def check_body(op: str, fn: Callable[..., Any]) -> None:
    """Raise :class:`ClosureRuleError` if ``fn`` writes a captured non-DDS variable."""
    code = getattr(fn, "__code__", None)
    if code is None:
        if not callable(fn):
            raise TypeError(f"{op!r}: the loop body must be callable, got {type(fn).__name__}")
        return
    key = (code, tuple(id(_lookup(fn, n)) for n in code.co_freevars))
    if key in _checked:
        return
    _check_bytecode(op, fn)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        tree = None  # no source (REPL, exec): the bytecode check above still applies
    if tree is not None:
        _check_ast(op, fn, tree, code.co_firstlineno)
    if len(_checked) > 4096:
        _checked.clear()
    _checked[key] = None


__all__ = ["check_body"]
