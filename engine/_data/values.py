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
from collections.abc import Mapping
from typing import Any

import numpy as np

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


#: How deep :func:`stable_text` follows objects whose ``repr`` shows an address.
MAX_NESTING = 300


def stable_text(v: Any) -> str:
    """The text a Python-object element is digested and compared by: its ``repr``,
    unless that shows a memory address (an object of a class without ``__repr__``,
    ``<Box object at 0x7f...>``, or a container holding one), which differs between
    processes and runs, so replays and the dual tests' sides could never agree on it.
    Then: the type's name and the object's state, recursively (a set's items in sorted
    order).  Values whose ``repr`` shows no address keep it, so the digests of traces
    recorded before are unchanged."""
    text = repr(v)
    return text if " at 0x" not in text else _state_text(v, set())


def _state_text(v: Any, path: set[int]) -> str:
    tp = type(v)
    if tp in IMMUTABLE:
        return repr(v)
    if id(v) in path:
        return "<cycle>"
    if len(path) >= MAX_NESTING:
        raise DDSError(
            f"a DDS element of type {type(v).__qualname__} is nested more than {MAX_NESTING} "
            "levels deep and shows memory addresses in its repr, so it cannot be compared "
            "between processes; give its classes a __repr__ that shows their state"
        )
    path.add(id(v))
    try:
        if isinstance(v, (list, tuple)):
            items = ", ".join(_state_text(x, path) for x in v)
            return f"{tp.__qualname__}[{items}]"
        if isinstance(v, dict):
            items = ", ".join(
                f"{_state_text(k, path)}: {_state_text(x, path)}" for k, x in v.items()
            )
            return f"{tp.__qualname__}{{{items}}}"
        if isinstance(v, (set, frozenset)):
            return f"{tp.__qualname__}{{{', '.join(sorted(_state_text(x, path) for x in v))}}}"
        if isinstance(v, np.ndarray) and v.dtype == object:
            return f"array[{', '.join(_state_text(x, path) for x in v.ravel().tolist())}]"
        text = repr(v)
        if " at 0x" not in text:
            return text
        state = attributes(v)
        if state is None:  # a lock, a C object: nothing but its kind to compare
            return f"<{tp.__qualname__} {getattr(v, '__qualname__', '')}>"
        items = ", ".join(f"{k}={_state_text(x, path)}" for k, x in state.items())
        return f"{tp.__qualname__}({items})"
    finally:
        path.discard(id(v))


def attributes(obj: Any) -> dict[str, Any] | None:
    """The instance attributes of ``obj``, its ``__dict__`` and then its set slots; None
    when it has neither a ``__dict__`` nor a set slot (a lock, most C objects)."""
    d = getattr(obj, "__dict__", None)
    found = dict(d) if isinstance(d, Mapping) else {}  # (a class's is a mappingproxy)
    found.update(slot_values(obj))
    return found if found or isinstance(d, Mapping) else None


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


__all__ = ["IMMUTABLE", "attributes", "detached", "frozen", "slot_values", "stable_text"]
