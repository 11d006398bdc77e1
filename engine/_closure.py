"""The closure rule: inside a loop body, everything except DDS is read-only.

A body runs on many nodes and threads, and may be re-run by reconnaissance, replay
or a dual test; a change to a captured Python object would be lost or applied a
different number of times on each of them.  Two checks enforce the rule:

* **Static, before the body runs** (:func:`check_body`).  The body's source (``ast``),
  when available, catches ``nonlocal``/``global`` rebinding and item/attribute
  assignment through a captured object (``counts[k] += 1`` on a captured list); without
  source the bytecode still catches rebinding.
* **Dynamic, while bodies run** (:func:`guard`).  Mutation through calls —
  ``seen.append(j)``, ``np.add.at(counts, idx, 1)``, ``d.setdefault(k, [])``, a helper
  that appends to a module-level list — is invisible to the first check.  Under
  reconnaissance (every first invocation), checked mode and test mode (dual tests), the
  body is wrapped in a :class:`BodyGuard` that fingerprints every non-DDS object the
  body can reach before the first body and after each one; what it covers is listed at
  the head of that section.  Normal execution after reconnaissance runs the bare body.
"""

from __future__ import annotations

import array
import ast
import builtins
import collections
import contextlib
import dis
import functools
import hashlib
import inspect
import os
import site
import sys
import sysconfig
import textwrap
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

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


# ====================================================================== mutation through calls
# The static check above cannot see ``seen.append(j)``, ``np.add.at(counts, idx, 1)`` or a
# helper that appends to a module-level list.  So, whenever bodies run under
# reconnaissance, checked mode or test mode, the body is wrapped in a guard that
# fingerprints every non-DDS object the body can reach before the first body and compares
# after each one.  The reachable *roots* are computed once per body function: its closure
# cells, the globals its code names, its default arguments, and the same, transitively, for
# the user functions it can call (see ``_user_file``), for user classes and modules it names
# (only the attributes its code names) and for methods of captured user objects.

_EMPTY = object()

#: Containers nested deeper than this below a root are not descended into (cost vs. reach).
MAX_DEPTH = 12
#: Objects descended into per fingerprint before it stops descending (cost vs. reach); the
#: identity of every element of a container already visited is still compared.
MAX_OBJECTS = 20_000
#: User functions followed from one body (helpers calling helpers); cost vs. reach.
MAX_FUNCTIONS = 200

_ROOT = Path(__file__).resolve().parent.parent
_OWN = tuple(str(_ROOT / p) + os.sep for p in ("engine", "tracer", "replay", "tui"))


def _library_dirs() -> tuple[str, ...]:
    dirs: set[str] = set()
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}:
        vars_ = {"base": prefix, "platbase": prefix, "installed_base": prefix}
        for key in ("stdlib", "platstdlib", "purelib", "platlib"):
            with contextlib.suppress(KeyError):
                dirs.add(sysconfig.get_path(key, vars=vars_))
    with contextlib.suppress(AttributeError):
        dirs.update(site.getsitepackages())
    with contextlib.suppress(AttributeError):
        dirs.add(site.getusersitepackages())
    return tuple(os.path.realpath(d) + os.sep for d in dirs if d)


_LIBS: tuple[str, ...] = ()


@functools.lru_cache(maxsize=4096)
def _user_file(filename: str) -> bool:
    """True for code the user wrote (their modules, tests, ``apps``, code built with
    ``exec``); False for the standard library, site-packages and engine/tracer/replay/tui."""
    global _LIBS
    if filename.startswith("<"):
        return not filename.startswith("<frozen")
    if not _LIBS:
        _LIBS = _library_dirs()
    path = os.path.realpath(filename)
    return not path.startswith(_LIBS) and not path.startswith(_OWN)


_user_types: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


def _user_module(mod: Any) -> bool:
    if not isinstance(mod, types.ModuleType):
        return False
    file = getattr(mod, "__file__", None)
    return isinstance(file, str) and _user_file(file)


def _user_type(tp: type) -> bool:
    """Classes defined in user code (instances are fingerprinted through ``__dict__``)."""
    got = _user_types.get(tp)
    if got is None:
        name = getattr(tp, "__module__", None)
        mod = sys.modules.get(name) if isinstance(name, str) else None
        if mod is None:
            got = name not in sys.builtin_module_names and name != "builtins"
        else:
            got = _user_module(mod)
        got = got or tp is types.SimpleNamespace
        with contextlib.suppress(TypeError):
            _user_types[tp] = got
    return got


