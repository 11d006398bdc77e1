"""Numbers a loop body reads outside DDS, compared across ranks (``closure.captured_numbers``
and ``check_same_numbers``): flagged exactly when two ranks' values differ in type or bits.

Each case builds the body twice, as two ranks' drivers would, with the value in one place
a body can read it from (a closure variable, a global, a default argument, a global a
helper reads, a kernel argument), and compares what each copy reports.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from engine import DriverCapturesDivergedError
from engine._asyncfor.closure import captured_numbers, check_same_numbers

PLACES = ("closure", "global", "default", "helper", "kernel")

_SOURCE = """
def make(value, label):
    v = value
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
    return closure_body, global_body, default_body, helper_body, kernel_py
"""


def _body(place: str, value: Any, label: str) -> list[tuple[str, str, str]]:
    """What one rank's body reports, built in a module of its own (like a user's file)."""
    ns: dict[str, Any] = {"V": value}
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


def test_labels_and_large_arrays_are_not_compared() -> None:
    """A per-rank string (a log prefix) may differ; an array past AGREE_ARRAY_BYTES is
    data, not a hyperparameter, and is not sent at every invocation."""
    assert _body("closure", "rank 0", "x") == []
    big = [_body("global", np.full(1024, float(r)), "x") for r in range(2)]
    assert big == [[], []]
    check_same_numbers("async_for 'op' (invocation 0)", big)


def test_the_error_names_where_the_body_reads_it() -> None:
    per_rank = [_body("helper", 1.0, "x"), _body("helper", 2.0, "x")]
    with pytest.raises(DriverCapturesDivergedError, match=r"reads 'V' \(float, global in "):
        check_same_numbers("sync_for 'op' (invocation 3)", per_rank)
    per_rank = [_body("kernel", 0.5, "x"), _body("kernel", 0.25, "x")]
    with pytest.raises(DriverCapturesDivergedError, match="'v' \\(float, argument of kernel_py"):
        check_same_numbers("async_for 'op' (invocation 0)", per_rank)
