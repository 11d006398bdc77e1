"""Each node keeps the reconnaissance sets of its own tasks' bodies once its plan runs.

Issue 35: every body's sets on every node are O(n) per node.  After the invocation that
made a plan (and the guard's plan from the whole sets), a node keeps only the sets of the
bodies its tasks run (``engine._asyncfor.recon.NodeSets``).  The class of failure: a
later use of the sets looks up a body the node no longer holds, or a wrong one, so a run
with a reused plan (checked mode, lock-split groups, kernels, a guard re-plan) computes
something else or fails where whole sets would not.  Generated programs run with and
without the nodes dropping the rest; results, orders and plans must be the same bits.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import engine as ap
from engine._asyncfor import loop as _loop
from engine._asyncfor.recon import AccessSets, NodeSets
from engine._errors import AccessOutsideReconError


@ap.kernel
def _kern(j: int, X: Any, off: int) -> None:
    X[j] = X[j] * 0.5 + X[(j + off) % len(X)] * 0.25 + 1.0


def _program(n: int, hot: int, off: int, epochs: int, checked_at: int, kernel: bool):
    """Body j writes X[j] and reads X[j+off]; every body also reads and writes one of
    ``hot`` shared rows of H (lock-split groups on 2 threads).  Invocation
    ``checked_at`` runs in checked mode (-1: none)."""

    def prog() -> tuple[Any, ...]:
        X = ap.dvector(n, shape=(), data=np.linspace(0.5, 1.5, n), name="X")
        H = ap.dvector(max(hot, 1), shape=(2,), dtype=np.float64, name="H")
        orders, kept = [], []

        def body(j: int) -> None:
            X[j] = X[j] * 0.5 + X[(j + off) % n] * 0.25 + 1.0
            if hot:
                h = j % hot
                H[h] = H[h] + np.array([1.0, X[j]])

        for e in range(epochs):
            b = _kern.bind(X, off) if kernel and not hot else body
            ap.async_for(0, n, b, name="b", checked=(e == checked_at))
            orders.append(ap.last_order("b"))
            sets = ap.current().ops["b"].sets
            kept.append(
                {p: part[0].tolist() for p, part in sets.parts.items()}
                if isinstance(sets, NodeSets)
                else None
            )
        state = ap.current().ops["b"]
        for (_, node), (per_body, group_w, _) in state.lock_cache.items():
            # the lock-split groups' locks, from the node's own sets, are the ones the
            # first invocation took from every body's sets
            idx = np.array(list(per_body), dtype=np.int64)
            again, group = _loop._lock_ids(state, idx, node)
            assert group.tolist() == group_w
            assert all(
                np.array_equal(a, per_body[j]) for j, a in zip(idx.tolist(), again, strict=True)
            )
        return X.gather(), H.gather(), orders, kept, state.sets.whole(), state.plan

    return prog


def _serial(n: int, hot: int, off: int, orders: list[np.ndarray]) -> tuple[Any, Any]:
    """The program's loop run serially in the given orders, one per invocation."""
    X = np.linspace(0.5, 1.5, n)
    H = np.zeros((max(hot, 1), 2))
    for order in orders:
        for j in order.tolist():
            X[j] = X[j] * 0.5 + X[(j + off) % n] * 0.25 + 1.0
            if hot:
                H[j % hot] = H[j % hot] + np.array([1.0, X[j]])
    return X, H


