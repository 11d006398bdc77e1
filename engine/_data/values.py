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
"""

from __future__ import annotations

import copy
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
    if not _sealed(tp):
        return False
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
    if _SEALED.get(tp) or _sealed(tp):
        for item in v:
            if type(item) not in IMMUTABLE and not frozen(item):
                break
        else:
            return v
    try:
        return copy.deepcopy(v)
    except Exception as exc:  # noqa: BLE001 - whatever deepcopy raises names the problem
        what = f"{where}: " if where else ""
        raise DDSError(
            f"{what}a DDS element is copied whenever it is read or written, and a "
            f"{type(v).__qualname__} cannot be ({type(exc).__name__}: {exc}); store plain "
            "data (numbers, strings, tuples, lists, dicts, arrays, your own objects of such)"
        ) from None


__all__ = ["IMMUTABLE", "detached", "frozen"]
