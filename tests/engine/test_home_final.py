"""The final exchange goes home (issue 35 item 2): after an ``async_for`` a written row's
last value goes to its home only; the next invocation fetches what its nodes touch, and
every other reader makes the replicas whole first.

Checked against the engine before the change (the final exchange to every node, patched
back in) over generated programs that interleave ``async_for`` with driver reads and
writes, ``reduce``, ``map`` and ``sync_for`` on 1, 2, 3 and 8 nodes; by the traffic of
a steady-state epoch; and through the guard, for a body that leaves its plan to read a
row it was not sent.  The routes themselves: tests/engine/test_routing_home.py.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import engine as ap
from engine._asyncfor import guard as _guard
from engine._data import dds as _dds


# ====================================================================== the engine
@contextlib.contextmanager
def _before_the_change() -> Iterator[None]:
    """The engine as it was: the final exchange makes every replica whole."""
    route0, mark0 = _guard.route, _dds.mark_dirty
    _guard.route = functools.partial(  # type: ignore[assignment]
        lambda plan, sets, nodes, home, **kw: route0(plan, sets, nodes, **kw)
    )
    _dds.mark_dirty = lambda d, slots, holders: None  # type: ignore[assignment]
    try:
        yield
    finally:
        _guard.route, _dds.mark_dirty = route0, mark0  # type: ignore[assignment]


N = 12

STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, N - 1)),  # X[j] from X[j + k]
        st.tuples(st.just("mix"), st.integers(1, N - 1)),  # Y from X shifted, X from Y
        st.tuples(st.just("read"), st.integers(0, N - 1)),  # driver reads X[i], Y[i]
        st.just(("reduce", 0)),
        st.just(("map", 0)),
        st.just(("sync", 0)),
        st.just(("driver_write", 0)),
    ),
    min_size=1,
    max_size=7,
)


def _program(steps: list[tuple[str, int]]) -> dict[str, Any]:
    X = ap.dvector(N, shape=(2,), init=ap.init.normal(0.0, 1.0), name="X")
    Y = ap.dvector(N, shape=(), init=ap.init.normal(0.0, 1.0), name="Y")
    idx = ap.dvector(N, shape=(), data=np.arange(N, dtype=np.float64), name="idx")
    seen: list[Any] = []
    for step, k in steps:
        if step == "write":

            def write(j: int, k: int = k) -> None:
                X[j] = 0.5 * X[j] + 0.25 * X[(j + k) % N] + 0.1

            ap.async_for(0, N, write, name=f"write{k}")
        elif step == "mix":

            def mix(j: int, k: int = k) -> None:
                Y[j] = Y[j] * 0.9 + float(X[(j + k) % N][0])

            def back(j: int, k: int = k) -> None:
                X[j] = X[j] + Y[(j + 2 * k) % N]

            ap.async_for(0, N, mix, name=f"mix{k}")
            ap.async_for(0, N, back, name=f"back{k}")
        elif step == "read":
            seen.append((X[k].tolist(), float(Y[k])))
        elif step == "reduce":
            seen.append(ap.reduce(Y, lambda v: float(v), initial=0.0))
        elif step == "map":
            out = ap.map(idx, lambda i: float(X[int(i)][1] * Y[(int(i) + 1) % N]))
            seen.append(out.gather().tolist())
        elif step == "sync":

            def sgd(batch: Any) -> None:
                Y[0] += 0.5 * (float(batch.values.mean()) - Y[0])

            ap.sync_for(idx, 4, sgd, sync="bsp", name="avg")
        else:
            X[3] = X[5] * 2.0
    return {"X": X.gather().tolist(), "Y": Y.gather().tolist(), "seen": seen}


@pytest.mark.parametrize("nodes", [1, 2, 3, 8])
@given(steps=STEPS)
def test_programs_give_the_bits_of_replicas_made_whole_every_invocation(
    nodes: int, steps: list[tuple[str, int]]
) -> None:
    """Generated programs interleaving async_for with driver reads and writes, reduce,
    map and sync_for: the values read and the digests equal those of the engine before
    the change (every replica whole after every invocation), in test mode too (which
    checks every replica that must be fresh after every invocation)."""
    now = ap.run(_program, {"steps": steps}, nodes=nodes)
    with _before_the_change():
        then = ap.run(_program, {"steps": steps}, nodes=nodes)
    assert now.value == then.value
    assert now.digests == then.digests
    checked = ap.run(_program, {"steps": steps}, nodes=nodes, checked=True)
    assert checked.value == then.value and checked.digests == then.digests


def test_a_steady_state_epoch_sends_rows_home_and_fetches_them_back() -> None:
    """SGD on 4 nodes: the second epoch's traffic (its fetch included) is well under the
    engine's before the change, with the same bits."""

    from tests.engine.mpi_defer import program

    def prog() -> dict[str, Any]:
        out = program()
        return {**out, "traffic": ap.current().cluster.traffic.snapshot()}

    now = ap.run(prog, nodes=4)
    with _before_the_change():
        then = ap.run(prog, nodes=4)
    assert now.digests == then.digests
    assert now.value["W"] == then.value["W"] and now.value["H"] == then.value["H"]
    assert now.value["traffic"]["sent_bytes"] < 0.7 * then.value["traffic"]["sent_bytes"]


def test_a_body_that_reads_a_row_it_was_not_fetched_is_replanned() -> None:
    """The first invocation writes every X[j] (its last values go home only); in the
    second, a flag makes body j also read X[j + 5], outside its sets: on a node that
    neither owns nor fetched that row the guard stops the body (its replica is old),
    and the invocation re-plans to the serial order's value."""

    def prog(replan: str = "auto") -> list[float]:
        X = ap.dvector(16, shape=(), init=ap.init.normal(0.0, 1.0), name="X")
        Z = ap.dvector(16, shape=(), init=ap.init.zeros(), name="Z")
        flag = ap.dvector(1, shape=(), init=ap.init.zeros(), name="flag")

        def body(j: int) -> None:
            X[j] = X[j] * 2.0 + 1.0

        def use(j: int) -> None:
            extra = float(X[(j + 5) % 16]) if flag[0] > 0 else 0.0
            Z[j] = Z[j] + X[j] + extra

        ap.async_for(0, 16, body, name="body")
        ap.async_for(0, 16, use, name="use")
        ap.async_for(0, 16, body, name="body")
        flag[0] = 1.0
        ap.async_for(0, 16, use, name="use", replan=replan)
        return Z.gather().tolist()

    want = ap.run(prog, nodes=1).value
    got = ap.run(prog, nodes=4)
    assert got.value == want
    with pytest.raises(ap.AccessOutsideReconError) as info:
        ap.run(prog, {"replan": "never"}, nodes=4)
    assert "only its home holds now" in str(info.value)