def _whole_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_loop, "_keep_own_parts", lambda sess, st: None)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.integers(1, 4),
    threads=st.integers(1, 2),
    n=st.integers(4, 24),
    hot=st.integers(0, 3),
    off=st.integers(1, 5),
    checked_at=st.integers(-1, 3),
    kernel=st.booleans(),
)
# lock-split groups on 2 threads, a checked invocation: the runs' orders may differ
@example(nodes=3, threads=2, n=22, hot=0, off=3, checked_at=3, kernel=False)
def test_a_reused_plan_runs_the_same_bits_on_the_nodes_own_sets(
    nodes: int, threads: int, n: int, hot: int, off: int, checked_at: int, kernel: bool
) -> None:
    prog = _program(n, hot, off, 4, checked_at, kernel)
    got = ap.run(prog, nodes=nodes, threads=threads).value
    with pytest.MonkeyPatch.context() as mp:
        _whole_sets(mp)
        ref = ap.run(prog, nodes=nodes, threads=threads).value
    X, H, orders, kept, whole, plan = got
    rX, rH, rorders, rkept, rwhole, rplan = ref
    assert rkept == [None] * 4  # the reference kept every body's sets
    # each run is the serial loop over the orders it reports (on 2 threads, lock-split
    # groups take their locks in a free order, so the two runs may differ in it)
    for x, h, o in ((X, H, orders), (rX, rH, rorders)):
        sx, sh = _serial(n, hot, off, o)
        assert np.array_equal(x, sx) and np.array_equal(h, sh)
    same_orders = all(np.array_equal(a, b) for a, b in zip(orders, rorders, strict=True))
    if threads == 1:
        assert same_orders
    if same_orders:
        assert np.array_equal(X, rX) and np.array_equal(H, rH)
    # each node kept exactly its own tasks' bodies, and together they are every body
    for per in kept:
        if nodes == 1:  # one node runs every body: it keeps the sets as they are
            assert per is None
            continue
        assert per is not None
        mine = {
            p: sorted(int(j) for rnd in plan.rounds for t in rnd[p] for j in t.indices)
            for p in range(nodes)
        }
        assert per == mine
    for a in ("r_indptr", "r_ids", "w_indptr", "w_ids"):
        assert np.array_equal(getattr(whole, a), getattr(rwhole, a)), a


def test_a_node_keeps_a_share_of_the_sets() -> None:
    """At 4 nodes each node holds about a quarter of the sets' bytes."""

    def prog() -> tuple[int, list[int]]:
        X = ap.dvector(400, shape=(), data=np.ones(400), name="X")

        def body(j: int) -> None:
            X[j] = X[j] + X[(j + 1) % 400]

        ap.async_for(0, 400, body, name="b")
        sets = ap.current().ops["b"].sets
        assert isinstance(sets, NodeSets)
        return sets.whole().nbytes(), [sets.nbytes(p) for p in range(4)]

    whole, per = ap.run(prog, nodes=4).value
    assert all(b < whole / 3 for b in per), (whole, per)


def test_test_mode_keeps_every_bodys_sets() -> None:
    """The dual tests read every body's sets after a run (``replay._dualctl``)."""

    def prog() -> bool:
        X = ap.dvector(8, shape=(), data=np.ones(8), name="X")
        for _ in range(2):
            ap.async_for(0, 8, lambda j: X.__setitem__(j, X[j] + 1.0), name="b")
        return isinstance(ap.current().ops["b"].sets, AccessSets)

    assert ap.run(prog, nodes=2, test_mode=True).value


@pytest.mark.parametrize("kernel", [False, True])
def test_checked_mode_on_a_reused_plan_still_catches_an_access_outside_the_sets(
    kernel: bool,
) -> None:
    """Invocation 2 reuses the plan (its nodes keep their own sets) and runs checked; a
    body that now reads a row its reconnaissance did not see is caught, as with every
    body's sets."""

    @ap.kernel
    def k(j: int, X: Any, far: int) -> None:
        X[j] = X[j] + X[(j + far) % len(X)]

    def prog() -> None:
        X = ap.dvector(12, shape=(), data=np.ones(12), name="X")
        far = [0]

        def body(j: int) -> None:
            X[j] = X[j] + X[(j + far[0]) % 12]

        for e in range(3):
            b = k.bind(X, 3 if e == 2 else 0) if kernel else body
            if e == 2:
                far[0] = 3  # the accesses change after the reconnaissance
            ap.async_for(0, 12, b, name="b", checked=(e == 2), replan="never")

    with pytest.raises(AccessOutsideReconError, match="read X.5., which is not in its recon"):
        ap.run(prog, nodes=3)
