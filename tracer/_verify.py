"""Checking a run's hash chains (see ``_chain``) and its cross-references.

Two depths.  The *open check* (``full=False``, run by ``replay cluster``, ``single``,
``show`` and the browser) reads every chained row once, recomputes each row's digest
and each node's links, and checks that the links' sequence ranges are contiguous and
cover every row (a crashed or live run may have an unlinked tail: the invocations it had
not completed).  ``replay verify`` (``full=True``) also decodes the blobs and checks the
cross-references: each link's events use exactly its sequence numbers, invocation
numbers have no gaps, every node completed the same invocations (finished runs),
digests are present, and message sequence numbers agree between senders and receivers.

The first problem found is returned as a :class:`Problem`; nothing here raises on damage.
"""

from __future__ import annotations

import bisect
import hmac
import json
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
from sqlalchemy import Engine, inspect, select
from sqlalchemy.exc import DBAPIError

from ._chain import (
    CHAINED,
    CODE,
    GENESIS_NODE,
    GROUP_MANIFEST_DTYPE,
    KEY_ENV,
    MANIFEST_DTYPE,
    ROW_DIGEST_BYTES,
    SEQ_COLUMN,
    SIDE,
    genesis,
    link_of,
    row_digest,
    side_key,
)
from ._codec import decode
from ._errors import TraceFormatError
from ._invset import NodeDone, decode_set, layout_of
from ._schema import (
    CALL_BLOCKS,
    ChainLink,
    Checkpoint,
    CheckpointBlock,
    Digest,
    Invocation,
    InvocationSet,
    MessageBlock,
    Run,
)

#: The channel whose source sequence numbers count every send of a source (0, 1, ...).
ROWS_CHANNEL = "rows"
#: Routed write-backs: the sender's exchange number, increasing per (receiver, sender) with
#: gaps (a node sends only to the nodes that touch its rows next).
ROUTED_CHANNEL = "routed"


@dataclass(frozen=True)
class Problem:
    """The first bad block: where it is and what is wrong with it."""

    table: str
    node: int | None
    what: str
    seq: int | None = None
    op: str | None = None
    invocation: int | None = None

    def line(self) -> str:
        """One line naming the block."""
        where = f"table {self.table}"
        if self.node is not None:
            where += f" node {self.node}"
        if self.op is not None and self.invocation is not None and self.invocation >= 0:
            where += f" invocation {self.op}:{self.invocation}"
        if self.seq is not None:
            where += f" seq {self.seq}"
        return f"{where}: {self.what}"


@dataclass
class Report:
    """What a check found: ``problem`` is None when the run verified."""

    run_id: str
    blocks: int = 0
    nodes: int = 0
    tail: int = 0  # rows after the last link of a crashed or live run (not verified)
    keyed: bool = False
    #: node 0's chain does not start from the run row: recorded before the run row (its
    #: target, parameters, seed, shape) was covered, so those fields are not verified
    legacy: bool = False
    problem: Problem | None = None
    checked: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.problem is None

    def to_json(self) -> dict[str, Any]:
        """``{"ok", "blocks", "nodes", "tail", "keyed", "legacy", "problem"}``."""
        return {
            "ok": self.ok,
            "run_id": self.run_id,
            "blocks": self.blocks,
            "nodes": self.nodes,
            "tail": self.tail,
            "keyed": self.keyed,
            "legacy": self.legacy,
            "problem": None if self.problem is None else asdict(self.problem),
        }


class _Found(Exception):
    def __init__(self, problem: Problem) -> None:
        self.problem = problem


def _fail(table: str, node: int | None, what: str, **kw: Any) -> None:
    raise _Found(Problem(table, node, what, **kw))


def _detail(exc: TraceFormatError, table: str) -> str:
    """What a decoder said of a row of ``table``, without the table the line names
    already: its row and column stay (they were cut, which left a damaged column
    unnamed)."""
    return str(exc).removeprefix(f"table {table} ")


def _fail_link(node: int, ln: Any, what: str) -> None:
    """:func:`_fail` for chain link ``ln`` of ``node``'s chain, named by where it starts."""
    _fail("chain_link", node, what, seq=ln.first_seq, op=ln.op, invocation=ln.invocation)


