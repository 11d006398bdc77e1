"""Order control: the lock turnstile (pure), and replaying recorded lock orders."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import engine as ap
from engine import DebugHooks, ScheduleSource
from engine._machines.turnstile import (
    GrantLock,
    LockFreed,
    LockReleased,
    LockRequested,
    ReportDivergence,
    Turnstile,
)
from engine.lowlevel import GrantLog, Schedule

sys.path.insert(0, str(Path(__file__).parent))
from progs import make_program  # noqa: E402


def test_turnstile_grants_in_recorded_order_only() -> None:
    ts = Turnstile({7: [(1, 10), (0, 11), (1, 12)]})
    assert ts.handle(LockRequested(7, 0, 11)) == []  # not its turn yet
    assert ts.handle(LockRequested(7, 1, 10)) == [GrantLock(7, 1, 10)]
    assert ts.handle(LockReleased(7, 1, 10)) == [GrantLock(7, 0, 11)]
    assert ts.handle(LockReleased(7, 0, 11)) == []
    assert ts.handle(LockRequested(7, 1, 12)) == [GrantLock(7, 1, 12)]


def test_turnstile_reports_a_request_the_trace_does_not_have() -> None:
    ts = Turnstile({7: [(1, 10)]})
    out = ts.handle(LockRequested(7, 0, 99))
    assert out == [ReportDivergence(7, 0, 99, (1, 10), 0)]
    out = Turnstile({}).handle(LockRequested(3, 0, 1))
    assert isinstance(out[0], ReportDivergence) and out[0].expected is None


@given(st.lists(st.tuples(st.sampled_from("ark"), st.integers(0, 2)), max_size=60))
def test_free_turnstile_is_a_plain_mutex_that_records_its_grants(steps) -> None:
    """Free mode (a normal run): at most one holder; a request for a free lock is
    granted at once, one for a held lock waits; a release with waiters reports the lock
    free, and whichever waiter asks again first gets it; ``granted`` is exactly the order
    the holders got the lock — what a replay then follows.  Each step lets a thread
    (0..2) ask ("a"), the holder release ("r"), or a waiter ask again ("k")."""
    ts = Turnstile(None)
    holder, waiting, expect, k = None, {}, [], 0
    for step, thread in steps:
        busy = set(waiting) | ({holder[0]} if holder else set())
        if step == "r" and holder is not None:
            out = ts.handle(LockReleased(0, *holder))
            holder = None
            assert out == ([LockFreed(0)] if waiting else [])
            continue
        if step == "a" and thread not in busy:  # a thread waits for one grant at a time
            who = (thread, k)
            k += 1
        elif step == "k" and thread in waiting:
            who = waiting.pop(thread)
        else:
            continue
        out = ts.handle(LockRequested(0, *who))
        if holder is None:
            holder = who
            expect.append(who)
            assert out == [GrantLock(0, *who)]
        else:
            waiting[who[0]] = who
            assert out == []
    assert ts.granted(0) == expect
    if holder is not None:  # releasing what another thread holds is refused
        bad = ts.handle(LockReleased(0, holder[0] + 1, holder[1]))
        assert isinstance(bad[0], ReportDivergence)
    # a replay of the recorded grants grants them in the same order, whatever the requests
    again = Turnstile({0: expect})
    got = []
    for who in reversed(expect):
        got += again.handle(LockRequested(0, *who))
    while got and len(got) < len(expect):
        got += again.handle(LockReleased(0, got[-1].thread, got[-1].index))
    assert [(g.thread, g.index) for g in got] == expect


@given(st.permutations(list(range(8))))
def test_turnstile_any_request_order_yields_the_recorded_grant_order(requests) -> None:
    order = [(j % 2, j) for j in range(8)]
    ts = Turnstile({0: order})
    granted, held = [], None
    pending = list(requests)
    for j in pending:
        for ins in ts.handle(LockRequested(0, j % 2, j)):
            granted.append(ins.index)
            held = ins
        while held is not None:
            out = ts.handle(LockReleased(0, held.thread, held.index))
            held = None
            for ins in out:
                granted.append(ins.index)
                held = ins
    assert granted == list(range(8))


class GrantRecorder(ap.Recorder):
    """Keeps each round's grant order (deviations) as the replay controller wants it."""

    def __init__(self) -> None:
        self.orders: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self.bodies = 0

    def lock_grants(
        self, op, invocation, node, round, bodies, grants, positions, threads, elements=()
    ):
        assert len(elements) == len(positions)
        assert grants >= bodies > 0
        self.bodies += bodies
        self.orders[(op, invocation, node, round)] = (positions.copy(), threads.copy())


