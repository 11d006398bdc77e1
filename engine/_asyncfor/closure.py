"""The closure rule: inside a loop body, everything except DDS is read-only.

A body runs on many nodes and threads, and may be re-run by reconnaissance, replay
or a dual test; a change to a captured Python object would be lost or applied a
different number of times on each of them.  Two checks enforce the rule:

* **Static, before the body runs** (:func:`check_body`).  The body's source (``ast``),
  when available, catches ``nonlocal``/``global`` rebinding and item/attribute
  assignment through a captured object (``counts[k] += 1`` on a captured list); without
  source the bytecode still catches rebinding.  The source is read once per body code;
  what each subscript target holds (a DDS or not) is looked up again at every invocation.
* **Dynamic, while bodies run** (:func:`guard`).  Mutation through calls —
  ``seen.append(j)``, ``np.add.at(counts, idx, 1)``, ``d.setdefault(k, [])``, a helper
  that appends to a module-level list — is invisible to the first check.  Under
  reconnaissance (every first invocation), checked mode and test mode (dual tests), the
  body is wrapped in a :class:`BodyGuard` that fingerprints every non-DDS object the
  body can reach before the first body and after each one; what it covers is listed at
  the head of that section.  Normal execution after reconnaissance runs the bare body,
  and :func:`watch`/:func:`verify` compare what it reaches once before and once after
  each invocation (the index is then unknown; checked mode names it).
"""

from __future__ import annotations

import array
import ast
import builtins
import collections
import contextlib
import dis
import functools
import inspect
import itertools
import operator
import os
import random
import site
import sys
import sysconfig
import textwrap
import threading
import time
import types
import weakref
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from .._data.dds import _DDS
from .._data.values import IMMUTABLE, attributes, slot_values
from .._errors import ClosureRuleError, DriverCapturesDivergedError, _shown
from .._runtime.session import AFTER_RUN

#: What :func:`check_body` found in each body's code (see :class:`_Target`).
_plans: dict[tuple[types.CodeType, bool], list[_Target]] = {}


def _where(fn: Callable[..., Any], lineno: int | None = None) -> str:
    code = fn.__code__
    return f"{code.co_filename}:{lineno or code.co_firstlineno}"


def _func_of(fn: Any) -> Any:
    """The function of a bound method body (``trainer.step``), else ``fn`` itself."""
    return fn.__func__ if isinstance(fn, types.MethodType) else fn


def _bound_name(fn: Any) -> str | None:
    """The name of the parameter a bound method's object fills (``self``), else None."""
    if not isinstance(fn, types.MethodType):
        return None
    code = fn.__code__
    return code.co_varnames[0] if code.co_argcount else None


def _lookup(fn: Callable[..., Any], name: str) -> Any:
    code = fn.__code__
    if name == _bound_name(fn):
        return fn.__self__  # type: ignore[attr-defined]
    if name in code.co_freevars and fn.__closure__ is not None:
        cell = fn.__closure__[code.co_freevars.index(name)]
        try:
            return cell.cell_contents
        except ValueError:
            return None
    if name in fn.__globals__:
        return fn.__globals__[name]
    return getattr(builtins, name, None)


def _fail(
    who: str, fn: Callable[..., Any], name: str, value: Any, lineno: int | None, part: str = ""
) -> None:
    """``who``: ``'sgd': the loop body``; ``part``: what the body assigns to inside
    ``name`` (``self.count``), if not all."""
    what = type(value).__name__ if value is not None else "variable"
    into = f" through {part}" if part and part != name else ""
    raise ClosureRuleError(
        f"{who} assigns to captured variable {name!r} ({what}){into} at "
        f"{_where(fn, lineno)}; only DDS elements may be written there (closure rule). "
        f"Make {part or name!r} a DDS, or compute it after the loop with ap.reduce"
    )


_UNKNOWN = object()


def _instance_attribute(owner: Any, name: str) -> Any:
    """``owner.name`` when it is a plain entry of the instance ``__dict__`` that no class
    attribute can override (what :func:`inspect.getattr_static` would find, at a fifth of
    its cost: this runs at every loop invocation), else :data:`_UNKNOWN`."""
    for klass in type(owner).__mro__:
        if name in klass.__dict__:
            return _UNKNOWN
    try:
        d = object.__getattribute__(owner, "__dict__")
    except AttributeError:
        return _UNKNOWN
    return d[name] if isinstance(d, dict) and name in d else _UNKNOWN


def _resolve(node: ast.AST, fn: Callable[..., Any]) -> Any:
    """The value a name or attribute chain (``X``, ``self.model.W``) of the body refers
    to, looked up without running code (no properties, no ``__getattr__``)."""
    if isinstance(node, ast.Name):
        return _lookup(fn, node.id)
    if isinstance(node, ast.Attribute):
        owner = _resolve(node.value, fn)
        if owner is not _UNKNOWN:
            got = _instance_attribute(owner, node.attr)
            if got is not _UNKNOWN:
                return got
            with contextlib.suppress(AttributeError):
                got = inspect.getattr_static(owner, node.attr)
                if isinstance(got, types.MemberDescriptorType):  # a slot
                    return got.__get__(owner)
                if not hasattr(type(got), "__get__") or isinstance(got, types.FunctionType):
                    return got
    return _UNKNOWN  # a property or other descriptor: only running it would tell


def _holds_only_dds(value: Any) -> bool:
    items = value.values() if isinstance(value, dict) else value
    if not isinstance(value, (tuple, list, dict)) or not items:
        return False
    return all(isinstance(v, _DDS) for v in items)


def _base_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