def _fail_row(model: Any, r: Any, node: int, what: str, seq: int) -> None:
    """:func:`_fail` for row ``r`` of ``model``, named by its operator and invocation."""
    at = dict(op=getattr(r, "op", None), invocation=getattr(r, "invocation", None))
    _fail(model.__tablename__, node, what, seq=seq, **at)


def _read(engine: Engine, run_id: str) -> tuple[Any, list[Any], dict[Any, list[Any]]]:
    try:
        with engine.connect() as conn:
            run = conn.execute(select(Run.__table__).where(Run.run_id == run_id)).first()
            links = list(
                conn.execute(
                    select(ChainLink.__table__)
                    .where(ChainLink.run == run_id, ChainLink.link_no >= 0)
                    .order_by(ChainLink.node, ChainLink.link_no)
                ).all()
            )
            have = set(inspect(conn).get_table_names())
            rows = {
                model: list(
                    conn.execute(
                        select(model.__table__)
                        .where(model.run == run_id)
                        .order_by(model.node, getattr(model, col))
                    ).all()
                )
                if model.__tablename__ in have  # tables added later are absent from old stores
                else []
                for model, col in CHAINED
            }
            for model in SIDE:
                rows[model] = list(
                    conn.execute(select(model.__table__).where(model.run == run_id)).all()
                )
            # side links after their rows: a side link commits with its rows, so every
            # row read here has its link in this later read, even while the run writes
            links += conn.execute(
                select(ChainLink.__table__)
                .where(ChainLink.run == run_id, ChainLink.link_no < 0)
                .order_by(ChainLink.node, ChainLink.link_no)
            ).all()
    except DBAPIError as exc:
        reason = str(getattr(exc, "orig", exc)).splitlines()[0]
        raise TraceFormatError(f"the trace is damaged ({reason}); re-record the run") from None
    return run, links, rows


def check_run(
    engine: Engine, run_id: str, *, full: bool = False, key: bytes | None = None
) -> Report:
    """Check the chains (and with ``full`` the cross-references) of run ``run_id``.

    ``key``: the chain key; without it a keyed chain's rows are still checked against
    their manifests, but its links only with ``full=False`` skipped, and ``full=True``
    reports that the key is needed.
    """
    run, links, rows = _read(engine, run_id)
    rep = Report(run_id)
    try:
        if run is None:
            _fail("run", None, f"no run {run_id!r}")
        _check_chains(run, links, rows, rep, full=full, key=key)
        if full:
            _check_references(run, rows, rep, _prior(engine, run))
    except _Found as found:
        rep.problem = found.problem
    return rep


