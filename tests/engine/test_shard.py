"""Sharded dvectors (issue 35 item 1): a dvector of Python objects holds on each node its
home rows and the rows that node's tasks touch, not a whole replica.

The classes of failure: a node reads a row it does not hold (inside a round, in a
reconnaissance, in ``map``/``reduce``, in ``sync_for``, in the driver) and gets a wrong
or missing value; the record of what each node holds (which every rank keeps alike, so
that homes know what to send) drifts from what it holds; a plan goes stale and the
guard misses it.  Generated programs (tests/engine/shard_progs.py) must give the bits of
the same program with ``sharded=False`` on 1, 2, 3 and 5 nodes, and every node must hold
exactly its home rows and what the record says.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import engine as ap
from tests.engine import shard_progs
from tests.engine.shard_progs import KINDS, N, program

STEPS = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(1, N - 1)), min_size=1, max_size=8)


def _run(steps: list[tuple[str, int]], nodes: int, sharded: bool | None) -> Any:
    def fn() -> dict[str, Any]:
        out = program(steps, sharded)
        A = next(d for d in ap.current().dds if d.name == "A")
        out["holding"] = shard_progs.holding(A)
        return out

    return ap.run(fn, nodes=nodes)


@pytest.mark.parametrize("nodes", [1, 2, 3, 5])
@given(steps=STEPS)
def test_programs_give_the_bits_of_whole_replicas(nodes: int, steps: list[tuple[str, int]]) -> None:
    got = _run(steps, nodes, None)
    want = _run(steps, nodes, False)
    assert {k: got.value[k] for k in ("A", "W", "seen")} == {
        k: want.value[k] for k in ("A", "W", "seen")
    }
    assert got.digests == want.digests
    if nodes > 1:  # and less than a whole replica, unless the steps needed every row
        held = [h for h, _, _ in got.value["holding"]]
        assert sum(held) <= nodes * N


def test_a_node_holds_its_home_rows_and_the_rows_its_tasks_touch() -> None:
    """SGD over ratings on 4 nodes: each node holds its quarter of the ratings and the
    ratings its tasks read, far from all of them; a plain replica holds every row."""

    def sgd() -> list[tuple[int, int, int]]:
        rng = np.random.default_rng(0)
        n = 400
        A = ap.dvector(
            n,
            data=[
                (int(rng.integers(20)), int(rng.integers(16)), float(rng.random()))
                for _ in range(n)
            ],
            name="A",
        )
        W = ap.dvector(20, shape=(3,), init=ap.init.constant(0.1), name="W")
        H = ap.dvector(16, shape=(3,), init=ap.init.constant(0.1), name="H")

        def body(j: int) -> None:
            u, i, r = A[j]
            w, h = W[u], H[i]
            err = r - w @ h
            W[u] = w + 0.05 * (err * h - 0.01 * w)
            H[i] = h + 0.05 * (err * w - 0.01 * h)

        for _ in range(3):
            ap.async_for(0, n, body, name="sgd", strategy="rotation")
        return shard_progs.holding(A)

    held = ap.run(sgd, nodes=4).value
    for rows, home, away in held:
        assert home == 100
        assert rows == home + away
        assert away <= 100  # the ratings of its own tasks: a quarter, three quarters away
    assert sum(rows for rows, _, _ in held) < 2 * 400


def test_a_body_that_reads_a_row_its_node_does_not_hold_is_replanned() -> None:
    """A body whose reads follow a value: once the values change, it reads rows its node
    was never sent.  The guard sees it (never a wrong value, never a KeyError) and
    re-plans, with a note; the result is the whole replicas' result."""

    def prog(sharded: bool | None) -> Any:
        def fn() -> Any:
            A = ap.dvector(16, data=[(j, float(j)) for j in range(16)], name="A", sharded=sharded)
            S = ap.dvector(16, shape=(), name="S")

            def chase(j: int) -> None:
                S[j] = S[j] + A[A[j][0]][1]

            def scramble(j: int) -> None:
                A[j] = ((j * 5 + 3) % 16, A[j][1] + 1.0)

            ap.async_for(0, 16, chase, name="chase")
            ap.async_for(0, 16, scramble, name="scramble")
            ap.async_for(0, 16, chase, name="chase")
            return S.gather().tolist(), ap.current().planner["chase"].get("replans", 0)

        return ap.run(fn, nodes=4)

    got, want = prog(None), prog(False)
    assert got.value[0] == want.value[0]
    assert got.digests == want.digests


def _lookup(re: bool, sharded: bool | None) -> Any:
    """A ``sync_for`` body that reads rows of another sharded dvector, catching errors
    (a user's ``try: ... except Exception``)."""

    def fn() -> float:
        A = ap.dvector(8, data=[(j,) for j in range(8)], name="A")
        B = ap.dvector(8, data=[(10 * j,) for j in range(8)], name="B", sharded=sharded)
        W = ap.dvector(1, shape=(), name="W")

        def body(batch: ap.Batch) -> None:
            for key, _ in batch:
                try:
                    v = B[(int(key) + 4) % 8][0]
                except Exception:  # noqa: BLE001 - what the test is about
                    v = 0
                W[0] = W[0] + v

        ap.sync_for(A, 2, body, name="s", re=re)
        return float(W[0])

    return ap.run(fn, nodes=2)


def test_a_sync_for_body_gets_the_rows_its_reconnaissance_read() -> None:
    got, want = _lookup(True, None), _lookup(True, False)
    assert got.value == want.value == 140.0  # the two nodes' sums, averaged (BSP)
    assert got.digests == want.digests


def test_a_swallowed_miss_outside_a_loop_round_is_still_an_error() -> None:
    """Without reconnaissance (``re=False``) nobody knows the rows beforehand; a body
    that catches the error would go on with a made-up value: the operator fails instead,
    naming the row, the node and what to do."""
    assert _lookup(False, False).value == 140.0
    with pytest.raises(
        ap.EngineError, match=r"B\[\d\] is not held on node \d.*re=True.*sharded=False"
    ):
        _lookup(False, None)


def test_sharded_true_on_numeric_rows_is_refused() -> None:
    with pytest.raises(ap.DDSError, match="sharded=True holds Python-object rows only"):
        ap.run(lambda: ap.dvector(4, shape=(2,), sharded=True, name="X"))
