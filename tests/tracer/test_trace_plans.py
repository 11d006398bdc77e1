"""Plan storage: real planner output survives encode/decode exactly, and stays small."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine._asyncfor.recon import AccessSets, csr_from_lists
from engine._data.dds import SLOT_BITS
from engine._machines.planner import Plan, Task, make_plan, wavefront_plan
from tracer import decode_plan, encode_plan


class _Row:
    """Stands in for an ``operator_plan`` row."""

    def __init__(self, cols: dict) -> None:
        self.__dict__.update(cols)


def roundtrip(plan: Plan) -> Plan:
    return decode_plan(_Row(encode_plan(plan)))


def assert_same(a: Plan, b: Plan) -> None:
    assert (a.strategy, a.start, a.n, a.nodes, a.threads) == (
        b.strategy,
        b.start,
        b.n,
        b.nodes,
        b.threads,
    )
    assert (a.imbalance, a.node_imbalance) == (b.imbalance, b.node_imbalance)
    assert len(a.rounds) == len(b.rounds)
    for ra, rb in zip(a.rounds, b.rounds, strict=True):
        assert len(ra) == len(rb)
        for ta, tb in zip(ra, rb, strict=True):
            assert [(t.thread, t.locked, t.indices.tolist()) for t in ta] == [
                (t.thread, t.locked, t.indices.tolist()) for t in tb
            ]
            assert all(t.indices.dtype == np.int64 for t in tb)


def sgd_sets(n: int, users: int, items: int, seed: int, start: int = 0) -> AccessSets:
    """Each body reads and writes one row of W (dds 0) and one of H (dds 1): rotation."""
    rng = np.random.default_rng(seed)
    u = rng.integers(0, users, n)
    i = (1 << SLOT_BITS) | rng.integers(0, items, n)
    ids = np.stack([u, i], axis=1).ravel().tolist()
    ptr, flat = csr_from_lists([2] * n, ids)
    return AccessSets(start, n, ptr, flat, ptr.copy(), flat.copy())


def random_sets(n: int, m: int, seed: int, start: int = 0) -> AccessSets:
    """Bodies that read 1-3 and write 1-2 of ``m`` elements of two DDS."""
    rng = np.random.default_rng(seed)

    def gid() -> int:
        return (int(rng.integers(2)) << SLOT_BITS) | int(rng.integers(m))

    r_counts, r_ids, w_counts, w_ids = [], [], [], []
    for _ in range(n):
        k = int(rng.integers(1, 4))
        r_counts.append(k)
        r_ids += [gid() for _ in range(k)]
        k = int(rng.integers(1, 3))
        w_counts.append(k)
        w_ids += [gid() for _ in range(k)]
    rp, ri = csr_from_lists(r_counts, r_ids)
    wp, wi = csr_from_lists(w_counts, w_ids)
    return AccessSets(start, n, rp, ri, wp, wi)


@pytest.mark.parametrize("nodes,threads", [(1, 1), (2, 1), (3, 1), (2, 3)])
def test_rotation_plans_round_trip_and_store_no_orders(nodes: int, threads: int) -> None:
    plan = make_plan(sgd_sets(3000, 50, 80, seed=1, start=7), nodes, threads, strategy="rotation")
    assert plan.strategy == "rotation"
    cols = encode_plan(plan)
    assert cols["n_explicit"] == 0
    assert_same(plan, decode_plan(_Row(cols)))


@given(st.integers(0, 10_000), st.integers(1, 4), st.integers(1, 3), st.integers(0, 50))
def test_components_plans_round_trip(seed: int, nodes: int, threads: int, start: int) -> None:
    plan = make_plan(random_sets(150, 20, seed, start), nodes, threads, strategy="components")
    assert_same(plan, roundtrip(plan))


@given(st.integers(0, 10_000), st.integers(1, 3), st.integers(1, 3))
def test_wavefront_plans_round_trip(seed: int, nodes: int, threads: int) -> None:
    sets = random_sets(100, 15, seed, start=5)
    order = np.random.default_rng(seed).permutation(100) + 5
    plan = wavefront_plan(sets, order, nodes, threads)
    assert_same(plan, roundtrip(plan))


def test_auto_plans_round_trip_with_locked_tasks() -> None:
    plan = make_plan(random_sets(400, 6, 3), 2, 3)
    assert plan.has_locks()
    assert_same(plan, roundtrip(plan))


def test_empty_plan_round_trips() -> None:
    plan = make_plan(random_sets(0, 5, 0), 2, 2)
    assert_same(plan, roundtrip(plan))


def test_missing_and_repeated_indices_are_kept_exactly() -> None:
    missing = Plan(
        "x", 10, 6, 2, 1, [[[Task(0, np.array([10, 12]))], [Task(0, np.array([15, 11]))]]]
    )
    assert_same(missing, roundtrip(missing))
    repeated = Plan("x", 0, 3, 1, 1, [[[Task(0, np.array([0, 1, 0]))]], [[Task(0, np.array([9]))]]])
    cols = encode_plan(repeated)
    assert cols["n_explicit"] == 4  # every task explicit when the id map cannot hold it
    assert_same(repeated, decode_plan(_Row(cols)))


def test_a_100k_body_rotation_plan_costs_well_under_a_byte_per_body() -> None:
    plan = make_plan(sgd_sets(100_000, 943, 1682, seed=0), 2, 1, strategy="rotation")
    cols = encode_plan(plan)
    size = sum(len(cols[c]) for c in ("tasks", "task_of", "orders"))
    assert size < 40_000  # 4 tasks: 2 bits of entropy per body
    assert_same(plan, decode_plan(_Row(cols)))


@st.composite
def wrapping_lengths(draw: st.DrawFn) -> list[int]:
    """Three to eight int64 lengths whose sum is ``2**64 + small``: ``small`` once wrapped."""
    n = draw(st.integers(3, 8))
    head = [2**64 // n + draw(st.integers(-(2**20), 2**20)) for _ in range(n - 1)]
    return [*head, 2**64 + draw(st.integers(0, 4)) - sum(head)]


@given(wrapping_lengths())
def test_task_lengths_whose_sum_wraps_round_are_refused(lengths: list[int]) -> None:
    """Explicit task lengths summed in int64 wrapped round to the number of orders
    stored, so a forged plan of 2**62-body tasks passed as consistent."""
    from tracer import TraceFormatError
    from tracer._codec import encode

    plan = Plan("auto", 0, 4, 1, 1, [[[Task(0, np.array([3, 1, 2, 0]))]]], imbalance=1.0)
    cols = encode_plan(plan)
    n = len(lengths)
    table = np.array([[0, 0, 0, 0, 1, length] for length in lengths], np.int64)
    orders = np.arange(sum(lengths) - 2**64, dtype=np.int64)
    cols["n_tasks"], (cols["tasks"], cols["tasks_codec"]) = n, encode(table.ravel())
    cols["n_explicit"], (cols["orders"], cols["orders_codec"]) = len(orders), encode(orders)
    cols["task_of"], cols["task_of_codec"] = encode(np.empty(0, np.int64))
    with pytest.raises(TraceFormatError, match="explicit orders do not match the task table"):
        decode_plan(_Row(cols))
