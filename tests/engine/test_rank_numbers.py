"""What the ranks compare so that one rank's Python state cannot go unnoticed: the numbers
a loop body reads outside DDS (``closure.captured_numbers``, ``check_same_numbers``) and the
driver's writes to DDS (``session._DriverWrites``): flagged exactly when two ranks' values
differ in type or bits.

Each case builds the body twice, as two ranks' drivers would, with the value in one place
a body can read it from (a closure variable, a global, a default argument, a global a
helper reads, a kernel argument, an attribute of a captured object, an attribute of the
object a method body is bound to), and compares what each copy reports.  The values are
numbers and arrays, and containers of numbers and strings nested in each other.
"""

from __future__ import annotations

import copy
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from engine import DriverCapturesDivergedError, DriverWritesDivergedError
from engine._asyncfor.closure import (
    AGREE_ARRAY_BYTES,
    AGREE_DEPTH,
    Captures,
    captured_numbers,
    check_same_numbers,
)
from engine._data.dds import value_bytes
from engine._runtime.session import WRITES_KEPT, _DriverWrites, _writes_error

PLACES = ("closure", "global", "default", "helper", "kernel", "attribute", "method")

_SOURCE = """
class Holder:
    def __init__(self, value, label):
        self.v = value
        self.t0 = sum(map(ord, label))  # per rank, but no body names it: not compared
    def step(self, j):
        return self.v
def make(value, label):
    v = value
    holder = Holder(value, label)
    def closure_body(j):
        return v + j if label else v
    def global_body(j):
        return V + j
    def default_body(j, v=value):
        return v + j
    def helper(x):
        return x * V
    def helper_body(j):
        return helper(j)
    def kernel_py(j, X, v):
        return v
    def attribute_body(j):
        return holder.v
    return (closure_body, global_body, default_body, helper_body, kernel_py, attribute_body,
            holder.step)
"""


def _body(place: str, value: Any, label: str) -> list[tuple[str, str, str]]:
    """What one rank's body reports, built in a module of its own (like a user's file;
    ``label`` differs per rank and no body compares it)."""
    ns: dict[str, Any] = {"V": value, "__name__": "rank_numbers_user"}
    exec(compile(_SOURCE, "<rank-numbers>", "exec"), ns)
    bodies = dict(zip(PLACES, ns["make"](value, label), strict=True))
    if place == "kernel":
        return captured_numbers(bodies["kernel"], (object(), value))
    return captured_numbers(bodies[place])


def _bits(v: Any) -> Any:
    """What makes two values the same here: the type and the exact bits."""
    if isinstance(v, np.ndarray):
        return ("array", v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, tuple):
        return ("tuple", tuple(_bits(x) for x in v))
    if isinstance(v, float):  # np.float64 too, but as a type of its own
        return (type(v), struct.pack("<d", v))
    if isinstance(v, complex):
        return (type(v), struct.pack("<dd", v.real, v.imag))
    if isinstance(v, np.generic):
        return (type(v), v.tobytes())
    return (type(v), v)


scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.complex_numbers(allow_nan=False),
    st.floats(width=32, allow_nan=False).map(np.float32),
    st.integers(-(2**31), 2**31 - 1).map(np.int64),
)
arrays = hnp.arrays(
    st.sampled_from([np.float64, np.int32]), hnp.array_shapes(max_dims=2, max_side=4)
)
numbers = st.one_of(scalars, st.tuples(scalars, scalars), st.none())