class Replaying(ScheduleSource):
    """Follows recorded grant orders: each invocation's schedule carries its grant log."""

    def __init__(self, orders) -> None:
        self.orders = orders

    def schedule(self, op, invocation, kind, nodes, span=None):
        mine = {
            (node, r): v
            for (o, inv, node, r), v in self.orders.items()
            if (o, inv) == (op, invocation)
        }
        return Schedule(op, invocation, grants=GrantLog.build(mine))


def lock_heavy_program(seed: int):
    """Every body updates one of three hot rows: one giant group split under locks."""

    def prog():
        X = ap.dvector(3, shape=(2,), init=ap.init.normal(0, 1), name="X")

        def body(j):
            k = j % 3
            X[k] = X[k] * 0.9 + np.sin(j + X[(k + 1) % 3])

        for _ in range(2):
            ap.async_for(0, 90, body, name="hot")
        return X.gather()

    return prog


def test_recorded_lock_orders_replay_bit_for_bit() -> None:
    rec = GrantRecorder()
    prog = lock_heavy_program(0)
    first = ap.run(prog, nodes=2, threads=3, recorder=rec).value
    assert rec.orders, "the threaded run took no locks"
    for _ in range(5):
        again = ap.run(prog, nodes=2, threads=3, schedules=Replaying(rec.orders)).value
        assert np.array_equal(again, first)


def test_replay_with_a_foreign_order_diverges_with_a_report() -> None:
    rec = GrantRecorder()
    prog = lock_heavy_program(0)
    ap.run(prog, nodes=1, threads=3, recorder=rec)
    key = next(iter(rec.orders))
    rec.orders[key] = (np.array([0]), np.array([7]))  # a thread the node does not have
    with pytest.raises(ap.DivergenceError) as info:
        ap.run(prog, nodes=1, threads=3, schedules=Replaying(rec.orders))
    err = info.value
    assert err.op == "hot" and err.node == 0 and err.what == "lock"
    assert "does not fit" in err.actual


def test_forced_serial_order_runs_on_one_thread() -> None:
    _, _, _, program = make_program(2)
    order_seen = {}

    class Serial(ScheduleSource, DebugHooks):
        def schedule(self, op, invocation, kind, nodes, span=None):
            return Schedule(op, invocation, grants=GrantLog(), serial=True)

        def wrap_body(self, op, invocation, node, body):
            def seen(j):
                order_seen.setdefault((invocation, node), []).append(j)
                assert threading.current_thread() is threading.main_thread()
                return body(j)

            return seen

    serial = Serial()
    ap.run(program, nodes=2, threads=3, schedules=serial, hooks=serial)
    assert order_seen


@pytest.mark.parametrize("serial", [True, False])
def test_schedule_order_is_the_serialization_order(serial: bool) -> None:
    """A schedule's ``order`` replaces the planner's choice: the run serializes to it
    (one plain loop on node 0 when ``serial``, else its wavefront levels)."""
    rng = np.random.default_rng(3)
    n = 40
    want = rng.permutation(n)

    class Ordered(ScheduleSource):
        def schedule(self, op, invocation, kind, nodes, span=None):
            assert kind == "async_for" and span == (0, n)
            return Schedule(op, invocation, serial=serial, order=want, order_threads=2)

    def program() -> None:
        X = ap.dvector(4, shape=(), init=ap.init.zeros(), name="X")

        def body(j: int) -> None:
            X[j % 4] = X[j % 4] * 1.5 + j

        ap.async_for(0, n, body, name="fold")
        ap.log_objective("x", float(X.gather().sum()))

    got = ap.run(program, nodes=2, threads=2, schedules=Ordered(), test_mode=True)
    if serial:
        assert np.array_equal(got.orders[("fold", 0)], want)
    else:  # wavefront levels keep the order of every pair of bodies that share an element
        done = got.orders[("fold", 0)]
        for r in range(4):
            assert np.array_equal(done[done % 4 == r], want[want % 4 == r])
    x = np.zeros(4)
    for j in want:
        x[j % 4] = x[j % 4] * 1.5 + j
    assert got.objectives["x"] == [float(x.sum())]
