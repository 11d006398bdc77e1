"""The schedule of one operator invocation, as a value.

Why it is built this way: every point where a run could go more than one way inside an
invocation — which plan runs, in which order a node-round's lock-split bodies take their
tickets, which updates an SSP clock sees, in which order a Hybrid node's threads take the
node mutex, and whether a node runs its bodies on one thread — is answered by one frozen
value that the engine asks for once, when the invocation starts.  Replay builds that value
from the trace before the invocation (so no query runs while threads wait for their
turns); a dual test builds it from the other side's run; a normal run has none (``None``:
free).  The value holds numpy arrays and a plan, never a callable or a database object, so
it can be built, compared and shipped like data.

The lookups here keep the meaning the engine relies on:

- ``grant_order(node, round)`` is the recorded deviation log of that node-round's ticket
  order (``engine._machines.grants``); an invocation without a grant log is free.
- ``visibility(node, clock)`` is, per owner, the last clock whose update the node must have
  applied before it runs ``clock`` (``None`` where the node has nothing recorded: free).
- ``mutex_order(node, clock)`` is the node's (thread, minibatch) mutex grant order of a
  Hybrid clock (``None`` where the node has nothing recorded: free).
- ``serial``: single-process replay runs each node-round on one thread, in the order
  :func:`serial_order` derives from the plan's tasks and the grant log.
- ``messages``: per node and channel, the sources of the invocation's messages in arrival
  order (``engine._machines.messages``; ``None``: free); ``partial`` says the followed run
  stopped inside this invocation, so running past its logs means its trace is exhausted.
- ``order``: the loop-index order an ``async_for`` invocation must serialize to (the dual
  tests' sides): the engine plans it from its own reconnaissance — one plain loop on node 0
  when ``serial`` is set, else the wavefront levels of the order on ``order_threads``
  threads per node (0: the run's threads).
- ``chaos``: the free parts (whatever the fields above leave free) are drawn from this
  seed instead of left to timing (``engine._machines.chaos``): lock-split merges, thread
  dispatch, message arrivals, SSP visibility within the bound, Hybrid mutex orders.

The same type is what a run *hands its recorder* at the end of each invocation
(``engine._machines.tape``): the plan, the grant log (with each row's body and grant
counts and the element of each hand-over), the message log (with each message's sequence
number and size), SSP visibility, the Hybrid mutex order and the ``sync_for`` aggregation
arrival order, plus ``timeline``: (kind, row) pairs (``GRANTS``..``MUTEX``) that say in
which order those entries happened, so a recorder can keep the run's event order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from .._errors import DivergenceError
from .chaos import Chaos
from .grants import recorded_ticket_order
from .messages import MessageLog, MessageOrder

if TYPE_CHECKING:
    from .planner import Plan, Task

_EMPTY = np.empty(0, dtype=np.int64)


def _i64(values: Iterable[int] | np.ndarray) -> np.ndarray:
    return np.asarray(list(values) if not isinstance(values, np.ndarray) else values, np.int64)


@dataclass(frozen=True)
class GrantLog:
    """Deviation logs of lock-split node-rounds: row ``k`` is ``(node[k], round[k])`` and its
    (positions, threads) are ``positions[ptr[k]:ptr[k+1]]`` and ``threads[...]``."""

    node: np.ndarray = field(default_factory=lambda: _EMPTY)
    round: np.ndarray = field(default_factory=lambda: _EMPTY)
    ptr: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    positions: np.ndarray = field(default_factory=lambda: _EMPTY)
    threads: np.ndarray = field(default_factory=lambda: _EMPTY)
    #: per row, how many locked bodies ran and how many element locks they took (what a
    #: run recorded; not needed to follow the log)
    bodies: np.ndarray = field(default_factory=lambda: _EMPTY)
    grants: np.ndarray = field(default_factory=lambda: _EMPTY)
    #: per deviation, the element lock its hand-over took over (``W[943]``, ``-``: none)
    elements: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=str))

    @classmethod
    def build(
        cls,
        rows: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]],
        counts: dict[tuple[int, int], tuple[int, int]] | None = None,
        elements: dict[tuple[int, int], list[str]] | None = None,
    ) -> GrantLog:
        """From ``{(node, round): (positions, threads)}``, and optionally what the run
        recorded with them: ``counts`` (bodies, grants) and ``elements`` per row."""
        keys = sorted(rows)
        for k in keys:
            if len(rows[k][0]) != len(rows[k][1]):
                raise ValueError(
                    f"grant log of node {k[0]}, round {k[1]}: {len(rows[k][0])} positions but "
                    f"{len(rows[k][1])} threads"
                )
        lens = [len(rows[k][0]) for k in keys]
        pos = [rows[k][0] for k in keys]
        thr = [rows[k][1] for k in keys]
        return cls(
            node=_i64(k[0] for k in keys),
            round=_i64(k[1] for k in keys),
            ptr=np.concatenate(([0], np.cumsum(lens, dtype=np.int64))).astype(np.int64),
            positions=np.concatenate(pos).astype(np.int64) if pos else _EMPTY,
            threads=np.concatenate(thr).astype(np.int64) if thr else _EMPTY,
            bodies=_i64(counts[k][0] for k in keys) if counts else _EMPTY,
            grants=_i64(counts[k][1] for k in keys) if counts else _EMPTY,
            elements=(
                np.asarray([e for k in keys for e in elements[k]], dtype=str)
                if elements
                else np.empty(0, dtype=str)
            ),
        )

    @cached_property
    def _row(self) -> dict[tuple[int, int], int]:
        return {
            (n, r): k
            for k, (n, r) in enumerate(zip(self.node.tolist(), self.round.tolist(), strict=True))
        }

    def of(self, node: int, round: int) -> tuple[np.ndarray, np.ndarray]:
        """The (positions, threads) of one node-round (empty: the predicted order itself)."""
        k = self._row.get((node, round))
        if k is None:
            return _EMPTY, _EMPTY
        a, b = int(self.ptr[k]), int(self.ptr[k + 1])
        return self.positions[a:b], self.threads[a:b]


@dataclass(frozen=True)
class VisibilityLog:
    """SSP visibility: row ``k`` says node ``node[k]`` ran ``clock[k]`` having applied the
    updates of owner q up to clock ``applied[k, q]`` (-1: none)."""

    node: np.ndarray = field(default_factory=lambda: _EMPTY)
    clock: np.ndarray = field(default_factory=lambda: _EMPTY)
    applied: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))

    @classmethod
    def build(cls, rows: dict[tuple[int, int], tuple[int, ...]]) -> VisibilityLog:
        """From ``{(node, clock): applied per owner}``."""
        keys = sorted(rows)
        width = max((len(rows[k]) for k in keys), default=0)
        applied = np.full((len(keys), width), -1, dtype=np.int64)
        for i, k in enumerate(keys):
            applied[i, : len(rows[k])] = rows[k]
        return cls(_i64(k[0] for k in keys), _i64(k[1] for k in keys), applied)

    @cached_property
    def _per_node(self) -> dict[int, dict[int, tuple[int, ...]]]:
        out: dict[int, dict[int, tuple[int, ...]]] = {}
        for i, (n, c) in enumerate(zip(self.node.tolist(), self.clock.tolist(), strict=True)):
            out.setdefault(n, {})[c] = tuple(self.applied[i].tolist())
        return out

    def has(self, node: int) -> bool:
        """Whether anything is recorded for ``node`` (otherwise its clocks are free)."""
        return node in self._per_node


@dataclass(frozen=True)
class MutexLog:
    """Hybrid node-mutex grants, in grant order within each (node, clock)."""

    node: np.ndarray = field(default_factory=lambda: _EMPTY)
    clock: np.ndarray = field(default_factory=lambda: _EMPTY)
    thread: np.ndarray = field(default_factory=lambda: _EMPTY)
    minibatch: np.ndarray = field(default_factory=lambda: _EMPTY)

    @classmethod
    def build(cls, rows: dict[tuple[int, int], list[tuple[int, int]]]) -> MutexLog:
        """From ``{(node, clock): [(thread, minibatch), ...] in grant order}``."""
        keys = sorted(rows)
        flat = [(k[0], k[1], t, m) for k in keys for t, m in rows[k]]
        cols = np.asarray(flat, dtype=np.int64).reshape(-1, 4)
        return cls(cols[:, 0].copy(), cols[:, 1].copy(), cols[:, 2].copy(), cols[:, 3].copy())

    @cached_property
    def _per_node(self) -> dict[int, dict[int, list[tuple[int, int]]]]:
        out: dict[int, dict[int, list[tuple[int, int]]]] = {}
        for n, c, t, m in zip(
            self.node.tolist(),
            self.clock.tolist(),
            self.thread.tolist(),
            self.minibatch.tolist(),
            strict=True,
        ):
            out.setdefault(n, {}).setdefault(c, []).append((t, m))
        return out

    def groups(self) -> dict[tuple[int, int], list[tuple[int, int]]]:
        """``{(node, clock): [(thread, minibatch), ...] in grant order}``."""
        return {(n, c): list(g) for n, per in self._per_node.items() for c, g in per.items()}


@dataclass(frozen=True)
class AggregationLog:
    """What a run recorded of ``sync_for`` aggregation: row ``k`` says owner ``node[k]``
    took the deltas of ``clock[k]`` from ``sources[ptr[k]:ptr[k+1]]`` in that arrival
    order.  Nothing follows it: the sum always runs in node order."""

    node: np.ndarray = field(default_factory=lambda: _EMPTY)
    clock: np.ndarray = field(default_factory=lambda: _EMPTY)
    ptr: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    sources: np.ndarray = field(default_factory=lambda: _EMPTY)

    @classmethod
    def build(cls, rows: dict[tuple[int, int], np.ndarray]) -> AggregationLog:
        """From ``{(node, clock): sources in arrival order}``."""
        keys = sorted(rows)
        parts = [np.asarray(rows[k], np.int64) for k in keys]
        return cls(
            node=_i64(k[0] for k in keys),
            clock=_i64(k[1] for k in keys),
            ptr=np.concatenate(([0], np.cumsum([len(p) for p in parts], dtype=np.int64))).astype(
                np.int64
            ),
            sources=np.concatenate(parts).astype(np.int64) if parts else _EMPTY,
        )


#: The kinds of :attr:`Schedule.timeline` entries (what happened, in the order it did).
GRANTS, MESSAGE, VISIBILITY, AGGREGATION, MUTEX = range(5)


@dataclass(frozen=True)
class Schedule:
    """What one invocation of operator ``op`` must follow (see the module docstring).

    ``plan``: the plan in force at this invocation in the run being followed (``None``: not
    known); ``replanned``: that run made it here, so this run uses it instead of reusing or
    making its own.  ``grants``: ``None`` lets lock-split groups take their locks freely.
    ``order``/``order_threads``: a serialization order to plan from (see the module
    docstring); ``None`` lets the planner choose.  ``workers``: a ``sync_for`` invocation
    on one node runs as the serial definition of (nodes, threads) workers, one at a time,
    with its own aggregation arithmetic (the dual tests' serial side).
    """

    op: str
    invocation: int
    plan: Plan | None = None
    replanned: bool = False
    grants: GrantLog | None = None
    visibility: VisibilityLog = field(default_factory=VisibilityLog)
    mutex: MutexLog = field(default_factory=MutexLog)
    serial: bool = False
    messages: MessageLog | None = None
    partial: bool = False
    order: np.ndarray | None = None
    order_threads: int = 0
    chaos: Chaos | None = None
    aggregation: AggregationLog = field(default_factory=AggregationLog)
    timeline: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.int64))
    workers: tuple[int, int] | None = None

    def grant_order(self, node: int, round: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The deviation log of a node-round's ticket order (``None``: take locks freely)."""
        if self.grants is None:
            return None
        return self.grants.of(node, round)

    def visible(self, node: int, clock: int) -> tuple[int, ...] | None:
        """Per owner, the last clock ``node`` must have applied before running ``clock``
        (``None``: nothing recorded for the node, so whatever arrived)."""
        seen = self.visibility._per_node.get(node)
        if not seen:
            return None
        got = seen.get(clock)
        if got is None:
            raise DivergenceError(
                node=node,
                op=self.op,
                invocation=self.invocation,
                event=f"clock {clock}",
                what="visibility",
                expected=f"clocks 0..{max(seen)} only",
                actual=f"clock {clock} started",
            )
        return got

    def has_visibility(self, node: int) -> bool:
        """Whether ``node``'s SSP clocks follow recorded visibility."""
        return self.visibility.has(node)

    def message_order(self) -> MessageOrder:
        """A fresh message-order machine for this invocation's receives."""
        return MessageOrder(
            self.messages,
            op=self.op,
            invocation=self.invocation,
            partial=self.partial,
        )

    def mutex_order(self, node: int, clock: int) -> list[tuple[int, int]] | None:
        """``node``'s (thread, minibatch) mutex grant order in ``clock`` (``None``: free)."""
        per = self.mutex._per_node.get(node)
        if not per:
            return None
        return per.get(clock, [])


def serial_order(sched: Schedule, node: int, round: int, tasks: list[Task]) -> np.ndarray:
    """One causally consistent single-thread order of a node-round: its unlocked tasks in
    plan order, then its lock-split bodies in the recorded ticket order (which orders every
    pair of bodies that share a lock)."""
    free = [t.indices for t in tasks if not t.locked]
    order = list(np.concatenate(free).tolist()) if free else []
    seqs: dict[int, list[np.ndarray]] = {}
    for t in tasks:
        if t.locked:
            seqs.setdefault(t.thread, []).append(np.asarray(t.indices, dtype=np.int64))
    if seqs:
        per = {th: np.concatenate(parts) for th, parts in seqs.items()}
        pos, thr = sched.grant_order(node, round) or (_EMPTY, _EMPTY)
        _, merged = recorded_ticket_order(
            pos, thr, per, node=node, op=sched.op, invocation=sched.invocation, round=round
        )
        order += merged.tolist()
    return np.asarray(order, dtype=np.int64)


__all__ = [
    "AGGREGATION",
    "GRANTS",
    "MESSAGE",
    "MUTEX",
    "VISIBILITY",
    "AggregationLog",
    "GrantLog",
    "MutexLog",
    "Schedule",
    "VisibilityLog",
    "serial_order",
]
