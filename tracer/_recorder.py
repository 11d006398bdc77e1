"""The recorder: buffers what the engine reports and commits once per invocation.

One :class:`TraceRecorder` serves every node hosted by this process.  The hot calls
(``message_received``, ``lock_grants``, the ``sync_for`` hooks) only take a sequence
number and append a tuple to a per-node list; arrays are kept by reference, never
copied (the engine hands over fresh arrays).  ``invocation_done`` is the commit
point: everything buffered for that node is written in one transaction, so a crash
loses at most the invocations that had not completed.  Sequence numbers are per node
and assigned at call time, so the read API can put a node's events back in order.

Under MPI the ranks finish an invocation together, and SQLite takes one writer at a
time: two ranks committing at once wait for each other, and the slower one holds up the
next round on both (about 5% of a 20 ms kernel epoch on 2 ranks).  So with a *funnel*
(the ranks' communicator) every rank hands what its nodes recorded of an invocation to
the primary, which writes all of it in one transaction, as one ``invocation_set`` row
with one chain link on its own chain (trace schema 7): the invocation is durable once
that transaction commits, on every node at once.  Each rank still builds its own block
rows; the primary builds the row and the link.  Checkpoints go the same way (every rank takes one
at the same invocation).  A rank on another host than the primary may not see the store
at all (SQLite on the primary's local disk): it is given no store (``store=None``) and
everything it records reaches the store through the funnel only.  The rows a rank that
does see the store flushes when a run stops early are written by that rank itself; a
rank without the store loses those (never a completed invocation: those went through
the funnel).
"""

from __future__ import annotations

import json
import os
import time
import zlib
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy import Engine, select

from engine import Recorder
from engine.lowlevel import Schedule, emit_events

from ._chain import ChainWriter, genesis, trace_key
from ._codec import AUTO, encode, encode_lines, int_width
from ._errors import TraceWriteError
from ._insert import RowWriter
from ._invset import MAX_SECONDS, NodeDone, encode_phase, encode_set
from ._plain import NotPlain, array_dtype, encode_plain
from ._plans import encode_plan
from ._reserve import SpaceReserve
from ._schema import (
    CALL_BLOCKS,
    AggregationBlock,
    ChainLink,
    Checkpoint,
    CheckpointBlock,
    CollectiveValue,
    Digest,
    IndexOrderBlock,
    InvocationSet,
    LockGrantBlock,
    MessageBlock,
    MutexGrantBlock,
    Objective,
    OperatorPlan,
    PhaseSet,
    Run,
    VisibilityBlock,
)
from ._store import checkpoint, create_store, finish_run, leave_wal, sqlite_path, start_run

#: How long a failing rank waits for the primary to commit the rows it handed over
#: last, before writing them itself (the primary commits within milliseconds unless it
#: died; see :meth:`TraceRecorder.close`).
FUNNEL_WAIT_S = 2.0

#: A buffered call: (op, invocation, header ints, first seq, value arrays).
Call = tuple[str, int, tuple[int, ...], int, tuple[Any, ...]]


#: The channel of routed write-backs (``engine``'s ``transport.ROUTED``): each names its
#: source and size, so schema 7 keeps per sender exchange number only how many arrived
#: and their bytes (``_invset``), not each arrival.
ROUTED = "routed"


class _NodeBuf:
    """Events of one node since its last commit, per block table."""

    __slots__ = ("seq", "mark", "msgs", "calls", "routed")

    def __init__(self) -> None:
        self.seq = 0  # next sequence number of this node
        self.mark = 0  # first sequence number after the last commit
        self.msgs: list[tuple[int, str, int, int, int]] = []
        self.calls: dict[Any, list[Call]] = {model: [] for model in CALL_BLOCKS}
        # routed arrivals: sender exchange number -> [messages, payload bytes]
        self.routed: dict[int, list[int]] = {}

    def pending(self) -> bool:
        return bool(self.msgs) or any(self.calls.values())

    def clear(self) -> None:
        self.msgs = []
        self.calls = {model: [] for model in CALL_BLOCKS}
        self.routed = {}

    def take_routed(self) -> np.ndarray:
        """(exchange, messages, bytes) rows of the routed arrivals since the last take."""
        got, self.routed = self.routed, {}
        if not got:
            return np.zeros((0, 3), np.int64)
        return np.array([(e, c, nb) for e, (c, nb) in sorted(got.items())], np.int64)


