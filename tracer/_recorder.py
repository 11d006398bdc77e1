"""The recorder: buffers what the engine reports and commits once per invocation.

One :class:`TraceRecorder` serves every node hosted by this process.  The hot calls
(``message_received``, ``lock_grants``) only take a sequence number and append to a
per-node list; arrays are kept by reference, never copied.  ``invocation_done`` is
the commit point: everything buffered for that node is written in one transaction,
so a crash loses at most the invocations that had not completed.  Sequence numbers
are per node and assigned at call time, so the read API can put every event of a
node back in program order.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from typing import Any

import numpy as np
from sqlalchemy import Engine, insert, select
from sqlalchemy.exc import DBAPIError

from engine import Recorder

from ._codec import encode
from ._plans import encode_plan
from ._schema import (
    Digest,
    IndexOrderBlock,
    Invocation,
    LockGrantBlock,
    MessageBlock,
    Objective,
    OperatorPlan,
    Run,
)
from ._store import checkpoint, create_store, finish_run, start_run, write_error


class _NodeBuf:
    """Events of one node since its last commit."""

    __slots__ = ("seq", "mark", "locks", "orders", "msgs")

    def __init__(self) -> None:
        self.seq = 0  # next sequence number of this node
        self.mark = 0  # first sequence number after the last commit
        self.locks: list[tuple[Any, ...]] = []
        self.orders: list[tuple[Any, ...]] = []
        self.msgs: list[tuple[int, str, int, int, int]] = []


def _blob(arr: np.ndarray, *, delta: bool | None = False) -> tuple[bytes, str]:
    """Encode ``arr``; ``delta=None`` keeps whichever of plain and delta is smaller."""
    if delta is None:
        a, b = encode(arr), encode(arr, delta=True)
        return a if len(a[0]) <= len(b[0]) else b
    return encode(arr, delta=delta)


class TraceRecorder(Recorder):
    """Records the events of the nodes hosted by this process into a trace store.

    ``is_primary`` (the lowest rank) also writes the run row if missing, plans,
    digests, objectives and the run's end status.
    """

    def __init__(
        self,
        store: str | os.PathLike[str] | Engine,
        run_id: str,
        nodes: list[int] | tuple[int, ...] | range,
        is_primary: bool,
        *,
        meta: dict[str, Any] | None = None,
    ) -> None:
        nodes = sorted(int(n) for n in nodes)
        if not nodes:
            raise ValueError("TraceRecorder needs at least one node id")
        self._own_engine = not isinstance(store, Engine)
        self._engine = create_store(store)
        self.run_id = str(run_id)
        self.nodes = nodes
        self.is_primary = bool(is_primary)
        self._home = nodes[0]
        self._bufs: dict[int, _NodeBuf] = {n: _NodeBuf() for n in nodes}
        self._objectives: list[dict[str, Any]] = []
        self._plan_no: dict[str, int] = {}
        self._done: dict[str, int] = {}
        self.closed = False
        if self.is_primary:
            with self._engine.connect() as conn:
                have = conn.execute(select(Run.run_id).where(Run.run_id == self.run_id)).first()
            if have is None:
                start_run(self._engine, self.run_id, meta or {"ranks": len(nodes)})

    # ------------------------------------------------------------ hot calls
    def _buf(self, node: int) -> _NodeBuf:
        b = self._bufs[node] = _NodeBuf()
        return b

    def message_received(self, node: int, channel: str, source: int, seq: int, nbytes: int) -> None:
        """Buffer one message arrival (a tuple append)."""
        b = self._bufs.get(node) or self._buf(node)
        s = b.seq
        b.seq = s + 1
        b.msgs.append((s, channel, source, seq, nbytes))

    def lock_grants(
        self,
        op: str,
        invocation: int,
        node: int,
        round: int,
        locks: np.ndarray,
        threads: np.ndarray,
        indices: np.ndarray,
    ) -> None:
        """Buffer one round's lock grants (the arrays are kept, not copied)."""
        b = self._bufs.get(node) or self._buf(node)
        s = b.seq
        b.seq = s + len(locks)
        b.locks.append((op, invocation, round, s, locks, threads, indices))

    def index_order(
        self, op: str, invocation: int, node: int, round: int, thread: int, indices: np.ndarray
    ) -> None:
        """Buffer one deviation from the plan's index order."""
        b = self._bufs.get(node) or self._buf(node)
        s = b.seq
        b.seq = s + 1
        b.orders.append((op, invocation, round, thread, s, np.array(indices, dtype=np.int64)))

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

    def invocation_done(self, op: str, invocation: int, node: int, info: dict[str, Any]) -> None:
        """Commit everything buffered for ``node`` together with this invocation."""
        b = self._bufs.get(node) or self._buf(node)
        rows: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        if self.is_primary:
            for dds, dig in info.get("digests") or ():
                rows[Digest].append(
                    dict(
                        run=self.run_id,
                        op=op,
                        invocation=int(invocation),
                        node=node,
                        seq=b.seq,
                        dds=str(dds),
                        digest=str(dig),
                    )
                )
                b.seq += 1
        counts, blob_bytes = self._bulk_rows(b, node, op, int(invocation), rows)
        rsec, rsec_c = encode(np.asarray(info.get("round_seconds", ()), dtype=np.float64))
        key = (op, int(invocation))
        rows[Invocation].append(
            dict(
                run=self.run_id,
                op=op,
                invocation=int(invocation),
                node=node,
                seq=b.seq,
                first_seq=b.mark,
                bodies=int(info.get("bodies", 0)),
                rounds=int(info.get("rounds", 0)),
                seconds=float(info.get("seconds", 0.0)),
                round_seconds=rsec,
                round_seconds_codec=rsec_c,
                n_lock_grants=counts[key][0],
                n_messages=counts[key][1],
                n_deviations=counts[key][2],
                blob_bytes=blob_bytes + len(rsec),
                committed_at=time.time(),
            )
        )
        b.seq += 1
        if self._objectives:
            rows[Objective] = self._objectives
        self._write(rows, (node,))
        self._objectives = []
        b.mark = b.seq
        if node == self._home:
            self._done[op] = max(self._done.get(op, 0), int(invocation) + 1)

    def _bulk_rows(
        self, b: _NodeBuf, node: int, op: str, invocation: int, rows: dict[Any, list]
    ) -> tuple[dict[tuple[str, int], list[int]], int]:
        """Turn ``b``'s buffered bulk events into block rows; return counts and blob bytes."""
        counts: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0, 0])
        nbytes = 0
        base = dict(run=self.run_id, node=node)
        locks_by: dict[tuple[str, int], list[tuple[Any, ...]]] = defaultdict(list)
        for call in b.locks:
            locks_by[(call[0], int(call[1]))].append(call)
        for (o, inv), calls in locks_by.items():
            lens = [len(c[4]) for c in calls]
            table = np.array([(int(c[2]), c[3], n) for c, n in zip(calls, lens, strict=True)])
            cat = [
                np.concatenate([np.asarray(c[k], dtype=np.int64) for c in calls]) for k in (4, 5, 6)
            ]
            row = dict(base, op=o, invocation=inv, first_seq=calls[0][3], count=sum(lens))
            row["n_calls"] = len(calls)
            for col, arr, delta in (
                ("calls", table.ravel(), False),
                ("locks", cat[0], None),
                ("threads", cat[1], False),
                ("indices", cat[2], None),
            ):
                row[col], row[col + "_codec"] = _blob(arr, delta=delta)
                nbytes += len(row[col]) if (o, inv) == (op, invocation) else 0
            rows[LockGrantBlock].append(row)
            counts[(o, inv)][0] += row["count"]
        if b.msgs:
            by_chan: dict[str, list[tuple[int, str, int, int, int]]] = defaultdict(list)
            for m in b.msgs:
                by_chan[m[1]].append(m)
            for chan, ms in by_chan.items():
                arr = np.array([(m[0], m[2], m[3], m[4]) for m in ms], dtype=np.int64)
                row = dict(base, op=op, invocation=invocation, channel=str(chan))
                row.update(first_seq=int(arr[0, 0]), count=len(ms))
                for k, col in enumerate(("seqs", "sources", "source_seqs", "nbytes")):
                    row[col], row[col + "_codec"] = _blob(arr[:, k], delta=k in (0, 2))
                    nbytes += len(row[col])
                rows[MessageBlock].append(row)
            counts[(op, invocation)][1] += len(b.msgs)
        orders_by: dict[tuple[str, int], list[tuple[Any, ...]]] = defaultdict(list)
        for call in b.orders:
            orders_by[(call[0], int(call[1]))].append(call)
        for (o, inv), calls in orders_by.items():
            table = np.array([(int(c[2]), int(c[3]), c[4], len(c[5])) for c in calls])
            flat = np.concatenate([c[5] for c in calls])
            row = dict(base, op=o, invocation=inv, first_seq=calls[0][4], count=len(calls))
            row["n_indices"] = len(flat)
            row["calls"], row["calls_codec"] = _blob(table.ravel())
            row["indices"], row["indices_codec"] = _blob(flat, delta=None)
            nbytes += len(row["calls"]) + len(row["indices"]) if (o, inv) == (op, invocation) else 0
            rows[IndexOrderBlock].append(row)
            counts[(o, inv)][2] += len(calls)
        return counts, nbytes

    def _write(self, rows: dict[Any, list[dict[str, Any]]], clear: tuple[int, ...] = ()) -> None:
        """Insert ``rows`` in one transaction, then drop the bulk buffers of ``clear``."""
        try:
            with self._engine.begin() as conn:
                for model, batch in rows.items():
                    if batch:
                        conn.execute(insert(model.__table__), batch)
        except DBAPIError as exc:
            raise write_error(self._engine, exc) from None
        for n in clear:
            b = self._bufs[n]
            b.locks, b.orders, b.msgs = [], [], []

    # ------------------------------------------------------------ end
    def close(self, status: str, error: str | None = None) -> None:
        """Flush what is buffered and record how the run ended (idempotent)."""
        if self.closed:
            return
        self.closed = True
        try:
            rows: dict[Any, list[dict[str, Any]]] = defaultdict(list)
            pending = tuple(n for n, b in self._bufs.items() if b.locks or b.orders or b.msgs)
            for node in pending:
                # events of an invocation that never completed (a body failed): keep them,
                # filed under the operator of the last lock grant or deviation, if any
                b = self._bufs[node]
                cur = b.locks[-1] if b.locks else b.orders[-1] if b.orders else ("", -1)
                self._bulk_rows(b, node, str(cur[0]), int(cur[1]), rows)
            if self._objectives:
                rows[Objective] = self._objectives
            if rows:
                self._write(rows, pending)
                self._objectives = []
            if self.is_primary or status != "finished":
                b = self._bufs[self._home]
                finish_run(self._engine, self.run_id, status, error, self._home, b.seq)
                b.seq += 1
        finally:
            if self.is_primary:
                checkpoint(self._engine)
            if self._own_engine:
                self._engine.dispose()


__all__ = ["TraceRecorder"]