def _user_function(fn: Any) -> bool:
    code = getattr(fn, "__code__", None)
    return isinstance(fn, types.FunctionType) and _user_file(code.co_filename)


@dataclass(frozen=True, slots=True)
class _Root:
    """A place a body can reach: ``holder[key]`` (a namespace), a cell, or a fixed value."""

    label: str
    kind: str  # "cell" | "name" | "value"
    holder: Any
    key: Any = None
    note: str = ""
    via: tuple[str, ...] = ()

    def read(self) -> Any:
        if self.kind == "cell":
            try:
                return self.holder.cell_contents
            except ValueError:
                return _EMPTY
        if self.kind == "name":
            return self.holder.get(self.key, _EMPTY)
        return self.holder

    def describe(self) -> str:
        """``'seen' (list)``, ``'helpers.CACHE' (dict) via helper()``."""
        value = self.read()
        what = "deleted" if value is _EMPTY else type(value).__name__
        note = f", {self.note}" if self.note else ""
        via = f" via {' -> '.join(f'{v}()' for v in self.via)}" if self.via else ""
        return f"{self.label} ({what}{note}){via}"


def _short(fn: Any) -> str:
    """``Stats.note``, ``helper``; the ``outer.<locals>.`` part of nested functions dropped."""
    return fn.__qualname__.rsplit("<locals>.", 1)[-1]


def _names(code: types.CodeType) -> set[str]:
    """Names used by ``code`` and the code objects nested in it (lambdas, comprehensions)."""
    names: set[str] = set()
    stack = [code]
    while stack:
        c = stack.pop()
        names.update(c.co_names)
        stack += [k for k in c.co_consts if isinstance(k, types.CodeType)]
    return names


class _Collector:
    """Breadth-first walk from the body to every root it reaches (shortest ``via`` first)."""

    def __init__(self) -> None:
        self.roots: list[_Root] = []
        self.seen: set[tuple[Any, ...]] = set()
        self.queue: list[tuple[Any, tuple[str, ...]]] = []
        self.fns: set[int] = set()

    def function(self, fn: Any, via: tuple[str, ...]) -> None:
        if id(fn) in self.fns or len(self.fns) >= MAX_FUNCTIONS:
            return
        self.fns.add(id(fn))
        self.queue.append((fn, via))

    def run(self, body: Any) -> list[_Root]:
        self.function(body, ())
        while self.queue:
            fn, via = self.queue.pop(0)
            self._visit(fn, via)
        return self.roots

    def _add(self, key: tuple[Any, ...], root: _Root, names: set[str], via: tuple[str, ...]):
        if key in self.seen:
            return
        self.seen.add(key)
        self.roots.append(root)
        self._expand(root.read(), names, via)

    def _visit(self, fn: Any, via: tuple[str, ...]) -> None:
        code = fn.__code__
        names = _names(code)
        g = fn.__globals__
        modname = g.get("__name__", "?")
        for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=False):
            root = _Root(repr(name), "cell", cell, via=via)
            self._add(("cell", id(cell)), root, names, via)
        for name in sorted(names):
            if name in g:
                label = repr(name) if not via else repr(f"{modname}.{name}")
                root = _Root(label, "name", g, name, via=via)
                self._add(("name", id(g), name), root, names, via)
        argnames = code.co_varnames[: code.co_argcount]
        for k, v in enumerate(fn.__defaults__ or ()):
            arg = argnames[len(argnames) - len(fn.__defaults__) + k]
            note = f"default argument of {_short(fn)}"
            root = _Root(repr(arg), "value", v, note=note, via=via)
            self._add(("value", id(fn), k), root, names, via)
        for arg, v in (fn.__kwdefaults__ or {}).items():
            note = f"default argument of {_short(fn)}"
            root = _Root(repr(arg), "value", v, note=note, via=via)
            self._add(("value", id(fn), arg), root, names, via)

    def _expand(self, v: Any, names: set[str], via: tuple[str, ...]) -> None:
        """Follow what a root's value lets the code reach beyond the value itself."""
        if isinstance(v, _DDS) or v is _EMPTY:
            return
        if isinstance(v, types.MethodType):
            v = v.__func__
        elif isinstance(v, functools.partial):
            v = v.func
        if isinstance(v, types.FunctionType):
            if _user_function(v):
                self.function(v, (*via, _short(v)))
            return
        if isinstance(v, types.ModuleType):
            if _user_module(v):
                ns, prefix = vars(v), v.__name__
                for name in sorted(names):
                    if name in ns and not name.startswith("__"):
                        root = _Root(repr(f"{prefix}.{name}"), "name", ns, name, via=via)
                        self._add(("name", id(ns), name), root, names, via)
            return
        tp = v if isinstance(v, type) else type(v)
        if not _user_type(tp):
            return
        for klass in tp.__mro__:
            if not _user_type(klass) or klass is types.SimpleNamespace:
                continue
            ns = klass.__dict__
            for name in sorted(names | {"__call__"}):
                if name not in ns:
                    continue
                attr = ns[name]
                if isinstance(attr, (staticmethod, classmethod)):
                    attr = attr.__func__
                if isinstance(attr, property):
                    for f in (attr.fget, attr.fset, attr.fdel):
                        if _user_function(f):
                            self.function(f, (*via, _short(f)))
                elif isinstance(attr, types.FunctionType):
                    if _user_function(attr):
                        self.function(attr, (*via, _short(attr)))
                elif not name.startswith("__"):  # a class attribute: Registry.items
                    label = repr(f"{klass.__qualname__}.{name}")
                    root = _Root(label, "name", ns, name, via=via)
                    self._add(("name", id(ns), name), root, names, via)


