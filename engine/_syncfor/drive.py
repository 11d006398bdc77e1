"""Drivers of the ``sync_for`` clock machines: the edge where instructions become I/O.

Each driver feeds :class:`~engine._machines.ssp.SspClock` events and performs what it answers
on a :class:`~engine._syncfor.node.NodeRun`:

* :func:`drive_in_process` hosts every node in this process and runs a discrete-event
  simulation in virtual time: computing a clock takes ``delays.compute(node, clock)``
  units and a message ``delays.latency(src, dst, clock)``, so tests can give nodes
  seeded random speeds and watch SSP let fast nodes run ahead.  The default model
  (every clock 1 unit, no latency) keeps all nodes in step.
* :func:`drive_mpi` runs one node per rank: deltas and updates travel with ``Isend``
  and are received through receives posted in advance (their sizes come from the
  layout); a node that must wait blocks in ``Waitany``.  What has arrived is taken
  in only at clock boundaries, so a clock's reads are fixed when it starts.

Both report to the recorder in the same way: message arrivals, the arrival order of
the deltas an owner aggregated, and (SSP) which updates each clock could see.  Both
ask the session's controller (replay) which updates each SSP clock must see, and hand
that script to the clock machine; a script the run cannot follow is a divergence.
"""

from __future__ import annotations

import collections
import contextlib
import heapq
import itertools
import os
import time
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from .._errors import DivergenceError, SyncProtocolError
from .._machines.grants import TURN_TIMEOUT_S
from .._machines.ssp import (
    Aggregate,
    ApplyUpdate,
    ClockTicked,
    DeltaArrived,
    Event,
    Finished,
    LoopStarted,
    Proceed,
    ReportMismatch,
    Script,
    SendDelta,
    SspClock,
    UpdateArrived,
    Wait,
)
from .node import HEADER, NodeRun, SyncContext, check_stamp

#: MPI tags of sync_for deltas (node -> owner) and updates (owner -> node).
TAG_DELTA = 121
TAG_UPDATE = 122
_CHANNELS = ("sync_for.delta", "sync_for.update")


class DelayModel(Protocol):
    """Virtual durations for the in-process simulation."""

    def compute(self, node: int, clock: int) -> float:
        """How long ``node`` computes ``clock``."""
        ...

    def latency(self, src: int, dst: int, clock: int) -> float:
        """How long a message of ``clock`` takes from ``src`` to ``dst``."""
        ...


class UniformDelays:
    """Every clock takes one unit; messages are instantaneous (nodes stay in step)."""

    def compute(self, node: int, clock: int) -> float:
        """One unit."""
        return 1.0

    def latency(self, src: int, dst: int, clock: int) -> float:
        """Zero."""
        return 0.0


class SeededDelays:
    """Random durations, a pure function of (seed, node, clock): replayable.

    ``slow`` maps a node to a factor on its compute time (a straggler).
    """

    def __init__(
        self,
        seed: int,
        compute: tuple[float, float] = (0.5, 2.0),
        latency: tuple[float, float] = (0.0, 0.5),
        slow: dict[int, float] | None = None,
    ) -> None:
        self.seed = seed
        self.range_c = compute
        self.range_l = latency
        self.slow = slow or {}

    def _u(self, *key: int) -> float:
        return float(np.random.default_rng([self.seed, *key]).random())

    def compute(self, node: int, clock: int) -> float:
        """Uniform in the compute range, times the node's slowness."""
        lo, hi = self.range_c
        return (lo + (hi - lo) * self._u(0, node, clock)) * self.slow.get(node, 1.0)

    def latency(self, src: int, dst: int, clock: int) -> float:
        """Uniform in the latency range."""
        lo, hi = self.range_l
        return lo + (hi - lo) * self._u(1, src, dst, clock)


#: The delay model of in-process runs; tests swap it with :func:`use_delays`.
DELAYS: list[DelayModel] = [UniformDelays()]


@contextlib.contextmanager
def use_delays(model: DelayModel) -> Iterator[None]:
    """Run in-process ``sync_for`` invocations under ``model`` inside the ``with`` block."""
    DELAYS.append(model)
    try:
        yield
    finally:
        DELAYS.remove(model)


