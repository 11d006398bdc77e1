"""Reconnaissance runs again only the bodies that read a sharded row their node lacked.

A node's reconnaissance stops a body at the first sharded row the node does not hold;
every rank fetches the rows missed, and the pass runs again.  A body that missed nothing
is not run again: its reads and writes from the pass before are kept
(``engine._asyncfor.recon.Done``).  The class of failure: a kept body's sets are not the
ones a fresh pass would find (wrong positions, a body counted twice or not at all, a
missed body's partial accesses kept), so the plan is made from wrong sets.  Generated
graph programs (each body reads its row and a chain of rows it names) run with and
without the reuse: the sets, plans and results must be the same bits, with no more body
runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine as ap
from engine._asyncfor import loop as _aloop
from engine._asyncfor import recon as _recon
from engine._machines.planparts import plan_digest
from engine._syncfor import loop as _sloop


def _program(n: int, deg: int, hops: int, seed: int, sync: bool):
    """Body j reads row j of a sharded table of neighbour lists, then ``hops`` times the
    rows its neighbours name (so which rows it reads depends on values read), and
    writes X[j]; ``sync``: the same through a ``sync_for`` over the table."""

    def prog() -> tuple[Any, ...]:
        rng = np.random.default_rng(seed)
        rows = [(j, tuple(int(x) for x in rng.integers(0, n, deg))) for j in range(n)]
        A = ap.dvector(n, data=rows, name="A")
        X = ap.dvector(n, shape=(), data=np.zeros(n), name="X")

        def total(j: int) -> float:
            s, frontier = 0.0, [j]
            for _ in range(hops):
                nxt = []
                for k in frontier:
                    for m in A[k][1]:
                        s += m
                        nxt.append(m)
                frontier = nxt[:2]
            return s

        if sync:

            def batch_body(batch: Any) -> None:
                for _, row in batch:
                    j = row[0]
                    X[j] = X[j] + total(j) * 0.5

            ap.sync_for(A, 4, batch_body, name="s")
            sets = ap.current().ops["sync_for:s"].sets
            plan = None
        else:

            def body(j: int) -> None:
                X[j] = X[j] + total(j)

            ap.async_for(0, n, body, name="g")
            st_ = ap.current().ops["g"]
            sets, plan = st_.sets, plan_digest(st_.plan)
        whole = sets.whole() if hasattr(sets, "whole") else sets
        return X.gather(), whole, plan

    return prog


def _counting(monkeypatch: pytest.MonkeyPatch, reuse: bool) -> list[int]:
    """Count the bodies reconnaissance runs; without ``reuse`` every pass runs them all."""
    runs = [0]
    real = _recon.recon_range

    def counted(sess, op, inv, body, lo, hi, done=None):  # type: ignore[no-untyped-def]
        def b(j: int) -> Any:
            runs[0] += 1
            return body(j)

        return real(sess, op, inv, b, lo, hi, done if reuse else None)

    monkeypatch.setattr(_aloop, "recon_range", counted)
    monkeypatch.setattr(_sloop, "recon_range", counted)
    return runs


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(4, 40),
    deg=st.integers(1, 4),
    hops=st.integers(1, 3),
    seed=st.integers(0, 1000),
    nodes=st.integers(2, 4),
    sync=st.booleans(),
)
def test_kept_bodies_give_the_sets_a_fresh_pass_would(
    n: int, deg: int, hops: int, seed: int, nodes: int, sync: bool
) -> None:
    prog = _program(n, deg, hops, seed, sync)
    with pytest.MonkeyPatch.context() as mp:
        fresh_runs = _counting(mp, reuse=False)
        x0, sets0, plan0 = ap.run(prog, nodes=nodes, test_mode=True).value
    with pytest.MonkeyPatch.context() as mp:
        kept_runs = _counting(mp, reuse=True)
        x1, sets1, plan1 = ap.run(prog, nodes=nodes, test_mode=True).value
    for a in ("r_indptr", "r_ids", "w_indptr", "w_ids"):
        assert np.array_equal(getattr(sets0, a), getattr(sets1, a)), a
    assert (sets0.start, sets0.n) == (sets1.start, sets1.n)
    assert plan0 == plan1 and np.array_equal(x0, x1)
    assert kept_runs[0] <= fresh_runs[0]


def test_a_pass_after_misses_runs_only_the_bodies_that_missed() -> None:
    """On 2 nodes node 0 runs bodies 0-19 and holds rows 0-19, node 1 bodies 20-39 and
    rows 20-39; bodies 25-29 also read a row of node 0.  The second pass runs those five
    again: not node 0's finished share, not node 1's other fifteen bodies."""

    def prog() -> None:
        A = ap.dvector(40, data=[(j,) for j in range(40)], name="A")
        X = ap.dvector(40, shape=(), data=np.zeros(40), name="X")

        def body(j: int) -> None:
            far = A[j - 20][0] if 25 <= j < 30 else 0
            X[j] = X[j] + A[j][0] + far

        ap.async_for(0, 40, body, name="g")

    with pytest.MonkeyPatch.context() as mp:
        runs = _counting(mp, reuse=True)
        ap.run(prog, nodes=2)
    assert runs[0] == 40 + 5
    with pytest.MonkeyPatch.context() as mp:
        runs = _counting(mp, reuse=False)  # node 1's share runs whole again
        ap.run(prog, nodes=2)
    assert runs[0] == 40 + 20
