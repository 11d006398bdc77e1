"""One run of a trace: summaries, plans, invocations, bulk arrays and events."""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from sqlalchemy import BigInteger, cast, distinct, func, select, union

from engine.lowlevel import digest_kind_of

from . import _stream
from ._codec import CODECS, decode
from ._codec import decode_column as _dec
from ._codec import where as _where
from ._errors import TraceFormatError, TracerError
from ._events import DeltasAggregated, DigestRecorded, Event, UpdatesApplied
from ._invset import MAX_NODES, NodeDone, decode_phase, decode_set
from ._plain import decode_array, decode_plain
from ._plans import decode_plan
from ._schema import (
    CALL_BLOCKS,
    CHECKPOINT_BLOB_COLUMNS,
    PHASE_KINDS,
    VERDICT_KINDS,
    WALL_CLOCK,
    Checkpoint,
    CheckpointBlock,
    CollectiveValue,
    Digest,
    Invocation,
    InvocationSet,
    LockGrantBlock,
    MessageBlock,
    MutexGrantBlock,
    Objective,
    OperatorPlan,
    Phase,
    PhaseSet,
    Run,
    Verdict,
)

if TYPE_CHECKING:
    from ._read import RunInfo, Trace

F = TypeVar("F", bound=Callable[..., Any])

#: ``invocation`` counter columns and the summary fields they fill.
_COUNTERS = {
    "n_lock_grants": "lock_grants",
    "n_messages": "messages",
    "n_deviations": "deviations",
    "n_aggregations": "aggregations",
    "n_visibility": "visibility",
    "n_mutex_grants": "mutex_grants",
}


@dataclass(frozen=True, slots=True)
class OperatorSummary:
    """Per-operator counts of one run."""

    op: str
    strategy: str
    rounds: int
    imbalance: float
    plans: int
    invocations: int
    bodies: int
    lock_grants: int
    messages: int
    deviations: int
    aggregations: int
    visibility: int
    mutex_grants: int
    store_bytes: int


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """A checkpoint every node of the run wrote (time travel)."""

    op: str
    invocation: int
    step: int  # its place among the run's loop invocations, from 0
    nbytes: int  # every node's blocks
    refused: tuple[tuple[str, str], ...]  # (dds, why) left out
    seconds: float = 0.0  # the slowest node's time to encode its part


@dataclass(frozen=True, slots=True)
class CheckpointState:
    """The DDS rows of one checkpoint, every node's owned rows merged, and each node's
    message counters (what ``engine.Controller.restore`` returns)."""

    op: str
    invocation: int
    rows: dict[str, tuple[np.ndarray, Any]]  # dds -> (slots, values)
    lengths: dict[str, int]
    counters: dict[int, dict[str, Any]]


@dataclass(frozen=True, slots=True)
class CollectiveRecorded:
    """A value the driver got from a collective call; ``value`` is None when refused."""

    k: int
    kind: str
    encoding: str
    value: Any
    detail: str


@dataclass(frozen=True, slots=True)
class InvocationInfo:
    """One node's record of one operator invocation."""

    op: str
    invocation: int
    node: int
    seq: int
    bodies: int
    rounds: int
    seconds: float
    round_seconds: tuple[float, ...]
    #: ``async_for``: (round, thread, start, end) of each thread's task groups, in seconds
    #: from the node's start of the round (empty for ``sync_for`` and older runs)
    thread_times: tuple[tuple[int, int, float, float], ...]
    lock_grants: int
    messages: int
    deviations: int
    aggregations: int
    visibility: int
    mutex_grants: int
    committed_at: float


