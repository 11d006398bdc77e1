"""The SSP clock machine, driven by hand-made events and by a random-delay simulation."""

from __future__ import annotations

import heapq
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import SyncProtocolError
from engine._machines.ssp import (
    Aggregate,
    ApplyUpdate,
    ClockTicked,
    DeltaArrived,
    Finished,
    LoopStarted,
    Proceed,
    SendDelta,
    SspClock,
    UpdateArrived,
    Wait,
)


def test_two_nodes_bsp_by_hand() -> None:
    m = SspClock(0, 2, clocks=2, staleness=0)
    assert m.handle(LoopStarted(0, 0)) == [Proceed(0, (-1, -1))]
    assert m.handle(DeltaArrived(0, 1, source=1, clock=0)) == []  # running: kept for later
    assert m.handle(ClockTicked(0, 2, 0)) == [
        SendDelta(0),
        Aggregate(0, (1, 0)),
        Wait(1, (1,)),
    ]
    assert m.handle(UpdateArrived(0, 3, source=1, clock=0)) == [
        ApplyUpdate(1, 0),
        Proceed(1, (0, 0)),
    ]
    assert m.handle(ClockTicked(0, 4, 1)) == [SendDelta(1), Wait(2, (0, 1))]
    assert m.handle(UpdateArrived(0, 5, source=1, clock=1)) == [ApplyUpdate(1, 1), Wait(2, (0,))]
    assert m.handle(DeltaArrived(0, 6, source=1, clock=1)) == [Aggregate(1, (0, 1)), Finished()]
    assert m.finished and m.applied == (1, 1) and m.completed == 2


def test_ssp_runs_ahead_and_applies_in_clock_order() -> None:
    m = SspClock(1, 2, clocks=5, staleness=1)
    assert m.handle(LoopStarted(1, 0)) == [Proceed(0, (-1, -1))]
    assert m.handle(ClockTicked(1, 1, 0)) == [SendDelta(0), Proceed(1, (-1, -1))]
    # clock 2 needs every update of clock 0
    assert m.handle(ClockTicked(1, 2, 1)) == [SendDelta(1), Wait(2, (0, 1))]
    # an update overtaking its predecessor waits for it
    assert m.handle(UpdateArrived(1, 3, source=0, clock=1)) == [Wait(2, (0, 1))]
    assert m.handle(DeltaArrived(1, 4, source=0, clock=0)) == [
        Aggregate(0, (1, 0)),
        Wait(2, (0,)),
    ]
    assert m.handle(UpdateArrived(1, 5, source=0, clock=0)) == [
        ApplyUpdate(0, 0),
        ApplyUpdate(0, 1),
        Proceed(2, (1, 0)),
    ]


def test_zero_clocks_finish_at_once() -> None:
    assert SspClock(0, 3, clocks=0, staleness=2).handle(LoopStarted(0, 0)) == [Finished()]


@pytest.mark.parametrize(
    "event",
    [
        ClockTicked(0, 1, 3),  # not the running clock
        DeltaArrived(0, 1, source=0, clock=0),  # from itself
        DeltaArrived(0, 1, source=5, clock=0),  # no such node
        UpdateArrived(0, 1, source=1, clock=9),  # no such clock
        LoopStarted(1, 1),  # another node's event
        LoopStarted(0, 1),  # started twice
    ],
)
def test_impossible_events_are_refused(event) -> None:
    m = SspClock(0, 2, clocks=3, staleness=0)
    m.handle(LoopStarted(0, 0))
    with pytest.raises(SyncProtocolError, match="cannot take"):
        m.handle(event)


def test_duplicate_update_is_refused() -> None:
    m = SspClock(0, 2, clocks=3, staleness=0)
    m.handle(UpdateArrived(0, 1, source=1, clock=0))
    with pytest.raises(SyncProtocolError, match="already arrived"):
        m.handle(UpdateArrived(0, 2, source=1, clock=0))


