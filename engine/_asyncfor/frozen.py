"""What a compiled kernel freezes: one digest of every value and function it was built from.

numba compiles a kernel's globals into its machine code as constants (a module-level
number, tuple or numpy array, an attribute read through a module, a default argument),
and links in the machine code of every jitted function the kernel calls.  Its on-disk
cache notices none of that: an entry is keyed by the kernel's own file and bytecode.  So
``SCALE = float(os.environ["SCALE"])`` or ``TABLE = np.load(path)`` read by a kernel,
or a helper edited in another file, left the next process running the old numbers from
the cache, with no error, and the Python path (split groups, ``--break``) with the new
ones.  The engine keys its body and loop caches by :func:`digest` as well, and compiles
the body again in a process whose digest has changed since it compiled it.

The walk follows what numba follows: the names the code reads (its nested code objects'
too) looked up in the function's globals, attributes of the modules it names, default
arguments and closure cells; a jitted function, kernel or plain function found there is
walked the same way, with its source file's bytes.  Values are hashed by type and
content; an object numba would not freeze (a class, a ufunc, a builtin) by its type's
name only.
"""

from __future__ import annotations

import builtins
import hashlib
import inspect
import os
import sysconfig
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

_SCALARS = (bool, int, float, complex, str, bytes, type(None))
#: Where installed libraries live: a plain (not jitted) function from there is named,
#: not walked (numba compiles its own versions of numpy's functions, and walking a
#: library's references would read half of it on every ``async_for``).
_LIBRARY_DIRS = tuple(
    os.path.join(os.path.realpath(p), "")
    for p in {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
)


#: A file's digest is reused only while its stat is the one it was read at and that
#: stat's last change (ctime, which every write and ``utime`` moves to the current time
#: and no user call can set back) was at least this long before the read: an edit within
#: the file system's clock tick of the read would keep size, mtime and ctime, so such a
#: file is read again every time (git's "racily clean" rule).  Reading the kernel's and
#: its helpers' files was a third of re-checking LDA's kernel before each ``async_for``.
RACY_NS = 3_000_000_000
_FILES: dict[str, tuple[tuple[int, int, int, int, int], bytes]] = {}


def _file_digest(path: str) -> bytes:
    try:
        st = os.stat(path)
        stamp = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        kept = _FILES.get(path)
        if kept is not None and kept[0] == stamp:
            return kept[1]
        now = time.time_ns()
        got = hashlib.blake2b(Path(path).read_bytes()).digest()
    except OSError:
        return b""
    if now - max(st.st_mtime_ns, st.st_ctime_ns) >= RACY_NS:
        _FILES[path] = (stamp, got)
    return got


def _library(path: str | None) -> bool:
    return path is not None and os.path.realpath(path).startswith(_LIBRARY_DIRS)


class _Walk:
    def __init__(self) -> None:
        self.h = hashlib.blake2b(digest_size=16)
        self.seen: set[int] = set()

    def put(self, *parts: Any) -> None:
        for p in parts:
            self.h.update(p if isinstance(p, bytes) else repr(p).encode())
            self.h.update(b"\0")

    def function(self, fn: types.FunctionType, jitted: bool = True) -> None:
        if id(fn) in self.seen:
            self.put("again", fn.__qualname__)
            return
        self.seen.add(id(fn))
        self.put("fn", fn.__module__, fn.__qualname__)
        try:
            path = inspect.getsourcefile(fn)
        except TypeError:
            path = None
        if not jitted and _library(path):
            return
        self.put(path, _file_digest(path) if path else b"")
        self.code(fn.__code__)
        for v in fn.__defaults__ or ():
            self.value(v)
        for cell in fn.__closure__ or ():
            try:
                self.value(cell.cell_contents)
            except ValueError:  # an empty cell
                self.put("empty cell")
        names = _names(fn.__code__)
        g = fn.__globals__
        for name in sorted(names):
            if name in g:
                self.put("global", name)
                self.value(g[name], names)
            elif not hasattr(builtins, name):
                self.put("missing", name)

    def code(self, code: types.CodeType) -> None:
        """Bytecode and constants; a nested code object's by content (its ``repr`` holds
        an address, which would give every process another digest)."""
        self.put(code.co_code)
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                self.code(c)
            elif isinstance(c, frozenset):  # ``x in {...}``: its repr's order is per process
                self.put("frozenset", sorted(map(repr, c)))
            else:
                self.put(type(c).__name__, c)

    def value(self, v: Any, names: frozenset[str] = frozenset()) -> None:
        if isinstance(v, _SCALARS):
            self.put(type(v).__name__, v)
        elif isinstance(v, np.ndarray) and not v.dtype.hasobject:
            self.put("array", v.dtype.str, v.shape)
            self.h.update(np.ascontiguousarray(v).reshape(-1).view(np.uint8).data)
        elif isinstance(v, np.generic):
            self.put("np", v.dtype.str, v.tobytes())
        elif isinstance(v, (tuple, list)):
            self.put(type(v).__name__, len(v))
            for x in v:
                self.value(x)
        elif isinstance(v, types.ModuleType):
            # numba freezes ``mod.NAME`` as it freezes a global: the module's attributes
            # the code names (its functions are walked like the kernel's own)
            self.put("module", v.__name__)
            if id(v) in self.seen:
                return
            self.seen.add(id(v))
            for name in sorted(names):
                if name in vars(v):
                    self.put("attr", name)
                    self.value(vars(v)[name])
            self.seen.discard(id(v))  # another function may name other attributes
        elif isinstance(v, types.FunctionType):
            self.function(v, jitted=False)
        elif isinstance(getattr(v, "py_func", None), types.FunctionType):
            # a numba dispatcher or an engine kernel: its Python function is what compiles
            self.put("jitted", type(v).__name__)
            self.function(v.py_func)
        else:
            self.put("object", type(v).__module__, type(v).__qualname__)


def _names(code: types.CodeType) -> frozenset[str]:
    """The global and attribute names ``code`` and the code objects nested in it read."""
    out = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= _names(c)
    return frozenset(out)


def digest(fn: types.FunctionType) -> str:
    """Hex digest of what compiling kernel function ``fn`` freezes into machine code (see
    the module docstring): equal digests, equal compiled code."""
    w = _Walk()
    w.function(fn)
    return w.h.hexdigest()


__all__ = ["digest"]
