"""Per-node hash chains over a trace's rows, written at commit time, checked on open.

Why a chain: a trace is only worth replaying if it is the trace that was recorded.  A
row dropped or altered by a bad disk, a copy cut short or a hand edit would otherwise
replay as "identical" (replay never reads some tables).  Each node already commits once
per operator invocation; that commit also writes one ``chain_link`` row covering every
*chained* row of that node whose sequence number lies in [first_seq, end_seq):

* a **manifest**, one entry per covered row in canonical order: table code, the row's
  sequence number and a 16-byte blake2b of the row's canonical bytes (so a damaged row
  is named precisely);
* a **link** = H(previous link || header || manifest), where H is blake2b, or an HMAC
  (blake2b) under ``REPLAY_TRACE_KEY`` when that is set.  The trace records whether a
  chain is keyed, never the key.

Rows are assigned to links by (node, sequence number), not by transaction: plans are
written at once by the primary and objectives may ride along with another node's
commit, but both take their sequence numbers from the primary node's counter, so they
fall into that node's next link.  Canonical bytes depend on the schema's column types
only (ints as int64, floats as float64 with one NaN, strings as UTF-8, blobs raw), never
on how the database stored them, and nothing is pickled.

The **run row** is covered too: the first link of the primary node (node 0) starts
from ``genesis(run row)`` instead of nothing, a digest of every field of the run row
that chooses what runs or how (target, parameters, code digest, ranks, threads, seed,
versions and environment, labels, the run it continues).  An edited target or
parameter therefore breaks node 0's chain, and under a key nobody can re-seal it.  A
chain whose node 0 starts from nothing was recorded before this rule (``Report.legacy``).

**Time-travel rows** (checkpoints, their blocks, the driver's collective values) have
no sequence numbers and are written outside the invocation commits (each rank writes
its own checkpoint).  Each node keeps a second, *side* chain for them: link numbers
-1, -2, ...; a side link is written in the same transaction as the rows it covers (a
checkpoint's marker, the collective values of one commit), and its manifest names each
row by a key derived from what identifies it (op, invocation, node, DDS; the call
number).  Blocks of a checkpoint whose marker never got written are ignored by every
reader and need no link.

Without a key the chain finds damage, not a determined editor, who can recompute it.
Verification lives in ``_verify``; this module is the pure encoding and the writer.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from sqlalchemy import Float, LargeBinary, String, Text

from ._schema import (
    CALL_BLOCKS,
    ChainLink,
    Checkpoint,
    CheckpointBlock,
    CollectiveValue,
    Digest,
    Invocation,
    InvocationSet,
    MessageBlock,
    Objective,
    OperatorPlan,
)

#: Environment variable holding the key that turns the chain into an HMAC.
KEY_ENV = "REPLAY_TRACE_KEY"
#: Bytes of each row's digest in a manifest: long enough that no accident collides and
#: that forging a row to a recorded digest is infeasible.
ROW_DIGEST_BYTES = 16

#: Chained tables (their index is the table code in manifests) and their seq column.
CHAINED: tuple[tuple[Any, str], ...] = (
    (OperatorPlan, "seq"),
    (Invocation, "seq"),
    (Digest, "seq"),
    (Objective, "seq"),
    (MessageBlock, "first_seq"),
    *((model, "first_seq") for model in CALL_BLOCKS),
    (InvocationSet, "seq"),
)
CODE = {model: k for k, (model, _) in enumerate(CHAINED)}
SEQ_COLUMN = dict(CHAINED)
#: Side-chained tables (time travel) and their table codes in manifests.
SIDE: dict[Any, int] = {Checkpoint: 100, CheckpointBlock: 101, CollectiveValue: 102}
#: The columns that identify a side row (its key in a manifest).
SIDE_KEY: dict[Any, tuple[str, ...]] = {
    Checkpoint: ("op", "invocation", "node"),
    CheckpointBlock: ("op", "invocation", "node", "dds"),
    CollectiveValue: ("k",),
}

MANIFEST_DTYPE = np.dtype([("table", "u1"), ("seq", "<i8"), ("digest", f"S{ROW_DIGEST_BYTES}")])
#: Schema 7: one link covers the rows of every node a recorder hosts, so each manifest
#: entry names its row's node too.
GROUP_MANIFEST_DTYPE = np.dtype(
    [("table", "u1"), ("node", "<u2"), ("seq", "<i8"), ("digest", f"S{ROW_DIGEST_BYTES}")]
)

_NAN = struct.pack("<d", math.nan)

#: The node whose chain starts from the run row's genesis digest (the primary's).
GENESIS_NODE = 0
#: Fields of the run row that choose what runs or how: what ``genesis`` covers.  The
#: end fields (status, error, ended_at, end_node, end_seq) are written later and are
#: checked against the chain's end instead.
RUN_FIELDS: tuple[tuple[str, str], ...] = (
    ("run_id", "s"),
    ("app", "s"),
    ("target", "s"),
    ("params", "s"),
    ("code_digest", "s"),
    ("ranks", "i"),
    ("threads", "i"),
    ("seed", "i"),
    ("versions", "s"),
    ("continues", "s"),
    ("labels", "s"),
)


def _kind(col: Any) -> str:
    t = col.type
    if isinstance(t, LargeBinary):
        return "b"
    if isinstance(t, Float):
        return "f"
    if isinstance(t, String | Text):
        return "s"
    return "i"


#: Per chained table: (column, kind, default) of every column but the database's id.
COLUMNS: dict[Any, tuple[tuple[str, str, Any], ...]] = {
    model: tuple(
        (c.name, _kind(c), c.default.arg if c.default is not None else None)
        for c in model.__table__.columns
        if c.name != "id"
    )
    for model in (*(m for m, _ in CHAINED), *SIDE)
}


def trace_key() -> bytes | None:
    """The chain key from ``REPLAY_TRACE_KEY`` (None when unset or empty)."""
    key = os.environ.get(KEY_ENV, "")
    return key.encode() if key else None


def _value(kind: str, v: Any) -> bytes:
    if kind == "f":  # SQLite stores NaN as NULL (both are the one NaN) and -0.0 as 0
        if v is None or v != v:
            return b"f" + _NAN
        return b"f" + struct.pack("<d", float(v) + 0.0)  # -0.0 + 0.0 is 0.0
    if v is None:
        return b"N"
    if kind == "i":
        try:
            n = int(v)
        except (TypeError, ValueError, OverflowError):
            n = None
        if n is None or not -(2**63) <= n < 2**63 or (isinstance(v, float) and n != v):
            # a damaged store (1e308, 2.5, text in an integer column): bytes no recorded
            # integer hashes to, so the link fails to match instead of the reader crashing
            return b"X" + repr(v).encode()
        return b"i" + struct.pack("<q", n)
    data = str(v).encode() if kind == "s" else bytes(v)
    return kind.encode() + struct.pack("<Q", len(data)) + data


def row_digest(model: Any, row: Mapping[str, Any]) -> bytes:
    """blake2b (16 bytes) of a row's canonical bytes: its table, then every column."""
    h = hashlib.blake2b(model.__tablename__.encode(), digest_size=ROW_DIGEST_BYTES)
    for name, kind, default in COLUMNS[model]:
        v = row.get(name, default)
        if kind == "b" and isinstance(v, (bytes, bytearray, memoryview)):
            h.update(b"b" + struct.pack("<Q", len(v)))  # hashed in place, never copied
            h.update(v)
        elif kind == "b" and v is not None:  # a damaged store: not a blob at all
            h.update(b"X" + str(v).encode())
        else:
            h.update(_value(kind, v))
    return h.digest()