# ---------------------------------------------------------------------- chains
def _check_chains(
    run: Any,
    links: list[Any],
    rows: dict[Any, list[Any]],
    rep: Report,
    *,
    full: bool,
    key: bytes | None,
) -> None:
    side_links = [ln for ln in links if ln.link_no < 0]
    links = [ln for ln in links if ln.link_no >= 0]
    per_node: dict[int, dict[Any, list[Any]]] = defaultdict(lambda: defaultdict(list))
    for model, r in _chained(rows):
        per_node[int(r.node)][model].append(r)
    by_node = _by_node(links)
    nodes = sorted(set(per_node) | set(by_node))
    rep.nodes = len(nodes)
    closed = run.status == "finished"
    # keyed-ness is one fact about the whole chain, side links included: a flag flipped
    # on one link must not switch that link's check off
    every = links + side_links
    rep.keyed = any(ln.keyed for ln in every)
    if rep.keyed and not all(ln.keyed for ln in every):
        ln = next(ln for ln in every if not ln.keyed)
        _fail_link(int(ln.node), ln, "keyed and unkeyed links are mixed: the chain was edited")
    if full and rep.keyed and key is None:
        _fail("chain_link", None, f"the chain is keyed: set {KEY_ENV} to verify it")
    if full and key is not None and links and not rep.keyed:
        _fail(
            "chain_link",
            None,
            f"{KEY_ENV} is set but the trace was recorded without a key: its chain cannot "
            "show that it was not edited",
        )
    if _layout(run) >= 7:
        _check_groups(run, by_node, rows, rep, full=full, key=key)
        nodes = []  # schema 7: one chain per recorder, checked above
    for node in nodes:
        tables = per_node[node]
        seqs = {m: [int(getattr(r, SEQ_COLUMN[m])) for r in tables[m]] for m in tables}
        prev, end = (genesis(run._mapping) if node == GENESIS_NODE else b""), 0
        for k, ln in enumerate(by_node[node]):
            _check_follows(node, k, ln, end)
            got: list[tuple[int, int, Any, Any]] = []
            for m in tables:
                lo = bisect.bisect_left(seqs[m], ln.first_seq)
                hi = bisect.bisect_left(seqs[m], ln.end_seq)
                got.extend((CODE[m], seqs[m][i], m, tables[m][i]) for i in range(lo, hi))
            got.sort(key=lambda e: (e[0], e[1]))
            _match_manifest(node, ln, got)
            _check_link(rep, node, k, ln, prev, bytes(ln.manifest), key)
            prev, end = bytes(ln.link), ln.end_seq
            rep.blocks += len(got)
            if full:
                _check_density(node, ln, got)
        tail = [(m, r) for m in tables for r, s in zip(tables[m], seqs[m], strict=True) if s >= end]
        if tail and closed:
            m, r = min(tail, key=lambda e: int(getattr(e[1], SEQ_COLUMN[e[0]])))
            _fail_row(
                m,
                r,
                node,
                "row is not covered by the node's chain (links were removed or rows added)",
                int(getattr(r, SEQ_COLUMN[m])),
            )
        rep.tail += len(tail)
        _check_end(run, node, end)
    if closed and run.end_node is not None and run.end_node not in by_node:
        _fail("chain_link", run.end_node, "the primary node has no chain at all")
    if _layout(run) >= 7:
        rep.nodes = len(_group_nodes(rows) | set(by_node))
    if not side_links and (rep.legacy or (rep.keyed and key is None)):
        return  # recorded before time-travel rows were chained, or the links need the key
    _check_side(side_links, rows, rep, key, live=run.status == "running")


def _layout(run: Any) -> int:
    """The layout of ``run``'s rows (7, or 6: the legacy per-node rows)."""
    try:
        versions = json.loads(run.versions) if isinstance(run.versions, str) else None
        return layout_of(versions, "table run")
    except (ValueError, RecursionError, TraceFormatError):
        _fail("run", None, "its versions column is damaged (not the JSON the run wrote)")
    raise AssertionError("unreachable")


def _sets(rows: Mapping[Any, list[Any]]) -> list[tuple[Any, list[NodeDone]]]:
    """Each ``invocation_set`` row with its per-node records (damage is a problem)."""
    out = []
    for r in rows.get(InvocationSet, ()):
        try:
            out.append((r, decode_set(r)))
        except TraceFormatError as exc:
            _fail(
                "invocation_set",
                int(r.node) if isinstance(r.node, int) else None,
                _detail(exc, "invocation_set"),
                seq=r.seq if isinstance(r.seq, int) else None,
                op=r.op,
                invocation=r.invocation,
            )
    return out


def _chained(rows: Mapping[Any, list[Any]]) -> Iterator[tuple[Any, Any]]:
    """Every chained row as (model, row), table by table in ``rows``' order: what the
    chains cover (the side rows of time travel have their own chain)."""
    for model, batch in rows.items():
        if model not in SIDE:
            for r in batch:
                yield model, r


def _group_nodes(rows: Mapping[Any, list[Any]]) -> set[int]:
    got = {int(r.node) for _, r in _chained(rows)}
    for _, done in _sets(rows):
        got.update(d.node for d in done)
    return got


def _by_node(links: list[Any]) -> dict[int, list[Any]]:
    """``links`` by the node whose chain they are, each list in the order given."""
    by_node: dict[int, list[Any]] = defaultdict(list)
    for ln in links:
        by_node[int(ln.node)].append(ln)
    return by_node


def _check_follows(node: int, k: int, ln: Any, end: int) -> None:
    """Link ``ln`` is the ``k``-th of ``node``'s chain and starts where the one before
    ended (at ``end``)."""
    if ln.link_no != k or ln.first_seq != end or ln.end_seq < ln.first_seq:
        _fail_link(
            node,
            ln,
            f"link {ln.link_no} does not follow link {k - 1} (seqs {ln.first_seq}.."
            f"{ln.end_seq}, expected to start at {end}): a link is missing",
        )