@dataclass(frozen=True)
class _Target:
    """A subscript assignment of a body (``X[i] = v``, ``self.W[u] += v``, ``D[k][i] = v``)
    through captured name ``name``: allowed or not by what the names hold at each
    invocation, so it is checked again at each one (:func:`check_body`)."""

    name: str
    lineno: int
    into: ast.AST  # what is subscripted: ``X``, ``self.W``, ``D[k]``
    part: ast.AST  # the same without subscripts: ``X``, ``self.W``, ``D``


def _targets(who: str, fn: Callable[..., Any], tree: ast.AST, line0: int) -> list[_Target]:
    """Refuse the assignments of body ``fn`` that break the closure rule whatever its
    names hold (rebinding a captured name, assigning an attribute of a captured object);
    return the subscript assignments through captured names, which depend on it."""
    func = next(
        (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.Lambda))),
        None,
    )
    if func is None or isinstance(func, ast.Lambda):
        return []  # a lambda cannot assign (a walrus binds a lambda-local name)
    declared: set[str] = set()
    local: set[str] = {a.arg for a in ast.walk(func.args) if isinstance(a, ast.arg)}
    stored: set[str] = set()
    for node in ast.walk(func):
        if isinstance(node, (ast.Nonlocal, ast.Global)):
            declared.update(node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            stored.add(node.id)
    local = (local | stored) - declared
    bound = _bound_name(fn)
    if bound is not None and bound not in stored:
        local.discard(bound)  # ``self`` of a bound method body is captured, not a local
    out: list[_Target] = []
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
                    _fail(who, fn, t.id, _lookup(fn, t.id), lineno)
                continue
            name = _base_name(t)
            if name is None or name in local:
                continue
            part = t  # what is assigned to, without the subscripts
            while isinstance(part, ast.Subscript):
                part = part.value
            if isinstance(t, ast.Subscript):
                out.append(_Target(name, lineno, t.value, part))
            else:
                _fail(who, fn, name, _lookup(fn, name), lineno, ast.unparse(part))
    return out


def _check_targets(who: str, fn: Callable[..., Any], targets: list[_Target]) -> None:
    for t in targets:
        into = _resolve(t.into, fn)
        if isinstance(into, _DDS) or (into is _UNKNOWN and isinstance(t.into, ast.Attribute)):
            continue  # X[i] = v, self.W[u] = v; a property's: the guard will see
        if isinstance(t.into, ast.Subscript) and _holds_only_dds(_resolve(t.part, fn)):
            continue  # D[k][i] = v where D is a tuple/list/dict of DDS
        _fail(who, fn, t.name, _lookup(fn, t.name), t.lineno, ast.unparse(t.part))


def _check_bytecode(who: str, fn: Callable[..., Any]) -> None:
    code = fn.__code__
    for ins in dis.get_instructions(code):
        if ins.opname == "STORE_GLOBAL" or (
            ins.opname == "STORE_DEREF" and ins.argval in code.co_freevars
        ):
            lineno = ins.positions.lineno if ins.positions is not None else None
            _fail(who, fn, ins.argval, _lookup(fn, ins.argval), lineno)


def check_body(op: str, fn: Callable[..., Any], subject: str = "the loop body") -> None:
    """Raise :class:`ClosureRuleError` if ``fn`` writes a captured non-DDS variable;
    ``subject`` names ``fn`` in the message.

    What the code does is checked once per code object (and whether it is a bound
    method); whether each subscript assignment writes a DDS depends on what the names
    hold now, so that part is checked at every call (a few microseconds a target)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        if not callable(fn):
            raise TypeError(f"{op!r}: {subject} must be callable, got {type(fn).__name__}")
        return
    who = f"{op!r}: {subject}"
    key = (code, isinstance(fn, types.MethodType))
    targets = _plans.get(key)
    if targets is None:
        _check_bytecode(who, fn)
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        except (OSError, TypeError, SyntaxError):
            tree = None  # no source (REPL, exec): the bytecode check above still applies
        targets = [] if tree is None else _targets(who, fn, tree, code.co_firstlineno)
        if len(_plans) > 1024:
            _plans.clear()
        _plans[key] = targets
    _check_targets(who, fn, targets)


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
#: User functions followed from one body (helpers calling helpers), and user objects
#: whose attributes are followed; cost vs. reach.
MAX_FUNCTIONS = 200
#: Containers with more elements are summarised (length, and the identities of the first
#: and last few elements) instead of compared element by element; cost vs. reach.
LARGE_ITEMS = 1024
_ENDS = 16
#: Arrays up to this size are copied and compared byte for byte after every body; larger
#: ones are write-protected while bodies run and compared with one baseline copy every
#: few bodies and after the last (a copy per body would cost more than the body), so a
#: change the write flag misses is reported as a range of bodies.
COPY_BYTES = 64 * 1024

#: Comparing contents after every body may cost up to this share of the first body's time;
#: when it would cost more it runs every few bodies (and after the last), so a change is
#: still caught but named as a range of bodies.  Cost vs. precision of the index.
CHECK_SHARE = 1.0
#: The most bodies between two comparisons of contents.
MAX_EVERY = 1000
#: Bodies between two reads of the global generators' state (a read costs tens of
#: microseconds; a draw changes the state for good, so none is missed, only located less
#: precisely).
RNG_EVERY = 16

_ROOT = Path(__file__).resolve().parents[2]
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
    return isinstance(fn, types.FunctionType) and _user_file(fn.__code__.co_filename)


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

    def reader(self) -> Callable[[], Any]:
        """:meth:`read` as a C-level callable (a ``ValueError`` for an emptied cell)."""
        if self.kind == "cell":
            return functools.partial(getattr, self.holder, "cell_contents")
        if self.kind == "name":
            return functools.partial(self.holder.get, self.key, _EMPTY)
        return functools.partial(operator.itemgetter(0), (self.holder,))

    def describe(self) -> str:
        """``'seen' (list)``, ``'CACHE' (dict, global in helpers.py) via helper()``."""
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
        self.names: set[str] = set()  # every name the code of the visited functions uses
        # user objects reached, with the attribute names already followed on each
        self.instances: dict[int, tuple[Any, tuple[str, ...], set[str]]] = {}

    def function(self, fn: Any, via: tuple[str, ...]) -> None:
        if id(fn) in self.fns or len(self.fns) >= MAX_FUNCTIONS:
            return
        self.fns.add(id(fn))
        self.queue.append((fn, via))

    def run(self, body: Any) -> list[_Root]:
        fn = _func_of(body)
        self.function(fn, ())
        if fn is not body:  # self.step: the instance is a root too
            root = _Root(repr(_bound_name(body) or "self"), "value", body.__self__)
            self._add(("value", id(body.__self__)), root, _names(fn.__code__), ())
        grew = True
        while grew:
            while self.queue:
                fn, via = self.queue.pop(0)
                self._visit(fn, via)
            # an attribute some reached code names (self.callback, self.model) may be
            # read on any object reached: follow what it holds, until nothing is new
            grew = False
            for obj, via, done in list(self.instances.values()):
                attrs = attributes(obj) or {}
                for name in sorted(self.names.intersection(attrs).difference(done)):
                    done.add(name)
                    grew = True
                    self._expand(attrs[name], self.names, via)
        return self.roots

    def _add(
        self, key: tuple[Any, ...], root: _Root, names: set[str], via: tuple[str, ...]
    ) -> None:
        if key in self.seen:
            return
        self.seen.add(key)
        self.roots.append(root)
        self._expand(root.read(), names, via)

    def _visit(self, fn: Any, via: tuple[str, ...]) -> None:
        code = fn.__code__
        names = _names(code)
        self.names |= names
        g = fn.__globals__
        file = g.get("__file__")
        where = os.path.basename(file) if isinstance(file, str) else g.get("__name__", "?")
        for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=False):
            root = _Root(repr(name), "cell", cell, via=via)
            self._add(("cell", id(cell)), root, names, via)
        for name in sorted(names):
            if name in g:
                note = f"global in {where}" if via else ""
                root = _Root(repr(name), "name", g, name, note=note, via=via)
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
        if v is not tp and id(v) not in self.instances and len(self.instances) < MAX_FUNCTIONS:
            self.instances[id(v)] = (v, via, set())
        for klass in tp.__mro__:
            if not _user_type(klass) or klass is types.SimpleNamespace:
                continue
            cls_ns = klass.__dict__
            for name in sorted(names | {"__call__"}):
                if name not in cls_ns:
                    continue
                attr = cls_ns[name]
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
                    root = _Root(label, "name", cls_ns, name, via=via)
                    self._add(("name", id(cls_ns), name), root, names, via)


_roots_cache: dict[tuple[Any, ...], tuple[Any, list[_Root], frozenset[str]]] = {}
# a run's bodies are new functions (new ids, so no later run hits their entries), and an
# entry pins its body's closure, so the cache is emptied when a run ends
AFTER_RUN.append(_roots_cache.clear)


def _is_body(fn: Any) -> bool:
    """A Python function, or a method of an object bound to one (``self.step``)."""
    return isinstance(_func_of(fn), types.FunctionType)


def _reach(fn: Any) -> tuple[list[_Root], frozenset[str]]:
    """The roots body ``fn`` (see :func:`_is_body`) can reach and the names its code and
    its helpers' use, cached by code object, closure cells, globals, defaults and bound
    instance (the cache keeps those alive, so their ids stay unique while cached)."""
    func = _func_of(fn)
    pins: tuple[Any, ...] = (
        func.__closure__,
        func.__globals__,
        func.__defaults__,
        func.__kwdefaults__,
    )
    if func is not fn:
        pins += (fn.__self__,)
    key = (func.__code__, *(id(p) for p in pins))
    got = _roots_cache.get(key)
    if got is not None:
        return got[1], got[2]
    collector = _Collector()
    roots = collector.run(fn)
    if len(_roots_cache) > 256:
        _roots_cache.clear()
    _roots_cache[key] = (pins, roots, frozenset(collector.names))
    return roots, _roots_cache[key][2]


def reachable(fn: Callable[..., Any]) -> list[_Root]:
    """The roots body ``fn`` can reach (see :func:`_reach`)."""
    return _reach(fn)[0]


#: Values the fingerprint takes as tokens without descending: immutable values, and
#: functions, modules, code and types (compared by identity).
_ATOMIC: frozenset[type] = IMMUTABLE | {
    types.FunctionType,
    types.ModuleType,
    types.CodeType,
    type,
    np.dtype,
}
_ATOMIC_BASES = (int, float, complex, str, bytes, type(None), np.generic, type, np.dtype)


class _Fingerprint:
    """One pass over the roots.  Tokens are ids and raw bytes, never values, so NaN and
    objects with odd ``__eq__`` compare correctly; ``keep`` holds what the ids name, so no
    id is reused while the fingerprint is alive.  Arrays larger than :data:`COPY_BYTES`
    are not copied but collected in ``large`` (the guard write-protects them instead)."""

    __slots__ = ("keep", "seen", "budget", "large")

    def __init__(self) -> None:
        self.keep: list[Any] = []
        self.seen: set[int] = set()
        self.budget = MAX_OBJECTS
        self.large: list[tuple[int, np.ndarray]] = []  # (root number, array)

    def of(self, values: list[Any]) -> list[list[Any]]:
        """Tokens of each root value."""
        out = []
        for k, v in enumerate(values):
            toks: list[Any] = []
            self.value(v, toks, 0, k)
            out.append(toks)
        return out

    def value(self, v: Any, out: list[Any], depth: int, k: int) -> None:
        tp = type(v)
        out.append(id(v))
        if tp in _ATOMIC or isinstance(v, _DDS):
            return
        if id(v) in self.seen or depth > MAX_DEPTH or self.budget <= 0:
            return
        self.seen.add(id(v))
        self.budget -= 1
        if isinstance(v, np.ndarray):
            self.array(v, out, depth, k)
        elif isinstance(v, (list, tuple, collections.deque, dict)):
            if len(v) > LARGE_ITEMS:
                self.summary(v, out)
            elif isinstance(v, dict):
                self.items(list(v), out, MAX_DEPTH, k)  # keys: identities only
                self.items(list(v.values()), out, depth, k)
            else:
                self.items(list(v), out, depth, k)
        elif isinstance(v, (set, frozenset)):
            out.append(len(v))
            if len(v) <= LARGE_ITEMS:
                members = tuple(v)
                self.keep.append(members)
                out.append(frozenset(map(id, members)))
        elif isinstance(v, (bytearray, array.array)):
            out.append(bytes(v))
        elif isinstance(v, (types.MethodType, types.BuiltinFunctionType)):
            owner = getattr(v, "__self__", None)  # seen.append: fingerprint seen
            if owner is not None and not isinstance(owner, types.ModuleType):
                self.value(owner, out, depth + 1, k)
        elif isinstance(v, functools.partial):
            self.items([v.func, v.args, v.keywords], out, depth, k)
        elif isinstance(v, _ATOMIC_BASES):
            return
        if _user_type(tp):
            self.instance(v, out, depth, k)

    def summary(self, v: Any, out: list[Any]) -> None:
        """A large container, without copying it: its length and the identities of the
        elements (of a dict: keys and values) at both ends."""
        out.append(len(v))
        parts: list[Any] = [v, v.values()] if isinstance(v, dict) else [v]
        for part in parts:
            ends = [*itertools.islice(part, _ENDS), *itertools.islice(reversed(part), _ENDS)]
            self.keep.append(ends)
            out.append(tuple(map(id, ends)))

    def items(self, items: list[Any], out: list[Any], depth: int, k: int) -> None:
        out.append(len(items))
        self.keep.append(items)
        out.append(tuple(map(id, items)))
        if depth >= MAX_DEPTH or set(map(type, items)) <= _ATOMIC:
            return
        for x in items:
            if type(x) not in _ATOMIC:
                self.value(x, out, depth + 1, k)

    def array(self, a: np.ndarray, out: list[Any], depth: int, k: int) -> None:
        out.append((a.shape, a.dtype.str, a.strides, a.__array_interface__["data"][0]))
        if a.dtype.hasobject:
            self.items(a.ravel().tolist(), out, depth, k)
        elif a.nbytes <= COPY_BYTES:
            out.append(a.tobytes())
        else:
            self.large.append((k, a))

    def instance(self, v: Any, out: list[Any], depth: int, k: int) -> None:
        d = getattr(v, "__dict__", None)
        if isinstance(d, dict):
            self.value(d, out, depth + 1, k)
        for _, value in slot_values(v):
            self.value(value, out, depth + 1, k)


def _index(arg: Any) -> Any:
    """The loop index of an ``async_for`` body, the minibatch number of a ``sync_for`` one,
    the shape of the deltas an aggregation function gets."""
    if isinstance(arg, np.ndarray):
        return arg.shape
    return getattr(arg, "number", arg)


class BodyGuard:
    """A loop body wrapped so that a change to anything it reaches, other than DDS, is a
    :class:`ClosureRuleError` naming what changed and the first index that changed it.

    The baseline is taken when the guard is made (before the first body of an invocation).
    After every body, every root is checked to still hold the same object (cheap), and
    the contents of the mutable ones are compared with the baseline.  Two things keep a
    check from costing more than the body:

    * arrays larger than :data:`COPY_BYTES` are write-protected while any body runs (a
      write through them fails at once, naming the index) and compared with a baseline
      copy only every few bodies — about :data:`COPY_BYTES` per body;
    * when comparing the contents costs more than :data:`CHECK_SHARE` times the first
      body, it runs only every few bodies.

    A change found by such a deferred comparison names the range of bodies since the last
    one; :meth:`finish` runs the last comparison after the last body, so nothing is missed.
    Bodies on several threads share one guard; the index named is then the body that
    finished when the change was seen.
    """

    __slots__ = (
        "fn",
        "op",
        "kind",
        "inv",
        "what",
        "subject",
        "roots",
        "values",
        "readers",
        "deep",
        "base",
        "large",
        "every",
        "calls",
        "since",
        "last",
        "_fp_s",
        "_keep",
        "rngs",
        "rng_first",
        "rng_last",
        "rng_count",
        "_active",
        "_mu",
        "light",
    )

    def __init__(
        self,
        fn: Callable[..., Any],
        op: str,
        kind: str,
        inv: int,
        what: str,
        subject: str = "the loop body",
        light: bool = False,
    ) -> None:
        self.fn = fn
        self.op = op
        self.kind = kind
        self.inv = inv
        self.what = what
        self.subject = subject
        self.roots = reachable(fn)
        # roots holding immutable values or DDS only need an identity check per body
        self.values = [r.read() for r in self.roots]
        self.readers = [r.reader() for r in self.roots]
        self.deep = [
            k
            for k, v in enumerate(self.values)
            if type(v) not in _ATOMIC and not isinstance(v, _DDS) and v is not _EMPTY
        ]
        t0 = time.perf_counter()
        fp = _Fingerprint()
        self.base = fp.of([self.values[k] for k in self.deep])
        self._fp_s = time.perf_counter() - t0
        # (name, state reader, state now) of each global generator the body may draw from
        self.rngs = [(label, get, get()) for label, get in _global_generators(fn)]
        self.rng_first: Any = _EMPTY  # the first body since the generators were compared
        self.rng_last: Any = _EMPTY
        self.rng_count = 0
        self._keep = fp.keep
        # the large arrays' baselines: a copy, or in light mode (:meth:`verify`) a hash
        self.large: list[tuple[int, np.ndarray, Any, bool]] = [
            (self.deep[k], a, _array_hash(a) if light else a.copy(), a.flags.writeable)
            for k, a in fp.large
        ]
        self.every = max(1, sum(a.nbytes for _, a in fp.large) // COPY_BYTES)
        self.calls = 0
        self.since: Any = _EMPTY  # the first body since contents were last compared
        self.last: Any = _EMPTY  # the body that finished last
        self._active = 0
        self._mu = threading.Lock()
        self.light = light

    def __call__(self, arg: Any) -> Any:
        if self.large or self.every > 1 or self.calls == 0:
            return self._call_slow(arg)
        out = self.fn(arg)
        try:  # the common case, in C: every root still holds the same object
            same = all(map(operator.is_, map(operator.call, self.readers), self.values))
        except ValueError:  # a cell was emptied (del)
            same = False
        if not same:
            self._check_identity(arg)
        if self.deep:
            self._check_contents(arg, arg)
        if self.rngs:
            self._tick_generators(arg)
        return out

    def _call_slow(self, arg: Any) -> Any:
        with self._mu:
            if self._active == 0:
                for _, a, _, writeable in self.large:
                    if writeable:
                        a.flags.writeable = False
            self._active += 1
            self.calls += 1
            n = self.calls
            if self.since is _EMPTY:
                self.since = arg
        t0 = time.perf_counter()
        try:
            out = self.fn(arg)
        except ValueError as exc:
            if not self.large or "read-only" not in str(exc):
                raise
            names = ", ".join(f"{self.roots[k].describe()}" for k, *_ in self.large)
            raise ClosureRuleError(
                f"{self._head()}: at {self._where(arg)} {self.subject} raised "
                f"'ValueError: {exc}' while the large captured arrays it can reach were "
                f"write-protected ({names}); everything it reaches except DDS is "
                "read-only (closure rule). Keep the state in a DDS, or build it in the "
                "driver after the loop"
            ) from exc
        finally:
            with self._mu:
                self._active -= 1
                if self._active == 0:
                    for _, a, _, writeable in self.large:
                        if writeable:
                            with contextlib.suppress(ValueError):
                                a.flags.writeable = True
        self.last = arg
        if n == 1:  # compare contents at most every few bodies if that costs more than one
            body_s = max(time.perf_counter() - t0, 1e-6)
            self.every = max(self.every, min(MAX_EVERY, int(self._fp_s / (CHECK_SHARE * body_s))))
        self._check_identity(arg)
        if n % self.every == 0:
            self._check_contents(arg, None)
        if self.rngs:
            self._tick_generators(arg)
        return out

    def finish(self) -> None:
        """After the last body of an invocation: compare what was compared only every few
        bodies once more."""
        if self.since is not _EMPTY:
            self._check_contents(None if self.last is _EMPTY else self.last, None)
        if self.rng_first is not _EMPTY:
            self._check_generators(self.rng_last)

    def _tick_generators(self, arg: Any) -> None:
        """A draw from a global generator changes its state for good, and reading the state
        costs tens of microseconds, so it is compared every :data:`RNG_EVERY` bodies and
        after the last (a draw is then named as a range of bodies)."""
        if self.rng_first is _EMPTY:
            self.rng_first = arg
        self.rng_last = arg
        self.rng_count += 1
        if self.rng_count % RNG_EVERY == 0:
            self._check_generators(arg)

    def _check_generators(self, last: Any) -> None:
        first, self.rng_first = self.rng_first, _EMPTY
        if first is last:
            where = self._where(last)
        else:
            span = f"{self.what} {_index(first)} and {self.what} {_index(last)}"
            where = f"a body between {span}{self._invocation()}"
        self._generators_changed(where)

    def _generators_changed(self, where: str) -> None:
        for label, get, state in self.rngs:
            if get() != state:
                raise ClosureRuleError(
                    f"{self._head()}: {self.subject} drew from {label} at {where}; its draws "
                    "depend on the order bodies run in, which differs between nodes, threads, "
                    "replays and the dual tests' serial side, so none of them could reproduce "
                    "this run (closure rule: the generator's state lives outside DDS). Draw "
                    "from ap.rng() instead: it is seeded by the run's seed, the operator, the "
                    "invocation and the index"
                )

    def _check_identity(self, arg: Any) -> None:
        now = [r.read() for r in self.roots]
        for k, (a, b) in enumerate(zip(now, self.values, strict=True)):
            if a is not b:
                if self.since is not _EMPTY:  # a deferred change may come from an earlier body
                    self._check_contents(arg, None)
                self._fail(k, self._where(arg))

    def _check_contents(self, arg: Any, exact: Any) -> None:
        """Compare contents with the baseline; ``exact``: the one body since the last
        comparison (else the range since ``self.since``, up to ``arg`` or the last body)."""
        since, self.since = self.since, _EMPTY
        if exact is None and since is not _EMPTY and since is arg:
            exact = arg
        if exact is not None:
            where = self._where(exact)
        else:
            last = "the last body" if arg is None else f"{self.what} {_index(arg)}"
            first = f"{self.what} {_index(since)}"
            where = f"a body between {first} and {last}{self._invocation()}"
        changed = self._changed()
        if changed:
            self._fail(changed, where)

    def _changed(self) -> list[int]:
        """Every root whose contents differ from the baseline (a deferred comparison may
        see several)."""
        changed: list[int] = []
        if self.deep:
            toks = _Fingerprint().of([r.read() for r in (self.roots[k] for k in self.deep)])
            if toks != self.base:
                changed += [
                    self.deep[i]
                    for i, (a, b) in enumerate(zip(toks, self.base, strict=True))
                    if a != b
                ]
        for k, a, base, _ in self.large:
            if self.light:
                if _array_hash(a) != base:
                    changed.append(k)
                continue
            now = a if a.flags.c_contiguous else np.ascontiguousarray(a)
            if not np.array_equal(now.reshape(-1).view(np.uint8), base.reshape(-1).view(np.uint8)):
                changed.append(k)
        return sorted(set(changed))

    def verify(self) -> None:
        """After an invocation whose bodies ran bare (a normal run, :func:`watch`): did
        anything the body reaches change?  The index is unknown here; ``--checked``
        names it."""
        noun = self.what.split(" of ")[0]
        where = (
            f"one of the calls{self._invocation()} (a normal run compares what it reaches "
            f"after the last call; run with --checked to name the {noun})"
        )
        now = [r.read() for r in self.roots]
        moved = [k for k, (a, b) in enumerate(zip(now, self.values, strict=True)) if a is not b]
        changed = sorted(set(moved + self._changed()))
        if changed:
            self._fail(changed, where)
        if self.rngs:
            self.rng_first = self.rng_last = _EMPTY
            self._generators_changed(where)

    def _where(self, arg: Any) -> str:
        return f"{self.what} {_index(arg)}{self._invocation()}"

    def _head(self) -> str:
        """``async_for 'sgd'``; ``op`` alone without a ``kind`` (``ap.map over A``)."""
        return f"{self.kind} {self.op!r}" if self.kind else self.op

    def _invocation(self) -> str:
        return f" (invocation {self.inv})" if self.inv >= 0 else ""

    def _fail(self, k: int | list[int], where: str) -> None:
        names = [self.roots[i].describe() for i in ([k] if isinstance(k, int) else k)]
        what = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        raise ClosureRuleError(
            f"{self._head()}: {self.subject} changed {what} at "
            f"{where}; everything it reaches except DDS is read-only "
            "(closure rule), and on other nodes, threads or replays that change would be "
            "lost or made a different number of times. Keep the state in a DDS, or build "
            "it in the driver after the loop"
        )


def _numpy_state() -> Any:
    _, keys, pos, has_gauss, gauss = np.random.mtrand._rand.get_state(legacy=True)
    return pos, np.asarray(keys).tobytes(), has_gauss, gauss


#: The process-wide generators a body must not draw from, and how to read their state.
_GLOBAL_GENERATORS: tuple[tuple[str, Any, Callable[[], Any]], ...] = (
    ("numpy's global random generator (np.random.*)", np.random.mtrand._rand, _numpy_state),
    ("Python's global random generator (random.*)", random._inst, random.getstate),
)


def _global_generators(fn: Any) -> list[tuple[str, Callable[[], Any]]]:
    """The global generators body ``fn`` may draw from: all of them when its code (or a
    helper's) names ``random`` (``np.random.rand()``, ``random.random()``), the one a
    captured function is bound to otherwise (``from numpy.random import rand``).  Reading
    their state costs tens of microseconds, so bodies that cannot reach them skip it."""
    roots, names = _reach(fn)
    if "random" in names:
        return [(label, get) for label, _, get in _GLOBAL_GENERATORS]
    owners = {id(getattr(r.read(), "__self__", None)) for r in roots}
    return [(label, get) for label, inst, get in _GLOBAL_GENERATORS if id(inst) in owners]


def guard(
    fn: Callable[..., Any],
    op: str,
    inv: int,
    *,
    kind: str = "async_for",
    what: str = "index",
    subject: str = "the loop body",
    light: bool = False,
) -> Callable[..., Any]:
    """``fn`` wrapped in a :class:`BodyGuard` (``fn`` itself when it is neither a Python
    function nor a method bound to an object, or reaches nothing to check); ``what``
    names its argument in messages (``index 3``), ``subject`` names ``fn``."""
    if not _is_body(fn) or not reachable(fn):
        return fn
    return BodyGuard(fn, op, kind, inv, what, subject, light)


def finish(body: Callable[..., Any]) -> None:
    """After the last body of an invocation: the final check of a guarded body."""
    if isinstance(body, BodyGuard):
        body.finish()


def watch(fn: Callable[..., Any], op: str, inv: int, **names: str) -> BodyGuard | None:
    """The closure rule in a normal run, where bodies run bare: a baseline of what ``fn``
    reaches, taken before an invocation, for :func:`verify` after it (large arrays by a
    hash instead of a copy; ``names`` as for :func:`guard`).  A body whose mutation
    depends on values that reconnaissance did not see (``if x > 2: seen.append(j)``,
    true from the third epoch on) is caught at the end of that invocation.  None when
    ``fn`` reaches nothing to check."""
    got = guard(fn, op, inv, light=True, **names)
    return got if isinstance(got, BodyGuard) else None


def verify(baseline: BodyGuard | None) -> None:
    """After the invocation :func:`watch` was taken for: a change is a
    :class:`ClosureRuleError`."""
    if baseline is not None:
        baseline.verify()


def _array_hash(a: np.ndarray) -> bytes:
    data: Any = np.ascontiguousarray(a)  # (numpy's stubs do not declare the buffer protocol)
    return xxhash.xxh3_128_digest(memoryview(data).cast("B"))


# ====================================================================== values across ranks
# Every rank runs the same driver, so a body must see the same values on every rank.  A
# value that lives in one rank's Python objects (an unseeded random number, the time, the
# process id, a history only rank 0 appends to) makes each rank's bodies compute something
# else, and nothing downstream tells: the owners' rows are exchanged as written, objectives
# are collectives, and a replay repeats each rank's value.  So at every invocation under
# MPI each rank sends the numbers its body can reach along with the driver step it is at
# (one allgather that happens anyway), and a difference stops every rank before any body
# runs.  Numbers only, wherever they sit: a captured number, and the numbers inside the
# lists, tuples, dicts, sets and user objects a body reads (with the lengths and keys of
# the containers holding them); a captured string or label may well differ (a log
# prefix), and other objects are the closure guard's business (it sees them change, not
# differ).

#: A captured numeric array is compared by content when it holds at most this many bytes
#: (one xxh3-128 hash), larger ones by dtype and shape only: they are data, which belongs
#: in a DDS (cost per invocation vs. reach).
AGREE_ARRAY_BYTES = 64 * 1024
#: A captured tuple of at most this many numbers is compared (and shown) as one value.
AGREE_TUPLE_ITEMS = 64
#: Items (container elements, attributes, numbers) compared per captured value; past it
#: the rest of the value is not compared (cost per invocation vs. reach).
AGREE_ITEMS = 256
#: Containers nested deeper than this inside a captured value are not compared.
AGREE_DEPTH = 4

_NUMBER = (bool, int, float, complex, np.number, np.bool_)
_KEY = (str, bytes, bool, int, float, complex, np.number, type(None))


def _number_key(v: Any) -> str | None:
    """The exact text of a number, a tuple of numbers or a numeric array; None for
    anything else."""
    if isinstance(v, _NUMBER):
        return repr(v)
    if isinstance(v, tuple) and 0 < len(v) <= AGREE_TUPLE_ITEMS:
        return repr(v) if all(isinstance(x, _NUMBER) for x in v) else None
    if isinstance(v, np.ndarray) and v.dtype.kind in "biufc":
        head = f"{v.dtype.str}{v.shape}"
        if v.nbytes > AGREE_ARRAY_BYTES:
            return head
        return f"{head}#{xxhash.xxh3_128_hexdigest(np.ascontiguousarray(v).data)}"
    return None


def _shown_value(v: Any) -> str:
    if isinstance(v, np.ndarray) and v.nbytes > AGREE_ARRAY_BYTES:
        return f"a {v.dtype} array of shape {v.shape}"
    return _shown(v)


#: Values that hold no number a body could read (callables, modules and DDS are followed
#: or checked elsewhere).
_NO_NUMBERS = (str, bytes, type(None), _DDS, types.FunctionType, types.ModuleType, type)


class _Values:
    """The comparable parts of the values a body reads, as ``(path, exact, value)``:
    numbers (:func:`_number_key`) and, for each container holding any, its type and
    length (a dict: its keys); ``names`` are the attribute names the body's code uses (of
    a user object only those are read).  :meth:`of` walks one value."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self.budget = AGREE_ITEMS
        self.out: list[tuple[str, str, Any]] = []
        self.active: set[int] = set()  # containers on the current path (cycles)

    def of(self, v: Any) -> list[tuple[str, str, Any]]:
        self.budget, self.out = AGREE_ITEMS, []
        self.walk(v, "", 0)
        return self.out

    def walk(self, v: Any, path: str, depth: int) -> None:
        if self.budget <= 0 or depth > AGREE_DEPTH or isinstance(v, _NO_NUMBERS):
            return
        self.budget -= 1
        key = _number_key(v)
        if key is not None:
            self.out.append((path, key, v))
            return
        if id(v) in self.active:
            return
        self.active.add(id(v))
        try:
            self._parts(v, path, depth)
        finally:
            self.active.discard(id(v))

    def _parts(self, v: Any, path: str, depth: int) -> None:
        at = len(self.out)
        if isinstance(v, (list, tuple, collections.deque)):
            for k, x in enumerate(itertools.islice(v, AGREE_ITEMS)):
                self.walk(x, f"{path}[{k}]", depth + 1)
            shape = f"{type(v).__name__} of {len(v)}"
        elif isinstance(v, dict):
            keys = list(itertools.islice(v, AGREE_ITEMS))
            for k in keys:
                self.walk(v[k], f"{path}[{k!r}]", depth + 1)
            shown = [repr(k) if isinstance(k, _KEY) else type(k).__name__ for k in keys]
            shape = f"dict of {len(v)}: {', '.join(shown)}"
        elif isinstance(v, (set, frozenset)):
            if len(v) <= AGREE_ITEMS and all(isinstance(x, _NUMBER) for x in v):
                texts = sorted(f"{type(x).__name__}:{x!r}" for x in v)
                self.out.append((path, f"set {texts}", v))
            return
        elif _user_type(type(v)):
            attrs = attributes(v) or {}
            for name in sorted(self.names.intersection(attrs)):
                self.walk(attrs[name], f"{path}.{name}", depth + 1)
            return
        else:
            return
        if len(self.out) > at or not v:  # holds numbers (or is empty): its shape counts
            self.out.insert(at, (path, shape, v))


def _described(root: _Root, path: str, value: Any) -> str:
    """``'lr' (float)``, ``"cfg['lr']" (float, global in train.py) via step()``."""
    if not path:
        return root.describe()
    name = f"{ast.literal_eval(root.label)}{path}"
    note = f", {root.note}" if root.note else ""
    via = f" via {' -> '.join(f'{v}()' for v in root.via)}" if root.via else ""
    return f"{name!r} ({type(value).__name__}{note}){via}"


class Captures:
    """The numbers body ``fn`` can read outside DDS (see :class:`_Values`): in its
    closure variables, globals, default arguments, bound instance and the same in the
    user functions it calls, then in ``bound``, the arguments a kernel is bound to (``fn``
    its Python function, whose parameters after the index name them).

    ``keys`` is what ranks compare, ``(place, exact text)`` per number; the place leaves
    the type out (ranks compare by it).  :meth:`details` adds what the error shows, only
    needed when they differ."""

    __slots__ = ("keys", "_items", "_by")

    def __init__(self, fn: Any, bound: tuple[Any, ...] = ()) -> None:
        self.keys: list[tuple[str, str]] = []
        self._items: list[tuple[Any, str, Any]] = []  # (root or parameter, path, value)
        self._by: list[str] = []  # who reads each number, if not the body ("")
        if not _is_body(fn):
            return
        roots, names = _reach(fn)
        values = _Values(names)
        for root in roots:
            for path, exact, v in values.of(root.read()):
                self.keys.append((f"{root.label}{path} {root.note} {root.via}", exact))
                self._items.append((root, path, v))
        func = _func_of(fn)
        params = func.__code__.co_varnames[1 : 1 + len(bound)]
        for name, value in zip(params, bound, strict=False):
            for path, exact, v in values.of(value):
                self.keys.append((f"argument {name}{path}", exact))
                self._items.append(((name, _short(func)), path, v))
        self._by = [""] * len(self.keys)

    def merge(self, other: Captures, by: str) -> None:
        """Add the numbers ``other``'s function reads, named as read by ``by`` (``the
        aggregation function of 'W'``)."""
        self.keys += [(f"{by}: {place}", exact) for place, exact in other.keys]
        self._items += other._items
        self._by += [by] * len(other.keys)

    def details(self) -> list[tuple[str, str, str, str]]:
        """(place, description, exact text, shown text) of each number."""
        out = []
        for (place, exact), (where, path, v), by in zip(
            self.keys, self._items, self._by, strict=True
        ):
            if isinstance(where, _Root):
                what = _described(where, path, v)
            else:
                name, func = where
                what = f"{name + path!r} ({type(v).__name__}, argument of {func})"
            out.append((place, f"{what} in {by}" if by else what, exact, _shown_value(v)))
        return out


def captured_numbers(fn: Any, bound: tuple[Any, ...] = ()) -> list[tuple[str, str, str, str]]:
    """:meth:`Captures.details` of body ``fn`` bound to ``bound``."""
    return Captures(fn, bound).details()


def agree_numbers(
    op: str,
    captures: Captures | None,
    got: list[Any],
    allgather: Callable[[Any], list[Any]],
) -> None:
    """After the step check: ``got`` is every rank's ``captures.keys``; if they differ,
    exchange the details and raise :class:`DriverCapturesDivergedError` on every rank."""
    if captures is not None and any(g != got[0] for g in got):
        check_same_numbers(op, allgather(captures.details()))


def check_same_numbers(op: str, per_rank: list[Any]) -> None:
    """Raise :class:`DriverCapturesDivergedError` (on every rank alike) if the ranks'
    :func:`captured_numbers` differ; ``per_rank`` is every rank's list, in rank order.
    Places and exact texts decide (as :attr:`Captures.keys`); the shown texts may differ
    for equal values (a set's iteration order)."""
    keys = [[(place, exact) for place, _, exact, _ in p or ()] for p in per_rank]
    if all(k == keys[0] for k in keys):
        return
    tables = [{place: rest for place, *rest in p or ()} for p in per_rank]
    places = list(dict.fromkeys(place for t in tables for place in t))
    for place in places:
        seen = [t.get(place, ("", "", "not a number")) for t in tables]
        if len({exact for _, exact, _ in seen}) > 1:
            what = next(d for d, _, _ in seen if d)
            shown = [s for _, _, s in seen]
            if len(set(shown)) < len({exact for _, exact, _ in seen}):  # alike when short
                shown = [
                    f"{s} (#{zlib.crc32(e.encode()):08x})"
                    for s, (_, e, _) in zip(shown, seen, strict=True)
                ]
            raise DriverCapturesDivergedError(op, what, shown)
    # the lists differ but no single place does (a place listed twice, another order)
    counts = [f"{len(p or ())} numbers in another order" for p in per_rank]
    raise DriverCapturesDivergedError(op, "its captured values", counts)


__all__ = [
    "BodyGuard",
    "Captures",
    "agree_numbers",
    "captured_numbers",
    "check_body",
    "check_same_numbers",
    "finish",
    "guard",
    "reachable",
    "verify",
    "watch",
]
