"""Who runs which minibatch in which clock, and which parameter rows move where.

The assignment is static: with P nodes, T threads and ``per_clock`` minibatches per
worker, clock ``c`` covers minibatches ``c*P*T*per_clock ..`` and worker (node p,
thread t) takes the ``per_clock`` consecutive ones at offset ``(p*T + t)*per_clock``.
The same assignment is used by BSP, SSP and Hybrid (where a node's threads share its
cache), so the three differ only in when updates become visible.

Row sets come from reconnaissance (``re=True``: per minibatch read and write sets) or
are whole DDS (``re=False``).  Every node computes the layout of every node the same
way, so each one knows the exact size of every message it will receive and posts
its receives in advance; nothing about sizes travels on the wire.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._asyncfor.recon import AccessSets, union_sorted
from .._data.dds import _DDS, SLOT_BITS, SLOT_MASK, dmap, dvector
from .routing import Routing

_EMPTY = np.empty(0, dtype=np.int64)


Index = np.ndarray | slice


def fast(ix: np.ndarray) -> Index:
    """``ix`` as a slice when it is a run of consecutive slots (views instead of copies)."""
    n = len(ix)
    if n == 0:
        return slice(0, 0)
    lo = int(ix[0])
    if int(ix[-1]) - lo == n - 1 and (n < 3 or bool(np.all(np.diff(ix) == 1))):
        return slice(lo, lo + n)
    return ix


@dataclass(slots=True)
class NodeClock:
    """One node's share of one clock (lists indexed by thread, then by parameter).

    The slot arrays are sorted; the ``f_*`` twins are the same positions as slices
    where possible, for indexing on the hot path.
    """

    ms: list[np.ndarray]  # per thread: minibatch numbers, in execution order
    pref: list[list[np.ndarray]]  # slots refreshed into the thread's cache
    wr: list[list[np.ndarray]]  # slots the thread writes (its delta rows)
    rows: list[np.ndarray]  # per parameter: union of the threads' written slots
    tpos: list[list[np.ndarray]]  # positions of ``wr`` inside ``rows``
    npref: list[np.ndarray]  # per parameter: union of ``pref`` (Hybrid's node cache)
    split: list[list[np.ndarray]]  # per owner, per parameter: positions in ``rows`` it owns
    active_threads: list[int] = field(default_factory=list)
    f_pref: list[list[Index]] = field(default_factory=list)
    f_wr: list[list[Index]] = field(default_factory=list)
    f_rows: list[Index] = field(default_factory=list)
    f_tpos: list[list[Index]] = field(default_factory=list)
    f_npref: list[Index] = field(default_factory=list)
    f_split: list[list[Index]] = field(default_factory=list)
    nrows: list[int] = field(default_factory=list)  # per parameter: ``len(rows[d])``

    def __post_init__(self) -> None:
        self.active_threads = [t for t, m in enumerate(self.ms) if len(m)]
        self.nrows = [len(x) for x in self.rows]
        self.f_pref = [[fast(x) for x in row] for row in self.pref]
        self.f_wr = [[fast(x) for x in row] for row in self.wr]
        self.f_rows = [fast(x) for x in self.rows]
        self.f_tpos = [[fast(x) for x in row] for row in self.tpos]
        self.f_npref = [fast(x) for x in self.npref]
        self.f_split = [[fast(x) for x in row] for row in self.split]


@dataclass(slots=True)
class OwnerClock:
    """What one owner aggregates in one clock."""

    rows: list[np.ndarray]  # per parameter: owned slots some node wrote (sorted)
    pos: list[list[np.ndarray]]  # per source node, per parameter: positions in ``rows``
    f_rows: list[Index] = field(default_factory=list)
    f_pos: list[list[Index]] = field(default_factory=list)
    nrows: list[int] = field(default_factory=list)  # per parameter: ``len(rows[d])``

    def __post_init__(self) -> None:
        self.nrows = [len(x) for x in self.rows]
        self.f_rows = [fast(x) for x in self.rows]
        self.f_pos = [[fast(x) for x in row] for row in self.pos]


#: Bytes of a message's clock stamp, before its blocks.
HEADER = 8

#: Per parameter (first byte, end byte, block shape) in a message; the message's length.
Spans = tuple[list[tuple[int, int, tuple[int, ...]]], int]


def _spans(shapes: list[tuple[int, ...]], row_nbytes: list[int]) -> Spans:
    out, off = [], HEADER
    for shape, rb in zip(shapes, row_nbytes, strict=True):
        nb = shape[0] * shape[1] * rb
        out.append((off, off + nb, shape))
        off += nb
    return out, off


def owner_array(dds: _DDS, nodes: int) -> np.ndarray:
    """The owner node of every slot of ``dds``."""
    n = len(dds)
    if isinstance(dds, dvector):
        return (np.searchsorted(dds._bounds, np.arange(n), side="right") - 1).astype(np.int64)
    assert isinstance(dds, dmap)  # every DDS is a dvector or a dmap
    return np.asarray(dds._owners, dtype=np.int64).reshape(n)


class SyncLayout:
    """Assignment and row sets of one ``sync_for`` operator (identical on every node)."""

    def __init__(
        self,
        *,
        n: int,
        size: int,
        nodes: int,
        threads: int,
        per_clock: int,
        params: list[_DDS],
        sets: AccessSets | None,
        lanes: list[int],
    ) -> None:
        self.n = n
        self.size = size
        self.minibatches = -(-n // size) if n else 0
        self.nodes = nodes
        self.threads = threads
        self.per_clock = per_clock
        self.params = params
        self.sets = sets
        self.lanes = lanes  # per parameter: delta blocks a node sends (T for custom, else 1)
        per = nodes * threads * per_clock
        self.clocks = -(-self.minibatches // per) if self.minibatches else 0
        self.owners = [owner_array(d, nodes) for d in params]
        self.row_nbytes = [d.row_nbytes() for d in params]
        self._all = [np.arange(len(d), dtype=np.int64) for d in params]
        self._owned_all = [
            [np.flatnonzero(own == o).astype(np.int64) for o in range(nodes)] for own in self.owners
        ]
        self._nodes: dict[tuple[int, int], NodeClock] = {}
        self._own: dict[tuple[int, int], OwnerClock] = {}
        self._workers: dict[tuple[int, bool], int] = {}
        self._contrib: dict[int, int] = {}
        self._allowed: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {}
        self._interned: dict[tuple[int, bytes], np.ndarray] = {}
        self._per_node: list[int] | None = None
        self._shapes: dict[tuple[int, int, int], list[tuple[int, ...]]] = {}
        self._dspans: dict[tuple[int, int, int], Spans] = {}
        self._uspans: dict[tuple[int, int, int, int], Spans] = {}
        self._urows: dict[tuple[int, int, int, int], list[Index]] = {}
        self._routing: dict[int, Routing] = {}
        self._written: dict[int, np.ndarray] = {}

    # ------------------------------------------------------------------ assignment
    def minibatch_slots(self, m: int) -> tuple[int, int]:
        """The slot range ``lo, hi`` of minibatch ``m``."""
        return m * self.size, min((m + 1) * self.size, self.n)

    def assigned(self, clock: int, node: int) -> list[np.ndarray]:
        """Per thread of ``node``: its minibatches in ``clock``."""
        k, T = self.per_clock, self.threads
        base = clock * self.nodes * T * k
        out = []
        for t in range(T):
            lo = base + (node * T + t) * k
            out.append(np.arange(lo, min(lo + k, self.minibatches), dtype=np.int64))
        return out

    def workers(self, clock: int, hybrid: bool) -> int:
        """Workers that ran in ``clock``: threads with a minibatch (Hybrid: nodes)."""
        key = (clock, hybrid)
        got = self._workers.get(key)
        if got is None:
            per_node = [len(self.node(clock, p).active_threads) for p in range(self.nodes)]
            got = sum(x > 0 for x in per_node) if hybrid else sum(per_node)
            self._workers[key] = got
        return got

    def contributors(self, clock: int) -> int:
        """Nodes that ran at least one minibatch in ``clock`` (what the average divides by)."""
        got = self._contrib.get(clock)
        if got is None:
            got = self._contrib[clock] = sum(
                bool(self.node(clock, p).active_threads) for p in range(self.nodes)
            )
        return got

    def bodies_per_node(self) -> list[int]:
        """Minibatches each node runs in one invocation."""
        if self._per_node is None:
            self._per_node = [
                sum(len(m) for c in range(self.clocks) for m in self.assigned(c, p))
                for p in range(self.nodes)
            ]
        return self._per_node

    # ------------------------------------------------------------------ row sets
    def _split_gids(self, gids: np.ndarray) -> list[np.ndarray]:
        out = []
        for d in self.params:
            lo = np.searchsorted(gids, d._id << SLOT_BITS)
            hi = np.searchsorted(gids, (d._id + 1) << SLOT_BITS)
            out.append(gids[lo:hi] & SLOT_MASK)
        return out

    def _sets_of(self, ms: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(prefetch, write) slots per parameter for minibatches ``ms``."""
        if not len(ms):
            return [_EMPTY] * len(self.params), [_EMPTY] * len(self.params)
        if self.sets is None:
            return list(self._all), list(self._all)
        s = self.sets
        w = [s.writes_of(m) for m in ms.tolist()]
        r = [s.reads_of(m) for m in ms.tolist()]
        wg = union_sorted(w)
        pg = union_sorted([*r, wg])
        return self._split_gids(pg), self._split_gids(wg)

    def allowed(self, m: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per parameter, the slots minibatch ``m`` may read (its reads and writes) and
        write, as seen by reconnaissance (cached; equal arrays are one object, which is
        what lets the guard skip re-masking between minibatches with the same rows)."""
        got = self._allowed.get(m)
        if got is None:
            r, w = self._sets_of(np.array([m], dtype=np.int64))
            got = self._allowed[m] = (
                [self._intern(d, x) for d, x in enumerate(r)],
                [self._intern(d, x) for d, x in enumerate(w)],
            )
        return got

    def _intern(self, d: int, ix: np.ndarray) -> np.ndarray:
        return self._interned.setdefault((d, ix.tobytes()), ix)

    def node(self, clock: int, node: int) -> NodeClock:
        """``node``'s share of ``clock`` (cached)."""
        key = (clock, node)
        got = self._nodes.get(key)
        if got is not None:
            return got
        ms = self.assigned(clock, node)
        pref, wr = [], []
        for m in ms:
            p, w = self._sets_of(m)
            pref.append(p)
            wr.append(w)
        D = len(self.params)
        rows, npref = [], []
        for d in range(D):
            if self.sets is None:
                active = any(len(m) for m in ms)
                rows.append(self._all[d] if active else _EMPTY)
                npref.append(rows[-1])
            else:
                rows.append(union_sorted([w[d] for w in wr]))
                npref.append(union_sorted([p[d] for p in pref]))
        tpos = [[np.searchsorted(rows[d], w[d]) for d in range(D)] for w in wr]
        split = [
            [np.flatnonzero(self.owners[d][rows[d]] == o) for d in range(D)]
            for o in range(self.nodes)
        ]
        got = self._nodes[key] = NodeClock(ms, pref, wr, rows, tpos, npref, split)
        return got

    def owner(self, clock: int, owner: int) -> OwnerClock:
        """What ``owner`` aggregates in ``clock`` (cached)."""
        key = (clock, owner)
        got = self._own.get(key)
        if got is not None:
            return got
        D = len(self.params)
        srcs = [self.node(clock, p) for p in range(self.nodes)]
        rows = []
        for d in range(D):
            parts = [nc.rows[d][nc.split[owner][d]] for nc in srcs]
            if self.sets is None and any(len(x) for x in parts):
                rows.append(self._owned_all[d][owner])
            else:
                rows.append(union_sorted(parts))
        pos = [
            [np.searchsorted(rows[d], nc.rows[d][nc.split[owner][d]]) for d in range(D)]
            for nc in srcs
        ]
        got = self._own[key] = OwnerClock(rows, pos)
        return got

    # ------------------------------------------------------------------ message sizes
    def delta_shapes(self, clock: int, src: int, owner: int) -> list[tuple[int, ...]]:
        """Per parameter, the shape of the block ``src`` sends ``owner`` for ``clock``."""
        key = (clock, src, owner)
        got = self._shapes.get(key)
        if got is None:
            nc = self.node(clock, src)
            got = self._shapes[key] = [
                (self.lanes[d], len(nc.split[owner][d]), *(p.shape or ()))
                for d, p in enumerate(self.params)
            ]
        return got

    def delta_spans(self, clock: int, src: int, owner: int) -> Spans:
        """Where each parameter's block lies in the delta message ``src`` sends ``owner``
        for ``clock``: per parameter (first byte, end byte, shape), and the message's
        length, header included (cached)."""
        key = (clock, src, owner)
        got = self._dspans.get(key)
        if got is None:
            got = self._dspans[key] = _spans(self.delta_shapes(clock, src, owner), self.row_nbytes)
        return got

    def written(self, d: int) -> np.ndarray:
        """Slots (sorted) of parameter ``d`` that some node writes in some clock: the only
        rows an invocation changes in any replica (cached)."""
        got = self._written.get(d)
        if got is None:
            parts = [self.node(c, p).rows[d] for c in range(self.clocks) for p in range(self.nodes)]
            got = self._written[d] = union_sorted(parts) if parts else _EMPTY
        return got

    def routing(self, staleness: int) -> Routing:
        """Who receives which rows of each update, under ``staleness`` (cached)."""
        got = self._routing.get(staleness)
        if got is None:
            got = self._routing[staleness] = Routing(self, staleness)
        return got

    def update_rows(self, clock: int, owner: int, dst: int, staleness: int) -> list[Index]:
        """Per parameter, the slots of ``owner``'s update of ``clock`` that ``dst`` receives."""
        key = (clock, owner, dst, staleness)
        got = self._urows.get(key)
        if got is None:
            rows = self.routing(staleness).rows(clock, owner)[dst]
            got = self._urows[key] = [fast(x) for x in rows]
        return got

    def update_spans(self, clock: int, owner: int, dst: int, staleness: int) -> Spans:
        """The same for the update ``owner`` sends ``dst`` for ``clock`` (a parameter none
        of whose rows ``dst`` receives has no block: its shape's first entry is 0)."""
        key = (clock, owner, dst, staleness)
        got = self._uspans.get(key)
        if got is None:
            rows = self.routing(staleness).rows(clock, owner)[dst]
            shapes = [(1, len(r), *(p.shape or ())) for r, p in zip(rows, self.params, strict=True)]
            got = self._uspans[key] = _spans(shapes, self.row_nbytes)
        return got

    def delta_nbytes(self, clock: int, src: int, owner: int) -> int:
        """Payload bytes of the delta ``src`` sends ``owner`` for ``clock`` (0: no message)."""
        return self.delta_spans(clock, src, owner)[1] - HEADER

    def update_nbytes(self, clock: int, owner: int, dst: int, staleness: int) -> int:
        """Payload bytes of the update ``owner`` sends ``dst`` for ``clock`` (0: no message)."""
        return self.update_spans(clock, owner, dst, staleness)[1] - HEADER

    def describe(self) -> dict[str, Any]:
        """Summary numbers for the planner report."""
        per_node = self.bodies_per_node()
        mean = sum(per_node) / max(len(per_node), 1)
        return {
            "clocks": self.clocks,
            "minibatches": self.minibatches,
            "imbalance": round(max(per_node) / mean, 4) if mean else 1.0,
        }


__all__ = [
    "HEADER",
    "Index",
    "NodeClock",
    "OwnerClock",
    "Spans",
    "SyncLayout",
    "fast",
    "owner_array",
]