def _check_link(
    rep: Report, node: int, k: int, ln: Any, prev: bytes, manifest: bytes, key: bytes | None
) -> None:
    """Link ``ln`` (the ``k``-th of ``node``'s chain) is the hash of ``prev``, its header
    and ``manifest``; a keyed link without ``key`` is left unchecked (its rows matched)."""
    lkey = key if ln.keyed else None
    if ln.keyed and key is None:
        return  # the rows match their manifest; the links need the key
    if not hmac.compare_digest(
        link_of(prev, _header(ln), manifest, lkey), bytes(ln.link)
    ) and not _legacy_start(rep, node, k, ln, lkey):
        what = "its link does not match the chain (the link rows were edited"
        what += ", or the key is wrong)" if ln.keyed else ")"
        _fail_link(node, ln, what)


def _check_end(run: Any, node: int, end: int) -> None:
    """A finished run that ended on ``node`` ended where ``node``'s chain ends."""
    if (
        run.status == "finished"
        and run.end_node == node
        and run.end_seq is not None
        and run.end_seq != end
    ):
        _fail(
            "chain_link",
            node,
            f"the chain ends at seq {end} but the run ended at seq {run.end_seq}: "
            "the last links are missing",
            seq=end,
        )


def _check_groups(
    run: Any,
    by_home: Mapping[int, list[Any]],
    rows: dict[Any, list[Any]],
    rep: Report,
    *,
    full: bool,
    key: bytes | None,
) -> None:
    """Schema 7: each recorder's chain (on its first node) covers the rows of every node
    it hosts; a manifest entry names (table, node, seq).  Every chained row is in exactly
    one manifest with its digest; a crashed or live run may have an unlinked tail.
    ``by_home``: the main links of each chain, by the node that holds it."""
    index: dict[tuple[int, int, int], tuple[Any, Any]] = {}
    for model, r in _chained(rows):
        ident = (CODE[model], int(r.node), int(getattr(r, SEQ_COLUMN[model])))
        if ident in index:
            _fail_row(
                model, r, ident[1], "two rows have one sequence number (a row was copied)", ident[2]
            )
        index[ident] = (model, r)
    names = {k: m.__tablename__ for m, k in CODE.items()}
    seen: set[tuple[int, int, int]] = set()
    closed = run.status == "finished"
    size = GROUP_MANIFEST_DTYPE.itemsize
    for home, chain in sorted(by_home.items()):
        prev, end = (genesis(run._mapping) if home == GENESIS_NODE else b""), 0
        for k, ln in enumerate(chain):
            _check_follows(home, k, ln, end)
            where = dict(op=ln.op, invocation=ln.invocation)
            raw = bytes(ln.manifest or b"")
            if len(raw) % size or len(raw) // size != ln.n_rows:
                _fail_link(home, ln, "its manifest is damaged")
            for e in np.frombuffer(raw, dtype=GROUP_MANIFEST_DTYPE):
                entry = (int(e["table"]), int(e["node"]), int(e["seq"]))
                got = index.get(entry)
                if got is None or entry in seen:
                    table = names.get(entry[0], f"#{entry[0]}")
                    _fail(table, entry[1], "row is missing (deleted)", seq=entry[2], **where)
                seen.add(entry)
                model, r = got  # type: ignore[misc]
                digest = bytes(e["digest"]).ljust(ROW_DIGEST_BYTES, b"\0")
                if row_digest(model, r._mapping) != digest:
                    _fail_row(
                        model,
                        r,
                        entry[1],
                        "row does not match its recorded digest (altered)",
                        entry[2],
                    )
            _check_link(rep, home, k, ln, prev, raw, key)
            prev, end = bytes(ln.link), ln.end_seq
            rep.blocks += len(raw) // size
        _check_end(run, home, end)
    tail = sorted((i[1], i[2], i[0]) for i in index if i not in seen)
    if tail and closed:
        node, seq, code = tail[0]
        model, r = index[(code, node, seq)]
        _fail_row(
            model,
            r,
            node,
            "row is not covered by the chain (links were removed or rows added)",
            seq,
        )
    rep.tail += len(tail)
    if full:
        _check_group_density({i: index[i] for i in seen})