class _Reporter:
    """What both drivers report of an attempt, onto its tape (``ctx.events``: an
    ``engine._machines.tape.Tape``, which keeps nothing when no recorder listens).  The
    recorder receives it as one schedule value once every node agrees the attempt stands
    (an attempt undone after an access outside its reconnaissance rows leaves no trace)."""

    def __init__(self, ctx: SyncContext) -> None:
        self.ctx = ctx
        self.rec = ctx.events
        self.on_message = ctx.events.message_received if ctx.events.active else None
        self.visibility = ctx.staleness > 0 and ctx.events.active
        self.order = ctx.events.active

    def proceed(self, node: int, ins: Proceed) -> None:
        if self.visibility:
            self.rec.ssp_visibility(
                self.ctx.name, self.ctx.inv, node, ins.clock, np.array(ins.applied, np.int64)
            )

    def aggregated(self, node: int, ins: Aggregate) -> None:
        if self.order:
            self.rec.aggregation_order(
                self.ctx.name, self.ctx.inv, node, ins.clock, np.array(ins.arrival, np.int64)
            )

    def arrived(self, node: int, kind: int, src: int, clock: int, nbytes: int) -> None:
        if self.on_message is not None:
            self.on_message(node, _CHANNELS[kind], src, clock, nbytes)


def _script(ctx: SyncContext, node: int) -> Script | None:
    """The controller's visibility script for ``node`` (None: a free run)."""
    sched = ctx.sched
    if ctx.staleness == 0 or sched is None:
        return None
    if not sched.has_visibility(node):
        if sched.chaos is None:
            return None
        # chaos: which updates each clock sees, drawn within the staleness bound
        return sched.chaos.visibility(ctx.name, ctx.inv, node, ctx.sess.cluster.size, ctx.staleness)
    return lambda clock: sched.visible(node, clock)


def _mismatch(ctx: SyncContext, node: int, ins: ReportMismatch) -> DivergenceError:
    return DivergenceError(
        node=node,
        op=ctx.name,
        invocation=ctx.inv,
        event=f"clock {ins.clock}",
        what="visibility",
        expected=f"updates applied up to clocks {list(ins.recorded)} per owner",
        actual=f"{list(ins.applied)} applied, and {ins.why}",
    )


# ====================================================================== in-process
def drive_in_process(ctx: SyncContext, runs: dict[int, NodeRun]) -> None:
    """Run every local node's clocks to the end in one virtual-time simulation."""
    cl = ctx.sess.cluster
    layout = ctx.layout
    P = layout.nodes
    delays = DELAYS[-1]
    rep = _Reporter(ctx)
    machines = {p: SspClock(p, P, layout.clocks, ctx.staleness, _script(ctx, p)) for p in runs}
    seqs = dict.fromkeys(runs, 0)
    heap: list[tuple[float, int, int, Event]] = []
    order = itertools.count()
    mail: dict[tuple[int, int, int, int], np.ndarray] = {}  # (dst, kind, src, clock)
    fifo: dict[tuple[int, int, int], float] = {}  # channel -> last arrival time
    done: set[int] = set()

    def seq(p: int) -> int:
        seqs[p] += 1
        return seqs[p]

    def post(at: float, p: int, ev: Event) -> None:
        heapq.heappush(heap, (at, next(order), p, ev))

    def send(now: float, kind: int, src: int, dst: int, clock: int, buf: np.ndarray) -> None:
        # a message of no rows is not sent, but its arrival is still simulated at the time
        # it would have arrived: the clock machines see the same events in the same order
        # as when every message travelled, so SSP visibility (and every bit) is unchanged
        at = max(now + delays.latency(src, dst, clock), fifo.get((kind, src, dst), 0.0))
        fifo[(kind, src, dst)] = at
        mail[(dst, kind, src, clock)] = buf
        if len(buf) > HEADER:
            ctx.sent_bytes[0] += len(buf)
            cl.traffic.sent(len(buf))
        ev_cls = DeltaArrived if kind == 0 else UpdateArrived
        post(at, dst, ev_cls(dst, seq(dst), src, clock))

    def perform(now: float, p: int, ins: Any) -> None:
        run = runs[p]
        if isinstance(ins, Proceed):
            rep.proceed(p, ins)
            cl.bind(p)
            run.compute(ins.clock)
            post(now + delays.compute(p, ins.clock), p, ClockTicked(p, seq(p), ins.clock))
        elif isinstance(ins, SendDelta):
            for o in range(P):
                if o != p:
                    send(now, 0, p, o, ins.clock, run.delta_payload(ins.clock, o))
        elif isinstance(ins, Aggregate):
            rep.aggregated(p, ins)
            got = {s: mail.pop((p, 0, s, ins.clock)) for s in range(P) if s != p}
            updates = run.aggregate(ins.clock, got)
            for d in range(P):
                if d != p:
                    send(now, 1, p, d, ins.clock, updates[d])
        elif isinstance(ins, ApplyUpdate):
            run.apply_update(ins.clock, ins.source, mail.pop((p, 1, ins.source, ins.clock)))
        elif isinstance(ins, Finished):
            done.add(p)
        elif isinstance(ins, ReportMismatch):
            raise _mismatch(ctx, p, ins)
        elif not isinstance(ins, Wait):
            raise SyncProtocolError(f"sync_for: unknown instruction {ins!r}")

    for p in runs:
        post(0.0, p, LoopStarted(p, 0))
    try:
        while heap:
            now, _, p, ev = heapq.heappop(heap)
            if isinstance(ev, (DeltaArrived, UpdateArrived)):
                kind = 0 if isinstance(ev, DeltaArrived) else 1
                nb = len(mail[(p, kind, ev.source, ev.clock)]) - HEADER
                if nb:
                    cl.traffic.received(nb + HEADER)
                    rep.arrived(p, kind, ev.source, ev.clock, nb)
            for ins in machines[p].handle(ev):
                perform(now, p, ins)
    finally:
        cl.bind(cl.local_nodes[0])
    if len(done) != len(runs):
        stuck = {p: machines[p].applied for p in runs if p not in done}
        if any(_script(ctx, p) is not None for p in stuck):
            p = min(stuck)
            raise DivergenceError(
                node=p,
                op=ctx.name,
                invocation=ctx.inv,
                event=f"clock {machines[p].completed}",
                what="visibility",
                expected="the recorded updates to arrive",
                actual=f"every node waits; applied per owner: {stuck}",
            )
        raise SyncProtocolError(f"sync_for {ctx.name!r}: nodes stopped before the end: {stuck}")


