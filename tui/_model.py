"""Pure views of trace data: order tables, timeline layout, log diff, divergence targets.

Nothing here touches the database; the repository feeds these functions what the
read API returned, and the widgets only ever format rows of the results.  Tables keep
their rows as numpy columns so a million-row order costs a few arrays, and a row
becomes text only when it scrolls into view.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from itertools import zip_longest
from operator import attrgetter
from typing import Any

import numpy as np

import tracer

from . import _format as fmt


# ============================================================= row tables
@dataclass(frozen=True, slots=True)
class Column:
    """A table column: header, width in cells, and whether it is left aligned."""

    name: str
    width: int
    left: bool = False
    #: a value shown as ``-`` (e.g. the task number of a deviation, which has none)
    missing: int | None = None
    #: how a value becomes text (default ``str``); called only for rows on screen
    show: Callable[[Any], str] | None = field(default=None, compare=False)


@dataclass
class RowTable:
    """Rows as parallel numpy columns; ``search`` names the column ``/`` looks in."""

    columns: tuple[Column, ...]
    arrays: tuple[np.ndarray, ...]
    search: str = "index"
    #: rows to emphasise (deviations from the plan), or None
    marked: np.ndarray | None = None
    #: a group number per row (lock, channel or thread); rows alternate shading by group
    group: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.arrays[0]) if self.arrays else 0

    def column(self, name: str) -> np.ndarray:
        """The array of column ``name``."""
        for col, arr in zip(self.columns, self.arrays, strict=True):
            if col.name == name:
                return arr
        raise KeyError(f"no column {name!r}; columns: {[c.name for c in self.columns]}")

    def cells(self, i: int) -> list[str]:
        """The text of row ``i``, one string per column."""
        return [
            "-"
            if c.missing is not None and a[i] == c.missing
            else c.show(a[i])
            if c.show is not None
            else str(a[i])
            for c, a in zip(self.columns, self.arrays, strict=True)
        ]

    def find(self, value: int) -> np.ndarray:
        """Rows whose search column equals ``value``, in table order."""
        return np.flatnonzero(self.column(self.search) == value)

    def find_where(self, where: Iterable[tuple[str, Any]]) -> np.ndarray:
        """Rows whose columns equal every (column, value) pair, in table order (a column
        the table does not have matches nothing)."""
        keep = np.ones(len(self), bool)
        for name, value in where:
            try:
                col = self.column(name)
            except KeyError:
                return np.empty(0, np.int64)
            keep &= col == (str(value) if col.dtype.kind in "US" else value)
        return np.flatnonzero(keep)


def empty_table(columns: tuple[Column, ...], search: str = "index") -> RowTable:
    """A table with ``columns`` and no rows."""
    return RowTable(columns, tuple(np.empty(0, np.int64) for _ in columns), search)


def _positions(keys: np.ndarray) -> np.ndarray:
    """Position of each row within its run of equal ``keys`` (rows already grouped)."""
    n = len(keys)
    if n == 0:
        return np.empty(0, np.int64)
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    lengths = np.diff(np.concatenate((starts, [n])))
    return np.arange(n, dtype=np.int64) - np.repeat(starts, lengths)


def _group_ids(*keys: np.ndarray) -> np.ndarray:
    """A running group number that changes whenever any of ``keys`` changes."""
    n = len(keys[0])
    if n == 0:
        return np.empty(0, np.int64)
    change = np.zeros(n, bool)
    for k in keys:
        change[1:] |= k[1:] != k[:-1]
    return np.cumsum(change)


#: Widest the element column of the lock table grows (longer names end in ``…``): with
#: it the table fits an 80-column terminal.
MAX_ELEMENT_WIDTH = 20

LOCK_COLUMNS = (
    Column("node", 4),
    Column("round", 5),
    Column("#", 6),
    Column("seq", 8),
    Column("position", 8),
    Column("thread", 6),
    Column("from", 4, missing=-1),
    Column("index", 8, missing=-1),
    Column("element", len("element"), left=True),
)


def lock_table(parts: Sequence[tuple[int, tracer.LockGrantArrays]], plan: Any = None) -> RowTable:
    """Where each (node, round)'s lock-ticket order left its prediction: from body
    ``position`` of the round's locked bodies on, ``thread`` went (grant order), taking
    over the lock of ``element`` from thread ``from`` to run loop ``index`` (both worked
    out from ``plan``; ``-`` without one).  The element column is as wide as its
    longest name, up to :data:`MAX_ELEMENT_WIDTH`."""
    parts = [(n, g) for n, g in parts if len(g.position)]
    if not parts:
        return empty_table(LOCK_COLUMNS)
    node, rnd, seq, index, before = [], [], [], [], []
    for n, g in parts:
        per = np.diff(g.offset)
        node.append(np.full(len(g.position), n, np.int64))
        rnd.append(np.repeat(g.round, per))
        seq.append(np.repeat(g.seq, per))
        if plan is not None:
            j, b, _ = g.handovers(plan, n)
        else:
            j = b = np.full(len(g.position), -1, np.int64)
        index.append(j)
        before.append(b)
    node_a, rnd_a, seq_a = np.concatenate(node), np.concatenate(rnd), np.concatenate(seq)
    position = np.concatenate([g.position for _, g in parts])
    thread = np.concatenate([g.thread for _, g in parts])
    element = np.concatenate([np.asarray(g.element, dtype=str) for _, g in parts])
    group = _group_ids(node_a, rnd_a)
    pos = _positions(group)
    widest = max((len(e) for e in element.tolist()), default=0)
    width = min(max(widest, len("element")), MAX_ELEMENT_WIDTH)
    columns = (*LOCK_COLUMNS[:-1], Column("element", width, left=True))
    arrays = (
        node_a,
        rnd_a,
        pos,
        seq_a,
        position,
        thread,
        np.concatenate(before),
        np.concatenate(index),
        element,
    )
    return RowTable(columns, arrays, group=group)


MESSAGE_COLUMNS = (
    Column("node", 4),
    Column("channel", 16, left=True),
    Column("#", 7),
    Column("seq", 9, missing=-1),
    Column("source", 6, missing=-1),
    Column("src seq", 9),
    Column("bytes", 8),
)


def routed_parts(counts: Sequence[tracer.RoutedCounts]) -> list[tuple[int, tracer.MessageArrays]]:
    """Schema 7's routed write-backs as message rows: one per node and exchange, on the
    ``routed`` channel, with the exchange number as ``src seq`` and the bytes of all its
    messages; no sequence number or source (``-``: not recorded)."""
    out = []
    for c in counts:
        none = np.full(len(c.exchange), -1, np.int64)
        channel = np.full(len(c.exchange), "routed")
        out.append((c.node, tracer.MessageArrays(none, channel, none, c.exchange, c.nbytes)))
    return out


def message_table(parts: Sequence[tuple[int, tracer.MessageArrays]]) -> RowTable:
    """Message arrivals grouped per (node, channel), each in arrival order."""
    parts = [(n, m) for n, m in parts if len(m.seq)]
    if not parts:
        return empty_table(MESSAGE_COLUMNS, search="seq")
    node = np.concatenate([np.full(len(m.seq), n, np.int64) for n, m in parts])
    channel = np.concatenate([np.asarray(m.channel, dtype=str) for _, m in parts])
    names, code = np.unique(channel, return_inverse=True)
    seq = np.concatenate([m.seq for _, m in parts])
    order = np.lexsort((seq, code, node))
    node, code, seq = node[order], code[order], seq[order]
    source = np.concatenate([m.source for _, m in parts])[order]
    src_seq = np.concatenate([m.source_seq for _, m in parts])[order]
    nbytes = np.concatenate([m.nbytes for _, m in parts])[order]
    group = _group_ids(node, code)
    arrays = (node, names[code], _positions(group), seq, source, src_seq, nbytes)
    return RowTable(MESSAGE_COLUMNS, arrays, search="seq", group=group)


INDEX_COLUMNS = (
    Column("node", 4),
    Column("thread", 6),
    Column("#", 8),
    Column("round", 5),
    Column("task", 5, missing=-1),
    Column("index", 10),
    Column("source", 8, left=True),
)


def index_table(
    plan: Any, deviations: Iterable[tracer.IndexOrderDeviated], node: int | None = None
) -> RowTable:
    """Loop indices per (node, thread) in execution order: the plan's, or the recorded
    deviation where a thread ran one round in another order."""
    dev: dict[tuple[int, int, int], tuple[int, ...]] = {}
    for d in deviations:
        dev[(d.node, d.round, d.thread)] = d.indices  # a later record wins
    chunks: list[tuple[int, int, int, int, np.ndarray, bool]] = []
    for r, per_node in enumerate(plan.rounds):
        for p, tasks in enumerate(per_node):
            if node is not None and p != node:
                continue
            for k, task in enumerate(tasks):
                if (p, r, int(task.thread)) not in dev:
                    idx = np.asarray(task.indices, np.int64)
                    chunks.append((p, int(task.thread), r, k, idx, False))
    for (p, r, t), order in dev.items():  # replaces every task of that thread in that round
        if node is None or p == node:
            chunks.append((p, t, r, -1, np.asarray(order, np.int64), True))
    chunks.sort(key=lambda c: (c[0], c[1], c[2]))  # stable: tasks keep their plan order
    if not chunks:
        return empty_table(INDEX_COLUMNS)
    lens = np.array([len(c[4]) for c in chunks], np.int64)

    def rep(k: int) -> np.ndarray:
        return np.repeat(np.array([c[k] for c in chunks], np.int64), lens)

    nodes, threads, rounds, task = rep(0), rep(1), rep(2), rep(3)
    marked = np.repeat(np.array([c[5] for c in chunks], bool), lens)
    index = np.concatenate([c[4] for c in chunks])
    group = _group_ids(nodes, threads)
    source = np.where(marked, "deviated", "plan")
    arrays = (nodes, threads, _positions(group), rounds, task, index, source)
    return RowTable(INDEX_COLUMNS, arrays, marked=marked, group=group)


OUTCOME_COLUMNS = (
    Column("node", 4),
    Column("seq", 9),
    Column("dds", 16, left=True),
    Column("digest", 32, left=True),
)


def outcome_table(digests: Iterable[tracer.DigestRecorded]) -> RowTable:
    """The DDS digests each node recorded after one invocation (the outcome replay and
    dual tests compare), per node in sequence order; ``/`` searches the sequence number."""
    rows = sorted(((d.node, d.seq, d.dds, d.digest) for d in digests), key=lambda r: r[:2])
    if not rows:
        return empty_table(OUTCOME_COLUMNS, search="seq")
    node, seq, dds, digest = zip(*rows, strict=True)
    arrays = (
        np.array(node, np.int64),
        np.array(seq, np.int64),
        np.array(dds, dtype=str),
        np.array(digest, dtype=str),
    )
    return RowTable(OUTCOME_COLUMNS, arrays, search="seq", group=arrays[0])


#: Event kinds the other order tables (or no order table) already cover.
_COVERED = frozenset(
    {
        "PlanMade",
        "LockGranted",
        "MessageReceived",
        "IndexOrderDeviated",
        "InvocationCompleted",
        "DigestRecorded",
        "ObjectiveLogged",
        "RunEnded",
    }
)
#: The widest the order column of the sync table gets (longer orders are cut with "…").
MAX_ORDER_WIDTH = 64
SYNC_COLUMNS = (
    Column("node", 4),
    Column("seq", 9),
    Column("clock", 6, missing=-1),
    Column("kind", 17, left=True),
    Column("order", len("order"), left=True),
)


def sync_kinds() -> list[type]:
    """Event kinds of ``sync_for`` orders (aggregation, SSP visibility, node mutex, ...)."""
    return [k for k in tracer.EVENT_TYPES if k.__name__ not in _COVERED]


def sync_table(events: Iterable[Any]) -> RowTable:
    """Sync-for order events per node in sequence order, said in words
    (``deltas aggregated``, ``from nodes 0, 1, in this order``)."""
    rows = []
    for ev in events:
        kind, order = fmt.sync_order(ev)
        rows.append((ev.node, ev.seq, getattr(ev, "clock", -1), kind, order))
    if not rows:
        return empty_table(SYNC_COLUMNS, search="clock")
    rows.sort(key=lambda r: (r[0], r[1]))
    cols = list(zip(*rows, strict=True))
    arrays = tuple(np.array(c, dtype=np.int64 if k < 3 else str) for k, c in enumerate(cols))
    widest = max(len(r[4]) for r in rows)
    width = min(max(widest, len("order")), MAX_ORDER_WIDTH)
    columns = (*SYNC_COLUMNS[:-1], Column("order", width, left=True))
    return RowTable(columns, arrays, search="clock", group=_group_ids(arrays[0], arrays[2]))


# ============================================================= timeline
@dataclass
class Lane:
    """One (node, thread) row of a timeline: its task groups as parallel arrays."""

    node: int
    thread: int
    start: np.ndarray
    end: np.ndarray
    round: np.ndarray
    locked: np.ndarray
    bodies: np.ndarray


@dataclass
class Timeline:
    """Where each task group of one invocation ran, on a common time axis."""

    op: str
    invocation: int
    unit: str  # "s" from recorded round times, else "bodies"
    total: float
    lanes: list[Lane]
    round_starts: list[float] = field(default_factory=list)
    #: False when the operator has no plan, so lanes are whole nodes and rounds only
    planned: bool = True
    #: True when each thread's bars come from its recorded start and end in the round
    thread_timed: bool = False


def timeline_layout(
    op: str, invocation: int, plan: Any, invocations: Sequence[tracer.InvocationInfo]
) -> Timeline:
    """Lay out the plan's rounds with the recorded per-round seconds of each node.

    Where the trace holds each thread's recorded start and end of its task groups in a
    round, that thread's groups share that span by bodies (so threads differ as they
    ran).  Otherwise (older traces, or no times) a task's width is its share of bodies,
    scaled so the busiest thread of that node fills the round.
    """
    by_node = {i.node: i for i in invocations}
    n_rounds = len(plan.rounds)
    timed = bool(by_node) and all(
        len(by_node.get(p, by_node[min(by_node)]).round_seconds) == n_rounds
        for p in range(plan.nodes)
    )
    threads = max([plan.threads] + [t.thread + 1 for rnd in plan.rounds for ts in rnd for t in ts])
    acc: dict[tuple[int, int], list[tuple[float, float, int, bool, int]]] = {
        (p, t): [] for p in range(plan.nodes) for t in range(threads)
    }
    total, round_starts = 0.0, []
    thread_timed = timed and all(by_node[p].thread_times for p in by_node)
    for p in range(plan.nodes):
        info = by_node.get(p, by_node[min(by_node)] if by_node else None)
        ran: dict[tuple[int, int], tuple[float, float]] = {}
        if thread_timed and info is not None and p in by_node:
            ran = {(r, t): (a, b) for r, t, a, b in info.thread_times}
        clock = 0.0
        for r, per_node in enumerate(plan.rounds):
            tasks = per_node[p] if p < len(per_node) else []
            load: dict[int, int] = {}
            for task in tasks:
                load[task.thread] = load.get(task.thread, 0) + len(task.indices)
            busiest = max(load.values(), default=0)
            span = info.round_seconds[r] if timed and info is not None else float(busiest)
            per_body = span / busiest if busiest else 0.0
            if p == 0:
                round_starts.append(clock)
            cursor = dict.fromkeys(load, clock)
            scale = dict.fromkeys(load, per_body)
            for t, n in load.items():
                if (r, t) in ran and n:  # the thread's own recorded span, inside the round
                    a, b = ran[(r, t)]
                    a = min(max(a, 0.0), span)
                    cursor[t] = clock + a
                    scale[t] = (min(max(b, a), span) - a) / n
            for task in tasks:
                width = len(task.indices) * scale[task.thread]
                s = cursor[task.thread]
                acc[(p, task.thread)].append((s, s + width, r, task.locked, len(task.indices)))
                cursor[task.thread] = s + width
            clock += span
        total = max(total, clock)
    lanes = []
    for (p, t), segs in sorted(acc.items()):
        arr = np.array(segs, dtype=np.float64).reshape(len(segs), 5)
        lanes.append(
            Lane(
                p,
                t,
                arr[:, 0],
                arr[:, 1],
                arr[:, 2].astype(np.int64),
                arr[:, 3].astype(bool),
                arr[:, 4].astype(np.int64),
            )
        )
    unit = "s" if timed else "bodies"
    return Timeline(op, invocation, unit, total, lanes, round_starts, thread_timed=thread_timed)


def round_timeline(
    op: str, invocation: int, invocations: Sequence[tracer.InvocationInfo]
) -> Timeline:
    """Rounds (clocks) per node from recorded times alone, for operators without a plan."""
    lanes: list[Lane] = []
    total, round_starts = 0.0, list[float]()
    for info in sorted(invocations, key=lambda i: i.node):
        spans = list(info.round_seconds) or [info.seconds]
        ends = np.cumsum(spans)
        starts = ends - np.asarray(spans)
        k = len(spans)
        lanes.append(
            Lane(
                info.node, -1, starts, ends, np.arange(k), np.zeros(k, bool), np.zeros(k, np.int64)
            )
        )
        total = max(total, float(ends[-1]) if k else 0.0)
        round_starts = round_starts or starts.tolist()
    return Timeline(op, invocation, "s", total, lanes, round_starts, planned=False)


# ============================================================= log diff
#: Event fields that measure time and so differ between any two runs.
TIMING_FIELDS = frozenset({"seconds"})


_KEYS: dict[type, Callable[[Any], Any]] = {}


def event_key(ev: Any) -> tuple[Any, ...]:
    """What must be equal for two events to count as the same (timings ignored)."""
    getter = _KEYS.get(type(ev))
    if getter is None:
        names = [f.name for f in fields(ev) if f.name not in TIMING_FIELDS]
        getter = _KEYS[type(ev)] = attrgetter(*names) if len(names) > 1 else lambda e: e
    return (type(ev), getter(ev))


@dataclass
class NodeDiff:
    """How two runs' logs of one node compare."""

    node: int
    compared: int  # events compared before the first difference (or all of them)
    first: int | None  # position of the first differing event, None when identical
    a: Any = None  # the event of run A there (None: A's log had ended)
    b: Any = None
    before: list[tuple[Any, Any]] = field(default_factory=list)