def _check_group_density(covered: dict[tuple[int, int, int], tuple[Any, Any]]) -> None:
    """Schema 7: each node's covered events use its sequence numbers 0, 1, ... without
    gaps or repeats, and each node's part of an ``invocation_set`` row starts where its
    previous commit ended."""
    per_node: dict[int, list[np.ndarray]] = defaultdict(list)
    for (_, node, seq), (model, r) in covered.items():
        if model is InvocationSet:
            for d in _sets({InvocationSet: [r]})[0][1]:
                c = d.counters
                if c["first_seq"] > c["seq"]:
                    _fail(
                        "invocation_set",
                        d.node,
                        f"its first seq {c['first_seq']} is after its seq {c['seq']}",
                        seq=c["seq"],
                        op=r.op,
                        invocation=r.invocation,
                    )
                per_node[d.node].append(np.array([c["seq"]], np.int64))
            continue
        try:
            per_node[node].append(_event_seqs(model, r))
        except TraceFormatError as exc:
            _fail_row(model, r, node, _detail(exc, model.__tablename__), seq)
    for node, parts in sorted(per_node.items()):
        have = np.sort(np.concatenate(parts))
        want = np.arange(len(have), dtype=np.int64)
        if not np.array_equal(have, want):
            bad = _first_gap(have, want)
            _fail(
                "chain_link",
                node,
                f"sequence numbers of the node's events are not 0..{len(have) - 1} "
                f"without gaps (first wrong: {bad})",
                seq=bad,
            )


def _check_side(
    links: list[Any],
    rows: dict[Any, list[Any]],
    rep: Report,
    key: bytes | None,
    *,
    live: bool = False,
) -> None:
    """The side chains (see ``_chain``): consecutive links, and every time-travel row is
    in one manifest with its digest (blocks of an unmarked checkpoint are ignored)."""
    by_node = _by_node(links)
    names = {k: m.__tablename__ for m, k in SIDE.items()}
    entries: dict[tuple[int, int], tuple[bytes, Any]] = {}
    for node, chain in by_node.items():
        chain.sort(key=lambda ln: -int(ln.link_no))
        prev = b""
        for k, ln in enumerate(chain):
            where = dict(op=ln.op, invocation=ln.invocation)
            if ln.link_no != -(k + 1):
                _fail(
                    "chain_link",
                    node,
                    f"side link {ln.link_no} is out of order: a side link is missing",
                    **where,
                )
            raw = bytes(ln.manifest or b"")
            size = MANIFEST_DTYPE.itemsize
            if len(raw) % size or len(raw) // size != ln.n_rows:
                _fail("chain_link", node, "its manifest is damaged", **where)
            if not (ln.keyed and key is None) and not hmac.compare_digest(
                link_of(prev, _header(ln), raw, key if ln.keyed else None), bytes(ln.link)
            ):
                _fail(
                    "chain_link",
                    node,
                    "its side link does not match the chain (the link "
                    "rows were edited" + (", or the key is wrong)" if ln.keyed else ")"),
                    **where,
                )
            prev = bytes(ln.link)
            for e in np.frombuffer(raw, dtype=MANIFEST_DTYPE):
                code = int(e["table"])
                if code not in names:
                    _fail("chain_link", node, f"its manifest names table #{code}", **where)
                entries[(code, int(e["seq"]))] = (bytes(e["digest"]), ln)
    marked = {(r.op, int(r.invocation), int(r.node)) for r in rows[Checkpoint]}
    seen: set[tuple[int, int]] = set()
    for model, code in SIDE.items():
        for r in rows[model]:
            owner = getattr(r, "node", None)
            at = dict(op=getattr(r, "op", None), invocation=getattr(r, "invocation", None))
            if model is CheckpointBlock and (r.op, int(r.invocation), int(r.node)) not in marked:
                continue  # its checkpoint never completed: no reader uses it
            key_ = (code, side_key(model, r._mapping))
            got = entries.get(key_)
            if got is None or key_ in seen:
                _fail(model.__tablename__, owner, "row is not in the chain (added or moved)", **at)
            seen.add(key_)
            assert got is not None
            if row_digest(model, r._mapping) != got[0].ljust(ROW_DIGEST_BYTES, b"\0"):
                _fail(
                    model.__tablename__,
                    owner,
                    "row does not match its recorded digest (altered)",
                    **at,
                )
            rep.blocks += 1
    for entry, (_, ln) in entries.items():
        if entry not in seen and not live:  # a live run may have committed it since
            _fail(
                names[entry[0]],
                int(ln.node),
                "row is missing (deleted)",
                op=ln.op,
                invocation=ln.invocation,
            )


