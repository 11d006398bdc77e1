"""What happened in one invocation, handed to the recorder as one schedule value.

Why it exists: the lock grants, message arrivals, SSP visibility, Hybrid mutex grants and
``sync_for`` aggregation orders of an invocation are facts of one attempt.  A
:class:`Tape` collects them while the attempt runs (plain appends, no database and no
recorder call on the hot path); an undone attempt drops its tape, and one that stands turns
it into a :class:`~engine._machines.schedule.Schedule` value — the same type replay builds
from a trace and follows — which the recorder receives at the end of the invocation.
:func:`emit` unfolds such a value into the per-event calls of a recorder, in the order the
events happened (``Schedule.timeline``), for recorders written against those calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .messages import MessageLog
from .schedule import (
    AGGREGATION,
    GRANTS,
    MESSAGE,
    MUTEX,
    VISIBILITY,
    AggregationLog,
    GrantLog,
    MutexLog,
    Schedule,
    VisibilityLog,
)

if TYPE_CHECKING:
    from .planner import Plan


class EventSink(Protocol):
    """The per-event calls :func:`emit` makes (``engine.Recorder``'s)."""

    def lock_grants(
        self,
        op: str,
        invocation: int,
        node: int,
        round: int,
        bodies: int,
        grants: int,
        positions: np.ndarray,
        threads: np.ndarray,
        elements: Any = (),
    ) -> None: ...

    def message_received(
        self, node: int, channel: str, source: int, seq: int, nbytes: int
    ) -> None: ...

    def aggregation_order(
        self, op: str, invocation: int, node: int, clock: int, sources: np.ndarray
    ) -> None: ...

    def ssp_visibility(
        self, op: str, invocation: int, node: int, clock: int, applied: np.ndarray
    ) -> None: ...

    def body_order(
        self,
        op: str,
        invocation: int,
        node: int,
        clock: int,
        threads: np.ndarray,
        minibatches: np.ndarray,
    ) -> None: ...


class Tape:
    """The events of one attempt at an invocation, in the order they happened (appends
    only: safe from the node threads under the GIL).  ``active=False`` (nothing records
    the run) keeps nothing."""

    def __init__(self, active: bool = True) -> None:
        self.active = active
        self._grants: list[tuple[int, int, int, int, np.ndarray, np.ndarray, list[str]]] = []
        self._msgs: list[tuple[int, str, int, int, int]] = []
        self._vis: list[tuple[int, int, np.ndarray]] = []
        self._agg: list[tuple[int, int, np.ndarray]] = []
        self._mutex: list[tuple[int, int, np.ndarray, np.ndarray]] = []
        self._when: list[tuple[int, int]] = []  # (kind, index into that kind's list)

    def lock_grants(
        self,
        op: str,
        invocation: int,
        node: int,
        round: int,
        bodies: int,
        grants: int,
        positions: np.ndarray,
        threads: np.ndarray,
        elements: Any = (),
    ) -> None:
        """A node-round's lock-split bodies took their tickets (see ``Recorder``)."""
        if self.active:
            names = [str(e) for e in elements][: len(positions)]
            names += ["-"] * (len(positions) - len(names))
            self._when.append((GRANTS, len(self._grants)))
            self._grants.append((node, round, int(bodies), int(grants), positions, threads, names))

    def message_received(self, node: int, channel: str, source: int, seq: int, nbytes: int) -> None:
        """A message from ``source`` arrived at ``node`` on ``channel``."""
        if self.active:
            self._when.append((MESSAGE, len(self._msgs)))
            self._msgs.append((node, channel, source, seq, nbytes))

    def ssp_visibility(
        self, op: str, invocation: int, node: int, clock: int, applied: np.ndarray
    ) -> None:
        """``node`` ran SSP ``clock`` having applied these updates per owner."""
        if self.active:
            self._when.append((VISIBILITY, len(self._vis)))
            self._vis.append((node, clock, np.array(applied, np.int64)))

    def aggregation_order(
        self, op: str, invocation: int, node: int, clock: int, sources: np.ndarray
    ) -> None:
        """Owner ``node`` took the deltas of ``clock`` in this arrival order."""
        if self.active:
            self._when.append((AGGREGATION, len(self._agg)))
            self._agg.append((node, clock, np.array(sources, np.int64)))

    def body_order(
        self,
        op: str,
        invocation: int,
        node: int,
        clock: int,
        threads: np.ndarray,
        minibatches: np.ndarray,
    ) -> None:
        """``node``'s threads took the Hybrid node mutex of ``clock`` in this order."""
        if self.active:
            self._when.append((MUTEX, len(self._mutex)))
            self._mutex.append((node, clock, np.asarray(threads), np.asarray(minibatches)))

    def __bool__(self) -> bool:
        return bool(self._when)

    def schedule(self, op: str, invocation: int, plan: Plan | None = None) -> Schedule:
        """The attempt's events as one :class:`Schedule` value (``timeline``: their order)."""
        grants = GrantLog.build(
            {(n, r): (p, t) for n, r, _, _, p, t, _ in self._grants},
            counts={(n, r): (b, g) for n, r, b, g, _, _, _ in self._grants},
            elements={(n, r): e for n, r, _, _, _, _, e in self._grants},
        )
        g_row = {
            k: i
            for i, k in enumerate(zip(grants.node.tolist(), grants.round.tolist(), strict=True))
        }
        # messages: grouped per (node, channel) in arrival order; remember each one's slot
        per: dict[tuple[int, str], list[int]] = {}
        for i, (n, c, _, _, _) in enumerate(self._msgs):
            per.setdefault((n, c), []).append(i)
        keys = sorted(per)
        order = [i for k in keys for i in per[k]]
        slot = np.empty(len(order), np.int64)
        slot[order] = np.arange(len(order))
        cols = np.asarray([m[2:] for m in self._msgs], np.int64).reshape(-1, 3)[order]
        lens = [len(per[k]) for k in keys]
        messages = MessageLog(
            node=np.asarray([k[0] for k in keys], np.int64),
            channel=np.asarray([k[1] for k in keys], dtype=str),
            ptr=np.concatenate(([0], np.cumsum(lens, dtype=np.int64))).astype(np.int64),
            sources=cols[:, 0].copy(),
            seq=cols[:, 1].copy(),
            nbytes=cols[:, 2].copy(),
        )
        vis = VisibilityLog.build({(n, c): tuple(a.tolist()) for n, c, a in self._vis})
        v_row = {
            k: i for i, k in enumerate(zip(vis.node.tolist(), vis.clock.tolist(), strict=True))
        }
        agg = AggregationLog.build({(n, c): s for n, c, s in self._agg})
        a_row = {
            k: i for i, k in enumerate(zip(agg.node.tolist(), agg.clock.tolist(), strict=True))
        }
        mutex = MutexLog.build(
            {(n, c): list(zip(t.tolist(), m.tolist(), strict=True)) for n, c, t, m in self._mutex}
        )
        m_first: dict[tuple[int, int], int] = {}
        for i, k in enumerate(zip(mutex.node.tolist(), mutex.clock.tolist(), strict=True)):
            m_first.setdefault(k, i)
        timeline = np.zeros((len(self._when), 2), np.int64)
        for e, (kind, i) in enumerate(self._when):
            if kind == GRANTS:
                row = g_row[self._grants[i][:2]]
            elif kind == MESSAGE:
                row = int(slot[i])
            elif kind == VISIBILITY:
                row = v_row[self._vis[i][:2]]
            elif kind == AGGREGATION:
                row = a_row[self._agg[i][:2]]
            else:
                row = m_first[self._mutex[i][:2]]
            timeline[e] = (kind, row)
        return Schedule(
            op=op,
            invocation=invocation,
            plan=plan,
            grants=grants,
            visibility=vis,
            mutex=mutex,
            messages=messages,
            aggregation=agg,
            timeline=timeline,
        )


def emit(sched: Schedule, sink: EventSink) -> None:
    """Make ``sink``'s per-event calls for every entry of ``sched``, in timeline order."""
    op, inv = sched.op, sched.invocation
    g, msg = sched.grants or GrantLog(), sched.messages or MessageLog()
    vis, agg, mx = sched.visibility, sched.aggregation, sched.mutex
    # the message row (node, channel) of every message slot
    m_row = np.repeat(np.arange(len(msg.node)), np.diff(msg.ptr)) if len(msg.node) else None
    for kind, k in sched.timeline.tolist():
        if kind == GRANTS:
            a, b = int(g.ptr[k]), int(g.ptr[k + 1])
            sink.lock_grants(
                op,
                inv,
                int(g.node[k]),
                int(g.round[k]),
                int(g.bodies[k]) if len(g.bodies) else b - a,
                int(g.grants[k]) if len(g.grants) else 0,
                g.positions[a:b],
                g.threads[a:b],
                g.elements[a:b].tolist() if len(g.elements) else (),
            )
        elif kind == MESSAGE:
            assert m_row is not None
            r = int(m_row[k])
            sink.message_received(
                int(msg.node[r]),
                str(msg.channel[r]),
                int(msg.sources[k]),
                int(msg.seq[k]) if len(msg.seq) else -1,
                int(msg.nbytes[k]) if len(msg.nbytes) else 0,
            )
        elif kind == VISIBILITY:
            sink.ssp_visibility(op, inv, int(vis.node[k]), int(vis.clock[k]), vis.applied[k])
        elif kind == AGGREGATION:
            a, b = int(agg.ptr[k]), int(agg.ptr[k + 1])
            sink.aggregation_order(op, inv, int(agg.node[k]), int(agg.clock[k]), agg.sources[a:b])
        elif kind == MUTEX:
            n, c = int(mx.node[k]), int(mx.clock[k])
            e = k
            while e < len(mx.node) and mx.node[e] == n and mx.clock[e] == c:
                e += 1
            sink.body_order(op, inv, n, c, mx.thread[k:e].copy(), mx.minibatch[k:e].copy())


__all__ = ["EventSink", "Tape", "emit"]