def first_difference(
    node: int, a: Iterable[Any], b: Iterable[Any], *, context: int = 3, tick: Any = None
) -> NodeDiff:
    """Walk two per-node logs in order; stop at the first event that differs."""
    recent: deque[tuple[Any, Any]] = deque(maxlen=context)
    seen = 0
    for x, y in zip_longest(a, b):
        if x is None or y is None or event_key(x) != event_key(y):
            return NodeDiff(node, seen, seen, x, y, list(recent))
        recent.append((x, y))
        seen += 1
        if tick is not None and seen % 4096 == 0:
            tick(seen)
    return NodeDiff(node, seen, None, None, None, list(recent))


__all__ = [
    "INDEX_COLUMNS",
    "LOCK_COLUMNS",
    "MAX_ELEMENT_WIDTH",
    "MAX_ORDER_WIDTH",
    "MESSAGE_COLUMNS",
    "OUTCOME_COLUMNS",
    "Column",
    "Lane",
    "NodeDiff",
    "RowTable",
    "SYNC_COLUMNS",
    "Timeline",
    "empty_table",
    "event_key",
    "first_difference",
    "index_table",
    "lock_table",
    "message_table",
    "outcome_table",
    "round_timeline",
    "sync_kinds",
    "sync_table",
    "timeline_layout",
]