def genesis(run: Mapping[str, Any]) -> bytes:
    """The digest node 0's chain starts from: every field of ``RUN_FIELDS``."""
    h = hashlib.blake2b(b"run", digest_size=32)
    for name, kind in RUN_FIELDS:
        v = run.get(name)
        if kind == "i" and not isinstance(v, int):  # a damaged row: hash what is there
            h.update(b"X" + str(v).encode())
        else:
            h.update(_value(kind, v))
    return h.digest()


def side_key(model: Any, row: Mapping[str, Any]) -> int:
    """A side row's key in a manifest (63 bits of blake2b over its identifying columns)."""
    if model is CollectiveValue:
        return int(row["k"])
    h = hashlib.blake2b(model.__tablename__.encode(), digest_size=8)
    for name in SIDE_KEY[model]:
        h.update(_value("s" if name in ("op", "dds") else "i", row.get(name)))
    return int.from_bytes(h.digest(), "little") >> 1


def side_manifest(entries: Iterable[tuple[Any, Mapping[str, Any]]]) -> bytes:
    """The manifest of side rows ``entries`` (model, row): sorted by (table code, key)."""
    items = sorted(
        ((SIDE[m], side_key(m, r), row_digest(m, r)) for m, r in entries),
        key=lambda e: (e[0], e[1]),
    )
    return np.array(items, dtype=MANIFEST_DTYPE).tobytes()


