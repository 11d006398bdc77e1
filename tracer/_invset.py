"""Schema 7's one row per invocation: per-node values as arrays (pure; no SQL).

Why: at P = 64 a synthetic SGDMF epoch gives a node 312 bodies, so the budget of one
byte per body is 312 B per node and invocation.  Schema 6 spent about 1,100 B there on
four rows per node (an ``invocation`` row, a chain link, a ``digests`` phase row, a
``message_block`` of routed arrivals), most of it row and index overhead and values
that are the same on every node.  Schema 7 writes one ``invocation_set`` row for the
nodes of a commit (every node in-process; every rank's under MPI, through the funnel),
whose columns are arrays with a value per node, and one ``phase_set`` row per phase.

A routed write-back names its source and its size (the routes fix both), so its
arrival order is no source of non-determinism and is not recorded: a node keeps, per
sender exchange number, how many routed messages it got and their payload bytes
(``RoutedCounts``).  Every other channel (``sync_for`` deltas and updates, the ``rows``
of traces before routing) is still recorded message by message.

Everything decoded here comes from a file: each array's length is checked against the
counts before it is decoded (and bounded, so a damaged count cannot make a reader
decompress gigabytes), and a value out of range is a :class:`TraceFormatError` naming
the table, row and column.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._codec import decode, encode, int_width
from ._codec import where as _where
from ._errors import TraceFormatError
from ._schema import RUN_LIMITS, SCHEMA_KEY, SCHEMA_VERSION, InvocationSet, PhaseSet

#: The per-node integer fields of ``invocation_set.counters``, one column each, in this
#: order (the order is the layout: append only, with a schema version bump).
COUNTERS: tuple[str, ...] = (
    "seq",  # the node's sequence number of its completion event
    "first_seq",  # its first sequence number of this commit
    "bodies",
    "rounds",
    "n_round_lengths",  # entries of ``round_us``
    "n_thread_spans",  # rows of ``thread_times``
    "n_routed",  # rows of ``routed``
    "n_lock_grants",
    "n_messages",  # every arrival, routed ones included
    "n_deviations",
    "n_aggregations",
    "n_visibility",
    "n_mutex_grants",
    "n_digests",
    "blob_bytes",
)
#: The fields a recorder gives (the rest are the array lengths, derived here).
GIVEN = tuple(c for c in COUNTERS if c not in ("n_round_lengths", "n_thread_spans", "n_routed"))
#: Most values one array of a row may hold: a damaged count must not make a reader
#: allocate or decompress without bound (64 nodes x 64 rounds need 4,096).
MAX_VALUES = 1 << 24
#: Longest phase, invocation or round a row stores (a clock that jumped must not
#: overflow an int64 of µs), in seconds and in the whole µs of ``round_us``.
MAX_SECONDS = 1e9
MAX_US = int(MAX_SECONDS * 1e6)
#: Most nodes one row may hold (the run's rank bound).
MAX_NODES = RUN_LIMITS["ranks"][1]


@dataclass(frozen=True, eq=False)
class NodeDone:
    """One node's record of one invocation, as a recorder hands it to :func:`encode_set`.

    ``round_us``: round lengths, whole µs; ``thread_times``: (round, thread, start µs,
    end µs) rows; ``routed``: (sender exchange number, messages, payload bytes) rows."""

    node: int
    counters: dict[str, int]
    seconds: float = 0.0
    round_us: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    thread_times: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), np.int64))
    routed: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), np.int64))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NodeDone):
            return NotImplemented
        return (
            self.node == other.node
            and np.float64(self.seconds).tobytes() == np.float64(other.seconds).tobytes()
            and {k: self.counters[k] for k in GIVEN} == {k: other.counters[k] for k in GIVEN}
            and all(
                np.array_equal(np.asarray(a, np.int64), np.asarray(b, np.int64))
                for a, b in (
                    (self.round_us, other.round_us),
                    (self.thread_times, other.thread_times),
                    (self.routed, other.routed),
                )
            )
        )


def _coded(arr: np.ndarray) -> tuple[bytes, str]:
    """The shorter of ``arr`` encoded plainly and delta-coded (the codec says which);
    floats are stored as f64."""
    if np.asarray(arr).dtype.kind == "f":
        return encode(np.asarray(arr, np.float64))
    a = np.asarray(arr, np.int64).ravel()
    plain = encode(a)
    d = np.diff(a, prepend=np.int64(0)) if a.size else a
    if int_width(d) > int_width(a):
        return plain
    coded = encode(a, delta=True)
    return coded if len(coded[0]) < len(plain[0]) else plain


def _columns(rows: list[np.ndarray], width: int) -> np.ndarray:
    """(node index, row...) rows of every node, column by column, flattened."""
    parts = [
        np.column_stack([np.full(len(r), k, np.int64), np.asarray(r, np.int64).reshape(-1, width)])
        for k, r in enumerate(rows)
    ]
    table = np.concatenate(parts) if parts else np.zeros((0, width + 1), np.int64)
    return table.T.ravel()


def _rows_delta(lists: list[np.ndarray]) -> np.ndarray:
    """Round lengths: a node with as many as the previous node stores its differences
    from that node's (an in-process cluster's nodes share every round: all zeros)."""
    out, prev = [], None
    for a in lists:
        a = np.asarray(a, np.int64).ravel()
        out.append(a - prev if prev is not None and len(prev) == len(a) else a)
        prev = a
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def encode_set(done: Sequence[NodeDone]) -> dict[str, Any]:
    """The array columns of an ``invocation_set`` row for ``done`` (nodes in order)."""
    done = sorted(done, key=lambda d: d.node)
    n = len(done)
    counters = np.zeros((len(COUNTERS), n), np.int64)
    for k, d in enumerate(done):
        lengths = {
            "n_round_lengths": len(np.asarray(d.round_us).ravel()),
            "n_thread_spans": len(np.asarray(d.thread_times).reshape(-1, 4)),
            "n_routed": len(np.asarray(d.routed).reshape(-1, 3)),
        }
        for j, name in enumerate(COUNTERS):
            counters[j, k] = lengths[name] if name in lengths else int(d.counters[name])
    row: dict[str, Any] = {"n_nodes": n}
    for col, arr in (
        ("nodes", np.array([d.node for d in done], np.int64)),
        ("counters", counters.ravel()),
        ("seconds", np.array([_seconds(d.seconds) for d in done], np.float64)),
        ("round_us", _rows_delta([d.round_us for d in done])),
        ("thread_times", _columns([d.thread_times for d in done], 4)),
        ("routed", _columns([d.routed for d in done], 3)),
    ):
        row[col], row[col + "_codec"] = _coded(arr)
    return row


def _seconds(s: float) -> float:
    """A time as a row stores it: within 0..MAX_SECONDS (a NaN as 0), as the reader
    requires."""
    return 0.0 if math.isnan(s) else min(max(s, 0.0), MAX_SECONDS)


def _bad(r: Any, col: str, what: str) -> TraceFormatError:
    return TraceFormatError(f"{_where(InvocationSet, r.id, col)}: {what}; the trace is damaged")


def _count(r: Any, col: str, n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= MAX_VALUES:
        raise _bad(r, col, f"{n!r} values is not a length this reader decodes (0..{MAX_VALUES})")
    return int(n)


def _sum(counts: np.ndarray) -> int:
    """The sum of per-node counts as a Python int: numpy's int64 sum wraps round, so four
    counts of 2**62 summed to 0, passed the bound, and ``np.repeat`` of them crashed the
    reader with a segmentation fault."""
    return sum(int(c) for c in counts)


def _node_table(
    r: Any, col: str, counts: np.ndarray, width: int
) -> tuple[list[np.ndarray], np.ndarray]:
    """Split a (node index, width columns) table by the per-node ``counts``."""
    total = _count(r, col, _sum(counts))
    flat = decode(
        getattr(r, col),
        getattr(r, col + "_codec"),
        total * (width + 1),
        _where(InvocationSet, r.id, col),
    )
    table = flat.reshape(width + 1, total).T
    want = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    if not np.array_equal(table[:, 0], want):
        raise _bad(r, col, "its node column does not match the per-node counts")
    ends = np.cumsum(counts)
    return np.split(table[:, 1:], ends[:-1]) if len(counts) else [], table


def decode_set(r: Any) -> list[NodeDone]:
    """The per-node records of one ``invocation_set`` row (checked; see the module)."""
    n = r.n_nodes
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_NODES:
        raise _bad(r, "n_nodes", f"{n!r} is not a node count (1..{MAX_NODES})")
    nodes = decode(r.nodes, r.nodes_codec, n, _where(InvocationSet, r.id, "nodes"))
    if nodes.min() < 0 or nodes.max() >= MAX_NODES or len(np.unique(nodes)) != n:
        raise _bad(r, "nodes", "node ids out of range or repeated")
    flat = decode(
        r.counters, r.counters_codec, n * len(COUNTERS), _where(InvocationSet, r.id, "counters")
    )
    counters = flat.reshape(len(COUNTERS), n)
    if counters.min() < 0:
        raise _bad(r, "counters", "a negative count")
    col = {name: counters[j] for j, name in enumerate(COUNTERS)}
    secs = decode(r.seconds, r.seconds_codec, n, _where(InvocationSet, r.id, "seconds"))
    # the browser and the export compute with these: a NaN stopped both
    if not np.all((secs >= 0) & (secs <= MAX_SECONDS)):
        raise _bad(r, "seconds", f"a time that is not 0..{MAX_SECONDS:.0e} s")
    lens = col["n_round_lengths"]
    total = _count(r, "round_us", _sum(lens))
    rd = decode(r.round_us, r.round_us_codec, total, _where(InvocationSet, r.id, "round_us"))
    rounds, prev, at = [], None, 0
    for k in range(n):
        a = rd[at : at + int(lens[k])]
        at += int(lens[k])
        a = a + prev if prev is not None and len(prev) == len(a) else a
        if len(a) and not (a.min() >= 0 and a.max() <= MAX_US):  # a delta that wrapped
            raise _bad(r, "round_us", f"a round length that is not 0..{MAX_US} µs")
        rounds.append(a)
        prev = a
    spans, _ = _node_table(r, "thread_times", col["n_thread_spans"], 4)
    routed, _ = _node_table(r, "routed", col["n_routed"], 3)
    return [
        NodeDone(
            int(nodes[k]),
            {name: int(col[name][k]) for name in GIVEN},
            float(secs[k]),
            rounds[k],
            spans[k],
            routed[k],
        )
        for k in range(n)
    ]


def layout_of(versions: Any, where: str) -> int:
    """The layout of a run's rows from its ``versions`` object: 7, or 6 when it names
    none (runs recorded before schema 7)."""
    v = versions.get(SCHEMA_KEY, 6) if isinstance(versions, dict) else 6
    if v not in (6, SCHEMA_VERSION) or isinstance(v, bool):
        raise TraceFormatError(
            f"{where} column versions: row layout {v!r} is not one this reader knows "
            f"(6 or {SCHEMA_VERSION}); the trace is damaged or from a newer version"
        )
    return int(v)


# ---------------------------------------------------------------------- phases
def encode_phase(times: Sequence[tuple[int, float, float]]) -> dict[str, Any]:
    """The columns of a ``phase_set`` row from (node, wall-clock start, seconds) per node:
    ``times`` holds the node ids, then (index, start offset µs, length µs) column by
    column."""
    times = sorted(times)
    start = min(t[1] for t in times)
    table = np.array(
        [
            (
                k,
                round(min(s - start, MAX_SECONDS) * 1e6),
                round(min(max(sec, 0.0), MAX_SECONDS) * 1e6),
            )
            for k, (_, s, sec) in enumerate(times)
        ],
        np.int64,
    ).reshape(-1, 3)
    ids = np.array([t[0] for t in times], np.int64)
    blob, codec = _coded(np.concatenate([ids, table.T.ravel()]))
    return {"n_nodes": len(times), "started_at": float(start), "times": blob, "times_codec": codec}


def decode_phase(r: Any) -> list[tuple[int, float, float]]:
    """(node, wall-clock start, seconds) per node of one ``phase_set`` row."""
    n = r.n_nodes
    w = _where(PhaseSet, r.id, "times")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_NODES:
        raise TraceFormatError(f"{_where(PhaseSet, r.id, 'n_nodes')}: {n!r} is not a node count")
    flat = decode(r.times, r.times_codec, 4 * n, w)
    nodes, table = flat[:n], flat[n:].reshape(3, n).T
    bad_ids = nodes.min() < 0 or nodes.max() >= MAX_NODES or len(np.unique(nodes)) != n
    if bad_ids or not np.array_equal(table[:, 0], np.arange(n)) or table[:, 1:].min() < 0:
        raise TraceFormatError(f"{w}: not (node, start, length) rows; the trace is damaged")
    start = float(r.started_at)
    return [
        (int(nodes[k]), start + int(table[k, 1]) / 1e6, int(table[k, 2]) / 1e6) for k in range(n)
    ]


__all__ = [
    "COUNTERS",
    "GIVEN",
    "MAX_SECONDS",
    "MAX_US",
    "MAX_VALUES",
    "NodeDone",
    "decode_phase",
    "decode_set",
    "encode_phase",
    "encode_set",
    "layout_of",
]