def _legacy_start(rep: Report, node: int, k: int, ln: Any, key: bytes | None) -> bool:
    """Whether node 0's first link starts from nothing, as chains recorded before the run
    row was covered do (then ``rep.legacy``: the run row is not verified)."""
    if node != GENESIS_NODE or k != 0:
        return False
    if not hmac.compare_digest(link_of(b"", _header(ln), bytes(ln.manifest), key), bytes(ln.link)):
        return False
    rep.legacy = True
    return True


def _header(ln: Any) -> dict[str, Any]:
    return {k: getattr(ln, k) for k in ("run", "node", "link_no", "first_seq", "end_seq", "op")} | {
        "invocation": ln.invocation,
        "keyed": ln.keyed,
    }


def _match_manifest(node: int, ln: Any, got: list[tuple[int, int, Any, Any]]) -> None:
    """Walk the recorded manifest and the rows found side by side (both sorted)."""
    where = dict(op=ln.op, invocation=ln.invocation)
    raw = bytes(ln.manifest or b"")
    if len(raw) % MANIFEST_DTYPE.itemsize or len(raw) // MANIFEST_DTYPE.itemsize != ln.n_rows:
        _fail_link(node, ln, "its manifest is damaged")
    man = np.frombuffer(raw, dtype=MANIFEST_DTYPE)
    names = {k: m.__tablename__ for m, k in CODE.items()}
    end = (1 << 8, 1 << 63)
    i = j = 0
    while i < len(man) or j < len(got):
        want = (int(man[i]["table"]), int(man[i]["seq"])) if i < len(man) else end
        have = (got[j][0], got[j][1]) if j < len(got) else end
        if want < have:
            table = names.get(want[0], f"#{want[0]}")
            _fail(table, node, "row is missing (deleted)", seq=want[1], **where)
        model, r = got[j][2], got[j][3]
        at = dict(seq=have[1], op=getattr(r, "op", None), invocation=getattr(r, "invocation", None))
        if have < want:
            _fail(model.__tablename__, node, "row is not in the chain (added or moved)", **at)
        if row_digest(model, r._mapping) != bytes(man[i]["digest"]).ljust(ROW_DIGEST_BYTES, b"\0"):
            _fail(
                model.__tablename__, node, "row does not match its recorded digest (altered)", **at
            )
        i, j = i + 1, j + 1


# ---------------------------------------------------------------------- events
def _event_seqs(model: Any, r: Any) -> np.ndarray:
    """The node sequence numbers of a row's events (decodes its blobs)."""
    where = f"table {model.__tablename__} row {r.id}"
    if model is MessageBlock:
        return decode(r.seqs, r.seqs_codec, r.count, where + " column seqs")
    spec = CALL_BLOCKS.get(model)
    if spec is None:
        return np.array([int(r.seq)], dtype=np.int64)
    calls = decode(r.calls, r.calls_codec, r.n_calls * spec.width, where + " column calls")
    calls = calls.reshape(r.n_calls, spec.width)
    starts, lens = calls[:, -2], calls[:, -1]
    if not spec.per_value:
        return starts
    return np.concatenate(
        [np.arange(s, s + n) for s, n in zip(starts, lens, strict=True)]
        or [np.zeros(0, dtype=np.int64)]
    )


def _check_density(node: int, ln: Any, got: list[tuple[int, int, Any, Any]]) -> None:
    parts = []
    for _, seq, model, r in got:
        try:
            parts.append(_event_seqs(model, r))
        except TraceFormatError as exc:
            _fail_row(model, r, node, _detail(exc, model.__tablename__), seq)
    have = np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)
    want = np.arange(ln.first_seq, ln.end_seq, dtype=np.int64)
    if have.shape != want.shape or not np.array_equal(have, want):
        bad = _first_gap(have, want)
        _fail_link(
            node,
            ln,
            f"sequence numbers of the link's events are not "
            f"{ln.first_seq}..{ln.end_seq - 1} without gaps (first wrong: {bad})",
        )


