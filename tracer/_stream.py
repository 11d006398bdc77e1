"""Events of a run in per-node sequence order, decoded one invocation at a time.

Single events (plans, completions, digests, objectives, the end) are few and are read
at once; bulk events (lock grants, messages, index-order deviations) live in blocks,
one per kind and commit.  Blocks of one commit interleave by sequence number, and
commits follow each other, so a node's stream is a merge of commit-sized merges.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from itertools import groupby
from typing import TYPE_CHECKING, Any

import numpy as np
from sqlalchemy import func, select

from ._codec import decode_column as _dec
from ._codec import decode_lines
from ._codec import where as _where
from ._errors import TraceFormatError
from ._events import (
    EVENT_TYPES,
    DeltasAggregated,
    DigestRecorded,
    Event,
    IndexOrderDeviated,
    InvocationCompleted,
    LockGranted,
    MessageReceived,
    MutexGranted,
    ObjectiveLogged,
    PlanMade,
    RunEnded,
    UpdatesApplied,
)
from ._schema import (
    CALL_BLOCKS,
    AggregationBlock,
    Digest,
    IndexOrderBlock,
    Invocation,
    LockGrantBlock,
    MessageBlock,
    MutexGrantBlock,
    Objective,
    OperatorPlan,
    Run,
    VisibilityBlock,
)

if TYPE_CHECKING:
    from ._run import RunTrace


def _kind_set(kinds: Iterable[type | str] | None) -> set[type]:
    if kinds is None:
        return set(EVENT_TYPES)
    by_name = {k.__name__: k for k in EVENT_TYPES}
    out = set()
    for k in kinds:
        cls = by_name.get(k) if isinstance(k, str) else k if k in EVENT_TYPES else None
        if cls is None:
            raise ValueError(f"unknown event kind {k!r}; known: {', '.join(sorted(by_name))}")
        out.add(cls)
    return out


def events(
    run: RunTrace,
    node: int | None = None,
    op: str | None = None,
    invocation: int | None = None,
    kinds: Iterable[type | str] | None = None,
) -> Iterator[Event]:
    """Events in per-node sequence order (node by node), decoded lazily."""
    want = _kind_set(kinds)
    for n in [node] if node is not None else run.nodes():
        few = singles(run, n, op, invocation, want)
        merged = heapq.merge(few, bulk(run, n, op, invocation, want), key=lambda t: t[0])
        yield from (ev for _, ev in merged)


def singles(
    run: RunTrace, node: int, op: str | None, invocation: int | None, want: set[type]
) -> list[tuple[int, Event]]:
    """(seq, event) of the few non-bulk events of ``node``, sorted."""
    out: list[tuple[int, Event]] = []

    def filt(stmt: Any, model: Any) -> Any:
        stmt = stmt.where(model.run == run.run_id, model.node == node)
        if op is not None:
            stmt = stmt.where(model.op == op)
        if invocation is not None:
            col = model.first_invocation if model is OperatorPlan else model.invocation
            stmt = stmt.where(col == invocation)
        return stmt

    if PlanMade in want:
        pcols = (OperatorPlan.seq, OperatorPlan.op, OperatorPlan.plan_no, OperatorPlan.strategy)
        for r in run._all(filt(select(*pcols, OperatorPlan.rounds, OperatorPlan.n), OperatorPlan)):
            out.append((r.seq, PlanMade(node, r.seq, r.op, r.plan_no, r.strategy, r.rounds, r.n)))
    if InvocationCompleted in want and run.info.schema >= 7:
        for i in run.invocations(op, node):
            if invocation is None or i.invocation == invocation:
                ev = InvocationCompleted(
                    node, i.seq, i.op, i.invocation, i.bodies, i.rounds, i.seconds
                )
                out.append((i.seq, ev))
    elif InvocationCompleted in want:
        cols = (Invocation.seq, Invocation.op, Invocation.invocation, Invocation.bodies)
        for r in run._all(filt(select(*cols, Invocation.rounds, Invocation.seconds), Invocation)):
            ev = InvocationCompleted(node, r.seq, r.op, r.invocation, r.bodies, r.rounds, r.seconds)
            out.append((r.seq, ev))
    if DigestRecorded in want:
        for r in run._all(filt(select(Digest.__table__), Digest)):
            out.append((r.seq, DigestRecorded(node, r.seq, r.op, r.invocation, r.dds, r.digest)))
    if op is None and invocation is None:
        if ObjectiveLogged in want:
            stmt = select(Objective.__table__).where(
                Objective.run == run.run_id, Objective.node == node
            )
            for r in run._all(stmt):
                out.append((r.seq, ObjectiveLogged(node, r.seq, r.name, r.iteration, r.value)))
        if RunEnded in want:
            out += end_event(run, node)
    out.sort(key=lambda t: t[0])
    return out


def end_event(run: RunTrace, node: int) -> list[tuple[int, Event]]:
    """The run's end on ``node``: recorded by the closing rank, or inferred after a crash."""
    row = run._all(select(Run.__table__).where(Run.run_id == run.run_id))[0]
    status = run.info.status
    if row.end_seq is not None:
        if row.end_node != node:
            return []
        return [(row.end_seq, RunEnded(node, row.end_seq, status, row.error))]
    if status == "running" or node != min(run.nodes(), default=node):
        return []
    last = max(last_seqs(run, node), default=-1)
    return [(last + 1, RunEnded(node, last + 1, status, row.error))]


