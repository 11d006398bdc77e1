"""Exact, order-free folds for ``ap.reduce``: a node folds its own values into a small
*part*, the nodes exchange only the parts, and every rank combines them.

Why exact: a fold whose bits do not depend on how the values were split over P nodes must
not depend on the order of its additions, and floating-point addition is not
associative.  An exact sum is: every finite float64 is an integer multiple of 2**-1074, so
a node's sum is a Python int on that grid (kept as ``(n, e)``, the value
``n * 2**(e - 1074)``, so that sums of ordinary numbers stay a few words long); the
combined int is rounded once, with Python's correctly rounded int / int division.  The
result is the correctly rounded sum of the values (``math.fsum``'s, except that a sum of
only -0.0 is -0.0, as IEEE addition gives and today's fold gave), the same for every P.

``max`` and ``min`` are order-free once ties are settled as a left fold settles them: the
fold keeps its accumulator unless a value is strictly greater (smaller), so its result is
the *first* extreme value in index order (1 before 1.0, 0.0 before -0.0).  A part is the
node's first extreme with its slot, and the combination takes the lowest slot among equals.

Which values qualify is decided so that splitting a list cannot change the verdict (each
part carries a *class*, and classes combine as the whole list's would): anything else,
and NaN under max/min, makes :func:`combine` answer :data:`GATHER` and the caller folds
gathered values in index order as before.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

#: :func:`combine`'s answer when the values need today's fold over gathered values.
GATHER: Any = object()

_MANT_BITS = 52
_LO_BITS = 26  #: mantissas are summed as two halves, so int64 group sums cannot overflow
_FLOAT_TYPES = frozenset({float, np.float64})
#: Largest count of (element, exponent) bins summed with ``np.bincount`` (one float64
#: each); beyond it, and for more than 2**25 values, groups are found by sorting.
_BINS = 1 << 20
_EXACT_BINCOUNT = 1 << 25
#: Most elements of an array value summed exactly: the exact sum costs Python work per
#: element and exponent (about 1 us), which for bigger arrays would outweigh gathering.
ARRAY_MAX = 1 << 12
#: Most floats stacked at once while a node sums its arrays (memory, 32 MB).
_STACK_MAX = 1 << 22


@dataclass(frozen=True, slots=True)
class Sum:
    """One node's exact sum.  ``cls``: ``"int"`` (Python ints), ``"float"`` (Python
    floats and numpy float64 scalars, Python ints allowed), ``"<dtype>"`` for numpy integer
    scalars of that one dtype, ``"array"`` (float64 arrays of shape ``shape``).  For
    floats: ``n``, ``e`` the finite values' sum ``n * 2**(e - 1074)`` (element-wise lists
    for arrays), ``nan``/``pinf``/``ninf`` whether a NaN/+inf/-inf was seen, ``negzero``
    whether every value was -0.0, ``np64`` whether a numpy float64 scalar was seen (the
    fold's result would be one)."""

    cls: str
    n: Any = 0
    e: Any = 0
    nan: Any = False
    pinf: Any = False
    ninf: Any = False
    negzero: Any = True
    np64: bool = False
    shape: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Extreme:
    """One node's first maximum (minimum) and its slot; ``types``: the values' types."""

    value: Any
    slot: int
    types: frozenset[type]


@dataclass(frozen=True, slots=True)
class Empty:
    """A node that owns no element: the identity of every combination."""


def supported(op: Any) -> bool:
    """Whether ``op`` has an exact, order-free fold here (``+``, builtin ``max``/``min``)."""
    return op is operator.add or op is max or op is min


# ------------------------------------------------------------------- one node
def part(values: list[Any], slots: list[int], op: Any) -> Sum | Extreme | Empty | None:
    """The part of a node's ``values`` (at ``slots``, in slot order) for ``op``, or None
    when they do not qualify (then the run gathers them)."""
    if not values:
        return Empty()
    if op is operator.add:
        return _sum_part(values)
    return _extreme_part(values, slots, op)


def _sum_part(values: list[Any]) -> Sum | None:
    types = set(map(type, values))
    if types == {int}:
        return Sum("int", n=sum(values), e=0, negzero=False)
    if types <= {int, float, np.float64}:
        ints = 0
        if int in types:
            ints = sum(v for v in values if type(v) is int)
            values = [v for v in values if type(v) is not int]
        floats = np.array(values, dtype=np.float64)
        n, e, nan, pinf, ninf, negzero = _floats(floats[None, :])
        total = _add((n[0], e[0]), (ints, 1074))
        return Sum(
            "float",
            n=total[0],
            e=total[1],
            nan=bool(nan[0]),
            pinf=bool(pinf[0]),
            ninf=bool(ninf[0]),
            negzero=bool(negzero[0]) and int not in types,
            np64=np.float64 in types,
        )
    if len(types) == 1:
        (t,) = types
        if issubclass(t, np.integer):
            return Sum(np.dtype(t).str, n=sum(int(v) for v in values), negzero=False)
        if t is np.ndarray:
            return _array_part(values)
    return None


def _array_part(values: list[np.ndarray]) -> Sum | None:
    shape = values[0].shape
    if not shape or any(v.dtype != np.float64 or v.shape != shape for v in values):
        return None
    size = values[0].size
    if size > ARRAY_MAX:
        return None
    step = max(1, _STACK_MAX // size)
    nan = pinf = ninf = np.zeros(size, dtype=bool)
    negzero = np.ones(size, dtype=bool)
    n, e = [0] * size, [0] * size
    for k in range(0, len(values), step):
        # one row per element position, at most _STACK_MAX floats at a time
        stacked = np.stack(values[k : k + step]).reshape(-1, size).T
        cn, ce, cnan, cpinf, cninf, cneg = _floats(stacked)
        for i in range(size):
            n[i], e[i] = _add((n[i], e[i]), (cn[i], ce[i]))
        nan, pinf, ninf, negzero = nan | cnan, pinf | cpinf, ninf | cninf, negzero & cneg
    return Sum("array", n=n, e=e, nan=nan, pinf=pinf, ninf=ninf, negzero=negzero, shape=shape)


def _floats(
    x: np.ndarray,
) -> tuple[list[int], list[int], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Exact sums of each row of the float64 matrix ``x``: per row ``(n, e)`` of its finite
    values, and whether it holds a NaN, +inf, -inf, and only -0.0."""
    rows = x.shape[0]
    nan = np.isnan(x).any(axis=1)
    pinf = (x == np.inf).any(axis=1)
    ninf = (x == -np.inf).any(axis=1)
    negzero = ((x == 0) & np.signbit(x)).all(axis=1)
    finite = np.isfinite(x)
    row = np.broadcast_to(np.arange(rows)[:, None], x.shape)[finite]
    bits = x[finite].view(np.int64)
    expo = (bits >> _MANT_BITS) & 0x7FF
    mant = bits & ((1 << _MANT_BITS) - 1)
    normal = expo != 0
    # a normal float is (2**52 + mantissa) * 2**(expo - 1075), a subnormal mantissa * 2**-1074
    mant = np.where(normal, mant | (1 << _MANT_BITS), mant)
    shift = np.where(normal, expo - 1, 0)
    sign = np.where(bits < 0, -1, 1)
    hi = sign * (mant >> _LO_BITS)
    lo = sign * (mant & ((1 << _LO_BITS) - 1))
    key = row * 2048 + shift
    if rows * 2048 <= _BINS and len(key) <= _EXACT_BINCOUNT:
        # float64 bin sums of terms below 2**27 stay exact below 2**26 terms per bin
        his = np.bincount(key, weights=hi, minlength=rows * 2048)
        los = np.bincount(key, weights=lo, minlength=rows * 2048)
        used = np.flatnonzero((his != 0) | (los != 0))
        groups = zip(
            used.tolist(),
            his[used].astype(np.int64).tolist(),
            los[used].astype(np.int64).tolist(),
            strict=True,
        )
    else:
        order = np.argsort(key, kind="stable")
        key = key[order]
        starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else key
        groups = zip(
            key[starts].tolist(),
            np.add.reduceat(hi[order], starts).tolist() if len(key) else [],
            np.add.reduceat(lo[order], starts).tolist() if len(key) else [],
            strict=True,
        )
    n = [0] * rows
    e = [0] * rows
    for k, h, lw in groups:
        r, s = divmod(k, 2048)
        n[r], e[r] = _add((n[r], e[r]), ((h << _LO_BITS) + lw, s))
    return n, e, nan, pinf, ninf, negzero


def _add(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    """``(n, e)`` of the sum of two ``(n, e)`` values (``n * 2**(e - 1074)``)."""
    (n1, e1), (n2, e2) = a, b
    if not n1:
        return n2, e2
    if not n2:
        return n1, e1
    lo = min(e1, e2)
    return (n1 << (e1 - lo)) + (n2 << (e2 - lo)), lo


def _extreme_part(values: list[Any], slots: list[int], op: Any) -> Extreme | None:
    types = frozenset(map(type, values))
    if not _ordered(types) or any(v != v for v in values):  # NaN: no order
        return None
    best = values[0]
    at = slots[0]
    better = operator.gt if op is max else operator.lt
    for v, s in zip(values, slots, strict=True):
        if better(v, best) or (not better(best, v) and s < at):
            best, at = v, s
    return Extreme(best, at, types)


def _ordered(types: frozenset[type]) -> bool:
    """Whether values of these types compare exactly with each other (Python ints and
    floats; floats and numpy float64; one numpy scalar type alone)."""
    if types <= {int, float} or types <= _FLOAT_TYPES:
        return True
    if len(types) == 1:
        (t,) = types
        return issubclass(t, (np.integer, np.floating))
    return False


# ------------------------------------------------------------------- combined
def combine(parts: list[Any], op: Any) -> Any:
    """The fold of every node's values from their parts (in node order; ``initial``'s part
    first), or :data:`GATHER`."""
    parts = [p for p in parts if not isinstance(p, Empty)]
    if not parts or any(p is None for p in parts):
        return GATHER
    if op is operator.add:
        return _combine_sums(parts)
    return _combine_extremes(parts, op)


def _combine_sums(parts: list[Any]) -> Any:
    if not all(isinstance(p, Sum) for p in parts):
        return GATHER
    classes = {p.cls for p in parts}
    if classes == {"int", "float"}:
        classes = {"float"}
    if len(classes) != 1:
        return GATHER
    (cls,) = classes
    if cls == "array":
        return _combine_arrays(parts)
    if cls == "int":
        return sum(p.n for p in parts)
    if cls != "float":  # numpy integers: the fold's wrap-around is modular, so exact too
        dtype = np.dtype(cls)
        bits = 8 * dtype.itemsize
        total = sum(p.n for p in parts) % (1 << bits)
        if dtype.kind == "i" and total >= 1 << (bits - 1):
            total -= 1 << bits
        return dtype.type(total)
    n, e = 0, 0
    for p in parts:
        n, e = _add((n, e), (p.n, p.e) if p.cls == "float" else (p.n, 1074))
    value = _finish(
        n,
        e,
        any(p.nan for p in parts),
        any(p.pinf for p in parts),
        any(p.ninf for p in parts),
        all(p.cls == "float" and p.negzero for p in parts),
    )
    return np.float64(value) if any(p.np64 for p in parts) else value


def _combine_arrays(parts: list[Sum]) -> Any:
    shape = parts[0].shape
    if any(p.shape != shape for p in parts):
        return GATHER
    size = len(parts[0].n)
    out = np.empty(size, dtype=np.float64)
    nan = np.logical_or.reduce([p.nan for p in parts])
    pinf = np.logical_or.reduce([p.pinf for p in parts])
    ninf = np.logical_or.reduce([p.ninf for p in parts])
    negzero = np.logical_and.reduce([p.negzero for p in parts])
    for i in range(size):
        n, e = 0, 0
        for p in parts:
            n, e = _add((n, e), (p.n[i], p.e[i]))
        out[i] = _finish(n, e, nan[i], pinf[i], ninf[i], negzero[i])
    return out.reshape(shape)


def _finish(n: int, e: int, nan: bool, pinf: bool, ninf: bool, negzero: bool) -> float:
    """The correctly rounded float of ``n * 2**(e - 1074)``, after IEEE's rules for the
    non-finite values seen and for a sum of only -0.0."""
    if nan or (pinf and ninf):
        return math.nan
    if pinf:
        return math.inf
    if ninf:
        return -math.inf
    if not n:
        return -0.0 if negzero else 0.0
    scale = e - 1074
    try:
        return float(n << scale) if scale >= 0 else n / (1 << -scale)
    except OverflowError:  # beyond the largest float once rounded: IEEE gives infinity
        return math.inf if n > 0 else -math.inf


def _combine_extremes(parts: list[Any], op: Any) -> Any:
    if not all(isinstance(p, Extreme) for p in parts):
        return GATHER
    if not _ordered(frozenset().union(*(p.types for p in parts))):
        return GATHER
    better = operator.gt if op is max else operator.lt
    best = parts[0]
    for p in parts[1:]:
        if better(p.value, best.value) or (not better(best.value, p.value) and p.slot < best.slot):
            best = p
    return best.value


__all__ = ["ARRAY_MAX", "GATHER", "Empty", "Extreme", "Sum", "combine", "part", "supported"]