@dataclass(frozen=True, slots=True)
class LockGrantArrays:
    """Lock grants of one node in one invocation: per round (in sequence order) its
    locked bodies and element grants, and the deviations of its ticket order from the
    predicted one — round ``k``'s are ``position[offset[k]:offset[k + 1]]`` (where
    another thread took over) and the matching ``thread`` entries, and ``element`` the
    element lock each hand-over took over (``W[943]``; ``-``: none named)."""

    seq: np.ndarray
    round: np.ndarray
    bodies: np.ndarray
    grants: np.ndarray
    offset: np.ndarray
    position: np.ndarray
    thread: np.ndarray
    element: np.ndarray

    def deviations(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(positions, threads) of the ``k``-th round listed."""
        a, b = int(self.offset[k]), int(self.offset[k + 1])
        return self.position[a:b], self.thread[a:b]

    def handovers(self, plan: Any, node: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per deviation, worked out from ``plan`` alone (no code runs): the loop index
        whose body took over, the thread that handed over (-1 at the first ticket) and
        the ticket's rank among its own thread's tickets of the round.  -1 throughout
        for a round whose deviations the plan does not explain (another plan's run)."""
        from engine import DivergenceError
        from engine.lowlevel import recorded_ticket_order

        n = len(self.position)
        index, before, rank = (np.full(n, -1, np.int64) for _ in range(3))
        for k in range(len(self.seq)):
            a, b = int(self.offset[k]), int(self.offset[k + 1])
            r = int(self.round[k])
            if a == b or r >= len(plan.rounds) or node >= len(plan.rounds[r]):
                continue
            seqs: dict[int, list[np.ndarray]] = {}
            for t in plan.rounds[r][node]:
                if t.locked:
                    seqs.setdefault(int(t.thread), []).append(np.asarray(t.indices, np.int64))
            per_thread = {th: np.concatenate(parts) for th, parts in seqs.items()}
            try:
                turns, merged = recorded_ticket_order(
                    self.position[a:b],
                    self.thread[a:b],
                    per_thread,
                    node=node,
                    op="",
                    invocation=-1,
                    round=r,
                )
            except DivergenceError:
                continue
            pos = self.position[a:b]
            if len(pos) and pos.max() >= len(turns):
                continue
            index[a:b] = merged[pos]
            before[a:b] = np.where(pos > 0, turns[np.maximum(pos - 1, 0)], -1)
            own = np.empty(len(turns), np.int64)  # each ticket's rank in its thread
            for th in np.unique(turns).tolist():
                mine = turns == th
                own[mine] = np.arange(int(np.count_nonzero(mine)))
            rank[a:b] = own[pos]
        return index, before, rank


@dataclass(frozen=True, slots=True)
class MutexGrantArrays:
    """Node-mutex grants of a hybrid ``sync_for`` on one node in one invocation, in order."""

    seq: np.ndarray
    clock: np.ndarray
    thread: np.ndarray
    minibatch: np.ndarray


@dataclass(frozen=True, slots=True)
class MessageArrays:
    """Messages received by one node, in arrival (sequence) order."""

    seq: np.ndarray
    channel: np.ndarray
    source: np.ndarray
    source_seq: np.ndarray
    nbytes: np.ndarray


@dataclass(frozen=True, slots=True)
class RoutedCounts:
    """Schema 7: routed write-backs one node received in one invocation, per sender
    exchange number (the exchange each was sent in): how many, and their payload bytes."""

    op: str
    invocation: int
    node: int
    exchange: np.ndarray
    count: np.ndarray
    nbytes: np.ndarray


@dataclass(frozen=True, slots=True)
class VerdictInfo:
    """A replay or dual-test verdict about a run."""

    id: int
    run_id: str
    kind: str
    passed: bool
    detail: dict[str, Any]
    created_at: float
    #: Why the row could not be decoded (only from ``verdicts(strict=False)``); None if it could.
    error: str | None = None


def _verdict(v: Any) -> VerdictInfo:
    """Decode and check one ``verdict`` row."""

    def bad(col: str, what: str) -> TraceFormatError:
        return TraceFormatError(f"{_where(Verdict, v.id, col)}: {what}; the trace is damaged")

    try:
        detail = json.loads(v.detail) if isinstance(v.detail, str) else None
    except (ValueError, RecursionError):
        raise bad("detail", "not JSON") from None
    if not isinstance(detail, dict):
        raise bad("detail", "not a JSON object")
    if v.kind not in VERDICT_KINDS:
        raise bad("kind", f"unknown verdict kind {v.kind!r}")
    if v.passed not in (0, 1) or isinstance(v.passed, float):
        raise bad("passed", f"{v.passed!r} is not a boolean")
    t = v.created_at
    if (
        isinstance(t, bool)
        or not isinstance(t, (int, float))
        or not WALL_CLOCK[0] <= t <= WALL_CLOCK[1]
    ):
        raise bad("created_at", f"{t!r} is not a wall-clock time")
    return VerdictInfo(v.id, v.run, v.kind, bool(v.passed), detail, float(t))


#: Builtin errors that decoding a damaged row raises deep inside numpy, zlib or int().
_DECODE_ERRORS = (ValueError, TypeError, OverflowError, IndexError, MemoryError, ZeroDivisionError)


def _damage(run: RunTrace, what: str, exc: BaseException) -> TraceFormatError:
    return TraceFormatError(
        f"{run.trace.source}: cannot read the {what} of run {run.run_id[:12]} "
        f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no detail'}); "
        "the trace is damaged, re-record the run"
    )


def _checked(what: str) -> Callable[[F], F]:
    """A read that a damaged row breaks raises :class:`TraceFormatError`, never a builtin.

    Checks with a precise table/row/column message come first; this is the net under them.
    """

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(self: RunTrace, *args: Any, **kw: Any) -> Any:
            try:
                out = fn(self, *args, **kw)
            except TracerError:
                raise
            except _DECODE_ERRORS as exc:
                raise _damage(self, what, exc) from None
            return _checked_iter(self, what, out) if isinstance(out, Iterator) else out

        return wrapper  # type: ignore[return-value]

    return deco


def _checked_iter(run: RunTrace, what: str, it: Iterator[Any]) -> Iterator[Any]:
    try:
        yield from it
    except TracerError:
        raise
    except _DECODE_ERRORS as exc:
        raise _damage(run, what, exc) from None


def _set_nodes(r: Any) -> np.ndarray:
    n = r.n_nodes
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_NODES:
        raise TraceFormatError(
            f"{_where(InvocationSet, r.id, 'n_nodes')}: {n!r} is not a node count; "
            "the trace is damaged"
        )
    return decode(r.nodes, r.nodes_codec, n, _where(InvocationSet, r.id, "nodes"))


def _node_info(r: Any, d: NodeDone) -> InvocationInfo:
    """One node's :class:`InvocationInfo` from its part of an ``invocation_set`` row."""
    c = d.counters
    tt = np.asarray(d.thread_times, np.int64).reshape(-1, 4)
    return InvocationInfo(
        op=r.op,
        invocation=int(r.invocation),
        node=d.node,
        seq=c["seq"],
        bodies=c["bodies"],
        rounds=c["rounds"],
        seconds=d.seconds,
        round_seconds=tuple((np.asarray(d.round_us) / 1e6).tolist()),
        thread_times=tuple((int(rd), int(th), a / 1e6, b / 1e6) for rd, th, a, b in tt.tolist()),
        **{f: c[col] for col, f in _COUNTERS.items()},
        committed_at=float(r.committed_at),
    )


def _summed(sets: list[tuple[Any, list[NodeDone]]]) -> dict[str, Any]:
    """Per operator what ``operators`` sums in SQL for rows per node."""
    out: dict[str, Any] = {}
    for r, done in sets:
        for d in done:
            _add(out, _node_info(r, d), str(r.strategy or ""))
    for s in out.values():
        s.invocations = len(s.inv)
    return out


def _add(out: dict[str, Any], i: InvocationInfo, strategy: str) -> None:
    s = out.get(i.op)
    if s is None:
        s = out[i.op] = SimpleNamespace(
            op=i.op, inv=set(), bodies=0, rounds=0, strategy="", **dict.fromkeys(_COUNTERS, 0)
        )
    s.inv.add(i.invocation)
    s.bodies += i.bodies
    s.rounds = max(s.rounds, i.rounds)
    s.strategy = max(s.strategy, strategy)
    for col, f in _COUNTERS.items():
        setattr(s, col, getattr(s, col) + getattr(i, f))


def _invocation_node(r: Any) -> tuple[int, int]:
    return (int(r.invocation), int(r.node))


def _grant_arrays(rows: list[Any]) -> LockGrantArrays:
    """One node's lock grants in one invocation, from its blocks in sequence order."""
    parts = [_stream.decode_calls(LockGrantBlock, r) for r in rows]
    calls = np.concatenate([c for c, _ in parts]) if parts else np.zeros((0, 5), np.int64)
    dev = np.concatenate([v for _, (v,) in parts]) if parts else np.zeros(0, np.int64)
    if len(dev) % 2:
        raise TraceFormatError("a lock-grant block holds an odd number of deviation values")
    names = [n for r in rows for n in _stream.element_names(r)]
    offset = np.concatenate(([0], np.cumsum(calls[:, -1] // 2)))
    return LockGrantArrays(
        calls[:, 3],
        calls[:, 0],
        calls[:, 1],
        calls[:, 2],
        offset,
        dev[0::2],
        dev[1::2],
        np.array(names, dtype=object),
    )


@dataclass(frozen=True, slots=True)
class PhaseTime:
    """One node's phase of an invocation outside its rounds (see ``Phase``)."""

    op: str
    invocation: int
    node: int
    kind: str
    started_at: float  # wall clock, as ``RunInfo.started_at``
    seconds: float


class RunTrace:
    """One run of a trace: operators, plans, invocations, events and outcomes."""

    def __init__(self, trace: Trace, info: RunInfo) -> None:
        self.trace = trace
        self.info = info
        self.run_id = info.run_id
        self._decoded: dict[tuple[Any, ...], list[NodeDone]] = {}

    def __repr__(self) -> str:
        return f"<RunTrace {self.run_id} of {self.trace.source}>"

    def _all(self, stmt: Any, *, check: bool = True) -> list[Any]:
        return self.trace._all(stmt, check=check)

    # ------------------------------------------------------------ summaries
    @_checked("node list")
    def nodes(self) -> list[int]:
        """Node ids that recorded anything in this run."""
        models = (Invocation, MessageBlock, OperatorPlan, Objective, *CALL_BLOCKS)
        parts: list[Any] = [select(m.node).where(m.run == self.run_id) for m in models]
        parts.append(select(Run.end_node).where(Run.run_id == self.run_id))
        got = {r[0] for r in self._all(union(*parts)) if r[0] is not None}
        if self.info.schema >= 7:
            stmt = select(InvocationSet.id, InvocationSet.n_nodes, InvocationSet.nodes)
            stmt = stmt.add_columns(InvocationSet.nodes_codec).where(
                InvocationSet.run == self.run_id
            )
            seen: set[tuple[Any, Any]] = set()
            for r in self._all(stmt):
                if (r.nodes, r.nodes_codec) not in seen:  # the same few node lists
                    seen.add((r.nodes, r.nodes_codec))
                    got.update(int(n) for n in _set_nodes(r))
        return sorted(got)

    def _sets(self, op: str | None = None) -> list[tuple[Any, list[NodeDone]]]:
        """Schema 7: the ``invocation_set`` rows (of ``op``) and their per-node records,
        in commit order."""
        if self.info.schema < 7:
            return []
        stmt = select(InvocationSet.__table__).where(InvocationSet.run == self.run_id)
        if op is not None:
            stmt = stmt.where(InvocationSet.op == op)
        rows = self._all(stmt.order_by(InvocationSet.committed_at, InvocationSet.node))
        # a row never changes once committed: ``events`` reads every node's part of the
        # same rows once per node, so each row is decoded once (keyed by all it holds)
        out = []
        for r in rows:
            key = tuple(r)
            got = self._decoded.get(key)
            if got is None:
                got = self._decoded[key] = decode_set(r)
            out.append((r, got))
        return out

    @_checked("operator summaries")
    def operators(self) -> dict[str, OperatorSummary]:
        """Per operator: plan shape and counts of invocations, bodies, grants, messages, bytes."""
        inv: dict[str, Any] = {
            r.op: r
            for r in self._all(
                select(
                    Invocation.op,
                    func.count(distinct(Invocation.invocation)).label("invocations"),
                    # PostgreSQL sums bigints to numeric (Decimal): cast back in SQL
                    cast(func.sum(Invocation.bodies), BigInteger).label("bodies"),
                    func.max(Invocation.rounds).label("rounds"),
                    func.max(Invocation.strategy).label("strategy"),
                    *(
                        cast(func.sum(getattr(Invocation, c)), BigInteger).label(c)
                        for c in _COUNTERS
                    ),
                )
                .where(Invocation.run == self.run_id)
                .group_by(Invocation.op)
            )
        }
        inv.update(_summed(self._sets()))
        plans: dict[str, list[Any]] = {}
        for p in self._all(
            select(
                OperatorPlan.op, OperatorPlan.strategy, OperatorPlan.rounds, OperatorPlan.imbalance
            )
            .where(OperatorPlan.run == self.run_id)
            .order_by(OperatorPlan.seq)
        ):
            plans.setdefault(p.op, []).append(p)
        sizes = self.trace._blob_bytes(self.run_id)
        out = {}
        for op in list(plans) + sorted(set(inv) - set(plans)):
            last = plans[op][-1] if op in plans else None
            i = inv.get(op)
            out[op] = OperatorSummary(
                op=op,
                strategy=last.strategy if last else str(i.strategy or "") if i else "",
                rounds=int(last.rounds) if last else int(i.rounds or 0) if i else 0,
                imbalance=float(last.imbalance) if last else 1.0,
                plans=len(plans.get(op, ())),
                invocations=int(i.invocations) if i else 0,
                bodies=int(i.bodies or 0) if i else 0,
                **{f: int(getattr(i, c) or 0) if i else 0 for c, f in _COUNTERS.items()},
                store_bytes=sizes.get(op, 0),
            )
        return out

    @_checked("store size")
    def store_bytes(self) -> int:
        """Bytes of this run: the whole file if it is the store's only run, else its blobs."""
        if len(self.trace.runs()) == 1:  # time-travel bytes are reported apart
            return max(self.trace.store_bytes() - self.checkpoint_bytes(), 0)
        return sum(self.trace._blob_bytes(self.run_id).values())

    @_checked("plan")
    def plan(self, op: str, invocation: int | None = None) -> Any:
        """The plan of ``op`` in force at ``invocation`` (None: the latest), as ``engine.Plan``."""
        stmt = select(OperatorPlan.__table__).where(
            OperatorPlan.run == self.run_id, OperatorPlan.op == op
        )
        if invocation is not None:
            stmt = stmt.where(OperatorPlan.first_invocation <= invocation)
        rows = self._all(stmt.order_by(OperatorPlan.plan_no.desc()).limit(1))
        if not rows:
            raise KeyError(f"run {self.run_id} has no plan for operator {op!r}")
        row = rows[0]
        where = f"table operator_plan row {row.id}"
        plan = decode_plan(row, where)
        # a plan spreads work over the run's own nodes and threads: one for more (a
        # forged row under a resealed chain) made replay's comparison fail as an
        # internal error
        if plan.nodes > self.info.ranks or plan.threads > self.info.threads:
            raise TraceFormatError(
                f"{where}: a plan for {plan.nodes} node(s) x {plan.threads} thread(s) in a "
                f"run of {self.info.ranks} x {self.info.threads}; the trace is damaged"
            )
        return plan

    @_checked("digests")
    def digest_kind(self) -> str | None:
        """The hash of this run's DDS digests (``engine.lowlevel.digest_kind_of``:
        xxh3-chunks, xxh3-128 or blake2b-128), None if it recorded none."""
        rows = self._all(select(Digest.digest).where(Digest.run == self.run_id).limit(1))
        return digest_kind_of(str(rows[0][0])) if rows else None

    @_checked("plan starts")
    def plan_starts(self, op: str) -> list[int]:
        """The invocations at which ``op`` got a new plan (the first is 0), ascending."""
        stmt = select(OperatorPlan.first_invocation).where(
            OperatorPlan.run == self.run_id, OperatorPlan.op == op
        )
        return sorted({int(r[0]) for r in self._all(stmt)})

    @_checked("invocations")
    def invocations(self, op: str | None = None, node: int | None = None) -> list[InvocationInfo]:
        """Completed invocations, by operator, invocation and node."""
        if self.info.schema >= 7:
            return [
                _node_info(r, d)
                for r, done in self._sets(op)
                for d in done
                if node is None or d.node == node
            ]
        stmt = select(Invocation.__table__).where(Invocation.run == self.run_id)
        if op is not None:
            stmt = stmt.where(Invocation.op == op)
        if node is not None:
            stmt = stmt.where(Invocation.node == node)
        stmt = stmt.order_by(Invocation.committed_at, Invocation.node)
        return [self._inv(r) for r in self._all(stmt)]

    def _inv(self, r: Any) -> InvocationInfo:
        rs = _dec(r, Invocation, "round_seconds", None)
        if rs.dtype.kind != "f":  # whole µs since 2026-12-06; float seconds before
            rs = rs / 1e6
        tt = _dec(r, Invocation, "thread_times", None)
        if len(tt) % 4:
            raise TraceFormatError(
                f"{_where(Invocation, r.id, 'thread_times')}: {len(tt)} values are not "
                "(round, thread, start, end) rows; the trace is damaged"
            )
        # a delta codec: the four columns one after another (since 2026-12-06); else rows
        columns = CODECS.get(r.thread_times_codec, (False, False))[1]
        tt = tt.reshape(4, -1).T if columns else tt.reshape(-1, 4)
        times = tuple((int(rd), int(th), a / 1e6, b / 1e6) for rd, th, a, b in tt.tolist())
        return InvocationInfo(
            op=r.op,
            invocation=r.invocation,
            node=r.node,
            seq=r.seq,
            bodies=r.bodies,
            rounds=r.rounds,
            seconds=r.seconds,
            round_seconds=tuple(rs.tolist()),
            thread_times=times,
            **{f: getattr(r, c) for c, f in _COUNTERS.items()},
            committed_at=r.committed_at,
        )

    @_checked("digests")
    def digests(self, op: str | None = None) -> list[DigestRecorded]:
        """DDS digests after each invocation."""
        stmt = select(Digest.__table__).where(Digest.run == self.run_id)
        if op is not None:
            stmt = stmt.where(Digest.op == op)
        rows = self._all(stmt.order_by(Digest.node, Digest.seq))
        return [DigestRecorded(r.node, r.seq, r.op, r.invocation, r.dds, r.digest) for r in rows]

    # ------------------------------------------------------------ time travel
    @_checked("checkpoints")
    def _checkpoint_rows(self) -> list[Any]:
        """Every node's checkpoint marker rows of the run, in program order."""
        return self._all(
            select(Checkpoint.__table__)
            .where(Checkpoint.run == self.run_id)
            .order_by(Checkpoint.step, Checkpoint.node)
        )

    def checkpoints(self) -> list[CheckpointInfo]:
        """Checkpoints every node of the run completed, in program order."""
        rows = self._checkpoint_rows()
        nodes = max(int(self.info.ranks), 1)
        by: dict[tuple[str, int], list[Any]] = {}
        for r in rows:
            by.setdefault((r.op, int(r.invocation)), []).append(r)
        out = []
        for (op, inv), rs in by.items():
            if len({int(r.node) for r in rs}) < nodes:
                continue  # a node died before writing its part
            refused: dict[str, str] = {}
            for r in rs:
                try:
                    for dds, why in json.loads(r.refused or "[]"):
                        refused[str(dds)] = str(why)
                except (ValueError, TypeError):
                    raise TraceFormatError(
                        f"{_where(Checkpoint, r.id, 'refused')}: not a list of pairs; "
                        "the trace is damaged"
                    ) from None
            out.append(
                CheckpointInfo(
                    op,
                    inv,
                    int(rs[0].step),
                    sum(int(r.nbytes) for r in rs),
                    tuple(sorted(refused.items())),
                    max(float(r.seconds or 0.0) for r in rs),
                )
            )
        return sorted(out, key=lambda c: c.step)

    def phase_times(self, limit: int) -> list[PhaseTime]:
        """At most ``limit`` phases the nodes recorded outside their rounds (planning,
        reconnaissance, digests), in the order written.  None for a trace written
        before the ``phase`` table existed.  The table is not chained and only serves
        timelines, so a row that makes no sense (an unknown kind, a time that is not a
        finite number, a negative length) is left out instead of refusing the trace."""
        if limit > 0 and self.info.schema >= 7:
            return self._phase_sets(limit)
        if limit <= 0 or not self.trace.has_table(Phase.__tablename__):
            return []
        cols = (Phase.op, Phase.invocation, Phase.node, Phase.kind, Phase.started_at)
        stmt = select(*cols, Phase.seconds).where(Phase.run == self.run_id)
        try:
            rows = self._all(stmt.order_by(Phase.id).limit(limit), check=False)
        except TraceFormatError:
            return []  # a damaged hint: the timeline goes without it
        out = []
        for r in rows:
            try:
                p = PhaseTime(str(r[0]), int(r[1]), int(r[2]), str(r[3]), float(r[4]), float(r[5]))
            except (TypeError, ValueError, OverflowError):
                continue
            if (
                p.kind in PHASE_KINDS
                and math.isfinite(p.started_at)
                and math.isfinite(p.seconds)
                and p.seconds >= 0
            ):
                out.append(p)
        return out

    def _phase_sets(self, limit: int) -> list[PhaseTime]:
        """Schema 7's ``phase_set`` rows, a :class:`PhaseTime` per node (a damaged row is
        left out, as ``phase_times`` leaves out a damaged ``phase`` row)."""
        cols = (PhaseSet.id, PhaseSet.op, PhaseSet.invocation, PhaseSet.kind, PhaseSet.n_nodes)
        stmt = select(*cols, PhaseSet.started_at, PhaseSet.times, PhaseSet.times_codec)
        stmt = stmt.where(PhaseSet.run == self.run_id).order_by(PhaseSet.id).limit(limit)
        try:
            rows = self._all(stmt, check=False)
        except TraceFormatError:
            return []
        out: list[PhaseTime] = []
        for r in rows:
            try:
                if not isinstance(r.started_at, float) or not math.isfinite(r.started_at):
                    continue
                times = decode_phase(r)
                got = [
                    PhaseTime(str(r.op), int(r.invocation), n, str(r.kind), t, sec)
                    for n, t, sec in times
                ]
            except (TraceFormatError, TypeError, ValueError, OverflowError):
                continue
            out += [p for p in got if p.kind in PHASE_KINDS]
        return out[:limit]

    @_checked("checkpoints")
    def checkpoint_times(self) -> list[tuple[str, int, int, float, int]]:
        """``(op, invocation, node, seconds, bytes)`` of each node's checkpoint, as recorded
        (seconds: encoding and writing it; a value that is not a finite non-negative
        number reads as 0)."""
        out = []
        for r in self._checkpoint_rows():
            sec = float(r.seconds or 0.0)
            sec = sec if math.isfinite(sec) and sec >= 0 else 0.0
            out.append((str(r.op), int(r.invocation), int(r.node), sec, int(r.nbytes)))
        return out

    @_checked("checkpoint")
    def checkpoint_state(self, op: str, invocation: int) -> CheckpointState:
        """Every node's rows of the checkpoint at the end of ``op``#``invocation``."""
        marks = self._all(
            select(Checkpoint.__table__).where(
                Checkpoint.run == self.run_id,
                Checkpoint.op == op,
                Checkpoint.invocation == invocation,
            )
        )
        if not marks:
            raise KeyError(f"run {self.run_id} has no checkpoint at {op}#{invocation}")
        counters: dict[int, dict[str, Any]] = {}
        for m in marks:
            try:
                c = json.loads(m.counters or "{}")
                recv = {str(k): int(v) for k, v in dict(c.get("recv", {})).items()}
                counters[int(m.node)] = {"recv": recv, "sent": int(c.get("sent", 0))}
            except (ValueError, TypeError, AttributeError):
                raise TraceFormatError(
                    f"{_where(Checkpoint, m.id, 'counters')}: not message counters; "
                    "the trace is damaged"
                ) from None
        blocks = self._all(
            select(CheckpointBlock.__table__)
            .where(
                CheckpointBlock.run == self.run_id,
                CheckpointBlock.op == op,
                CheckpointBlock.invocation == invocation,
            )
            .order_by(CheckpointBlock.node, CheckpointBlock.id)
        )
        parts: dict[str, list[tuple[np.ndarray, Any]]] = {}
        lengths: dict[str, int] = {}
        for b in blocks:
            slots = _dec(b, CheckpointBlock, "slots", int(b.count))
            if b.kind == "array":
                try:
                    shape = json.loads(b.shape)
                except ValueError:
                    shape = None
                vals: Any = decode_array(
                    b.values,
                    b.values_codec,
                    b.dtype,
                    shape,
                    int(b.count),
                    _where(CheckpointBlock, b.id, "values"),
                )
            elif b.kind == "plain":
                vals = decode_plain(
                    b.values, b.values_codec, _where(CheckpointBlock, b.id, "values")
                )
                if not isinstance(vals, list) or len(vals) != int(b.count):
                    raise TraceFormatError(
                        f"{_where(CheckpointBlock, b.id, 'values')}: not {b.count} values; "
                        "the trace is damaged"
                    )
            else:
                raise TraceFormatError(
                    f"{_where(CheckpointBlock, b.id, 'kind')}: unknown kind {b.kind!r}; "
                    "the trace is damaged"
                )
            if len(slots) and (int(slots.min()) < 0 or int(slots.max()) >= int(b.length)):
                raise TraceFormatError(
                    f"{_where(CheckpointBlock, b.id, 'slots')}: a slot outside the DDS's "
                    f"{b.length} elements; the trace is damaged"
                )
            parts.setdefault(b.dds, []).append((slots, vals))
            lengths[b.dds] = int(b.length)
        rows: dict[str, tuple[np.ndarray, Any]] = {}
        for dds, ps in parts.items():
            slots = np.concatenate([p[0] for p in ps])
            if isinstance(ps[0][1], np.ndarray):
                rows[dds] = (slots, np.concatenate([p[1] for p in ps]))
            else:
                rows[dds] = (slots, [v for p in ps for v in p[1]])
        return CheckpointState(op, invocation, rows, lengths, counters)

    @_checked("collective values")
    def collective_values(self) -> list[CollectiveRecorded]:
        """The values the driver got from collective calls, by call number."""
        rows = self._all(
            select(CollectiveValue.__table__)
            .where(CollectiveValue.run == self.run_id)
            .order_by(CollectiveValue.k)
        )
        out = []
        for r in rows:
            w = _where(CollectiveValue, r.id, "data")
            value: Any = None
            if r.encoding == "array":
                try:
                    shape = [int(x) for x in json.loads(r.shape)]
                except (ValueError, TypeError):
                    raise TraceFormatError(f"{w}: bad shape; the trace is damaged") from None
                if not shape:
                    value = decode_array(r.data, r.data_codec, r.dtype, [], 1, w).reshape(())
                else:
                    value = decode_array(r.data, r.data_codec, r.dtype, shape[1:], shape[0], w)
            elif r.encoding == "plain":
                value = decode_plain(r.data, r.data_codec, w)
            elif r.encoding != "refused":
                raise TraceFormatError(
                    f"{w}: unknown encoding {r.encoding!r}; the trace is damaged"
                )
            out.append(CollectiveRecorded(int(r.k), r.kind, r.encoding, value, r.detail or ""))
        return out

    @_checked("checkpoint size")
    def checkpoint_bytes(self) -> int:
        """Blob bytes of this run's checkpoints and collective values (apart from the
        trace's own bytes: they do not count against the bytes-per-body budget)."""
        total = 0
        for model, cols in CHECKPOINT_BLOB_COLUMNS.items():
            for c in cols:
                stmt = select(func.sum(func.length(getattr(model, c)))).where(
                    model.run == self.run_id
                )
                total += int(self._all(stmt)[0][0] or 0)
        return total

    @_checked("objectives")
    def objectives(self) -> dict[str, list[float]]:
        """Objective values per name, by iteration."""
        rows = self._all(
            select(Objective.name, Objective.value)
            .where(Objective.run == self.run_id)
            .order_by(Objective.seq)
        )
        out: dict[str, list[float]] = {}
        for name, value in rows:  # NULL: a NaN the store could not keep as a REAL
            out.setdefault(name, []).append(math.nan if value is None else float(value))
        return out

    @_checked("verdicts")
    def verdicts(self, *, strict: bool = True) -> list[VerdictInfo]:
        """Replay and dual-test verdicts recorded about this run, oldest first.

        ``strict=False``: a row that cannot be decoded comes back with ``error`` set (kind
        ``"?"``, failed, empty detail) instead of raising :class:`TraceFormatError`.
        """
        rows = self._all(  # _verdict checks each row, so one bad row need not spoil the rest
            select(Verdict.__table__).where(Verdict.run == self.run_id).order_by(Verdict.id),
            check=False,
        )
        out = []
        for v in rows:
            try:
                out.append(_verdict(v))
            except TraceFormatError as exc:
                if strict:
                    raise
                out.append(VerdictInfo(v.id, self.run_id, "?", False, {}, 0.0, str(exc)))
        out.sort(key=lambda v: v.created_at)
        return out

    # ------------------------------------------------------------ bulk arrays
    @_checked("lock grants")
    def lock_grants(self, op: str, invocation: int, node: int) -> LockGrantArrays:
        """Lock grants of ``node`` in one invocation (one query, every round)."""
        stmt = select(LockGrantBlock.__table__).where(
            LockGrantBlock.run == self.run_id,
            LockGrantBlock.op == op,
            LockGrantBlock.invocation == invocation,
            LockGrantBlock.node == node,
        )
        return _grant_arrays(self._all(stmt.order_by(LockGrantBlock.first_seq)))

    @_checked("lock grants and messages")
    def schedule_window(
        self, op: str, first: int, stop: int
    ) -> tuple[dict[tuple[int, int], LockGrantArrays], dict[tuple[int, int], MessageArrays]]:
        """Lock grants and messages of invocations ``first`` to ``stop - 1`` of ``op``, by
        (invocation, node): what :meth:`lock_grants` and :meth:`messages` give for each,
        in two queries instead of two per invocation and node (a replay reads ahead)."""
        out = []
        for model in (LockGrantBlock, MessageBlock):
            stmt = select(model.__table__).where(
                model.run == self.run_id,
                model.op == op,
                model.invocation >= first,
                model.invocation < stop,
            )
            rows = self._all(stmt.order_by(model.invocation, model.node, model.first_seq))
            out.append({k: list(g) for k, g in itertools.groupby(rows, _invocation_node)})
        grants = {k: _grant_arrays(rs) for k, rs in out[0].items()}
        return grants, {k: self._message_arrays(rs) for k, rs in out[1].items()}

    @_checked("mutex grants")
    def mutex_grants(self, op: str, invocation: int, node: int) -> MutexGrantArrays:
        """Node-mutex grants of a hybrid ``sync_for`` on ``node`` in one invocation."""
        return MutexGrantArrays(*self._per_value(MutexGrantBlock, op, invocation, node))

    def _per_value(self, model: Any, op: str, invocation: int, node: int) -> list[np.ndarray]:
        """(seq, header columns..., value arrays...) of the per-value events of one block kind."""
        stmt = select(model.__table__).where(
            model.run == self.run_id,
            model.op == op,
            model.invocation == invocation,
            model.node == node,
        )
        parts = [_stream.expand(model, r) for r in self._all(stmt.order_by(model.first_seq))]
        spec = CALL_BLOCKS[model]
        if not parts:
            return [np.empty(0, np.int64)] * (1 + len(spec.header) + len(spec.values))
        return [np.concatenate(col) for col in zip(*parts, strict=True)]

    @_checked("aggregations")
    def aggregations(
        self, op: str | None = None, invocation: int | None = None, node: int | None = None
    ) -> list[DeltasAggregated]:
        """``sync_for`` delta arrival orders, per node in sequence order."""
        kinds = [DeltasAggregated]
        return list(_stream.events(self, node, op, invocation, kinds))  # type: ignore[arg-type]

    @_checked("visibility records")
    def visibility(
        self, op: str | None = None, invocation: int | None = None, node: int | None = None
    ) -> list[UpdatesApplied]:
        """SSP ``sync_for``: the updates each node had applied before each clock."""
        kinds = [UpdatesApplied]
        return list(_stream.events(self, node, op, invocation, kinds))  # type: ignore[arg-type]

    @_checked("messages")
    def messages(
        self, node: int, op: str | None = None, invocation: int | None = None
    ) -> MessageArrays:
        """Messages received by ``node`` (optionally during one operator or invocation)."""
        stmt = select(MessageBlock.__table__).where(
            MessageBlock.run == self.run_id, MessageBlock.node == node
        )
        if op is not None:
            stmt = stmt.where(MessageBlock.op == op)
        if invocation is not None:
            stmt = stmt.where(MessageBlock.invocation == invocation)
        return self._message_arrays(self._all(stmt.order_by(MessageBlock.first_seq)))

    @_checked("routed arrivals")
    def routed(self, op: str | None = None, invocation: int | None = None) -> list[RoutedCounts]:
        """Schema 7: per node and invocation, the routed write-backs it received, per
        sender exchange number (how many, their payload bytes); each one's source is
        not recorded (empty for runs before schema 7, whose ``messages`` hold them)."""
        out = []
        for r, done in self._sets(op):
            if invocation is not None and r.invocation != invocation:
                continue
            for d in done:
                if len(d.routed):
                    a = np.asarray(d.routed, np.int64).reshape(-1, 3)
                    out.append(
                        RoutedCounts(r.op, int(r.invocation), d.node, a[:, 0], a[:, 1], a[:, 2])
                    )
        return out

    def _message_arrays(self, rows: list[Any]) -> MessageArrays:
        parts = [self._msg_arrays(r) for r in rows]
        if not parts:
            e = np.empty(0, np.int64)
            return MessageArrays(e, np.empty(0, dtype=str), e, e, e)
        cols = [np.concatenate(c) for c in zip(*parts, strict=True)]
        order = np.argsort(cols[0], kind="stable")
        return MessageArrays(*(c[order] for c in cols))

    def _msg_arrays(self, r: Any) -> tuple[np.ndarray, ...]:
        if not isinstance(r.count, int) or r.count < 0 or not isinstance(r.channel, str):
            raise TraceFormatError(
                f"{_where(MessageBlock, r.id, 'count')}: bad count or channel; the trace is damaged"
            )
        cols = [_dec(r, MessageBlock, c, r.count) for c in ("seqs", "sources", "source_seqs")]
        nb = _dec(r, MessageBlock, "nbytes", r.count)
        for name, col in (
            ("seqs", cols[0]),
            ("sources", cols[1]),
            ("source_seqs", cols[2]),
            ("nbytes", nb),
        ):
            if len(col) and col.min() < 0:
                raise TraceFormatError(
                    f"{_where(MessageBlock, r.id, name)}: negative value; the trace is damaged"
                )
        return (cols[0], np.full(r.count, r.channel), cols[1], cols[2], nb)

    @_checked("events")
    def events(
        self,
        node: int | None = None,
        op: str | None = None,
        invocation: int | None = None,
        kinds: Iterable[type | str] | None = None,
    ) -> Iterator[Event]:
        """Events in per-node sequence order (node by node), decoded lazily.

        ``kinds``: event classes or their names; ``op``/``invocation`` keep the events
        of that operator invocation (objectives and the run's end belong to none).
        """
        return _stream.events(self, node, op, invocation, kinds)


__all__ = [
    "InvocationInfo",
    "LockGrantArrays",
    "MessageArrays",
    "MutexGrantArrays",
    "OperatorSummary",
    "RoutedCounts",
    "RunTrace",
    "VerdictInfo",
]