def simulate(nodes: int, clocks: int, staleness: int, compute, latency) -> dict:
    """Drive one machine per node through a virtual-time network; check invariants."""
    machines = [SspClock(p, nodes, clocks, staleness) for p in range(nodes)]
    heap: list = []
    order = itertools.count()
    seqs = [0] * nodes
    ticked = [0] * nodes  # global view: clocks each node has finished
    aggregated = [[] for _ in range(nodes)]
    applied = [[[] for _ in range(nodes)] for _ in range(nodes)]
    fifo: dict = {}
    finished = set()
    stale = 0

    def post(at, p, ev):
        heapq.heappush(heap, (at, next(order), p, ev))

    def send(now, cls, src, dst, clock):
        at = max(now + latency(src, dst, clock), fifo.get((cls, src, dst), 0))
        fifo[(cls, src, dst)] = at
        seqs[dst] += 1
        post(at, dst, cls(dst, seqs[dst], src, clock))

    for p in range(nodes):
        post(0, p, LoopStarted(p, 0))
    while heap:
        now, _, p, ev = heapq.heappop(heap)
        if isinstance(ev, ClockTicked):
            ticked[p] += 1
        for ins in machines[p].handle(ev):
            if isinstance(ins, Proceed):
                c = ins.clock
                assert c == ticked[p]
                # the bound: no node runs more than `staleness` clocks ahead of the slowest
                assert c - min(ticked) <= staleness, (p, c, ticked)
                # visibility: everything up to c - staleness - 1 is applied
                assert min(ins.applied) >= c - staleness - 1
                if staleness == 0:
                    assert ins.applied == (c - 1,) * nodes
                stale += min(ins.applied) < c - 1
                seqs[p] += 1
                post(now + compute(p, c), p, ClockTicked(p, seqs[p], c))
            elif isinstance(ins, SendDelta):
                for o in range(nodes):
                    if o != p:
                        send(now, DeltaArrived, p, o, ins.clock)
            elif isinstance(ins, Aggregate):
                assert sorted(ins.arrival) == list(range(nodes))
                assert min(ticked) > ins.clock  # every node finished that clock
                aggregated[p].append(ins.clock)
                applied[p][p].append(ins.clock)
                for d in range(nodes):
                    if d != p:
                        send(now, UpdateArrived, p, d, ins.clock)
            elif isinstance(ins, ApplyUpdate):
                applied[p][ins.source].append(ins.clock)
            elif isinstance(ins, Finished):
                finished.add(p)
            else:
                assert isinstance(ins, Wait)
    # liveness and exactly-once, in-order delivery
    assert finished == set(range(nodes))
    for p in range(nodes):
        assert aggregated[p] == list(range(clocks))
        for q in range(nodes):
            assert applied[p][q] == list(range(clocks))
    return {"stale": stale}


@given(
    nodes=st.integers(1, 4),
    clocks=st.integers(0, 8),
    staleness=st.integers(0, 3),
    data=st.data(),
)
def test_no_node_ever_exceeds_the_staleness_bound(nodes, clocks, staleness, data) -> None:
    durations = st.floats(0.0, 10.0, allow_nan=False)
    cache: dict = {}

    def draw(key):
        if key not in cache:
            cache[key] = data.draw(durations, label=str(key))
        return cache[key]

    simulate(
        nodes,
        clocks,
        staleness,
        compute=lambda p, c: draw(("c", p, c)),
        latency=lambda s, d, c: draw(("l", s, d, c)),
    )


def test_a_straggler_makes_fast_nodes_read_stale_values() -> None:
    out = simulate(3, 12, 2, compute=lambda p, c: 5.0 if p == 0 else 1.0, latency=lambda *a: 0.1)
    assert out["stale"] > 0
    out0 = simulate(3, 12, 0, compute=lambda p, c: 5.0 if p == 0 else 1.0, latency=lambda *a: 0.1)
    assert out0["stale"] == 0