def manifest(entries: Iterable[tuple[Any, Mapping[str, Any]]]) -> bytes:
    """The manifest of ``entries`` (model, row): sorted by (table code, seq)."""
    items = sorted(
        ((CODE[m], int(r[SEQ_COLUMN[m]]), row_digest(m, r)) for m, r in entries),
        key=lambda e: (e[0], e[1]),
    )
    return np.array(items, dtype=MANIFEST_DTYPE).tobytes()


def group_manifest(entries: Iterable[tuple[Any, Mapping[str, Any]]]) -> bytes:
    """Schema 7: the manifest of ``entries`` (model, row) of any nodes, sorted by (table
    code, node, seq)."""
    items = sorted(
        (CODE[m], int(r["node"]), int(r[SEQ_COLUMN[m]]), row_digest(m, r)) for m, r in entries
    )
    return np.array(items, dtype=GROUP_MANIFEST_DTYPE).tobytes()


def link_of(
    prev: bytes, header: Mapping[str, Any], manifest_bytes: bytes, key: bytes | None
) -> bytes:
    """H(prev || header || manifest): blake2b, or HMAC-blake2b under ``key``."""
    h: Any = hmac.new(key, digestmod=hashlib.blake2b) if key else hashlib.blake2b(digest_size=32)
    h.update(prev)
    for name in ("run", "node", "link_no", "first_seq", "end_seq", "op", "invocation", "keyed"):
        h.update(_value("s" if name in ("run", "op") else "i", header[name]))
    h.update(manifest_bytes)
    return h.digest()


class _NodeChain:
    __slots__ = ("prev", "link_no", "first_seq", "pending", "side_prev", "side_no")

    def __init__(self) -> None:
        self.prev = b""
        self.link_no = 0
        self.first_seq = 0
        self.pending: list[tuple[Any, Mapping[str, Any]]] = []
        self.side_prev = b""
        self.side_no = -1


