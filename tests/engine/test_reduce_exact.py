"""``ap.reduce`` gives the same bits on any number of nodes without gathering every value:
sums of numbers are exact (the correctly rounded sum), max/min keep a left fold's first
extreme, and everything else is still folded in index order.

The failures these guard against: a sum whose last bits depend on how the values were
split over nodes (float addition is not associative), a wrong IEEE special case (signed
zero, infinities, NaN, overflow, subnormals), a max/min that picks another of two equal
values (1 vs 1.0, 0.0 vs -0.0) than the fold did, a user's op folded out of order, and a
reduce that still sends every value to every node."""

from __future__ import annotations

import functools
import math
import operator
import pickle
import re
import struct
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine as ap
from engine._runtime.transport import InProcessCluster
from tests.conftest import run_mpi
from tests.engine import reduce_cases

HERE = Path(__file__).parent
NODES = (1, 2, 3, 8, 64)


def _reduce(values: list[Any], nodes: int, op: Any = operator.add, **kw: Any) -> Any:
    def prog() -> Any:
        X = ap.dvector(len(values), data=range(len(values)))
        return ap.reduce(X, lambda i: values[int(i)], op=op, **kw)

    return ap.run(prog, nodes=nodes).value


def _bits(v: Any) -> tuple[str, str]:
    if isinstance(v, np.ndarray):
        return f"{v.dtype}{v.shape}", v.tobytes().hex()
    if isinstance(v, float):
        return type(v).__name__, struct.pack("<d", v).hex()
    return type(v).__name__, repr(v)


def _on_every_cluster(values: list[Any], op: Any = operator.add, **kw: Any) -> Any:
    """The result on P = 1; the test fails unless P = 2, 3, 8, 64 give the same bits."""
    results = [_reduce(values, p, op, **kw) for p in NODES]
    assert len({_bits(r) for r in results}) == 1, dict(zip(NODES, results, strict=True))
    return results[0]


def _ieee_sum(values: list[float]) -> float:
    """The correctly rounded sum after IEEE's rules, computed with fractions."""
    if any(math.isnan(v) for v in values) or (math.inf in values and -math.inf in values):
        return math.nan
    if math.inf in values or -math.inf in values:
        return math.inf if math.inf in values else -math.inf
    total = sum(Fraction(v) for v in values)
    if total == 0:
        neg = all(type(v) is not int and math.copysign(1.0, v) < 0 for v in values)
        return -0.0 if neg else 0.0
    try:
        return float(total)  # n / d: correctly rounded
    except OverflowError:
        return math.inf if total > 0 else -math.inf


def _same_float(a: float, b: float) -> bool:
    return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))


SPECIAL = st.sampled_from(
    [
        0.0,
        -0.0,
        5e-324,
        -5e-324,
        2.2250738585072014e-308,
        1.7976931348623157e308,
        -1.7976931348623157e308,
        1e16,
        1.0,
        0.1,
    ]
)
FINITE = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(min_value=-1e-300, max_value=1e-300),  # subnormals and tiny ones
    SPECIAL,
)


@st.composite
def cancelling(draw: st.DrawFn) -> list[float]:
    """Mixed magnitudes that cancel to (almost) nothing, in any order."""
    base = draw(st.lists(FINITE, min_size=1, max_size=12))
    extra = draw(st.lists(FINITE, max_size=3))
    return draw(st.permutations(base + [-x for x in base] + extra))


@settings(max_examples=40, deadline=None)
@given(st.one_of(cancelling(), st.lists(FINITE, min_size=1, max_size=20)))
def test_a_float_sum_is_correctly_rounded_and_the_same_on_any_cluster(values: list[float]) -> None:
    got = _on_every_cluster(values)
    assert type(got) is float
    want = _ieee_sum(values)
    assert _same_float(got, want), (got, want)
    try:
        fsum = math.fsum(values)
    except OverflowError:  # fsum gives up on an intermediate overflow, even [M, M, -M]
        return
    # fsum gives +0.0 for a sum of only -0.0 (IEEE, and the fold, give -0.0)
    assert got == fsum


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.one_of(
            FINITE,
            st.sampled_from([math.inf, -math.inf, math.nan]),
            st.integers(min_value=-(2**70), max_value=2**70),
            FINITE.map(np.float64),
        ),
        min_size=1,
        max_size=15,
    )
)
def test_non_finite_values_ints_and_numpy_scalars_follow_ieee(values: list[Any]) -> None:
    got = _on_every_cluster(values)
    kinds = set(map(type, values))
    if kinds == {int}:
        assert type(got) is int and got == sum(values)
        return
    assert type(got) is (np.float64 if np.float64 in kinds else float)
    assert _same_float(
        float(got), _ieee_sum([float(v) if type(v) is not int else v for v in values])
    )