class _Group:
    """What the nodes of one invocation committed so far (written once all have)."""

    __slots__ = ("rows", "done", "phases", "strategy")

    def __init__(self) -> None:
        self.rows: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        self.done: list[NodeDone] = []
        self.phases: dict[tuple[str, int], list[tuple[int, float, float]]] = defaultdict(list)
        self.strategy = ""


def _thread_times(times: Sequence[Sequence[float]]) -> np.ndarray:
    """(round, thread, start µs, end µs) rows from (round, thread, s, s) ones."""
    a = np.asarray(times, dtype=np.float64).reshape(-1, 4)
    out = a.astype(np.int64)
    out[:, 2:] = np.rint(a[:, 2:] * 1e6).astype(np.int64)
    return out


def _round_us(seconds: Sequence[float]) -> np.ndarray:
    """Round lengths in whole µs: 64 rounds of a P = 64 node took 413 B as f64 and 218 B
    as u32 (1.3 of the 16 B per body its synthetic SGDMF trace grew by, 2026-12-06)."""
    a = np.asarray(seconds, dtype=np.float64).ravel()
    return np.rint(np.clip(np.nan_to_num(a), 0.0, MAX_SECONDS) * 1e6).astype(np.int64)


def _blob(arr: np.ndarray, *, delta: bool | None = False) -> tuple[bytes, str]:
    """Encode ``arr``; ``delta=None`` delta-codes when that narrows the dtype."""
    if delta is None:
        a = np.asarray(arr, dtype=np.int64)
        d = np.diff(a, prepend=np.int64(0)) if a.size else a
        delta = int_width(d) < int_width(a)
    return encode(arr, delta=delta)


def _shorter(arr: np.ndarray) -> tuple[bytes, str]:
    """The shorter of ``arr`` encoded plainly and delta-coded (the codec says which).

    Routed write-backs arrive from a few neighbours in turn: their sources took 142 B a
    block at P = 64 and 102 B delta-coded, although both narrow to one byte a value."""
    plain = encode(arr)
    coded = encode(arr, delta=True)
    return coded if len(coded[0]) < len(plain[0]) else plain


#: Checkpoint values: bytes of the sample compressed to decide, the zlib level, and the
#: ratio under which compressing the whole is worth its time (trained float weights
#: rarely compress: ~0.93 at any level, for ~20 ms per 200 kB).
PROBE_BYTES = 4096
CHECKPOINT_LEVEL = 1
WORTH = 0.8