class ChainWriter:
    """The chain state of the nodes a recorder hosts (pure: no SQL, no clock)."""

    def __init__(self, run_id: str, key: bytes | None, start: bytes = b"") -> None:
        self.run_id = run_id
        self.key = key
        #: where the chain of :data:`GENESIS_NODE` starts (the run row's genesis)
        self.start = start
        self._nodes: dict[int, _NodeChain] = {}

    def _node(self, node: int) -> _NodeChain:
        st = self._nodes.get(node)
        if st is None:
            st = self._nodes[node] = _NodeChain()
            if node == GENESIS_NODE:
                st.prev = self.start
        return st

    def _row(
        self,
        prev: bytes,
        entries: Sequence[tuple[Any, Mapping[str, Any]]],
        encode: Callable[[Iterable[tuple[Any, Mapping[str, Any]]]], bytes],
        *,
        node: int,
        link_no: int,
        first_seq: int,
        end_seq: int,
        op: str,
        invocation: int,
    ) -> dict[str, Any]:
        """The ``chain_link`` row over ``entries`` (manifest by ``encode``) after ``prev``.

        The header fields are what :func:`link_of` hashes and what ``_verify`` reads back
        (``_header``); every kind of link is built here so they cannot drift apart."""
        man = encode(entries)
        row = dict(
            run=self.run_id,
            node=node,
            link_no=link_no,
            first_seq=first_seq,
            end_seq=int(end_seq),
            op=op,
            invocation=int(invocation),
            n_rows=len(entries),
            keyed=int(self.key is not None),
        )
        row["manifest"] = man
        row["link"] = link_of(prev, row, man, self.key)
        return row

    def written(self, rows: Mapping[Any, list[dict[str, Any]]], *, but: int | None = None) -> None:
        """Note chained ``rows`` committed without a link (they join their node's next one)."""
        for model, batch in rows.items():
            if model in CODE:
                for r in batch:
                    if r["node"] != but:
                        self._node(int(r["node"])).pending.append((model, r))

    def has_links(self, node: int) -> bool:
        """Whether a link of ``node``'s chain was committed (:meth:`advance`)."""
        return self._node(node).link_no > 0

    def has_pending(self, node: int) -> bool:
        """True when ``node`` has rows written since its last link."""
        return bool(self._node(node).pending)

    def link(
        self,
        node: int,
        end_seq: int,
        op: str,
        invocation: int,
        rows: Mapping[Any, list[dict[str, Any]]],
    ) -> dict[str, Any]:
        """The ``chain_link`` row for ``node``'s commit of ``rows`` up to ``end_seq``.

        Call :meth:`advance` with it once the transaction that holds it has committed.
        """
        st = self._node(node)
        mine = [
            (m, r) for m, batch in rows.items() if m in CODE for r in batch if r["node"] == node
        ]
        entries = st.pending + mine
        return self._row(
            st.prev,
            entries,
            manifest,
            node=node,
            link_no=st.link_no,
            first_seq=st.first_seq,
            end_seq=end_seq,
            op=op,
            invocation=invocation,
        )

    def group_link(
        self,
        home: int,
        ends: Mapping[int, int],
        op: str,
        invocation: int,
        rows: Mapping[Any, list[dict[str, Any]]],
    ) -> dict[str, Any]:
        """Schema 7: one ``chain_link`` row on ``home``'s chain covering every chained row
        of ``rows`` (any node) and the rows noted since (:meth:`written`) of the nodes in
        ``ends``; ``first_seq``/``end_seq`` are ``home``'s range.  Call
        :meth:`advance_group` with it once committed."""
        st = self._node(home)
        entries = [e for n in ends for e in self._node(n).pending]
        entries += [(m, r) for m, batch in rows.items() if m in CODE for r in batch]
        return self._row(
            st.prev,
            entries,
            group_manifest,
            node=home,
            link_no=st.link_no,
            first_seq=st.first_seq,
            end_seq=ends.get(home, st.first_seq),
            op=op,
            invocation=invocation,
        )

    def advance_group(self, link: Mapping[str, Any], ends: Mapping[int, int]) -> None:
        """A :meth:`group_link` is durable: ``home``'s chain follows it, and the rows
        noted for the nodes in ``ends`` are covered."""
        self.advance(link)
        for n, end in ends.items():
            st = self._node(n)
            st.pending = []
            if n != int(link["node"]):
                st.first_seq = int(end)

    def advance(self, link: Mapping[str, Any]) -> None:
        """``link`` is durable: the node's next link follows it."""
        st = self._node(int(link["node"]))
        if int(link["link_no"]) < 0:
            st.side_prev = link["link"]
            st.side_no -= 1
            return
        st.prev = link["link"]
        st.link_no += 1
        st.first_seq = int(link["end_seq"])
        st.pending = []

    def side_link(
        self, node: int, op: str, invocation: int, rows: Mapping[Any, list[dict[str, Any]]]
    ) -> dict[str, Any]:
        """The side ``chain_link`` row covering the time-travel ``rows`` (written in the
        same transaction); :meth:`advance` it once committed."""
        st = self._node(node)
        entries = [(m, r) for m, batch in rows.items() if m in SIDE for r in batch]
        return self._row(
            st.side_prev,
            entries,
            side_manifest,
            node=node,
            link_no=st.side_no,
            first_seq=-1,
            end_seq=-1,
            op=op,
            invocation=invocation,
        )


__all__ = [
    "CHAINED",
    "CODE",
    "COLUMNS",
    "GENESIS_NODE",
    "GROUP_MANIFEST_DTYPE",
    "RUN_FIELDS",
    "KEY_ENV",
    "MANIFEST_DTYPE",
    "SEQ_COLUMN",
    "SIDE",
    "SIDE_KEY",
    "ChainLink",
    "ChainWriter",
    "genesis",
    "group_manifest",
    "link_of",
    "manifest",
    "row_digest",
    "side_key",
    "side_manifest",
    "trace_key",
]