def _first_gap(have: np.ndarray, want: np.ndarray) -> int:
    n = min(len(have), len(want))
    diff = np.nonzero(have[:n] != want[:n])[0]
    if len(diff):
        return int(want[diff[0]])
    return int(want[n]) if len(want) > n else int(have[n])


# ---------------------------------------------------------------------- cross-references
def _prior(engine: Engine, run: Any) -> dict[tuple[str, int], int] | None:
    """For a resumed run: per (op, node) how many invocations the crashed run it
    continues completed (its own invocations start where those end)."""
    if run is None or not run.continues:
        return None
    try:
        with engine.connect() as conn:
            have = conn.execute(
                select(Run.run_id, Run.continues).where(Run.run_id == run.continues)
            ).first()
            got: list[Any] = list(
                conn.execute(
                    select(Invocation.op, Invocation.node, Invocation.invocation).where(
                        Invocation.run == run.continues
                    )
                ).all()
            )
            if inspect(conn).has_table(InvocationSet.__tablename__):
                sets = list(
                    conn.execute(
                        select(InvocationSet.__table__).where(InvocationSet.run == run.continues)
                    ).all()
                )
                got += [
                    (r.op, d.node, r.invocation)
                    for r, done in _sets({InvocationSet: sets})
                    for d in done
                ]
    except DBAPIError as exc:
        reason = str(getattr(exc, "orig", exc)).splitlines()[0]
        raise TraceFormatError(f"the trace is damaged ({reason}); re-record the run") from None
    if have is None:
        _fail(
            "run", None, f"the run continues run {run.continues!r}, which the trace does not hold"
        )
    done: dict[tuple[str, int], set[int]] = defaultdict(set)
    for op, node, inv in got:
        done[(op, int(node))].add(int(inv))
    out = {}
    for key, invs in done.items():
        # a crashed run that was itself resumed starts after its own checkpoint (its
        # start was checked against the run before it when the chain was verified)
        k = min(invs) if have is not None and have.continues else 0
        while k in invs:
            k += 1
        out[key] = k  # the contiguous prefix ..k-1 the resumed run may build on
    return out


def _completions(rows: Mapping[Any, list[Any]]) -> list[Any]:
    """(op, node, invocation, n_digests) of each node's completion of an invocation:
    its ``invocation`` row (schema 6) or its part of an ``invocation_set`` row (7)."""
    out: list[Any] = list(rows[Invocation])
    for r, done in _sets(rows):
        for d in done:
            out.append(
                SimpleNamespace(
                    op=r.op,
                    node=d.node,
                    invocation=int(r.invocation),
                    n_digests=d.counters["n_digests"],
                )
            )
    return out