def test_a_sum_of_only_negative_zeros_is_negative_zero_and_ints_make_it_positive() -> None:
    assert _same_float(_on_every_cluster([-0.0, -0.0, -0.0]), -0.0)
    assert _same_float(_on_every_cluster([-0.0, 0, -0.0]), 0.0)
    assert _same_float(_on_every_cluster([-0.0, 1.0, -1.0]), 0.0)
    assert _same_float(_on_every_cluster([-0.0], initial=-0.0), -0.0)
    assert _same_float(_on_every_cluster([-0.0], initial=0), 0.0)


def test_a_sum_past_the_largest_float_is_infinite_not_an_error() -> None:
    big = sys.float_info.max
    assert _on_every_cluster([big, big]) == math.inf
    assert _on_every_cluster([-big, -big, 1.0]) == -math.inf
    assert _on_every_cluster([big, big, -big]) == big  # exact: no intermediate overflow


@settings(max_examples=25, deadline=None)
@given(
    st.integers(min_value=1, max_value=4).flatmap(
        lambda k: st.lists(
            st.lists(
                st.one_of(FINITE, st.sampled_from([math.inf, -math.inf, math.nan])),
                min_size=k,
                max_size=k,
            ),
            min_size=1,
            max_size=12,
        )
    )
)
def test_float64_arrays_sum_element_by_element(rows: list[list[float]]) -> None:
    values = [np.array(r, dtype=np.float64) for r in rows]
    got = _on_every_cluster(values)
    assert isinstance(got, np.ndarray) and got.dtype == np.float64 and got.shape == values[0].shape
    for i, g in enumerate(got.tolist()):
        assert _same_float(g, _ieee_sum([r[i] for r in rows])), (i, g)