# ====================================================================== MPI
def _bare(clock: int) -> np.ndarray:
    """The stamp of ``clock`` alone: a message of no rows, which is never sent."""
    buf = np.empty(HEADER, dtype=np.uint8)
    buf.view(np.int64)[0] = clock
    return buf


#: Polls of the posted receives before a waiting rank starts yielding its core: spinning
#: answers fastest on dedicated cores, yielding lets an oversubscribed peer run.
SPIN_POLLS = 200
#: Unfinished sends a rank keeps before checking which completed (memory vs. polling).
SENDS_KEPT = 16


def _wait_some(cl: Any, recvs: list[Any], deadline: float | None = None) -> list[int] | None:
    """Indices of completed receives: poll, then poll while yielding the CPU.  Empty when
    nothing is in flight; None when ``deadline`` (``time.monotonic``) passed first."""
    for k in itertools.count():
        ready = cl.test_some(recvs)
        if ready is None or ready:
            return ready or []
        if k >= SPIN_POLLS:
            if deadline is not None and k % SPIN_POLLS == 0 and time.monotonic() > deadline:
                return None
            os.sched_yield()
    return []  # unreachable


def drive_mpi(ctx: SyncContext, run: NodeRun) -> None:
    """Run this rank's node to the end, exchanging deltas and updates over MPI."""
    cl: Any = ctx.sess.cluster
    layout = ctx.layout
    me, P, C = run.node, layout.nodes, layout.clocks
    rep = _Reporter(ctx)
    script = _script(ctx, me)
    machine = SspClock(me, P, C, ctx.staleness, script)
    counter = itertools.count(1)
    # one posted receive per (kind, peer): slot 2*peer + kind
    recvs: list[Any] = [cl.null_request() for _ in range(2 * P)]
    meta: list[tuple[int, np.ndarray] | None] = [None] * (2 * P)
    got: dict[tuple[int, int, int], np.ndarray] = {}  # (kind, src, clock) -> message
    sends: list[tuple[Any, np.ndarray]] = []

    # Messages of no rows are not sent (``engine._syncfor.routing``); both sides know which
    # from the layout, and the receiver makes their arrival itself.  Every arrival reaches
    # the machine only once this node has ticked its clock: with every message sent, an
    # update of clock k could not come before this node's own delta of k, and now an owner
    # that needs no rows from this node may aggregate k first.  Held back this way, the
    # clock protocol and the visibility it reports are what they were.
    held: list[tuple[int, int, int]] = []  # heap of (clock, kind, src); buffers in ``got``

    def post_recv(kind: int, src: int, clock: int) -> None:
        """Post the receive of the first message sent at or after ``clock`` on the channel."""
        while clock < C:
            size = (
                layout.delta_nbytes(clock, src, me)
                if kind == 0
                else layout.update_nbytes(clock, src, me, ctx.staleness)
            )
            if size:
                buf = np.empty(HEADER + size, dtype=np.uint8)
                tag = TAG_DELTA if kind == 0 else TAG_UPDATE
                recvs[2 * src + kind] = cl.irecv_bytes(buf, src, tag)
                meta[2 * src + kind] = (clock, buf)
                return
            got[(kind, src, clock)] = _bare(clock)
            heapq.heappush(held, (clock, kind, src))
            clock += 1

    def release() -> list[Any]:
        """Feed the machine the held arrivals of the clocks this node has ticked."""
        out: list[Any] = []
        while held and held[0][0] < machine.completed:
            clock, kind, src = heapq.heappop(held)
            ev_cls = DeltaArrived if kind == 0 else UpdateArrived
            out += machine.handle(ev_cls(me, next(counter), src, clock))
        return out

    def completed(i: int) -> list[Any]:
        src, kind = divmod(i, 2)
        entry = meta[i]
        assert entry is not None
        clock, buf = entry
        meta[i] = None
        check_stamp(buf, clock, f"{_CHANNELS[kind]} from node {src}")
        got[(kind, src, clock)] = buf
        heapq.heappush(held, (clock, kind, src))
        cl.traffic.received(len(buf))
        rep.arrived(me, kind, src, clock, len(buf) - HEADER)
        post_recv(kind, src, clock + 1)
        return release()

    def drain() -> list[Any]:
        out: list[Any] = []
        for i in cl.test_some(recvs) or []:
            out += completed(i)
        return out

    def send(kind: int, dst: int, buf: np.ndarray) -> None:
        if len(buf) == HEADER:
            return  # no rows: not sent (the receiver knows)
        sends.append((cl.isend_bytes(buf, dst, TAG_DELTA if kind == 0 else TAG_UPDATE), buf))
        ctx.sent_bytes[0] += len(buf)
        cl.traffic.sent(len(buf))

    if C:
        for q in range(P):
            if q != me:
                post_recv(0, q, 0)
                post_recv(1, q, 0)
    queue = collections.deque(machine.handle(LoopStarted(me, 0)))
    while queue:
        ins = queue.popleft()
        if isinstance(ins, Proceed):
            rep.proceed(me, ins)
            run.compute(ins.clock)
            queue += drain()  # buffered by the machine: the node is still running
            queue += machine.handle(ClockTicked(me, next(counter), ins.clock))
            queue += release()
        elif isinstance(ins, SendDelta):
            for o in range(P):
                if o != me:
                    send(0, o, run.delta_payload(ins.clock, o))
        elif isinstance(ins, Aggregate):
            rep.aggregated(me, ins)
            deltas = {s: got.pop((0, s, ins.clock)) for s in range(P) if s != me}
            updates = run.aggregate(ins.clock, deltas)
            for d in range(P):
                if d != me:
                    send(1, d, updates[d])
        elif isinstance(ins, ApplyUpdate):
            run.apply_update(ins.clock, ins.source, got.pop((1, ins.source, ins.clock)))
        elif isinstance(ins, Wait):
            if queue:
                continue  # superseded: newer instructions already answer this wait
            if len(sends) > SENDS_KEPT:  # let finished sends go (and their buffers with them)
                done = set(cl.test_some([r for r, _ in sends]) or [])
                sends = [s for i, s in enumerate(sends) if i not in done]
            deadline = None if script is None else time.monotonic() + TURN_TIMEOUT_S
            ready = _wait_some(cl, recvs, deadline)
            if ready is None:
                raise DivergenceError(
                    node=me,
                    op=ctx.name,
                    invocation=ctx.inv,
                    event=f"clock {ins.clock}",
                    what="visibility",
                    expected=f"the recorded updates of owners {list(ins.missing)}",
                    actual=f"nothing arrived within {TURN_TIMEOUT_S:g} s "
                    f"(applied per owner: {list(machine.applied)})",
                )
            if not ready:
                raise SyncProtocolError(
                    f"sync_for {ctx.name!r}: node {me} waits for {ins} with nothing in flight"
                )
            for i in ready:
                queue += completed(i)
            if not queue:  # only arrivals of clocks not ticked yet (held): wait on
                queue.append(ins)
        elif isinstance(ins, ReportMismatch):
            raise _mismatch(ctx, me, ins)
        elif isinstance(ins, Finished):
            break
    cl.wait_all([r for r, _ in sends])
    if not machine.finished:
        raise SyncProtocolError(f"sync_for {ctx.name!r}: node {me} stopped at {machine.applied}")


__all__ = [
    "DELAYS",
    "DelayModel",
    "SeededDelays",
    "TAG_DELTA",
    "TAG_UPDATE",
    "UniformDelays",
    "drive_in_process",
    "drive_mpi",
]