def _check_references(
    run: Any,
    rows: Mapping[Any, list[Any]],
    rep: Report,
    prior: dict[tuple[str, int], int] | None = None,
) -> None:
    finished = run.status == "finished"
    completed = _completions(rows)
    invs: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for r in completed:
        invs[r.op][int(r.node)].append(int(r.invocation))
    nodes = sorted({n for per in invs.values() for n in per})
    for op, per in sorted(invs.items()):
        longest = max(len(v) for v in per.values())
        for node in nodes:
            got = sorted(per.get(node, []))
            # a resumed run starts after its checkpoint: its first invocation of each
            # operator must follow what the crashed run completed (the runs chain)
            start = got[0] if prior is not None and got else 0
            if start and prior is not None and prior.get((op, node), 0) < start:
                _fail(
                    "invocation",
                    node,
                    f"the resumed run starts at invocation {start}, but the run it continues "
                    f"completed only {prior.get((op, node), 0)}",
                    op=op,
                    invocation=start,
                )
            if got != list(range(start, start + len(got))):
                first = next(i for i, v in enumerate(got + [-1], start) if v != i)
                _fail(
                    "invocation",
                    node,
                    "invocation is missing (gap in invocation numbers)",
                    op=op,
                    invocation=first,
                )
            if finished and len(got) != longest:
                _fail(
                    "invocation",
                    node,
                    "invocation is missing: other nodes completed it",
                    op=op,
                    invocation=start + len(got),
                )
    # digests: each invocation holds as many as it says, and the digesting node digests all
    count: dict[tuple[str, int, int], int] = defaultdict(int)
    for d in rows[Digest]:
        count[(d.op, int(d.invocation), int(d.node))] += 1
    digesting = {int(d.node) for d in rows[Digest]}
    for r in completed:
        k = (r.op, int(r.invocation), int(r.node))
        if count.get(k, 0) != r.n_digests or (int(r.node) in digesting and r.n_digests == 0):
            _fail(
                "digest",
                int(r.node),
                f"{count.get(k, 0)} digest(s) for an invocation that recorded {r.n_digests}",
                op=getattr(r, "op", None),
                invocation=int(r.invocation),
            )
    # routed arrivals (schema 7): a node takes part in each exchange once
    exchanges: dict[int, list[np.ndarray]] = defaultdict(list)
    for r, done in _sets(rows):
        for d in done:
            exchanges[d.node].append(np.asarray(d.routed, np.int64).reshape(-1, 3)[:, 0])
            if len(d.routed) and np.asarray(d.routed)[:, 1:].min() < 0:
                _fail(
                    "invocation_set",
                    d.node,
                    "a negative routed count",
                    op=r.op,
                    invocation=r.invocation,
                )
    for node, parts in sorted(exchanges.items()):
        ex = np.concatenate(parts)
        if len(np.unique(ex)) != len(ex):
            _fail(
                "invocation_set",
                node,
                "routed arrivals name one exchange twice (rows were copied)",
            )
    # messages: per (receiver, source) the source's sequence numbers 0..k-1, and every
    # receiver saw the same k from a source when the run finished
    got_from: dict[tuple[int, int, str], list[np.ndarray]] = defaultdict(list)
    first_block: dict[tuple[int, int, str], Any] = {}
    for b in rows[MessageBlock]:
        where = f"table message_block row {b.id}"
        try:
            src = decode(b.sources, b.sources_codec, b.count, where + " column sources")
            sseq = decode(
                b.source_seqs, b.source_seqs_codec, b.count, where + " column source_seqs"
            )
        except TraceFormatError as exc:
            _fail(
                "message_block",
                int(b.node),
                _detail(exc, "message_block"),
                seq=b.first_seq,
                op=b.op,
                invocation=b.invocation,
            )
        whole_run = b.channel in (ROWS_CHANNEL, ROUTED_CHANNEL)
        chan = b.channel if whole_run else f"{b.channel}@{b.op}:{b.invocation}"
        for s in np.unique(src):
            key = (int(b.node), int(s), chan)
            got_from[key].append(sseq[src == s])
            first_block.setdefault(key, b)
    sent: dict[tuple[int, str], dict[int, int]] = defaultdict(dict)
    for (dst, s, chan), parts in sorted(got_from.items()):
        seqs = np.sort(np.concatenate(parts))
        b = first_block[(dst, s, chan)]
        if chan == ROWS_CHANNEL:
            # a resumed run goes on numbering from its checkpoint's message counters
            first = int(seqs[0]) if prior is not None and len(seqs) else 0
            ok = np.array_equal(seqs, np.arange(first, first + len(seqs)))
            sent[(s, chan)][dst] = len(seqs)
        else:  # routed, and sync_for channels (by clock within an invocation): no repeats
            ok = len(np.unique(seqs)) == len(seqs)
        if not ok:
            _fail(
                "message_block",
                dst,
                f"messages from node {s} on channel {b.channel} have "
                f"source sequence numbers with gaps or repeats",
                seq=b.first_seq,
                op=b.op,
                invocation=b.invocation,
            )
    if finished:
        for (s, chan), counts in sorted(sent.items()):
            if len(set(counts.values())) > 1:
                dst = min(counts, key=lambda d: (counts[d], d))
                _fail(
                    "message_block",
                    dst,
                    f"received {counts[dst]} message(s) from node {s} on "
                    f"channel {chan}, other nodes received {max(counts.values())}",
                )


__all__ = ["Problem", "Report", "check_run"]