def last_seqs(run: RunTrace, node: int) -> list[int]:
    """The largest recorded seq of ``node`` in each table of single events."""
    out = [i.seq for i in run.invocations(node=node)] if run.info.schema >= 7 else []
    for m in (Invocation, Digest, Objective, OperatorPlan):
        (v,) = run._all(select(func.max(m.seq)).where(m.run == run.run_id, m.node == node))[0]
        if v is not None:
            out.append(int(v))
    return out


#: The event class of each bulk table.
BLOCK_EVENTS: dict[Any, type] = {
    MessageBlock: MessageReceived,
    LockGrantBlock: LockGranted,
    IndexOrderBlock: IndexOrderDeviated,
    AggregationBlock: DeltasAggregated,
    VisibilityBlock: UpdatesApplied,
    MutexGrantBlock: MutexGranted,
}


def bulk(
    run: RunTrace, node: int, op: str | None, invocation: int | None, want: set[type]
) -> Iterator[tuple[int, Event]]:
    """Bulk events of ``node``, one invocation's blocks at a time."""
    heads: list[tuple[int, str, int, int, Any]] = []
    for model, cls in BLOCK_EVENTS.items():
        if cls not in want:
            continue
        stmt = select(model.id, model.op, model.invocation, model.first_seq)
        stmt = stmt.where(model.run == run.run_id, model.node == node)
        if op is not None:
            stmt = stmt.where(model.op == op)
        if invocation is not None:
            stmt = stmt.where(model.invocation == invocation)
        heads += [(r[0], r[1], r[2], r[3], model) for r in run._all(stmt)]
    # blocks of one commit interleave; commits follow each other in sequence order
    first: dict[tuple[str, int], int] = {}
    for h in heads:
        first[(h[1], h[2])] = min(first.get((h[1], h[2]), h[3]), h[3])
    heads.sort(key=lambda h: (first[(h[1], h[2])], h[3]))
    for _, group in groupby(heads, key=lambda h: (h[1], h[2])):
        gens = [block_events(run, node, h[4], h[0]) for h in group]
        yield from heapq.merge(*gens, key=lambda t: t[0])


def decode_calls(model: Any, r: Any) -> tuple[np.ndarray, list[np.ndarray]]:
    """The checked ``calls`` table (n_calls x width) and value arrays of a call block."""
    spec = CALL_BLOCKS[model]
    calls = _dec(r, model, "calls", r.n_calls * spec.width).reshape(r.n_calls, spec.width)
    lens = calls[:, -1]
    want = r.n_values if spec.per_value else r.n_calls
    # summed as Python ints: int64 wraps round, and counts of 2**62 that summed to 0 made
    # np.repeat in ``expand`` kill the reader with a segmentation fault
    if lens.min(initial=0) < 0 or sum(lens.tolist()) != r.n_values or r.count != want:
        raise TraceFormatError(
            f"{_where(model, r.id, 'calls')}: call lengths do not add up; the trace is damaged"
        )
    return calls, [_dec(r, model, c, r.n_values) for c in spec.values]


def element_names(r: Any) -> list[str]:
    """The element names of a lock-grant block row, one per deviation."""
    return decode_lines(
        r.elements, r.elements_codec, r.n_values // 2, _where(LockGrantBlock, r.id, "elements")
    )


def expand(model: Any, r: Any) -> list[np.ndarray]:
    """Per-value events of a block: [seq, header columns..., value arrays...]."""
    calls, values = decode_calls(model, r)
    counts = calls[:, -1]
    starts = np.cumsum(counts) - counts
    seq = np.repeat(calls[:, -2], counts) + np.arange(r.n_values) - np.repeat(starts, counts)
    headers = [np.repeat(calls[:, k], counts) for k in range(calls.shape[1] - 2)]
    return [seq, *headers, *values]


def block_events(run: RunTrace, node: int, model: Any, row_id: int) -> Iterator[tuple[int, Event]]:
    """(seq, event) of one block, in sequence order."""
    (r,) = run._all(select(model.__table__).where(model.id == row_id))
    cls = BLOCK_EVENTS[model]
    if model is MessageBlock:
        seq, _, src, sseq, nb = run._msg_arrays(r)
        for s, a, b, c in zip(seq.tolist(), src.tolist(), sseq.tolist(), nb.tolist(), strict=True):
            yield s, MessageReceived(node, s, r.channel, a, b, c)
    elif CALL_BLOCKS[model].per_value:
        cols = [a.tolist() for a in expand(model, r)]
        for row in zip(*cols, strict=True):
            yield row[0], cls(node, row[0], r.op, r.invocation, *row[1:])
    else:
        calls, (flat,) = decode_calls(model, r)
        names = element_names(r) if model is LockGrantBlock else []
        off = 0
        for *header, s, length in calls.tolist():
            vals = tuple(flat[off : off + length].tolist())
            more: tuple[tuple[str, ...], ...] = ()
            if model is LockGrantBlock:  # (position, thread) pairs: one name per pair
                more = (tuple(names[off // 2 : (off + length) // 2]),)
            off += length
            yield s, cls(node, s, r.op, r.invocation, *header, vals, *more)


__all__ = ["BLOCK_EVENTS", "decode_calls", "element_names", "events", "expand"]