def _variants(v: Any) -> list[Any]:
    """``v`` again (a copy) and values a rank could have instead that are *almost* ``v``:
    the next float, the other zero, the same number as another type, one array element
    changed, the same bytes in another shape."""
    if v is None:
        return [None, 0.0]
    if isinstance(v, bool):
        return [v, not v, int(v)]
    if isinstance(v, np.ndarray):
        other = np.int64 if v.dtype == np.float64 else np.float32  # the same bytes
        out = [v.copy(), v.view(other), v.reshape(-1)]
        for k in (0, -1)[: v.size]:
            w = v.copy()
            w.flat[k] = 7 if w.flat[k] != 7 else 8
            out.append(w)
        return out
    if isinstance(v, tuple):
        return [v, (v[1], v[0]), v[:1]]
    if isinstance(v, np.float32):
        return [v, np.float64(v), np.nextafter(v, np.float32(np.inf))]
    if isinstance(v, np.int64):
        return [v, int(v), np.int64(int(v) // 2)]
    if isinstance(v, float):
        return [v, -v, float(np.nextafter(v, np.inf)), np.float64(v)]
    if isinstance(v, complex):
        return [v, v.conjugate(), complex(v.imag, v.real)]
    return [v, v + 1, -v, float(v)]  # int


def _pair(values: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[Any, Any]]:
    """Two ranks' values: equal (a copy), almost equal (:func:`_variants`), or unrelated."""
    near = values.flatmap(lambda v: st.sampled_from(_variants(v)).map(lambda w: (v, w)))
    return st.one_of(near, near, st.tuples(values, values))


@given(place=st.sampled_from(PLACES), pair=_pair(numbers))
def test_flagged_exactly_when_the_ranks_numbers_differ(place: str, pair: tuple[Any, Any]) -> None:
    _check(place, *pair)


@given(place=st.sampled_from(PLACES), pair=_pair(arrays))
def test_flagged_exactly_when_the_ranks_arrays_differ(place: str, pair: tuple[Any, Any]) -> None:
    _check(place, *pair)


def _check(place: str, a: Any, b: Any) -> None:
    per_rank = [_body(place, a, "rank 0"), _body(place, b, "rank 1")]
    if _bits(a) == _bits(b):
        check_same_numbers("async_for 'op' (invocation 0)", per_rank)
        return
    with pytest.raises(DriverCapturesDivergedError) as err:
        check_same_numbers("async_for 'op' (invocation 0)", per_rank)
    msg = str(err.value)
    assert "the body of async_for 'op' (invocation 0) reads '" in msg
    assert "on rank 0 and " in msg and " on rank 1;" in msg
    if a is None or b is None:
        assert "not a number on rank" in msg


def test_labels_and_large_arrays_by_shape_are_not_compared() -> None:
    """A per-rank string (a log prefix) may differ; an array past AGREE_ARRAY_BYTES is
    data, not a hyperparameter, and only its dtype and shape are sent at every invocation."""
    assert _body("closure", "rank 0", "x") == []
    assert _body("global", ["rank 0", ("log", b"x")], "x") == []
    big = [_body("global", np.full(AGREE_ARRAY_BYTES // 8 + 1, float(r)), "x") for r in range(2)]
    check_same_numbers("async_for 'op' (invocation 0)", big)
    other = _body("global", np.zeros(AGREE_ARRAY_BYTES // 8 + 2), "x")
    with pytest.raises(DriverCapturesDivergedError, match=r"float64 array of shape \(8194,\) on"):
        check_same_numbers("async_for 'op' (invocation 0)", [big[0], other])


def test_the_error_names_where_the_body_reads_it() -> None:
    per_rank = [_body("helper", 1.0, "x"), _body("helper", 2.0, "x")]
    with pytest.raises(DriverCapturesDivergedError, match=r"reads 'V' \(float, global in "):
        check_same_numbers("sync_for 'op' (invocation 3)", per_rank)
    per_rank = [_body("kernel", 0.5, "x"), _body("kernel", 0.25, "x")]
    with pytest.raises(DriverCapturesDivergedError, match="'v' \\(float, argument of kernel_py"):
        check_same_numbers("async_for 'op' (invocation 0)", per_rank)


def _aggregation_reading(scale: float) -> Any:
    return lambda deltas: deltas.sum(axis=0) * scale


def test_an_aggregation_functions_numbers_are_named_as_its_own() -> None:
    """``sync_for`` adds the numbers each aggregation function reads to its body's
    (``Captures.merge``); a callable that is no Python function (``functools.partial``
    of a numpy function) reads none."""
    import functools

    per_rank = []
    for scale in (1.0, 2.0):
        caps = Captures(lambda j: j)
        caps.merge(Captures(functools.partial(np.sum, axis=0)), "the aggregation function of 'V'")
        caps.merge(Captures(_aggregation_reading(scale)), "the aggregation function of 'W'")
        per_rank.append(caps.details())
    with pytest.raises(
        DriverCapturesDivergedError,
        match=r"reads 'scale' \(float\) in the aggregation function of 'W', which is 1.0 on",
    ):
        check_same_numbers("sync_for 'op' (invocation 0)", per_rank)


# ---------------------------------------------------------------- numbers inside values
# A body reads numbers through lists, dicts, tuples, sets and objects too (a config dict,
# a schedule, ``self.lr``, ``len(history)``).  Reference: two values read the same when
# their numbers agree bit for bit at the same positions and every container that holds a
# number (or is empty) has the same type and length (a dict: the same keys); strings, and
# containers that hold nothing else, are labels; deeper than AGREE_DEPTH is not compared.

plain = st.recursive(
    st.one_of(scalars, st.text(max_size=2)),
    lambda kids: st.one_of(
        st.lists(kids, max_size=3),
        st.lists(kids, max_size=3).map(tuple),
        st.dictionaries(st.one_of(st.text(max_size=2), st.integers(0, 3)), kids, max_size=3),
        st.frozensets(st.integers(-3, 3) | st.floats(allow_nan=False), max_size=3),
    ),
    max_leaves=12,
)


def _content(v: Any, depth: int = 0) -> Any:
    """What the ranks must agree on in ``v``; None when nothing in it is compared."""
    if depth > AGREE_DEPTH or isinstance(v, str):
        return None
    if isinstance(v, tuple) and v and all(not isinstance(x, (str, tuple, list, dict)) for x in v):
        if not any(isinstance(x, (frozenset)) for x in v):
            return _bits(v)  # a tuple of numbers is one value
    if isinstance(v, (list, tuple)):
        items = [_content(x, depth + 1) for x in v]
        keep = not v or any(x is not None for x in items)
        return (type(v), len(v), items) if keep else None
    if isinstance(v, dict):
        items = [(repr(k), _content(x, depth + 1)) for k, x in v.items()]
        keep = not v or any(x is not None for _, x in items)
        return ("dict", items) if keep else None
    if isinstance(v, frozenset):
        return ("set", sorted(repr(_bits(x)) for x in v))
    return _bits(v)


def _edited(v: Any, data: st.DataObject) -> Any:
    """``v`` with one thing changed somewhere inside: a number (:func:`_variants`), a
    string, an item added or dropped, a key renamed; or nothing."""
    if isinstance(v, str):
        return data.draw(st.text(max_size=2))
    if isinstance(v, (list, tuple, dict)) and data.draw(st.booleans()):
        how = data.draw(st.sampled_from(["inside", "add", "drop", "key"]))
        keys = list(v) if isinstance(v, dict) else list(range(len(v)))
        if not keys or how == "add":
            extra = data.draw(plain)
            if isinstance(v, dict):
                return {**v, data.draw(st.text(max_size=2)): extra}
            return type(v)([*v, extra])
        k = data.draw(st.sampled_from(keys))
        if isinstance(v, dict):
            rest = {key: x for key, x in v.items() if key != k}
            if how == "drop":
                return rest
            if how == "key":
                return {**rest, f"{k}!": v[k]}
            return {**rest, k: _edited(v[k], data)}
        items = list(v)
        if how == "drop":
            del items[k]
        else:
            items[k] = _edited(items[k], data)
        return type(v)(items)
    if isinstance(v, (list, tuple, dict, frozenset)):
        return copy.deepcopy(v)
    return data.draw(st.sampled_from(_variants(v)))


@given(place=st.sampled_from(PLACES), a=plain, data=st.data())
def test_flagged_exactly_when_the_numbers_inside_differ(
    place: str, a: Any, data: st.DataObject
) -> None:
    b = _edited(a, data) if data.draw(st.booleans()) else data.draw(plain)
    per_rank = [_body(place, a, "rank 0"), _body(place, b, "rank 1")]
    if _content(a) == _content(b):
        check_same_numbers("async_for 'op' (invocation 0)", per_rank)
        return
    with pytest.raises(DriverCapturesDivergedError, match="on rank 0 and .* on rank 1;"):
        check_same_numbers("async_for 'op' (invocation 0)", per_rank)


def test_the_error_names_the_item_inside() -> None:
    """A history only rank 0 appends to (``len(HISTORY)`` as an epoch counter), a config
    dict, an attribute of a bound object: the message names the place and both values."""
    cases = [
        ("global", [[], [0.25]], "reads 'V' (list), which is [] on rank 0 and [0.25] on rank 1"),
        ("closure", [{"lr": 0.1}, {"lr": 0.2}], "\"v['lr']\" (float), which is 0.1 on rank 0"),
        ("method", [(1, [2.0]), (1, [3.0])], "reads 'self.v[1][0]' (float), which is 2.0 on"),
        ("attribute", [1, 2], "reads 'holder.v' (int), which is 1 on rank 0 and 2 on rank 1"),
    ]
    for place, (a, b), message in cases:
        per_rank = [_body(place, a, "rank 0"), _body(place, b, "rank 1")]
        with pytest.raises(DriverCapturesDivergedError) as err:
            check_same_numbers("async_for 'op' (invocation 0)", per_rank)
        assert message in str(err.value), str(err.value)


# ---------------------------------------------------------------- driver writes
# Each rank hashes the driver's DDS writes (element, value_bytes) since its last operation;
# ranks compare the hashes at the next one, and the error names the first write that differs.

written = st.one_of(
    arrays,
    hnp.arrays(np.float64, st.just(())),  # a 0-d element of a 1-d numeric DDS
    numbers,
    st.text(max_size=4),
)


def _same_write(a: tuple[str, Any], b: tuple[str, Any]) -> bool:
    if a[0] != b[0]:
        return False
    va, vb = a[1], b[1]
    if isinstance(va, np.ndarray) or isinstance(vb, np.ndarray):
        return (
            isinstance(va, np.ndarray)
            and isinstance(vb, np.ndarray)
            and (va.dtype, va.shape, va.tobytes()) == (vb.dtype, vb.shape, vb.tobytes())
        )
    return _bits(va) == _bits(vb) if not isinstance(va, str) else va == vb


def _changed(writes: list[tuple[str, Any]], data: st.DataObject) -> list[tuple[str, Any]]:
    """Another rank's writes: the same, or one write changed, dropped or added."""
    how = data.draw(st.sampled_from(["same", "value", "element", "drop", "add"]))
    out = list(writes)
    if how == "same" or (how != "add" and not out):
        return out
    k = data.draw(st.integers(0, len(out) - (how != "add")))
    if how == "value":
        element, v = out[k]
        out[k] = (
            element,
            data.draw(
                st.sampled_from(_variants(v)) if not isinstance(v, str) else st.text(max_size=4)
            ),
        )
    elif how == "element":
        out[k] = (out[k][0] + "x", out[k][1])
    elif how == "drop":
        del out[k]
    else:
        out.insert(k, ("X[0]", data.draw(written)))
    return out


def _summary(writes: list[tuple[str, Any]]) -> tuple[_DriverWrites, tuple[int, str]]:
    w = _DriverWrites()
    for element, value in writes:
        w.add(element, value_bytes(value), lambda v=value: repr(v))
    return w, w.summary()


@given(
    base=st.lists(st.tuples(st.sampled_from(["X[0]", "X[1]", "M['k']"]), written), max_size=70),
    data=st.data(),
)
def test_driver_writes_compare_equal_exactly_when_the_same(
    base: list[tuple[str, Any]], data: st.DataObject
) -> None:
    other = _changed(base, data)
    (w0, s0), (w1, s1) = _summary(base), _summary(other)
    first = next(
        (k for k, (a, b) in enumerate(zip(base, other, strict=False)) if not _same_write(a, b)),
        None if len(base) == len(other) else min(len(base), len(other)),
    )
    assert (s0 == s1) == (first is None)
    if first is None:
        return
    err = _writes_error("async_for 'op' #0 over [0, 4)", [s0[0], s1[0]], [w0.kept, w1.kept])
    assert isinstance(err, DriverWritesDivergedError)
    if first < WRITES_KEPT:
        assert f"its DDS write {first + 1} before async_for 'op' #0 over [0, 4) was " in str(err)
    elif len(base) != len(other):
        assert f"its DDS writes before async_for 'op' #0 over [0, 4) were {len(base)} on " in str(
            err
        )
    else:
        assert f"(the first {WRITES_KEPT} agree)" in str(err)


@given(a=written, data=st.data())
def test_a_written_value_compares_by_type_shape_and_bits(a: Any, data: st.DataObject) -> None:
    b = data.draw(st.sampled_from(_variants(a)) if not isinstance(a, str) else st.text(max_size=4))
    same = _same_write(("X[0]", a), ("X[0]", b))
    assert (value_bytes(a) == value_bytes(b)) == same, (a, b)
