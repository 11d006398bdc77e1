"""The serial side of a dual test for ``sync_for``: its semantics, executed one worker
at a time in one process, independently of the distributed implementation (``node``,
``layout``, ``drive``), whose code it does not call.

A clock of ``sync_for`` on P nodes × T threads: every worker runs its minibatches on
its own copy of the parameters (Hybrid: the threads of a node share one copy, in the
recorded body order); a node's delta is the sum of its threads' deltas, and what is
added is the average of the nodes' deltas over the nodes that ran a minibatch in the
clock (or the registered aggregation of the (node, thread)-ordered deltas).  Because this
is written against the definition and not the distributed code, an aggregation bug there
(counting a delta twice, summing in another order) makes the two sides differ.

It runs when the invocation's schedule value says so (``Schedule.workers``: the dual
tests' serial side is a schedule builder like every other), and follows that value as
the engine would: a Hybrid node's body order is the value's mutex order.  Where the
value leaves it free, this side chooses the threads' plain order and hands that to the
recorder as the invocation's schedule value, for the other side to follow.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from .._data.dds import _DDS
from .._machines.schedule import Schedule
from .._machines.tape import Tape
from .._runtime.session import Session, _tls
from .dds import bind_thread, enter_sync_mode, make_batch, unbind_thread


@contextmanager
def _worker(
    sess: Session, key: int, node: int, params: list[_DDS], caches: list[Any]
) -> Iterator[None]:
    """Run bodies in this thread as a worker of ``node``: every DDS reads ``node``'s
    replica, except the ``params``, which read and write their ``caches``."""
    reads = {d._id: d._bufs[node] for d in sess.dds}
    writes = {d._id: c for d, c in zip(params, caches, strict=True)}
    reads.update(writes)
    bind_thread(reads, writes)
    _tls.op_key = key
    try:
        yield
    finally:
        _tls.op_key = None
        unbind_thread()


def reference_sync_for(
    sess: Session,
    inv: int,
    data: _DDS,
    minibatch: int,
    body: Callable[..., Any],
    *,
    sync: str,
    name: str,
    per_clock: int,
    params: list[_DDS],
    aggs: list[Callable[[np.ndarray], np.ndarray] | None],
    schedule: Schedule,
) -> None:
    """Invocation ``inv`` of ``sync_for`` ``name`` in a one-node session, simulating the
    ``schedule.workers`` = (nodes, threads) workers; ``aggs[k]`` is the aggregation
    registered for ``params[k]`` (``None``: the average)."""
    assert schedule.workers is not None
    nodes, threads = schedule.workers
    chosen = Tape(active=True)
    t0 = time.perf_counter()
    n = len(data)
    batches = -(-n // minibatch) if n else 0
    per = nodes * threads * per_clock
    clocks = -(-batches // per) if batches else 0
    hybrid = sync == "hybrid"
    key = sess.op_key(name, inv)
    node0 = sess.cluster.local_nodes[0]

    def assigned(clock: int, p: int, t: int) -> list[int]:
        lo = clock * per + (p * threads + t) * per_clock
        return list(range(lo, min(lo + per_clock, batches)))

    def run(ms: list[int], caches: list[np.ndarray]) -> None:
        with _worker(sess, key, node0, params, caches):
            for m in ms:
                lo, hi = m * minibatch, min((m + 1) * minibatch, n)
                _tls.index = m
                body(make_batch(data, data._bufs[node0], m, lo, hi))

    def hybrid_order(p: int, clock: int) -> list[int]:
        got = schedule.mutex_order(p, clock)
        if got:
            return [m for _, m in got]
        pairs = [(t, m) for t in range(threads) for m in assigned(clock, p, t)]
        if threads > 1 and pairs:  # the order this side chose: the other side must follow it
            arr = np.array(pairs, dtype=np.int64)
            chosen.body_order(name, inv, p, clock, arr[:, 0].copy(), arr[:, 1].copy())
        return [m for _, m in pairs]

    sess.mode = "sync"
    for d in sess.dds:
        enter_sync_mode(d)
    try:
        for clock in range(clocks):
            base = [d._bufs[node0].copy() for d in params]
            deltas: list[list[np.ndarray]] = [[] for _ in params]  # (node, thread) order
            blocks: list[list[np.ndarray]] = [[] for _ in params]  # per node: sum of threads
            ran = 0  # nodes with a minibatch in this clock: the average's denominator
            for p in range(nodes):
                node_sum = [np.zeros_like(b) for b in base]
                if hybrid:
                    lanes = [hybrid_order(p, clock)]
                else:
                    lanes = [assigned(clock, p, t) for t in range(threads)]
                ran += any(lanes)
                for ms in lanes:
                    if not ms:
                        continue
                    caches = [b.copy() for b in base]
                    run(ms, caches)
                    for k, (c, b) in enumerate(zip(caches, base, strict=True)):
                        deltas[k].append(c - b)
                        node_sum[k] += c - b  # a node sums its threads in thread order
                for k in range(len(params)):
                    blocks[k].append(node_sum[k])
            for k, d in enumerate(params):
                if not deltas[k]:
                    continue
                stack = np.stack(deltas[k])
                fn = aggs[k]
                if fn is None:
                    total = np.zeros_like(base[k])
                    for blk in blocks[k]:  # the owner sums the nodes in node order
                        total += blk
                    step = total / ran
                else:
                    step = np.asarray(fn(stack))
                changed = (stack != 0).reshape(len(stack), len(d), -1).any(axis=(0, 2))
                slots = np.flatnonzero(changed)
                d.set_rows(node0, slots, (base[k] + step)[slots])
    finally:
        sess.set_mode("driver")
    if chosen:
        sess.recorder.schedule_done(chosen.schedule(name, inv))
    sess.planner[name] = {"strategy": sync, "staleness": 0, "bodies": batches, "rounds": clocks}
    sess.op_times.setdefault(name, []).append(time.perf_counter() - t0)
    sess.record_digests(name, inv)
    sess.take_phases()  # no recorder hears of a reference run's invocations
    sess.hooks.after_invocation(name, inv)


__all__ = ["reference_sync_for"]
