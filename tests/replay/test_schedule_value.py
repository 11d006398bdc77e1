"""Schedules as data, both ways: the value a run hands its recorder at the end of each
invocation is the value replay builds from the trace before that invocation starts.

The run's side is what its free-mode machines saw (the grant gate, the message-order
machine, the SSP clock, the Hybrid node mutex); replay's side is read back from the store.
If the two ever differ, a replay follows something other than what happened.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import engine
import tracer
from engine.lowlevel import Schedule, Tape
from replay._controller import TraceController
from tests.replay import nondet_apps


class Keeping(tracer.TraceRecorder):
    """Records as usual and keeps every schedule value it is handed."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.values: list[Schedule] = []

    def schedule_done(self, sched: Schedule) -> None:
        self.values.append(sched)
        super().schedule_done(sched)


def _grants(s: Schedule) -> dict[tuple[int, int], tuple[list[int], list[int]]]:
    g = s.grants
    out: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
    if g is None:
        return out
    for n, r in zip(g.node.tolist(), g.round.tolist(), strict=True):
        pos, thr = g.of(n, r)
        out[(n, r)] = (pos.tolist(), thr.tolist())
    return out


def _messages(s: Schedule) -> dict[tuple[int, str], list[int]]:
    m = s.messages
    assert m is not None
    return {
        (n, c): m.of(n, c).tolist()
        for n, c in zip(m.node.tolist(), m.channel.tolist(), strict=True)
    }


@pytest.mark.parametrize(
    "fn,params,kind",
    [
        (nondet_apps.hot_locks, {"n": 300}, "async_for"),
        (nondet_apps.ssp_delays, {"n": 120}, "sync_for"),
        (nondet_apps.hybrid_threads, {"n": 120}, "sync_for"),
    ],
)
def test_the_recorded_value_is_the_value_replay_follows(
    tmp_path: Path, fn: Any, params: dict[str, Any], kind: str
) -> None:
    path = tmp_path / "t.sqlite"
    # the run row says what ran: a plan for more threads than the run is a damaged trace
    rec = Keeping(path, "r", [0, 1], True, meta={"ranks": 2, "threads": 3})
    engine.run(fn, params, nodes=2, threads=3, recorder=rec)
    rec.close("finished")
    assert rec.values, "no invocation handed its recorder a schedule value"
    happened = 0
    with tracer.open(path) as trace:
        ctl = TraceController(trace.run("r"), single=False)
        for got in rec.values:
            want = ctl.schedule(got.op, got.invocation, kind, 2)
            assert _grants(got) == _grants(want)
            if kind == "async_for":
                # routed write-backs name their source (the routes fix it): schema 7
                # stores their counts, not an arrival order for replay to follow
                routed = {k for k in _messages(got) if k[1] == "routed"}
                assert routed and not any(k[1] == "routed" for k in _messages(want))
                assert {k: v for k, v in _messages(got).items() if k not in routed} == (
                    _messages(want)
                )
                assert got.plan is not None and want.plan is not None
                assert got.plan.strategy == want.plan.strategy
            for node in (0, 1):
                assert got.visibility._per_node.get(node) == want.visibility._per_node.get(node)
                assert got.mutex._per_node.get(node) == want.mutex._per_node.get(node)
            happened += len(got.timeline)
    assert happened > 0  # the runs did take grants / receive messages / see updates


def test_an_undone_attempt_hands_over_nothing(tmp_path: Path, capfd: Any) -> None:
    """An attempt undone by the guard (its accesses left its reconnaissance) leaves no
    value behind; the one that stands hands over exactly one per invocation."""

    def prog(n: int = 40) -> None:
        X = engine.dvector(n, shape=(), name="X")
        flag = engine.dvector(1, shape=(), name="flag")

        def body(j: int) -> None:
            # value-dependent access: once the driver sets flag, body j also writes X[j + 1]
            x = X[j]
            X[j] = x * 0.5 + 1.0
            if flag[0] > 0 and j + 1 < n:
                X[j + 1] = X[j + 1] * 0.9 + x

        for it in range(3):
            engine.async_for(0, n, body, name="dep")
            if it == 0:
                flag[0] = 1.0

    rec = Keeping(tmp_path / "t.sqlite", "r", [0, 1], True)
    engine.run(prog, nodes=2, threads=1, recorder=rec)
    rec.close("finished")
    assert "re-planned" in capfd.readouterr().err  # an attempt was undone
    seen = [(s.op, s.invocation) for s in rec.values]
    assert seen == [("dep", 0), ("dep", 1), ("dep", 2)]


def test_timeline_keeps_the_event_order_of_the_run() -> None:
    """``emit`` unfolds a value into per-event calls in the order they were taped."""
    tape = Tape()
    tape.message_received(0, "rows", 1, 0, 16)
    tape.lock_grants("op", 0, 0, 0, 3, 5, np.array([1]), np.array([1]), ["W[2]"])
    tape.message_received(1, "rows", 0, 0, 24)
    tape.ssp_visibility("op", 0, 1, 4, np.array([3, 2]))
    tape.message_received(0, "rows", 1, 1, 8)
    tape.aggregation_order("op", 0, 0, 4, np.array([1, 0]))
    tape.body_order("op", 0, 1, 4, np.array([1, 0]), np.array([7, 6]))
    calls: list[tuple[Any, ...]] = []

    class Sink(engine.Recorder):
        def lock_grants(self, *a: Any) -> None:
            calls.append(("grants", a[2], a[3], a[4], a[5], a[6].tolist(), list(a[8])))

        def message_received(self, *a: Any) -> None:
            calls.append(("msg", *a))

        def ssp_visibility(self, *a: Any) -> None:
            calls.append(("vis", a[2], a[3], a[4].tolist()))

        def aggregation_order(self, *a: Any) -> None:
            calls.append(("agg", a[2], a[3], a[4].tolist()))

        def body_order(self, *a: Any) -> None:
            calls.append(("mutex", a[2], a[3], a[4].tolist(), a[5].tolist()))

    value = tape.schedule("op", 0)
    Sink().schedule_done(value)
    assert calls == [
        ("msg", 0, "rows", 1, 0, 16),
        ("grants", 0, 0, 3, 5, [1], ["W[2]"]),
        ("msg", 1, "rows", 0, 0, 24),
        ("vis", 1, 4, [3, 2]),
        ("msg", 0, "rows", 1, 1, 8),
        ("agg", 0, 4, [1, 0]),
        ("mutex", 1, 4, [1, 0], [7, 6]),
    ]