def _bulk(flat: np.ndarray) -> tuple[bytes, str]:
    """Encode checkpoint values: compressed (level 1) only if a sample shows it pays."""
    sample = flat[: max(PROBE_BYTES // max(flat.itemsize, 1), 1)]
    raw = sample.astype("<f8" if sample.dtype.kind == "f" else np.int64).tobytes()
    if raw and len(zlib.compress(raw, CHECKPOINT_LEVEL)) > WORTH * len(raw):
        return encode(flat, level=0)
    return encode(flat, level=CHECKPOINT_LEVEL)


class TraceRecorder(Recorder):
    """Records the events of the nodes hosted by this process into a trace store.

    ``is_primary`` (the lowest rank) also writes the run row if missing, plans,
    digests, objectives and the run's end status.  ``funnel``: an MPI communicator
    (mpi4py) of the ranks recording into this store, rank 0 the primary; each rank's
    commit of an invocation is then written by the primary, all ranks' in one
    transaction (see the module's docstring).
    """

    #: 0: no checkpoints, N: every N-th loop invocation, None: automatic (<= 3%)
    checkpoint_every: int | None = None

    def __init__(
        self,
        store: str | os.PathLike[str] | Engine | None,
        run_id: str,
        nodes: list[int] | tuple[int, ...] | range,
        is_primary: bool,
        *,
        meta: dict[str, Any] | None = None,
        checkpoint_every: int | None = None,
        funnel: Any = None,
    ) -> None:
        if checkpoint_every is not None and checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0 or None, got {checkpoint_every}")
        self.checkpoint_every = checkpoint_every
        self._collectives: list[dict[str, Any]] = []
        nodes = sorted(int(n) for n in nodes)
        if not nodes:
            raise ValueError("TraceRecorder needs at least one node id")
        if store is None and (is_primary or funnel is None or funnel.Get_size() < 2):
            raise ValueError("only a non-primary rank with a funnel may record without a store")
        self._own_engine = not isinstance(store, Engine)
        # None: this rank cannot see the store; it writes only through the funnel
        self._engine: Engine | None = None if store is None else create_store(store)
        db = (
            sqlite_path(self._engine)
            if self._engine is not None and self._engine.dialect.name == "sqlite"
            else None
        )
        self._reserve = SpaceReserve(db) if db is not None else None  # for the run row
        self._writer = RowWriter(self._engine) if self._engine is not None else None
        self.run_id = str(run_id)
        self.nodes = nodes
        self.is_primary = bool(is_primary)
        self._home = nodes[0]
        self._bufs: dict[int, _NodeBuf] = {n: _NodeBuf() for n in nodes}
        self._objectives: list[dict[str, Any]] = []
        self._plan_no: dict[str, int] = {}
        self._done: dict[str, int] = {}
        self._groups: dict[tuple[str, int], _Group] = {}
        # each node's hash chain; the key (if any) is read once, never stored
        self._chain = ChainWriter(self.run_id, trace_key())
        self.closed = False
        self._funnel = funnel if funnel is not None and funnel.Get_size() > 1 else None
        if self._funnel is not None and self.is_primary != (self._funnel.Get_rank() == 0):
            raise ValueError("the funnel's rank 0 must be the primary recorder")
        self._handed: tuple[str, int, _Group] | None = None  # the last group handed over
        self._full: str | None = None  # the write error, once a write found the disk full
        if self.is_primary:
            assert self._engine is not None
            with self._engine.connect() as conn:
                have = conn.execute(select(Run.__table__).where(Run.run_id == self.run_id)).first()
            if have is None:
                row = start_run(self._engine, self.run_id, meta or {"ranks": len(nodes)})
            else:
                row = dict(have._mapping)
            # node 0's chain starts from the run row, so an edited target or parameter
            # breaks it (see ``_chain``)
            self._chain.start = genesis(row)

    # ------------------------------------------------------------ hot calls
    def _buf(self, node: int) -> _NodeBuf:
        b = self._bufs[node] = _NodeBuf()
        return b

    def schedule_done(self, sched: Schedule) -> None:
        """Buffer what happened in one invocation: every entry of the schedule value, in
        the order the run met them (``sched.timeline``), as the blocks below, so the
        stored event order is the run's."""
        emit_events(sched, self)

    def message_received(self, node: int, channel: str, source: int, seq: int, nbytes: int) -> None:
        """Buffer one message arrival (a tuple append); a routed one only adds to its
        exchange's count and bytes, and takes no sequence number."""
        b = self._bufs.get(node) or self._buf(node)
        if channel == ROUTED:
            got = b.routed.get(seq)
            if got is None:
                b.routed[seq] = [1, int(nbytes)]
            else:
                got[0] += 1
                got[1] += int(nbytes)
            return
        s = b.seq
        b.seq = s + 1
        b.msgs.append((s, channel, source, seq, nbytes))

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
        elements: Sequence[str] = (),
    ) -> None:
        """Buffer one round's lock grants: one event holding the deviations of its
        ticket order from the predicted one, as flattened (position, thread) pairs, and
        the element each took over (``-`` where the engine named none)."""
        b = self._bufs.get(node) or self._buf(node)
        s = b.seq
        b.seq = s + 1
        dev = np.stack([np.asarray(positions, np.int64), np.asarray(threads, np.int64)], 1)
        names = list(elements)[: len(dev)]
        names += ["-"] * (len(dev) - len(names))
        head = (round, int(bodies), int(grants))
        b.calls[LockGrantBlock].append((op, invocation, head, s, (dev.ravel(), names)))

    def index_order(
        self, op: str, invocation: int, node: int, round: int, thread: int, indices: np.ndarray
    ) -> None:
        """Buffer one deviation from the plan's index order."""
        b = self._bufs.get(node) or self._buf(node)
        s = b.seq
        b.seq = s + 1
        ix = np.array(indices, dtype=np.int64)  # rare: copy, the caller may reuse it
        b.calls[IndexOrderBlock].append((op, invocation, (round, thread), s, (ix,)))

    def aggregation_order(
        self, op: str, invocation: int, node: int, clock: int, sources: np.ndarray
    ) -> None:
        """Buffer the arrival order of the deltas an owner aggregated in one clock."""
        b = self._bufs.get(node) or self._buf(node)
        s = b.seq
        b.seq = s + 1
        src = np.array(sources, dtype=np.int64)
        b.calls[AggregationBlock].append((op, invocation, (clock,), s, (src,)))

    def ssp_visibility(
        self, op: str, invocation: int, node: int, clock: int, applied: np.ndarray
    ) -> None:
        """Buffer which updates a node had applied before one SSP clock."""
        b = self._bufs.get(node) or self._buf(node)
        s = b.seq
        b.seq = s + 1
        seen = np.array(applied, dtype=np.int64)
        b.calls[VisibilityBlock].append((op, invocation, (clock,), s, (seen,)))

    def body_order(
        self,
        op: str,
        invocation: int,
        node: int,
        clock: int,
        threads: np.ndarray,
        minibatches: np.ndarray,
    ) -> None:
        """Buffer one clock's node-mutex grants of a hybrid ``sync_for`` (one event each)."""
        b = self._bufs.get(node) or self._buf(node)
        s = b.seq
        b.seq = s + len(threads)
        b.calls[MutexGrantBlock].append((op, invocation, (clock,), s, (threads, minibatches)))

    def objective(self, name: str, iteration: int, value: float) -> None:
        """Buffer an objective value (primary only); written with the next commit."""
        if not self.is_primary:
            return
        b = self._bufs[self._home]
        s = b.seq
        b.seq = s + 1
        self._objectives.append(
            dict(
                run=self.run_id,
                name=str(name),
                iteration=int(iteration),
                value=float(value),
                node=self._home,
                seq=s,
            )
        )

    # ------------------------------------------------------------ writes
    def plan_made(self, op: str, plan: Any) -> None:
        """Write the plan of ``op`` at once (primary only)."""
        if not self.is_primary:
            return
        b = self._bufs[self._home]
        s = b.seq
        b.seq = s + 1
        no = self._plan_no.get(op, 0)
        self._plan_no[op] = no + 1
        row = dict(
            encode_plan(plan),
            run=self.run_id,
            op=op,
            plan_no=no,
            first_invocation=self._done.get(op, 0),
            node=self._home,
            seq=s,
            created_at=time.time(),
        )
        self._write({OperatorPlan: [row]})
        self._chain.written({OperatorPlan: [row]})  # joins the primary node's next link

    def invocation_done(self, op: str, invocation: int, node: int, info: dict[str, Any]) -> None:
        """Note ``node``'s completion of an invocation with everything buffered for it;
        once every node this recorder hosts has completed it, commit them all: one
        ``invocation_set`` row, their blocks and one chain link, in one transaction."""
        b = self._bufs.get(node) or self._buf(node)
        invocation = int(invocation)
        g = self._groups.get((op, invocation))
        if g is None:
            g = self._groups[(op, invocation)] = _Group()
        rows = g.rows
        n_digests = 0
        if self.is_primary:
            for dds, dig in info.get("digests") or ():
                rows[Digest].append(
                    dict(
                        run=self.run_id,
                        op=op,
                        invocation=invocation,
                        node=node,
                        seq=b.seq,
                        dds=str(dds),
                        digest=str(dig),
                    )
                )
                b.seq += 1
                n_digests += 1
        counts, blob_bytes = self._bulk_rows(b, node, op, invocation, rows)
        routed = b.take_routed()
        mine = counts[(op, invocation)]
        mine["n_messages"] += int(routed[:, 1].sum())
        g.done.append(
            NodeDone(
                node,
                dict(
                    mine,
                    seq=b.seq,
                    first_seq=b.mark,
                    bodies=int(info.get("bodies", 0)),
                    rounds=int(info.get("rounds", 0)),
                    n_digests=n_digests,
                    blob_bytes=blob_bytes,
                ),
                float(info.get("seconds", 0.0)),
                _round_us(info.get("round_seconds", ())),
                _thread_times(info.get("thread_times") or ()),
                routed,
            )
        )
        g.strategy = g.strategy or str(info.get("strategy", ""))
        seen: dict[str, int] = defaultdict(int)
        for kind, started, seconds in info.get("phases") or ():
            # a re-planned invocation plans twice: a row per attempt at a phase
            g.phases[(str(kind), seen[str(kind)])].append((node, float(started), float(seconds)))
            seen[str(kind)] += 1
        b.seq += 1
        b.mark = b.seq
        b.clear()  # its rows are in the group now
        if {d.node for d in g.done} >= set(self.nodes):
            self._commit(op, invocation)

    def _commit(self, op: str, invocation: int, *, alone: bool = False) -> None:
        """Write the group of ``op``#``invocation`` with its chain link (see above).

        Funnel (unless ``alone``): the ranks hand their groups to the primary, which
        writes every rank's nodes as one row with one link on its own chain (a
        collective every rank reaches at the same invocation); a rank keeps what it
        handed over until it is known to be written (:meth:`close`)."""
        g = self._groups.pop((op, invocation))
        if self._funnel is not None and not alone:
            got = self._funnel.gather(None if self.is_primary else g, root=0)
            if not self.is_primary:
                # the primary commits before its next driver operation, whose first
                # message every rank waits for: only the group handed last can be unwritten
                self._handed = (op, invocation, g)
                return
            for other in got[1:]:
                g.done += other.done
                for model, batch in other.rows.items():
                    g.rows[model] += batch
                for k, times in other.phases.items():
                    g.phases[k] += times
                g.strategy = g.strategy or other.strategy
        rows = g.rows
        ends = {d.node: d.counters["seq"] + 1 for d in g.done}
        home = self._home if self._home in ends else min(ends)
        row = dict(
            encode_set(g.done),
            run=self.run_id,
            op=op,
            invocation=invocation,
            node=home,
            seq=ends[home] - 1,
            strategy=g.strategy,
            committed_at=time.time(),
        )
        # the row's own blobs count as the home node's (they are per invocation)
        rows[InvocationSet].append(row)
        if self._objectives:
            rows[Objective] = self._objectives
        link = self._chain.group_link(home, ends, op, invocation, rows)
        rows[ChainLink].append(link)
        # outside the chain (timeline only), in the same transaction
        for (kind, _), times in g.phases.items():
            rows[PhaseSet].append(
                dict(
                    encode_phase(times),
                    run=self.run_id,
                    op=op,
                    invocation=invocation,
                    node=home,
                    kind=kind,
                )
            )
        side = None
        if self._collectives:  # on the side chain, in this same transaction
            rows[CollectiveValue] = self._collectives
            side = self._chain.side_link(home, op, invocation, {CollectiveValue: self._collectives})
            rows[ChainLink].append(side)
        self._write(rows)
        self._chain.advance_group(link, ends)
        if side is not None:
            self._chain.advance(side)
        self._objectives = []
        self._collectives = []
        if home == self._home:
            self._done[op] = max(self._done.get(op, 0), invocation + 1)

    def _bulk_rows(
        self, b: _NodeBuf, node: int, op: str, invocation: int, rows: dict[Any, list[Any]]
    ) -> tuple[dict[tuple[str, int], dict[str, int]], int]:
        """Turn ``b``'s buffered events into block rows (messages go to ``op``/``invocation``);
        return per (op, invocation) event counts and the blob bytes of this invocation."""
        counts: dict[tuple[str, int], dict[str, int]] = defaultdict(
            lambda: {spec.counter: 0 for spec in CALL_BLOCKS.values()} | {"n_messages": 0}
        )
        nbytes = 0
        base: dict[str, Any] = dict(run=self.run_id, node=node)
        for model, spec in CALL_BLOCKS.items():
            by_inv: dict[tuple[str, int], list[Call]] = defaultdict(list)
            for call in b.calls[model]:
                by_inv[(call[0], int(call[1]))].append(call)
            for (o, inv), calls in by_inv.items():
                lens = [len(c[4][0]) for c in calls]
                header = np.array(
                    [(*c[2], c[3], n) for c, n in zip(calls, lens, strict=True)], dtype=np.int64
                )
                row: dict[str, Any] = dict(base, op=o, invocation=inv, first_seq=calls[0][3])
                row.update(n_calls=len(calls), n_values=sum(lens))
                row["count"] = row["n_values"] if spec.per_value else len(calls)
                row["calls"], row["calls_codec"] = _blob(header.ravel())
                for k, col in enumerate(spec.values):
                    flat = np.concatenate([np.asarray(c[4][k], dtype=np.int64) for c in calls])
                    row[col], row[col + "_codec"] = _blob(flat, delta=None)
                extra: tuple[str, ...] = ()
                if model is LockGrantBlock:  # one element name per deviation, as text
                    extra = ("elements",)
                    row["elements"], row["elements_codec"] = encode_lines(
                        [name for c in calls for name in c[4][1]]
                    )
                if (o, inv) == (op, invocation):
                    nbytes += len(row["calls"]) + sum(len(row[c]) for c in spec.values + extra)
                rows[model].append(row)
                # lock blocks count element grants (one event per round holds many)
                grants = header[:, spec.header.index("grants")] if "grants" in spec.header else None
                counts[(o, inv)][spec.counter] += (
                    row["count"] if grants is None else int(grants.sum())
                )
        by_chan: dict[str, list[tuple[int, str, int, int, int]]] = defaultdict(list)
        for m in b.msgs:
            by_chan[m[1]].append(m)
        for chan, ms in by_chan.items():
            arr = np.array([(m[0], m[2], m[3], m[4]) for m in ms], dtype=np.int64)
            row = dict(base, op=op, invocation=invocation, channel=str(chan))
            row.update(first_seq=int(arr[0, 0]), count=len(ms))
            for k, col in enumerate(("seqs", "sources", "source_seqs", "nbytes")):
                row[col], row[col + "_codec"] = (
                    _blob(arr[:, k], delta=True) if k in (0, 2) else _shorter(arr[:, k])
                )
                nbytes += len(row[col])
            rows[MessageBlock].append(row)
        counts[(op, invocation)]["n_messages"] += len(b.msgs)
        return counts, nbytes

    def _handed_unwritten(self) -> tuple[str, int, _Group] | None:
        """The group this rank handed over last, if the primary has not committed it
        within :data:`FUNNEL_WAIT_S` (it died, or stopped before its commit)."""
        handed, self._handed = self._handed, None
        if handed is None or self._engine is None:  # without the store: nothing to check
            return None
        op, invocation, _ = handed
        query = select(InvocationSet.id).where(
            InvocationSet.run == self.run_id,
            InvocationSet.op == op,
            InvocationSet.invocation == invocation,
        )
        deadline = time.monotonic() + FUNNEL_WAIT_S
        while True:
            with self._engine.connect() as conn:
                if conn.execute(query).first() is not None:
                    return None
            if time.monotonic() > deadline:
                return handed
            time.sleep(0.01)

    def _write(self, rows: dict[Any, list[dict[str, Any]]], clear: tuple[int, ...] = ()) -> None:
        """Insert ``rows`` in one transaction, then drop the bulk buffers of ``clear``."""
        if self._writer is None:  # a rank without the store: what it could not hand over
            for n in clear:
                self._bufs[n].clear()
            return
        try:
            self._writer.write(rows)
        except TraceWriteError as exc:
            if exc.disk_full and self._full is None:
                self._full = str(exc)
            raise
        for n in clear:
            self._bufs[n].clear()

    def _ends(self) -> dict[int, int]:
        """Each hosted node's next sequence number."""
        return {n: b.seq for n, b in self._bufs.items()}

    # ------------------------------------------------------------ time travel
    def collective_value(self, k: int, kind: str, value: Any) -> None:
        """Buffer a value the driver got from a collective call; written with the next
        commit (primary only: every rank got the same value)."""
        if not self.is_primary:
            return
        # every column in every row, so that one commit's values go in one executemany
        row: dict[str, Any] = dict(
            run=self.run_id, k=int(k), kind=str(kind), dtype="", shape="[]", detail=""
        )
        try:
            if isinstance(value, np.ndarray):
                dt = array_dtype(value)
                if dt is None:
                    raise NotPlain(f"it is an array of dtype {value.dtype}")
                data, codec = encode(value.ravel(), level=AUTO)  # weights rarely compress
                row.update(encoding="array", dtype=dt, shape=json.dumps(list(value.shape)))
            else:
                data, codec = encode_plain(value)
                row.update(encoding="plain")
        except NotPlain as exc:
            data, codec = encode(np.empty(0, dtype=np.uint8))
            row.update(encoding="refused", detail=str(exc))
        row.update(data=data, data_codec=codec)
        self._collectives.append(row)

    def checkpoint(
        self,
        op: str,
        invocation: int,
        node: int,
        step: int,
        blocks: Sequence[Any],
        counters: dict[str, Any],
        refused: Sequence[tuple[str, str]] = (),
    ) -> int:
        """Write ``node``'s rows of one checkpoint, then its marker."""
        t0 = time.perf_counter()
        rows: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        nbytes = 0
        for blk in blocks:
            slots, slots_c = _blob(np.asarray(blk.slots, dtype=np.int64), delta=True)
            if blk.kind == "array":
                values, values_c = _bulk(np.asarray(blk.values).ravel())
            else:
                values, values_c = encode_plain(list(blk.values))
            nbytes += len(slots) + len(values)
            rows[CheckpointBlock].append(
                dict(
                    run=self.run_id,
                    op=op,
                    invocation=int(invocation),
                    node=int(node),
                    dds=blk.dds,
                    kind=blk.kind,
                    dtype=blk.dtype,
                    shape=json.dumps(list(blk.shape)),
                    length=int(blk.length),
                    count=len(blk.slots),
                    slots=slots,
                    slots_codec=slots_c,
                    values=values,
                    values_codec=values_c,
                )
            )
        rows[Checkpoint].append(
            dict(
                run=self.run_id,
                op=op,
                invocation=int(invocation),
                node=int(node),
                step=int(step),
                counters=json.dumps(counters),
                refused=json.dumps([list(r) for r in refused]),
                nbytes=nbytes,
                created_at=time.time(),
            )
        )
        # the blocks first, then the marker with the time both took: a checkpoint counts
        # only once its marker is written (a crash in between leaves ignored blocks)
        mark = rows.pop(Checkpoint)
        if self._funnel is not None:
            return self._checkpoint_funnel(node, op, invocation, rows, mark, t0, nbytes)
        self._write(rows)
        mark[0]["seconds"] = time.perf_counter() - t0
        # the marker and the side link that covers it and its blocks, in one transaction
        side = self._chain.side_link(node, op, invocation, {Checkpoint: mark, **rows})
        self._write({Checkpoint: mark, ChainLink: [side]})
        self._chain.advance(side)
        return nbytes

    def _checkpoint_funnel(
        self,
        node: int,
        op: str,
        invocation: int,
        rows: dict[Any, list[dict[str, Any]]],
        mark: list[dict[str, Any]],
        t0: float,
        nbytes: int,
    ) -> int:
        """Funnel: the primary writes every rank's checkpoint (the ranks take one at the
        same invocation): all blocks in one transaction, then all markers with their side
        links in another, so a crash in between leaves only ignored blocks."""
        assert self._funnel is not None
        mark[0]["seconds"] = time.perf_counter() - t0
        side = self._chain.side_link(node, op, invocation, {Checkpoint: mark, **rows})
        mine = (dict(rows), mark, side)
        got = self._funnel.gather(None if self.is_primary else mine, root=0)
        self._chain.advance(side)
        if not self.is_primary:
            return nbytes
        blocks: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        marks: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for part_rows, part_mark, part_side in (mine, *got[1:]):
            for model, batch in part_rows.items():
                blocks[model] += batch
            marks[Checkpoint] += part_mark
            marks[ChainLink].append(part_side)
        self._write(blocks)
        self._write(marks)
        return nbytes

    # ------------------------------------------------------------ end
    def close(self, status: str, error: str | None = None) -> None:
        """Flush what is buffered and record how the run ended (idempotent).

        After a write failed for lack of space the run ended ``crashed`` with the error
        ``disk full: ...`` whatever stopped the program (the write error itself): its
        completed invocations are intact and it can be resumed once there is room.
        Nothing else is written then, so that this small update may still fit.
        """
        if self.closed:
            return
        self.closed = True
        failed: TraceWriteError | None = None
        try:
            if self._full is None:
                try:
                    self._flush(status)
                except TraceWriteError as exc:
                    if not exc.disk_full:
                        raise
                    failed = exc
            if self._full is not None:
                status, error = "crashed", f"disk full: {self._full}"
                if self._reserve is not None:
                    self._reserve.release()  # room for the run row's few pages
            if self._engine is not None and (self.is_primary or status != "finished"):
                b = self._bufs[self._home]
                try:
                    finish_run(self._engine, self.run_id, status, error, self._home, b.seq)
                except TraceWriteError:
                    if self._full is None:
                        raise
                    # still full: readers show the run crashed after its last commit
                b.seq += 1
            if failed is not None:
                raise failed
        finally:
            if self._reserve is not None:
                self._reserve.release()
            if self._writer is not None:
                self._writer.close()  # before the WAL checkpoint, which it would block
            if self._engine is not None and self.is_primary:
                checkpoint(self._engine)
            if self._own_engine and self._engine is not None:
                self._engine.dispose()
                if self.is_primary:
                    leave_wal(sqlite_path(self._engine))

    def _flush(self, status: str) -> None:
        """Write what is still buffered: events of an unfinished invocation, objectives,
        collective values, chain links, and rows handed to a primary that never wrote
        them."""
        rows: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        # a run that stops early may stop before the primary wrote what this rank
        # handed over last: then this rank writes it, or its chain would skip a link
        handed = self._handed_unwritten() if status != "finished" and not self.is_primary else None
        if handed is not None:  # on this rank's own chain (its nodes' rows are its own)
            self._groups[handed[:2]] = handed[2]
        for key in list(self._groups):  # nodes that completed an invocation others did not
            self._commit(*key, alone=True)
        pending = tuple(n for n, b in self._bufs.items() if b.pending())
        for node in pending:
            # events of an invocation that never completed (a body failed): kept, and
            # messages filed under the operator of the node's last other event, if any
            b = self._bufs[node]
            last = max((c for cs in b.calls.values() for c in cs), key=lambda c: c[3], default=None)
            self._bulk_rows(b, node, *(last[:2] if last else ("", -1)), rows)
        if self._objectives:
            rows[Objective] = self._objectives
        # one link on the home node's chain covers every node's rest (schema 7)
        # a finished run that never committed (no loop invocation, nothing logged) still
        # gets its primary's chain, which readers check it ended on: an empty first link
        bare = status == "finished" and self.is_primary and not self._chain.has_links(self._home)
        links = (
            [self._chain.group_link(self._home, self._ends(), "", -1, rows)]
            if rows or bare or any(self._chain.has_pending(n) for n in self._bufs)
            else []
        )
        if rows or links or self._collectives:
            rows[ChainLink] = links
            if self._collectives:
                rows[CollectiveValue] = self._collectives
                links.append(
                    self._chain.side_link(self._home, "", -1, {CollectiveValue: self._collectives})
                )
                self._collectives = []
            self._write(rows, pending)
            for link in links:
                if link["link_no"] >= 0:
                    self._chain.advance_group(link, self._ends())
                else:
                    self._chain.advance(link)
            self._objectives = []


__all__ = ["TraceRecorder"]