_roots_cache: dict[tuple[Any, ...], tuple[Any, list[_Root]]] = {}


def reachable(fn: Callable[..., Any]) -> list[_Root]:
    """The roots body ``fn`` can reach, cached by code object, closure cells, globals
    and defaults (the cache keeps those alive, so their ids stay unique while cached)."""
    code = fn.__code__
    pins = (fn.__closure__, fn.__globals__, fn.__defaults__, fn.__kwdefaults__)
    key = (code, *(id(p) for p in pins))
    got = _roots_cache.get(key)
    if got is not None:
        return got[1]
    roots = _Collector().run(fn)
    if len(_roots_cache) > 256:
        _roots_cache.clear()
    _roots_cache[key] = (pins, roots)
    return roots


_ATOMIC: frozenset[type] = frozenset(
    {
        int,
        float,
        complex,
        str,
        bytes,
        bool,
        type(None),
        type(...),
        range,
        types.FunctionType,
        types.ModuleType,
        types.CodeType,
        type,
        np.float64,
        np.float32,
        np.int64,
        np.int32,
        np.bool_,
        np.dtype,
    }
)
_ATOMIC_BASES = (int, float, complex, str, bytes, type(None), np.generic, type, np.dtype)


class _Fingerprint:
    """One pass over the roots.  Tokens are ids and digests, never values, so NaN and
    objects with odd ``__eq__`` compare correctly; ``keep`` holds what the ids name, so no id
    is reused while the fingerprint is alive."""

    __slots__ = ("keep", "seen", "budget")

    def __init__(self) -> None:
        self.keep: list[Any] = []
        self.seen: set[int] = set()
        self.budget = MAX_OBJECTS

    def of(self, values: list[Any]) -> list[list[Any]]:
        """Tokens of each root value."""
        out = []
        for v in values:
            toks: list[Any] = []
            self.value(v, toks, 0)
            out.append(toks)
        return out

    def value(self, v: Any, out: list[Any], depth: int) -> None:
        tp = type(v)
        out.append(id(v))
        if tp in _ATOMIC or isinstance(v, _DDS):
            return
        if id(v) in self.seen or depth > MAX_DEPTH or self.budget <= 0:
            return
        self.seen.add(id(v))
        self.budget -= 1
        if isinstance(v, np.ndarray):
            self.array(v, out, depth)
        elif isinstance(v, (list, tuple, collections.deque)):
            self.items(list(v), out, depth)
        elif isinstance(v, dict):
            keys = list(v)
            self.keep.append(keys)
            out.append(tuple(map(id, keys)))
            self.items(list(v.values()), out, depth)
        elif isinstance(v, (set, frozenset)):
            members = tuple(v)
            self.keep.append(members)
            out.append(frozenset(map(id, members)))
        elif isinstance(v, (bytearray, array.array)):
            out.append(hashlib.blake2b(v).digest())
        elif isinstance(v, (types.MethodType, types.BuiltinFunctionType)):
            owner = getattr(v, "__self__", None)  # seen.append: fingerprint seen
            if owner is not None and not isinstance(owner, types.ModuleType):
                self.value(owner, out, depth + 1)
        elif isinstance(v, functools.partial):
            self.items([v.func, v.args, v.keywords], out, depth)
        elif isinstance(v, _ATOMIC_BASES):
            return
        if _user_type(tp):
            self.instance(v, tp, out, depth)

    def items(self, items: list[Any], out: list[Any], depth: int) -> None:
        self.keep.append(items)
        out.append(tuple(map(id, items)))
        if set(map(type, items)) <= _ATOMIC:
            return
        for x in items:
            if type(x) not in _ATOMIC:
                self.value(x, out, depth + 1)

    def array(self, a: np.ndarray, out: list[Any], depth: int) -> None:
        out.append((a.shape, a.dtype.str, a.strides))
        if a.dtype.hasobject:
            self.items(a.ravel().tolist(), out, depth)
            return
        c = a if a.flags.c_contiguous else np.ascontiguousarray(a)
        out.append(hashlib.blake2b(c.data, digest_size=16).digest())

    def instance(self, v: Any, tp: type, out: list[Any], depth: int) -> None:
        d = getattr(v, "__dict__", None)
        if isinstance(d, dict):
            self.value(d, out, depth + 1)
        for klass in tp.__mro__:
            for slot in klass.__dict__.get("__slots__", ()):
                if isinstance(slot, str) and slot not in ("__dict__", "__weakref__"):
                    self.value(getattr(v, slot, _EMPTY), out, depth + 1)


