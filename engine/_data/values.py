"""Python-object elements are handed out, and taken in, by value.

A numeric row read with ``X[i]`` is a copy, so changing it never changes the DDS, and
``X[i] = v`` is the only way to write: that is what makes every write visible to the
engine (planned, recorded, sent to the other replicas, digested).  A Python object
element handed out by reference would break that: ``rec = A[j]; rec.append(x)`` would
change the replica of the node that ran the body and no other, and reconnaissance, which
runs every body once more, would apply it twice.  So every path between a DDS and user
code (loop bodies in every mode, the driver, the functions of ``map``/``reduce``/
``create``/``evaluate``, ``sync_for`` minibatches, ``gather``) goes through
:func:`detached`: a value nothing can change in place (numbers, strings, tuples and named
tuples of such) is passed as it is, anything else as a deep copy.

Object elements are digested and compared between processes (replay, replica checks, dual
tests) by :func:`stable_text`, which must not depend on where an object sits in memory.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import decimal
import fractions
import types
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import xxhash

from .._errors import DDSError

#: Types whose values cannot change in place.
IMMUTABLE: frozenset[type] = frozenset(
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
        np.float64,
        np.float32,
        np.float16,
        np.int64,
        np.int32,
        np.int16,
        np.int8,
        np.uint64,
        np.uint32,
        np.uint16,
        np.uint8,
        np.bool_,
        np.complex128,
        np.complex64,
    }
)

#: Per type: can its instances hold nothing but their items (a tuple, a named tuple, a
#: frozenset; not a tuple subclass whose instances have a ``__dict__``)?
_SEALED: dict[type, bool] = {}


def _sealed(tp: type) -> bool:
    got = _SEALED.get(tp)
    if got is None:
        got = issubclass(tp, (tuple, frozenset)) and getattr(tp, "__dictoffset__", 1) == 0
        _SEALED[tp] = got
    return got


def frozen(v: Any) -> bool:
    """True when nothing reachable from ``v`` can change in place."""
    tp = type(v)
    if tp in IMMUTABLE:
        return True
    return _sealed(tp) and _items_frozen(v)


def _items_frozen(v: Any) -> bool:
    for item in v:
        if type(item) not in IMMUTABLE and not frozen(item):
            return False
    return True


def detached(v: Any, where: Any = "") -> Any:
    """``v`` itself when it cannot change in place, else a deep copy of it.

    ``where`` names the element for the error raised when ``v`` cannot be copied (a lock,
    an open file, a generator): such a value cannot be a DDS element."""
    tp = type(v)  # frozen(v), inlined: this runs at every read of an object element
    if tp in IMMUTABLE:
        return v
    if (_SEALED.get(tp) or _sealed(tp)) and _items_frozen(v):
        return v
    try:
        return copy.deepcopy(v)
    except RecursionError:
        what = f"{where}: " if where else ""
        raise DDSError(
            f"{what}a DDS element is copied whenever it is read or written, and this "
            f"{type(v).__qualname__} is nested too deeply to be copied; store it flatter "
            "(the values of a linked structure in a list, its links as indices)"
        ) from None
    except Exception as exc:  # noqa: BLE001 - whatever deepcopy raises names the problem
        what = f"{where}: " if where else ""
        raise DDSError(
            f"{what}a DDS element is copied whenever it is read or written, and a "
            f"{type(v).__qualname__} cannot be ({type(exc).__name__}: {exc}); store plain "
            "data (numbers, strings, tuples, lists, dicts, arrays, your own objects of such)"
        ) from None


#: Which :func:`stable_text` a run's object digests were made with, recorded with the
#: run: 1, the ``repr`` (before 2026-11-28); 2, the exact text.
TEXT_VERSION = 2

#: How deep :func:`stable_text` follows a value that is not plain.
MAX_NESTING = 300

#: Types whose ``repr`` is their whole value, exactly (a float's to the last bit).
EXACT_REPR: frozenset[type] = IMMUTABLE | {
    bytearray,
    datetime.date,
    datetime.datetime,
    datetime.time,
    datetime.timedelta,
    datetime.timezone,
    decimal.Decimal,
    fractions.Fraction,
    uuid.UUID,
}


def stable_text(v: Any) -> str:
    """The text a Python-object element is digested and compared by (digests, replica
    checks, dual tests): two elements have the same text exactly when they hold the same
    values, bit for bit, wherever and whenever they were made.

    A *plain* value (numbers, strings, ``None``, the types of :data:`EXACT_REPR`, and
    lists, tuples, named tuples, dicts and sets of plain values) is its ``repr``, which is
    exact for those, so the digests of traces recorded before are unchanged.  Anything
    else is not trusted to its ``repr``: a numpy array's shows 8 digits and hides the
    middle of a long one, an object's may show an address that differs between
    processes, or only what its author wanted to read.  Such a value is its structure,
    written as ``repr`` would write plain parts: an array by dtype, shape and the
    xxh3-128 of its bytes, an object by its class and attributes (``Box(n=1, seen=[1])``,
    which is a dataclass's own ``repr``), or by what it pickles to when its class says
    how (``__reduce__``, ``__getstate__``), a set's items in sorted order."""
    try:
        return repr(v) if _plain(v, 0) else _state_text(v, set())
    except RecursionError:
        raise _too_deep(v) from None


def _too_deep(v: Any) -> DDSError:
    return DDSError(
        f"a DDS element of type {type(v).__qualname__} is nested too deeply to be digested "
        "and compared; store it flatter (the values of a linked structure in a list, its "
        "links as indices)"
    )


def _plain(v: Any, depth: int) -> bool:
    tp = type(v)
    if tp in EXACT_REPR:
        return True
    kind = _KIND.get(tp)
    if kind is None:
        kind = _KIND[tp] = _kind_of(tp)
    if kind == "items" and depth <= MAX_NESTING:
        for x in v:
            if type(x) not in EXACT_REPR and not _plain(x, depth + 1):
                return False
        return True
    if kind == "dict" and depth <= MAX_NESTING:
        for k, x in v.items():
            if not (type(k) in EXACT_REPR or _plain(k, depth + 1)):
                return False
            if not (type(x) in EXACT_REPR or _plain(x, depth + 1)):
                return False
        return True
    return False


#: Per type: "items" (a list, tuple, set, frozenset or named tuple: its ``repr`` is its
#: items'), "dict", or "" (anything else).
_KIND: dict[type, str] = {}


def _kind_of(tp: type) -> str:
    if tp in (list, tuple, set, frozenset) or _named_tuple(tp):
        return "items"
    return "dict" if tp is dict else ""


def _named_tuple(tp: type) -> bool:
    """A class made by ``collections.namedtuple`` (or ``typing.NamedTuple``), whose
    ``repr`` is its name and fields."""
    return (
        issubclass(tp, tuple)
        and hasattr(tp, "_fields")
        and getattr(tp.__repr__, "__module__", None) == "collections"
    )


def _state_text(v: Any, path: set[int]) -> str:
    tp = type(v)
    if tp in EXACT_REPR or isinstance(v, type):
        return repr(v)
    if isinstance(v, np.generic):  # a structured or other numpy scalar: its bytes
        return f"{tp.__name__}{_array_text(np.asarray(v))}"
    if isinstance(v, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        return f"<{tp.__name__} {getattr(v, '__module__', None)}.{v.__qualname__}>"
    if id(v) in path:
        return "<cycle>"
    if len(path) >= MAX_NESTING:
        raise _too_deep(v)
    path.add(id(v))
    try:
        return _compound_text(v, tp, path)
    finally:
        path.discard(id(v))


def _compound_text(v: Any, tp: type, path: set[int]) -> str:
    def text(x: Any) -> str:
        return _state_text(x, path)

    if tp is list:
        return f"[{', '.join(map(text, v))}]"
    if tp is tuple:
        return f"({text(v[0])},)" if len(v) == 1 else f"({', '.join(map(text, v))})"
    if _named_tuple(tp):
        fields: tuple[str, ...] = getattr(tp, "_fields")  # noqa: B009 - a type's, for mypy
        return (
            f"{tp.__name__}({', '.join(f'{k}={text(x)}' for k, x in zip(fields, v, strict=True))})"
        )
    if tp is dict:
        return f"{{{', '.join(f'{text(k)}: {text(x)}' for k, x in v.items())}}}"
    if tp is set or tp is frozenset:
        items = [text(x) for x in v]
        if not all(_plain(x, 0) for x in v):  # objects hashed by address: no fixed order
            items.sort()
        if not items:
            return f"{tp.__name__}()"
        inner = f"{{{', '.join(items)}}}"
        return inner if tp is set else f"frozenset({inner})"
    if isinstance(v, (list, tuple, set, frozenset, dict)):  # subclasses: name, items, state
        if isinstance(v, dict):
            shown = [f"{text(k)}: {text(x)}" for k, x in v.items()]
        else:
            shown = [text(x) for x in v]
            if isinstance(v, (set, frozenset)):
                shown.sort()
        extra = [f"{k}={text(x)}" for k, x in (attributes(v) or {}).items()]
        return f"{tp.__qualname__}[{', '.join(shown + extra)}]"
    if isinstance(v, np.ndarray):
        if v.dtype.hasobject:
            whole = f"array[{', '.join(map(text, v.ravel().tolist()))}; {v.shape}]"
        else:
            whole = f"array{_array_text(v)}"
        if tp is np.ndarray:
            return whole
        more = ", ".join(f"{k}={text(x)}" for k, x in (attributes(v) or {}).items())
        return f"{tp.__qualname__}[{whole}; {more}]"  # a masked array's mask, ...
    state = attributes(v) if _pickles_by_attributes(tp) else None
    if state is not None:
        return f"{tp.__qualname__}({', '.join(f'{k}={text(x)}' for k, x in state.items())})"
    return _reduced_text(v, tp, text)


#: Float types whose bytes include padding that is not part of the value (x86's 80-bit
#: long double in 16 bytes): compared by their exact ``repr`` instead.
_PADDED = tuple(t for t in (np.longdouble, np.clongdouble) if t not in (np.float64, np.complex128))


def _array_text(a: np.ndarray) -> str:
    """A numeric array exactly: dtype (byte order included), shape, xxh3-128 of its bytes."""
    if a.dtype.type in _PADDED:
        return f"({a.dtype.str}, {a.shape}, [{', '.join(map(repr, a.ravel()))}])"
    data: Any = np.ascontiguousarray(a).view(np.uint8) if a.size else b""
    dtype = a.dtype.descr if a.dtype.fields else a.dtype.str  # a record's fields too
    return f"({dtype}, {a.shape}, {xxhash.xxh3_128_hexdigest(data)})"


def _pickles_by_attributes(tp: type) -> bool:
    """Does ``tp`` pickle (and copy) its instances as their attributes, as ``object`` does?"""
    return (
        getattr(tp, "__reduce_ex__", None) is object.__reduce_ex__
        and getattr(tp, "__reduce__", None) is object.__reduce__
        and getattr(tp, "__getstate__", None) is object.__getstate__
    )


def _reduced_text(v: Any, tp: type, text: Callable[[Any], str]) -> str:
    """``v`` by what it pickles to (how ``copy.deepcopy``, which every stored element went
    through, sees it): the constructor's name, its arguments, the state and the items."""
    try:
        rv = v.__reduce_ex__(4)
    except Exception:  # noqa: BLE001 - nothing but its kind to compare
        return f"<{tp.__qualname__}>"
    if isinstance(rv, str):  # a global: its name
        return f"<{tp.__qualname__} {rv}>"
    fn, *rest = rv
    parts = [text(list(x) if isinstance(x, Iterator) else x) for x in rest if x is not None]
    name = getattr(fn, "__qualname__", type(fn).__qualname__)
    return f"{tp.__qualname__}<{name}>({'; '.join(parts)})"


def attributes(obj: Any) -> dict[str, Any] | None:
    """The instance attributes of ``obj``, its ``__dict__`` and then its set slots; None
    when it has neither a ``__dict__`` nor a set slot (a lock, most C objects)."""
    d = getattr(obj, "__dict__", None)
    mapping = isinstance(d, (dict, types.MappingProxyType))  # (a class's is a proxy)
    found: dict[str, Any] = dict(d) if mapping else {}  # type: ignore[arg-type]
    found.update(slot_values(obj))
    return found if found or mapping else None


def slot_values(obj: Any) -> list[tuple[str, Any]]:
    """The slots of ``obj`` that are set, over its class's MRO, with their values."""
    out = []
    for klass in type(obj).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if isinstance(slot, str) and slot not in ("__dict__", "__weakref__"):
                with contextlib.suppress(AttributeError):
                    out.append((slot, getattr(obj, slot)))
    return out


__all__ = [
    "EXACT_REPR",
    "IMMUTABLE",
    "MAX_NESTING",
    "TEXT_VERSION",
    "attributes",
    "detached",
    "frozen",
    "slot_values",
    "stable_text",
]
