"""One node's work in a ``sync_for`` clock: caches, bodies, deltas, aggregation, updates.

Everything here is transport-free: the drivers (``_syncdrive``) decide *when* a node
computes, aggregates or applies, and move the byte buffers this module produces.
Messages are flat ``uint8`` numpy buffers: an 8-byte clock stamp, then per parameter
DDS (in a fixed order) the rows of the layout, so they travel with MPI buffer
methods and are never pickled.

Aggregation arithmetic is fixed so that BSP is bitwise reproducible: a node sums its
threads' deltas in thread order into a zero block; an owner sums the nodes' blocks in
node order into a zero block and divides by the number of nodes that ran a minibatch
in the clock (the default: threads add up, nodes average), or stacks the workers'
deltas in (node, thread) order for a registered aggregation function.  Arrival order
never enters the arithmetic.

With reconnaissance sets, every lane runs its bodies under a ``_syncguard.LaneGuard``:
an access outside the running minibatch's rows is recorded in ``NodeRun.violations``
and the lane's remaining bodies are skipped (their mutex turns and the clock protocol
still happen), so the driver can finish the attempt everywhere and let ``_syncfor``
undo it.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .._errors import (
    AccessOutsideReconError,
    BodyError,
    ClosureRuleError,
    DDSError,
    DivergenceError,
    SyncProtocolError,
)
from .._machines.turnstile import TurnstileDriver
from .._runtime.session import _tls
from .dds import batch_maker, bind_thread, unbind_thread
from .guard import LaneGuard, NodeViolations
from .layout import HEADER, NodeClock, SyncLayout

if TYPE_CHECKING:
    from .._data.dds import _DDS
    from .._machines.schedule import Schedule
    from .._runtime.session import Session


@dataclass
class SyncContext:
    """What every node of one invocation shares (read-only while it runs)."""

    sess: Session
    name: str
    inv: int
    op_key: int
    body: Callable[[Any], Any]
    data: _DDS
    layout: SyncLayout
    hybrid: bool
    staleness: int
    aggs: list[Callable[[np.ndarray], np.ndarray] | None]
    caches: dict[tuple[int, int, int], np.ndarray]  # (node, lane, dds id) -> cache
    events: Any = None  # the attempt's ``engine._machines.tape.Tape``
    sched: Schedule | None = None  # the invocation's schedule (None: free)
    sent_bytes: list[int] = field(default_factory=lambda: [0])

    @property
    def params(self) -> list[_DDS]:
        return self.layout.params


def _stamp(clock: int, parts: list[np.ndarray]) -> np.ndarray:
    """A message: the 8-byte stamp of ``clock``, then ``parts``' bytes in order.

    One allocation: each part is copied straight into its place in the message (no
    per-part contiguous copy, no concatenation).
    """
    out = np.empty(HEADER + sum(p.nbytes for p in parts), dtype=np.uint8)
    out[:HEADER].view(np.int64)[0] = clock
    off = HEADER
    for p in parts:
        nb = p.nbytes
        if nb:
            out[off : off + nb].view(p.dtype).reshape(p.shape)[...] = p
            off += nb
    return out


def check_stamp(buf: np.ndarray, clock: int, what: str) -> None:
    """Fail loudly if a message is not the one the layout expects."""
    got = int(buf[:HEADER].view(np.int64)[0])
    if got != clock:
        raise SyncProtocolError(f"sync_for: {what} stamped clock {got}, expected clock {clock}")


def summation_order(nodes: int, me: int) -> list[int]:
    """The nodes whose deltas owner ``me`` sums, in summing order: every node once, in node
    order, whatever order the deltas arrived in (so the sum is the same bits in every run).

    A step of its own so that tests can substitute a broken aggregation (``tests/mutants.py``).
    """
    return list(range(nodes))


class NodeRun:
    """One node's state during one invocation."""

    def __init__(self, ctx: SyncContext, node: int) -> None:
        self.ctx = ctx
        self.node = node
        self.replicas = [d._bufs[node] for d in ctx.params]
        self.batch = batch_maker(ctx.data, ctx.data._bufs[node])
        lanes = 1 if ctx.hybrid else ctx.sess.cluster.threads
        self.caches = [self._cache(lane) for lane in range(lanes)]
        self.violations = NodeViolations(node)
        self.guards: list[LaneGuard | None] = [
            None
            if ctx.layout.sets is None
            else LaneGuard(ctx.layout, ctx.data, self.violations, ctx.name, ctx.inv)
            for _ in range(lanes)
        ]
        base = {d._id: d._bufs[node] for d in ctx.sess.dds}
        self.rbufs = []
        self.wbufs = []
        for cache in self.caches:
            w = {d._id: c for d, c in zip(ctx.params, cache, strict=True)}
            self.rbufs.append({**base, **w})
            self.wbufs.append(w)
        self.whole = ctx.layout.sets is None
        self.block_tail = [r.shape[1:] for r in self.replicas]
        self.dtypes = [r.dtype for r in self.replicas]
        self.own: dict[int, list[np.ndarray]] = {}  # clock -> delta blocks, until aggregated
        self.clock_seconds: list[float] = []

    def _cache(self, lane: int) -> list[np.ndarray]:
        out = []
        for d, r in zip(self.ctx.params, self.replicas, strict=True):
            key = (self.node, lane, d._id)
            got = self.ctx.caches.get(key)
            if got is None or got.shape != r.shape:
                got = self.ctx.caches[key] = np.empty_like(r)
            out.append(got)
        return out

    # ------------------------------------------------------------------ computing
    def compute(self, clock: int) -> None:
        """Run this node's minibatches of ``clock``; keep its delta blocks."""
        t0 = time.perf_counter()
        nc = self.ctx.layout.node(clock, self.node)
        if self.violations.first is not None:  # decided per clock: deterministic per lane
            for g in self.guards:
                if g is not None:
                    g.hit = True
        if self.ctx.hybrid:
            self.own[clock] = self._compute_hybrid(clock, nc)
        else:
            self.own[clock] = self._compute_workers(nc)
        self.clock_seconds.append(time.perf_counter() - t0)

    def _run_bodies(
        self,
        lane: int,
        ms: np.ndarray,
        thread: int = 0,
        turnstile: TurnstileDriver | None = None,
    ) -> None:
        """Run minibatches ``ms`` on ``lane``'s buffers; with ``turnstile`` (Hybrid), each
        body holds the node mutex, granted by it (free in a normal run, in a given order
        otherwise), which logs (thread, minibatch) in grant order."""
        ctx = self.ctx
        size, n, make = ctx.layout.size, ctx.layout.n, self.batch
        wrapped = ctx.sess.hooks.wrap_body(ctx.name, ctx.inv, self.node, ctx.body)
        guard = self.guards[lane]
        bind_thread(self.rbufs[lane], self.wbufs[lane], guard)
        _tls.op_key = ctx.op_key

        def body(m: int, batch: Any) -> None:
            if guard is None:
                wrapped(batch)
                return
            if guard.hit:
                return  # this attempt is void: skip, but keep the mutex turns
            guard.enter(m)
            try:
                wrapped(batch)
            except Exception:
                if not guard.hit:
                    raise
                # a violation of this body (maybe caught and re-raised as something
                # else): the attempt will be undone, the error is not the user's

        m = -1
        try:
            for m in ms.tolist():
                lo = m * size  # ``layout.minibatch_slots(m)``
                batch = make(m, lo, min(lo + size, n))
                _tls.index = m
                if turnstile is None:
                    body(m, batch)
                    continue
                turnstile.acquire(0, thread, m)
                try:
                    body(m, batch)
                finally:
                    turnstile.release(0, thread, m)
        except (AccessOutsideReconError, ClosureRuleError, DDSError, DivergenceError):
            raise
        except Exception as exc:
            raise BodyError(ctx.name, ctx.inv, m, self.node, exc) from exc
        finally:
            _tls.op_key = None
            unbind_thread()

    def _threads(self, work: list[Callable[[], None]]) -> None:
        if len(work) == 1:
            work[0]()
            return
        pool = self.ctx.sess.cluster.pool(self.node)
        futures = [pool.submit(fn) for fn in work]
        errors = [f.exception() for f in futures]
        for e in errors:
            if e is not None:
                raise e

    def _lane(self, t: int, nc: NodeClock) -> list[np.ndarray]:
        """Refresh thread ``t``'s cache, run its minibatches, return its delta rows."""
        cache, reps = self.caches[t], self.replicas
        if self.whole:
            for c, r in zip(cache, reps, strict=True):
                np.copyto(c, r)
        else:
            for c, r, ix in zip(cache, reps, nc.f_pref[t], strict=True):
                c[ix] = r[ix]
        self._run_bodies(t, nc.ms[t])
        return [c[ix] - r[ix] for c, r, ix in zip(cache, reps, nc.f_wr[t], strict=True)]

    def _compute_workers(self, nc: NodeClock) -> list[np.ndarray]:
        """BSP/SSP: each thread on its own cache; node delta blocks per parameter."""
        active = nc.active_threads
        if len(active) == 1:  # no pool round trip, no closures
            tdeltas = {active[0]: self._lane(active[0], nc)}
        else:
            tdeltas = {}

            def worker(t: int) -> Callable[[], None]:
                def run() -> None:
                    tdeltas[t] = self._lane(t, nc)

                return run

            self._threads([worker(t) for t in active])
        out = []
        lanes = self.ctx.layout.lanes
        for d, shape in enumerate(self.block_tail):
            blk = np.zeros((lanes[d], nc.nrows[d], *shape), dtype=self.replicas[d].dtype)
            for t in active:  # thread order: part of the fixed aggregation order
                if lanes[d] == 1:
                    blk[0, nc.f_tpos[t][d]] += tdeltas[t][d]
                else:
                    blk[t, nc.f_tpos[t][d]] = tdeltas[t][d]
            out.append(blk)
        return out

    def _compute_hybrid(self, clock: int, nc: NodeClock) -> list[np.ndarray]:
        """Hybrid: the node's threads share one cache; bodies hold the node mutex."""
        ctx = self.ctx
        cache = self.caches[0]
        for c, r, ix in zip(cache, self.replicas, nc.f_npref, strict=True):
            if ctx.layout.sets is None:
                np.copyto(c, r)
            else:
                c[ix] = r[ix]
        order = self._hybrid_order(clock, nc)
        where = {"node": self.node, "op": ctx.name, "invocation": ctx.inv}
        # the node mutex: free in a normal run, the given order otherwise (one thread:
        # nothing to order, no mutex)
        ts = None
        if ctx.sess.cluster.threads > 1:
            ts = TurnstileDriver(None if order is None else {0: order}, where)
        if order is not None and ctx.sched is not None and ctx.sched.serial:
            # single-node replay: the recorded grant order, on this thread
            for t, run in itertools.groupby(order, key=lambda tm: tm[0]):
                ms = np.array([m for _, m in run], dtype=np.int64)
                self._run_bodies(0, ms, t, ts)
        else:

            def worker(t: int) -> Callable[[], None]:
                return lambda: self._run_bodies(0, nc.ms[t], t, ts)

            self._threads([worker(t) for t in nc.active_threads])
        grants = [] if ts is None else ts.granted(0)
        if grants:
            arr = np.array(grants, dtype=np.int64)
            ctx.events.body_order(
                ctx.name, ctx.inv, self.node, clock, arr[:, 0].copy(), arr[:, 1].copy()
            )
        return [
            (c[ix] - r[ix])[None] for c, r, ix in zip(cache, self.replicas, nc.f_rows, strict=True)
        ]

    def _hybrid_order(self, clock: int, nc: NodeClock) -> list[tuple[int, int]] | None:
        """The controller's mutex grant order of ``clock`` (None: free), checked up front
        against what each thread will ask for, so a changed program diverges at once
        instead of waiting for a turn that never comes."""
        ctx = self.ctx
        if ctx.sess.cluster.threads == 1:
            return None  # one thread: one order, nothing recorded
        order = None if ctx.sched is None else ctx.sched.mutex_order(self.node, clock)
        if order is None and ctx.sched is not None and ctx.sched.chaos is not None:
            # chaos: a random merge of the threads' minibatch sequences
            seqs = {t: nc.ms[t].tolist() for t in nc.active_threads}
            return ctx.sched.chaos.interleave(ctx.name, ctx.inv, self.node, clock, seqs)
        if order is None:
            return None
        order = [(int(t), int(m)) for t, m in order]
        for t in sorted(set(nc.active_threads) | {t for t, _ in order}):
            want = [m for th, m in order if th == t]
            got = nc.ms[t].tolist() if t in nc.active_threads else []
            if want != got:
                raise DivergenceError(
                    node=self.node,
                    op=ctx.name,
                    invocation=ctx.inv,
                    event=f"clock {clock}",
                    what="body order",
                    expected=f"thread {t} to run minibatches {want[:8]}"
                    + ("..." if len(want) > 8 else ""),
                    actual=f"minibatches {got[:8]}" + ("..." if len(got) > 8 else ""),
                )
        return order

    # ------------------------------------------------------------------ messages
    def delta_payload(self, clock: int, owner: int) -> np.ndarray:
        """The message carrying this node's delta of ``clock`` to ``owner``."""
        split = self.ctx.layout.node(clock, self.node).f_split[owner]
        return _stamp(clock, [blk[:, ix] for blk, ix in zip(self.own[clock], split, strict=True)])

    def _unpack_delta(self, clock: int, src: int, buf: np.ndarray) -> list[np.ndarray]:
        spans, size = self.ctx.layout.delta_spans(clock, src, self.node)
        if size != len(buf):
            raise SyncProtocolError(
                f"sync_for: delta from node {src} for clock {clock} has {len(buf)} bytes, "
                f"the layout says {size}"
            )
        return [
            buf[lo:hi].view(dt).reshape(shape)
            for (lo, hi, shape), dt in zip(spans, self.dtypes, strict=True)
        ]

    def aggregate(self, clock: int, received: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        """Aggregate the deltas of ``clock`` into the owned rows; return the update message
        for each other node (``engine._syncfor.routing``: the rows it may read; a message
        of no rows is the bare stamp, which the drivers do not send)."""
        ctx, layout, me = self.ctx, self.ctx.layout, self.node
        oc = layout.owner(clock, me)
        own = self.own.pop(clock)
        split = layout.node(clock, me).f_split[me]
        blocks: list[list[np.ndarray]] = []
        for src in range(layout.nodes):
            if src == me:
                blocks.append([blk[:, ix] for blk, ix in zip(own, split, strict=True)])
            else:
                blocks.append(self._unpack_delta(clock, src, received.pop(src)))
        contributors = layout.contributors(clock)
        srcs = summation_order(layout.nodes, me)
        for d, rep in enumerate(self.replicas):
            n = oc.nrows[d]
            if not n:
                continue
            rows = oc.f_rows[d]
            fn = ctx.aggs[d]
            if fn is None:
                acc = np.zeros((n, *self.block_tail[d]), dtype=rep.dtype)
                for src in srcs:  # node order, whatever the arrival order
                    acc[oc.f_pos[src][d]] += blocks[src][d][0]
                agg = acc / contributors
            else:
                agg = self._custom(clock, d, fn, blocks, n, layout.workers(clock, ctx.hybrid))
            rep[rows] = rep[rows] + agg
        # the owner's new values as ``rep`` now holds them (an aggregate of another dtype,
        # e.g. float64 for float32 rows, is cast by the assignment)
        out = {}
        for dst in range(layout.nodes):
            if dst != me:
                sub = layout.update_rows(clock, me, dst, ctx.staleness)
                out[dst] = _stamp(clock, [r[ix] for r, ix in zip(self.replicas, sub, strict=True)])
        return out

    def _custom(
        self,
        clock: int,
        d: int,
        fn: Callable[[np.ndarray], np.ndarray],
        blocks: list[list[np.ndarray]],
        n: int,
        workers: int,
    ) -> np.ndarray:
        layout, rep = self.ctx.layout, self.replicas[d]
        oc = layout.owner(clock, self.node)
        stack = np.zeros((workers, n, *rep.shape[1:]), dtype=rep.dtype)
        w = 0
        for src in range(layout.nodes):
            nc = layout.node(clock, src)
            if self.ctx.hybrid:
                lanes = [0] if nc.active_threads else []
            else:
                lanes = nc.active_threads
            for lane in lanes:  # (node, thread) order
                stack[w, oc.f_pos[src][d]] = blocks[src][d][lane]
                w += 1
        agg = np.asarray(fn(stack))
        want = (n, *rep.shape[1:])
        if agg.shape != want:
            dds = self.ctx.params[d]
            raise DDSError(
                f"{dds.name}: the aggregation function registered for it returned shape "
                f"{agg.shape} for deltas of shape {stack.shape}; it must return {want} "
                "(one aggregate delta per row)"
            )
        return agg

    def apply_update(self, clock: int, owner: int, buf: np.ndarray) -> None:
        """Write ``owner``'s new values of ``clock`` (the rows routed here) into this node's
        replica."""
        layout, stale = self.ctx.layout, self.ctx.staleness
        spans, size = layout.update_spans(clock, owner, self.node, stale)
        if size != len(buf):
            raise SyncProtocolError(
                f"sync_for: update from node {owner} for clock {clock} has {len(buf)} bytes, "
                f"the layout says {size}"
            )
        rows = layout.update_rows(clock, owner, self.node, stale)
        for d, (lo, hi, shape) in enumerate(spans):
            if hi > lo:
                self.replicas[d][rows[d]] = buf[lo:hi].view(self.dtypes[d]).reshape(shape[1:])


__all__ = ["HEADER", "NodeRun", "SyncContext", "check_stamp", "summation_order"]