def test_arrays_summed_in_several_stacks_give_the_same_bits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node stacks at most ``_STACK_MAX`` floats at once; how many it stacks must not
    change a bit."""
    from engine._data import exact

    rows = [[(-1) ** i * 10.0 ** (i % 37 - 18), 1e16, -0.0, 5e-324 * i] for i in range(50)]
    values = [np.array(r) for r in rows]
    whole = _on_every_cluster(values)
    monkeypatch.setattr(exact, "_STACK_MAX", 12)  # 3 values per stack
    assert _bits(_on_every_cluster(values)) == _bits(whole)
    for i in range(4):
        assert _same_float(float(whole[i]), _ieee_sum([r[i] for r in rows]))


def test_arrays_beyond_array_max_are_folded_in_index_order() -> None:
    from engine._data.exact import ARRAY_MAX

    rng = np.random.default_rng(3)
    values = [rng.normal(size=ARRAY_MAX + 1) * 10.0 ** rng.integers(-8, 8) for _ in range(12)]
    want = functools.reduce(operator.add, values)
    assert _bits(_on_every_cluster(values)) == _bits(want)


def test_numpy_integers_wrap_around_as_the_fold_does() -> None:
    values = [np.int8(100), np.int8(100), np.int8(-7), np.int8(90)]
    with np.errstate(over="ignore"):
        want = functools.reduce(operator.add, values)
    got = _on_every_cluster(values)
    assert type(got) is np.int8 and got == want


EXTREME = st.one_of(
    st.integers(min_value=-3, max_value=3),
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 3.0, 2.5]),
    st.floats(allow_nan=False),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(EXTREME, min_size=1, max_size=15), st.sampled_from([max, min]))
def test_max_and_min_keep_the_folds_first_extreme(values: list[Any], op: Any) -> None:
    """Ties between 1 and 1.0, or 0.0 and -0.0, go to the one a left fold keeps."""
    want = functools.reduce(op, values)
    assert _bits(_on_every_cluster(values, op)) == _bits(want)
    want = functools.reduce(op, values, 0)
    assert _bits(_on_every_cluster(values, op, initial=0)) == _bits(want)


@pytest.mark.parametrize(
    "values,op",
    [
        ([f"{i}," for i in range(20)], operator.add),  # objects: concatenated in order
        (list(range(1, 20)), lambda a, b: 2 * a - b),  # a user's op, not associative
        ([1.0, math.nan, 2.0, -1.0], max),  # NaN has no order: the fold decides
        ([np.float32(0.1)] * 9 + [0.3], operator.add),  # float32: rounded as the fold does
        ([1, 2, 3, 4], lambda a, b: a + b),  # a lambda is not operator.add
    ],
)
def test_anything_else_is_still_folded_in_index_order(values: list[Any], op: Any) -> None:
    with np.errstate(all="ignore"):
        want = functools.reduce(op, values)
    assert _bits(_on_every_cluster(values, op)) == _bits(want)


@pytest.mark.parametrize("op", [max, min])
def test_a_dmaps_ties_go_where_the_fold_in_slot_order_puts_them(op: Any) -> None:
    """A dmap's owners hold slots spread by hash, not in runs: the tie is still settled
    by slot, as the fold over the slots in order settles it."""
    values = {f"k{i}": [1, 1.0, -0.0, 0.0, 0][i % 5] for i in range(40)}

    def prog() -> Any:
        m = ap.dmap()
        for k, v in values.items():
            m[k] = v
        return ap.reduce(m, lambda v: v, op=op)

    want = _bits(ap.run(prog, nodes=1, exact_reduce=False).value)
    for p in (1, 2, 3, 8):
        assert _bits(ap.run(prog, nodes=p).value) == want, p


def test_a_sum_differs_from_the_left_fold_and_exact_reduce_false_folds() -> None:
    """``exact_reduce=False`` (a replay of a run recorded before the exact sum)."""
    values = [1e16, 1.0, 1.0, -1e16]
    assert _on_every_cluster(values) == 2.0
    for p in (1, 3):

        def prog() -> Any:
            X = ap.dvector(len(values), data=range(len(values)))
            return ap.reduce(X, lambda i: values[int(i)])

        assert ap.run(prog, nodes=p, exact_reduce=False).value == 0.0  # (1e16 + 1) + 1 ...


def test_only_one_small_object_per_node_crosses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Of 20,000 floats on 8 nodes, each node contributes its fold, not its values (what
    ``run_on_nodes`` returns is what an MPI allgather sends); a user's op still moves
    every value."""
    sent: list[list[int]] = []
    real = InProcessCluster.run_on_nodes

    def counting(self: InProcessCluster, fn: Any) -> list[Any]:
        out = real(self, fn)
        sent.append([len(pickle.dumps(v)) for v in out])
        return out

    values = [math.sin(i) * 10.0 ** (i % 40 - 20) for i in range(20_000)]
    arrays = [np.full(32, v) for v in values[:2000]]

    def prog() -> list[int]:
        X = ap.dvector(len(values), data=range(len(values)))
        monkeypatch.setattr(InProcessCluster, "run_on_nodes", counting)
        ap.reduce(X, lambda i: values[int(i)])
        ap.reduce(X, lambda i: arrays[int(i) % 2000])
        ap.reduce(X, lambda i: values[int(i)], op=max)
        ap.reduce(X, lambda i: values[int(i)], op=lambda a, b: a + b)
        return [sum(s) for s in sent]

    exact_sum, array_sum, biggest, own = ap.run(prog, nodes=8).value
    assert len(sent) == 4  # one exchange each
    assert exact_sum < 8 * 200 and biggest < 8 * 200, sent
    assert array_sum < 8 * 32 * 100, sent  # 32 exact element sums per node
    assert own > 20_000 * 8, sent


def test_empty_and_initial() -> None:
    def prog() -> Any:
        E = ap.dvector(0, data=[])
        with pytest.raises(ap.DataFormatError, match="needs initial="):
            ap.reduce(E)
        return ap.reduce(E, initial=-0.0), ap.reduce(E, op=max, initial=3)

    for p in (1, 3):
        zero, three = ap.run(prog, nodes=p).value
        assert _same_float(zero, -0.0) and three == 3
    assert _on_every_cluster([0.5, 0.25], initial=1) == 1.75


@pytest.mark.parametrize("ranks", [2, 3])
def test_every_mpi_rank_gets_the_in_process_bits(ranks: int) -> None:
    want = reduce_cases.bits(ap.run(reduce_cases.program, nodes=1).value)
    assert reduce_cases.bits(ap.run(reduce_cases.program, nodes=ranks).value) == want
    proc = run_mpi([str(HERE / "mpi_reduce.py")], ranks, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the ranks' lines may reach mpiexec's stdout run together
    got = sorted(re.findall(r"rank (\d+) bits ([0-9a-f]{24})", proc.stdout))
    assert got == [(str(r), want) for r in range(ranks)], proc.stdout + proc.stderr
