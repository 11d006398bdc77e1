"""A debugger stopped in a loop body reads what it likes, and the run does not change.

``replay single --break`` stops in pdb inside a body; every pdb command runs under
``engine.lowlevel.inspecting``.  The class of failure: an access a person makes from the
debugger is counted as the body's (a plan violation that re-plans the invocation and
runs the body a second time, a reconnaissance miss, a sync_for violation), so looking
changes what is replayed.  Here a "debugger" inside a body reads every element of every
DDS; what leaves the body's reach must raise :class:`NotSeenError` and count nothing: the
run gives the same bits and notes as without it, and each value shown is the one the body
sees.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine as ap
from engine._errors import NotSeenError
from engine._runtime.control import DebugHooks
from engine.lowlevel import inspecting


def _look(*tables: ap.dvector) -> tuple[dict[tuple[str, int], object], int]:
    """What a debugger shows of every element of ``tables``, and how many it may not."""
    shown, refused = {}, 0
    with inspecting():
        for t in tables:
            for k in range(len(t)):
                try:
                    shown[(t.name, k)] = t[k]
                except NotSeenError as e:
                    assert "the debugger does not show it" in str(e)
                    refused += 1
    return shown, refused


class Stop(DebugHooks):
    """A breakpoint as ``replay single --break`` sets one (``wrap_body``): at (op,
    invocation, index) it looks at every element of ``tables`` before the body runs,
    then runs the body on values it records (what the body saw)."""

    def __init__(self, op: str, invocation: int, index: int, tables: list[str]) -> None:
        self.at = (op, invocation, index)
        self.tables = tables
        self.looks: list[tuple[dict[tuple[str, int], object], int]] = []

    def wrap_body(self, op: str, invocation: int, node: int, body: Any) -> Any:
        if (op, invocation) != self.at[:2]:
            return body

        def stop(j: Any) -> Any:
            if getattr(j, "number", j) == self.at[2]:
                dds = {d.name: d for d in ap.current().dds}
                self.looks.append(_look(*(dds[n] for n in self.tables)))
            return body(j)

        return stop


def _async_program(n: int, off: int, checked: bool):
    """Body j reads its own object row, X[j] and X[j+off], and writes X[j]."""

    def prog():
        X = ap.dvector(n, shape=(), data=np.linspace(0.5, 1.5, n), name="X")
        A = ap.dvector(n, data=[(k, 0.25 * k) for k in range(n)], name="A")
        orders = []

        def body(j: int) -> None:
            a = A[j][1]
            X[j] = X[j] * 0.5 + X[(j + off) % n] * 0.25 + a

        for _ in range(3):
            ap.async_for(0, n, body, name="b", checked=checked)
            orders.append(ap.last_order("b"))
        return X.gather(), orders

    return prog


def _serial(n: int, off: int, orders: list[np.ndarray]) -> np.ndarray:
    X = np.linspace(0.5, 1.5, n)
    for order in orders:
        for j in order.tolist():
            X[j] = X[j] * 0.5 + X[(j + off) % n] * 0.25 + 0.25 * j
    return X


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(6, 14),
    off=st.integers(1, 5),
    nodes=st.integers(1, 3),
    threads=st.integers(1, 2),
    checked=st.booleans(),
    where=st.tuples(st.integers(0, 2), st.integers(0, 13)),
)
def test_looking_from_a_body_changes_no_async_for_run(
    n: int, off: int, nodes: int, threads: int, checked: bool, where: tuple[int, int], capfd
) -> None:
    capfd.readouterr()
    hooks = Stop("b", where[0], where[1] % n, ["X", "A"])
    x, orders = ap.run(
        _async_program(n, off, checked), nodes=nodes, threads=threads, hooks=hooks
    ).value
    err = capfd.readouterr().err
    assert "note:" not in err, err  # nothing re-planned: the looks were not the body's
    assert len(hooks.looks) == 1  # the stopped body ran once
    assert x.tobytes() == _serial(n, off, orders).tobytes()
    if threads == 1:  # (more threads: lock-split bodies in their grant order)
        plain, plain_orders = ap.run(_async_program(n, off, checked), nodes=nodes).value
        assert [o.tolist() for o in orders] == [o.tolist() for o in plain_orders]
        assert x.tobytes() == plain.tobytes()


def test_a_look_outside_the_plan_is_refused_and_named() -> None:
    """On 2 nodes a body's neighbour row is written by the other node in the same round:
    the debugger says so instead of showing the node's old copy; what it shows of the
    body's own rows is what the body then reads."""
    hooks = Stop("b", 1, 0, ["X", "A"])
    ap.run(_async_program(8, 4, False), nodes=2, hooks=hooks)
    ((shown, refused),) = hooks.looks
    assert refused > 0 and ("X", 0) in shown and ("A", 0) in shown


def _sync_program():
    def prog():
        D = ap.dvector(24, shape=(), data=np.arange(24, dtype=np.float64), name="D")
        W = ap.dvector(5, shape=(), data=np.zeros(5), name="W")

        def body(batch: ap.Batch) -> None:
            for k, v in batch:
                W[int(k) % 5] = W[int(k) % 5] + v * 0.5

        for _ in range(2):
            ap.sync_for(D, 2, body, name="s")
        return W.gather()

    return prog


@pytest.mark.parametrize("nodes,threads", [(1, 1), (2, 1), (2, 2)])
def test_looking_from_a_sync_for_body_changes_nothing(nodes: int, threads: int, capfd) -> None:
    capfd.readouterr()
    hooks = Stop("s", 1, 2, ["W", "D"])
    w = ap.run(_sync_program(), nodes=nodes, threads=threads, hooks=hooks).value
    assert "engine: sync_for" not in capfd.readouterr().err  # no re-plan
    ((shown, refused),) = hooks.looks  # the stopped body ran once
    assert refused == 3  # W has 5 rows; minibatch 2 (keys 4, 5) touches two of them
    assert w.tobytes() == ap.run(_sync_program(), nodes=nodes, threads=threads).value.tobytes()


class Write(DebugHooks):
    """A debugger that, stopped before body 0 of ``w``'s first invocation, sets X[3]."""

    def __init__(self) -> None:
        self.said: list[str] = []

    def wrap_body(self, op: str, invocation: int, node: int, body: Any) -> Any:
        def stop(j: Any) -> Any:
            if j == 0:
                X = next(d for d in ap.current().dds if d.name == "X")
                with inspecting():
                    try:
                        X[3] = 9.0  # node 1's row in this round
                    except NotSeenError as e:
                        self.said.append(str(e))
            return body(j)

        return stop


def test_a_write_from_the_debugger_outside_the_plan_is_refused(capfd) -> None:
    def prog():
        X = ap.dvector(6, shape=(), init=ap.init.zeros(), name="X")

        def body(j: int) -> None:
            X[j] = X[j] + 1.0

        ap.async_for(0, 6, body, name="w", strategy="rotation")
        return X.gather()

    capfd.readouterr()
    hooks = Write()
    assert ap.run(prog, nodes=2, hooks=hooks).value.tolist() == [1.0] * 6
    assert "note:" not in capfd.readouterr().err
    assert len(hooks.said) == 1 and "X[3] is not what this body writes here" in hooks.said[0]