class BodyGuard:
    """A loop body wrapped so that a change to anything it reaches, other than DDS, is a
    :class:`ClosureRuleError` naming what changed and the first index that changed it.

    The baseline is taken when the guard is made (before the first body of an invocation)
    and compared after every call.  Bodies on several threads share one guard; the index
    named is then the body that finished when the change was seen.
    """

    __slots__ = ("fn", "op", "kind", "inv", "what", "roots", "values", "deep", "base", "_keep")

    def __init__(self, fn: Callable[..., Any], op: str, kind: str, inv: int, what: str) -> None:
        self.fn = fn
        self.op = op
        self.kind = kind
        self.inv = inv
        self.what = what
        self.roots = reachable(fn)
        # roots holding immutable values or DDS only need an identity check per body
        self.values = [r.read() for r in self.roots]
        self.deep = [
            k
            for k, v in enumerate(self.values)
            if type(v) not in _ATOMIC and not isinstance(v, _DDS) and v is not _EMPTY
        ]
        fp = _Fingerprint()
        self.base = fp.of([self.values[k] for k in self.deep])
        self._keep = fp.keep

    def __call__(self, arg: Any) -> Any:
        out = self.fn(arg)
        self.check(arg)
        return out

    def check(self, arg: Any) -> None:
        """Raise :class:`ClosureRuleError` if a root changed since the baseline."""
        now = [r.read() for r in self.roots]
        for k, (a, b) in enumerate(zip(now, self.values, strict=True)):
            if a is not b:
                self._fail(k, arg)
        if self.deep:
            toks = _Fingerprint().of([now[k] for k in self.deep])
            if toks != self.base:
                k = next(i for i, (a, b) in enumerate(zip(toks, self.base, strict=True)) if a != b)
                self._fail(self.deep[k], arg)

    def _fail(self, k: int, arg: Any) -> None:
        index = getattr(arg, "number", arg)
        raise ClosureRuleError(
            f"{self.kind} {self.op!r}: the loop body changed {self.roots[k].describe()} at "
            f"{self.what} {index} (invocation {self.inv}); inside a loop body everything "
            "except DDS is read-only (closure rule), and on other nodes, threads or replays "
            "that change would be lost or made a different number of times. Keep the state "
            "in a DDS, or build it in the driver after the loop"
        )


def guard(
    fn: Callable[..., Any], op: str, inv: int, *, kind: str = "async_for", what: str = "index"
) -> Callable[..., Any]:
    """``fn`` wrapped in a :class:`BodyGuard` (``fn`` itself when it is not a Python
    function or reaches nothing to check)."""
    if not isinstance(fn, types.FunctionType) or not reachable(fn):
        return fn
    return BodyGuard(fn, op, kind, inv, what)


__all__ = ["BodyGuard", "check_body", "guard", "reachable"]
