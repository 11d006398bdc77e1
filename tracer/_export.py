"""Export a run as Chrome trace-event JSON (opens in Perfetto and chrome://tracing).

One process per node (pid = node).  Each node has its own track (``NODE_TID``) and
one track per worker thread (tid = thread):

* node track: a slice per operator invocation with nested slices per round
  (``async_for``) or clock (``sync_for``, with its bodies, delta order and SSP
  visibility), an instant per received message, and a flow arrow (``s``/``f``) from
  the sender's round to each receive;
* thread tracks: per round a slice from the thread's recorded start and end of its task
  groups (``"timed": "recorded"``; traces without them: scaled by the thread's share of
  the round's bodies in the plan), nested slices per task group sharing that time by
  bodies, and an instant per lock hand-over naming the DDS element the thread took
  over (``lock W[943]``) and the loop index whose body took it; per ``sync_for`` clock
  a slice naming the thread's minibatches, and an instant per hybrid node-mutex grant;
* node track, around each invocation: a slice per phase the node recorded outside its
  rounds (``reconnaissance``, ``planning`` before them, ``digests`` after them; from the
  ``phase`` table, absent from traces written before it);
* a checkpoint track per node: a slice per checkpoint, after its invocation;
* a counter track per logged objective.

The trace records order, and time only per round and per thread: round/clock durations
and each thread's task-group span as each node measured them, and the per-node sequence
of events, but no timestamp per lock grant or message.  Such events are placed by
recorded order inside their task group (or round) and say so in their args
(``"placed": "by order"``); messages are placed by their sequence number among those
events.  A send is not recorded at all: its flow starts in the
sender's slice of the round the receiver was in, as late as possible but not after
the receive.  Invocations start together on every node (the earliest start any node
measured).  Times are microseconds from the start of the run.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.lowlevel import write_file

from ._events import ObjectiveLogged
from ._read import Trace
from ._run import InvocationInfo, PhaseTime, RoutedCounts, RunTrace

#: How a schema-7 trace's routed write-backs are drawn (``args.placed`` of each instant).
ROUTED_PLACEMENT = "after the round of its exchange number"
#: What the export says of them (``otherData.routed``): coarser than a schema-6 trace.
ROUTED_NOTE = (
    "schema 7 records routed write-backs as per-node, per-exchange message counts and "
    "bytes: one instant per exchange, after its round, and no arrow from the sender "
    "(their sources and arrival order are not recorded: the routes fix both)"
)

#: tid of each node's own track (worker threads are 0..T-1).
NODE_TID = 1_000_000
#: tid of each node's checkpoint track (time travel), beside its own.
CHECKPOINT_TID = NODE_TID + 1

#: A (round, thread) with more task groups than this gets one slice for all of them:
#: connected-component plans can have thousands of tiny groups (file size vs detail).
MAX_TASK_SLICES = 200

#: Shortest slice drawn for a round or clock, in µs: a flow binds to the slice
#: *enclosing* its timestamp, so a slice must have an inside (rounds can measure 0 s).
MIN_ROUND_US = 1.0

#: Phases drawn before an invocation's rounds, in the order they run (digests come after).
PRE_PHASES = ("reconnaissance", "planning")

#: Most times one node's invocation is planned (reconnaissance and planning): before it,
#: and again after the plan guard undid that attempt.  More rows are not drawn.
PLANNINGS_PER_INVOCATION = 2

#: Most phase rows one node's invocation can hold (its plannings' and its digests); a
#: trace with more is not trusted to bound the export's work.
PHASES_PER_INVOCATION = len(PRE_PHASES) * PLANNINGS_PER_INVOCATION + 1

#: Longest phase slice drawn, in seconds: the phase table is not chained, so an absurd
#: recorded length is cut to this instead of stretching the timeline without end.
MAX_PHASE_S = 7 * 24 * 3600.0

_ORDER = "by order"  # the args value of events whose position is order, not time


@dataclass(frozen=True, slots=True)
class _Span:
    """Where one node's invocation sits on the timeline (µs)."""

    start: float
    rounds: tuple[tuple[float, float], ...]  # (start, duration) per round or clock

    @property
    def end(self) -> float:
        s, d = self.rounds[-1]
        return s + d

    def inside(self, r: int, ts: float) -> float:
        """``ts`` moved strictly inside round ``r`` (where a flow can bind)."""
        s, d = self.rounds[min(max(r, 0), len(self.rounds) - 1)]
        eps = min(0.25, d / 4)
        return min(max(ts, s + eps), s + d - eps)


def _phases(run: RunTrace, invocations: int) -> dict[tuple[str, int, int, str], list[PhaseTime]]:
    """The recorded phases of each kind per node's invocation, in the order written (an
    invocation the plan guard re-planned has two of reconnaissance and planning, one of
    digests), reading at most :data:`PHASES_PER_INVOCATION` rows per invocation row."""
    out: dict[tuple[str, int, int, str], list[PhaseTime]] = {}
    for p in run.phase_times(invocations * PHASES_PER_INVOCATION):
        kept = out.setdefault((p.op, p.invocation, p.node, p.kind), [])
        if len(kept) < (PLANNINGS_PER_INVOCATION if p.kind in PRE_PHASES else 1):
            kept.append(p)
    return out


def _spread(start: float, dur: float, n: int) -> np.ndarray:
    """``n`` points spread evenly over ``[start, start + dur]``, one per equal share."""
    return start + (np.arange(n) + 0.5) * (dur / max(n, 1))


class _Builder:
    """Collects the events of one run."""

    def __init__(self, run: RunTrace) -> None:
        self.run = run
        self.events: list[dict[str, Any]] = []
        self.threads: dict[int, set[int]] = defaultdict(set)
        self.nodes = max(len(run.nodes()), 1)
        self.flow_id = 0
        self.plans: dict[tuple[str, int], Any] = {}
        self.minibatches: dict[tuple[str, int, int], dict[int, dict[int, list[int]]]] = {}

    def slice(
        self, name: str, cat: str, pid: int, tid: int, ts: float, dur: float, args: dict[str, Any]
    ) -> None:
        if tid != NODE_TID:
            self.threads[pid].add(tid)
        self.events.append(
            {
                "name": name,
                "cat": cat,
                "ph": "X",
                "ts": round(ts, 3),
                # rounding the end, not the duration, keeps nested slices inside their parent
                "dur": round(max(round(ts + dur, 3) - round(ts, 3), 0.0), 3),
                "pid": pid,
                "tid": tid,
                "args": args,
            }
        )

    def instant(
        self, name: str, cat: str, pid: int, tid: int, ts: float, args: dict[str, Any]
    ) -> None:
        if tid != NODE_TID:
            self.threads[pid].add(tid)
        ev = {"name": name, "cat": cat, "ph": "i", "s": "t", "ts": round(ts, 3)}
        self.events.append({**ev, "pid": pid, "tid": tid, "args": args})

    # ------------------------------------------------------------ phases
    def phase(self, p: PhaseTime, ts: float, attempt: int = 1) -> float:
        """A slice for phase ``p`` at ``ts`` on its node's track; returns where it ends.
        ``attempt`` 2 is the re-planning after the plan guard undid the first attempt."""
        dur = max(min(p.seconds, MAX_PHASE_S) * 1e6, MIN_ROUND_US)
        name = f"{p.kind} {p.op}#{p.invocation}" + (" (re-plan)" if attempt > 1 else "")
        args: dict[str, Any] = {"op": p.op, "invocation": p.invocation, "seconds": p.seconds}
        if attempt > 1:
            args["attempt"] = attempt
        self.slice(name, "phase", p.node, NODE_TID, ts, dur, args)
        return ts + dur

    # ------------------------------------------------------------ invocations
    def invocation(self, i: InvocationInfo, span: _Span, plan: Any) -> np.ndarray:
        """Slices and grants of one node's invocation; returns its anchors (seq, ts, round)."""
        sync = plan is None
        self.slice(
            f"{i.op}#{i.invocation}",
            "invocation",
            i.node,
            NODE_TID,
            span.start,
            span.end - span.start,
            {
                "op": i.op,
                "invocation": i.invocation,
                "kind": "sync_for" if sync else "async_for",
                "strategy": getattr(plan, "strategy", ""),
                "bodies": i.bodies,
                "rounds": i.rounds,
                "seconds": i.seconds,
                "lock_grants": i.lock_grants,
                "messages": i.messages,
            },
        )
        if sync:
            return self._sync(i, span)
        anchors = self._grants(i, span, plan)
        for r, (s, d) in enumerate(span.rounds):
            loads = _thread_tasks(plan, r, i.node)
            bodies = sum(len(t.indices) for ts in loads.values() for t in ts)
            tasks = sum(len(ts) for ts in loads.values())
            args = {"op": i.op, "invocation": i.invocation, "round": r, "bodies": bodies}
            self.slice(f"round {r}", "round", i.node, NODE_TID, s, d, {**args, "tasks": tasks})
        return anchors

    def _thread_slices(
        self, i: InvocationInfo, span: _Span, plan: Any
    ) -> dict[tuple[int, int], list[tuple[float, float, Any]]]:
        """Round and task-group slices of every thread; (round, thread) → task spans."""
        out: dict[tuple[int, int], list[tuple[float, float, Any]]] = {}
        recorded = {(rd, th): (a * 1e6, b * 1e6) for rd, th, a, b in i.thread_times}
        for r, (s0, d0) in enumerate(span.rounds):
            loads = _thread_tasks(plan, r, i.node)
            if not loads:  # no plan for this round: one slice on thread 0
                loads = {0: []}
            busiest = max((sum(len(t.indices) for t in ts) for ts in loads.values()), default=0)
            k = 0
            for thread, tasks in sorted(loads.items()):
                bodies = sum(len(t.indices) for t in tasks)
                s, dur = s0, d0 * (bodies / busiest if busiest and bodies else 1.0)
                timed = "by plan share"
                if (r, thread) in recorded:  # inside the round even if clocks disagree
                    a, b = recorded[(r, thread)]
                    s = s0 + min(max(a, 0.0), d0)
                    dur = min(max(b - a, 0.0), s0 + d0 - s)
                    timed = "recorded"
                args = {
                    "op": i.op,
                    "invocation": i.invocation,
                    "round": r,
                    "bodies": bodies,
                    "tasks": len(tasks),
                    "locked": any(t.locked for t in tasks),
                    "timed": timed,
                }
                self.slice(
                    f"{i.op}#{i.invocation} round {r}", "round", i.node, thread, s, dur, args
                )
                spans: list[tuple[float, float, Any]] = []
                if len(tasks) > MAX_TASK_SLICES:
                    name = f"{len(tasks)} task groups"
                    self.slice(name, "task", i.node, thread, s, dur, {"bodies": bodies})
                    spans.append((s, dur, None))
                else:
                    at = s
                    for t in tasks:
                        td = dur * len(t.indices) / bodies if bodies else 0.0
                        td = min(td, s + dur - at)  # float error must not leave the parent
                        args = {
                            "group": k,
                            "bodies": len(t.indices),
                            "locked": bool(t.locked),
                            "first_index": int(t.indices[0]) if len(t.indices) else None,
                        }
                        self.slice(f"group {k}", "task", i.node, thread, at, td, args)
                        spans.append((at, td, t))
                        at += td
                        k += 1
                if not tasks:
                    spans.append((s, dur, None))
                out[(r, thread)] = spans
        return out

    def _grants(self, i: InvocationInfo, span: _Span, plan: Any) -> np.ndarray:
        """Thread slices and lock hand-over instants; anchors (seq, ts, round) of the
        rounds' grant records.

        A trace keeps each round's lock-ticket order as its deviations from a predicted
        order (where another thread took over), each with the element lock it took over,
        not every per-lock grant (that would cost bytes per body).  So the timeline shows
        the hand-overs, each on the thread that took over, named by its element, placed
        at its body inside the task group (the plan tells which body took each ticket),
        else at its position among the round's locked bodies.
        """
        tasks = self._thread_slices(i, span, plan)
        g = self.run.lock_grants(i.op, i.invocation, i.node) if i.lock_grants else None
        if g is None or not len(g.seq):
            return np.empty((0, 3))
        index, before, _ = g.handovers(plan, i.node)
        for k in range(len(g.seq)):
            r = int(g.round[k])
            start, dur = span.rounds[_clip(r, span)]
            bodies = int(g.bodies[k])
            a = int(g.offset[k])
            positions, threads = g.deviations(k)
            for n, (p, t) in enumerate(zip(positions.tolist(), threads.tolist(), strict=True)):
                element, j = str(g.element[a + n]), int(index[a + n])
                args: dict[str, Any] = {
                    "element": element,
                    "round": r,
                    "position": int(p),
                    "index": j if j >= 0 else None,
                    "from_thread": int(before[a + n]) if j >= 0 else None,
                    "locked_bodies": bodies,
                    "grants": int(g.grants[k]),
                    "seq": int(g.seq[k]),
                    "placed": _ORDER,
                }
                ts = _at_body(tasks.get((r, int(t)), []), j)
                if ts is None:
                    ts = start + dur * int(p) / max(bodies, 1)
                self.instant(f"lock {element}", "lock", i.node, int(t), ts, args)
        return _anchors(g.seq, g.round, span)

    # ------------------------------------------------------------ sync_for
    def _sync(self, i: InvocationInfo, span: _Span) -> np.ndarray:
        """Clock slices (node and threads) and mutex grants of a ``sync_for`` invocation."""
        run, node, op, inv = self.run, i.node, i.op, i.invocation
        mb = self.minibatches.get((op, inv, node), {})
        aggs = {a.clock: a for a in run.aggregations(op, inv, node)} if i.aggregations else {}
        vis = {v.clock: v for v in run.visibility(op, inv, node)} if i.visibility else {}
        m = run.mutex_grants(op, inv, node) if i.mutex_grants else None
        seqs: list[np.ndarray] = [np.array([a.seq for a in aggs.values()], np.int64)]
        clocks: list[np.ndarray] = [np.array(list(aggs), np.int64)]
        seqs.append(np.array([v.seq for v in vis.values()], np.int64))
        clocks.append(np.array(list(vis), np.int64))
        for c, (s, d) in enumerate(span.rounds):
            per_thread = mb.get(c, {})
            args: dict[str, Any] = {
                "op": op,
                "invocation": inv,
                "clock": c,
                "bodies": sum(len(v) for v in per_thread.values()),
            }
            if c in aggs:
                args["deltas_from"] = list(aggs[c].sources)
            if c in vis:
                args["applied"] = list(vis[c].applied)
            self.slice(f"clock {c}", "clock", node, NODE_TID, s, d, args)
            busiest = max((len(v) for v in per_thread.values()), default=0)
            for thread, batches in sorted(per_thread.items()):
                if not batches:
                    continue
                targs = {"op": op, "invocation": inv, "clock": c, "bodies": len(batches)}
                targs["minibatches"] = batches
                dur = d * len(batches) / busiest
                self.slice(f"{op}#{inv} clock {c}", "clock", node, thread, s, dur, targs)
        if m is not None and len(m.seq):
            self._mutex(i, span, m, mb)
            seqs.append(m.seq)
            clocks.append(m.clock)
        seq, clock = np.concatenate(seqs), np.concatenate(clocks)
        order = np.argsort(seq, kind="stable")
        return _anchors(seq[order], clock[order], span)

    def _mutex(self, i: InvocationInfo, span: _Span, m: Any, mb: dict[Any, Any]) -> None:
        order = np.argsort(m.seq, kind="stable")
        clock, thread, batch = m.clock[order], m.thread[order], m.minibatch[order]
        for c in np.unique(clock):
            s, d = span.rounds[_clip(c, span)]
            per_thread = mb.get(int(c), {})
            busiest = max((len(v) for v in per_thread.values()), default=1) or 1
            sel = np.flatnonzero(clock == c)
            for t in np.unique(thread[sel]):
                mine = sel[thread[sel] == t]
                dur = d * len(per_thread.get(int(t), mine)) / busiest
                for k, ts in zip(mine, _spread(s, dur, len(mine)), strict=True):
                    args = {
                        "clock": int(c),
                        "minibatch": int(batch[k]),
                        "grant": int(np.searchsorted(sel, k)),
                        "placed": _ORDER,
                    }
                    name = f"mutex: minibatch {int(batch[k])}"
                    self.instant(name, "mutex", i.node, int(t), float(ts), args)

    # ------------------------------------------------------------ messages
    def messages(
        self, i: InvocationInfo, spans: dict[Any, Any], anchors: np.ndarray, lo: int
    ) -> None:
        """Receive instants and flows of one node's invocation (``lo``: previous commit seq)."""
        if not i.messages:
            return
        msgs = self.run.messages(i.node, i.op, i.invocation)
        if not len(msgs.seq):
            return
        span = spans[(i.op, i.invocation, i.node)]
        a = anchors[(anchors[:, 0] > lo) & (anchors[:, 0] < i.seq)] if len(anchors) else anchors
        xp = np.concatenate([[lo], a[:, 0], [i.seq]]) if len(a) else np.array([lo, i.seq])
        fp = np.concatenate([[span.start], a[:, 1], [span.end]]) if len(a) else None
        if fp is None:
            fp = np.array([span.start, span.end])
        ts = np.interp(msgs.seq.astype(float), xp.astype(float), fp)
        # the round of the latest anchor before a receive: the round the node was in
        before = np.searchsorted(a[:, 0], msgs.seq) - 1 if len(a) else np.full(len(ts), -1)
        for k in range(len(msgs.seq)):
            r = int(a[before[k], 2]) if before[k] >= 0 else _round_at(span, float(ts[k]))
            t_f = span.inside(r, float(ts[k]))
            ch, src = str(msgs.channel[k]), int(msgs.source[k])
            args = {
                "channel": ch,
                "source": src,
                "source_seq": int(msgs.source_seq[k]),
                "nbytes": int(msgs.nbytes[k]),
                "seq": int(msgs.seq[k]),
                "round": r,
                "placed": _ORDER,
            }
            # 1 ns after the arrow's end, so the arrow binds to the round, not to this instant
            name = f"recv {ch} from node {src}"
            self.instant(name, "message", i.node, NODE_TID, t_f + 1e-3, args)
            sender = spans.get((i.op, i.invocation, src))
            if sender is None:
                continue
            t_s = sender.inside(r, min(t_f, sender.end))
            self.flow_id += 1
            flow = {"name": ch, "cat": "message", "id": self.flow_id, "tid": NODE_TID}
            self.events.append({**flow, "ph": "s", "ts": round(t_s, 3), "pid": src})
            self.events.append({**flow, "ph": "f", "bp": "e", "ts": round(t_f, 3), "pid": i.node})

    def routed(self, c: RoutedCounts, span: _Span, last: int) -> None:
        """Schema 7: an instant per exchange whose routed write-backs reached the node,
        with their count and bytes, and no arrow: their sources are not recorded.
        ``last``: the invocation's last exchange number (its final exchange, at the end
        of its rounds); the ``j``-th before it follows round ``R - j``, and one before
        the first round is the fetch of the rows the previous invocation left away."""
        rounds = len(span.rounds)
        for e, n, nb in zip(c.exchange.tolist(), c.count.tolist(), c.nbytes.tolist(), strict=True):
            j = last - int(e)
            r = rounds - j  # the exchange after round r (r = rounds: the final one)
            if r >= rounds:
                ts, r = span.end, rounds - 1
            elif r < 0:
                ts, r = span.start, 0
            else:
                ts = span.rounds[r][0] + span.rounds[r][1]
            args = {
                "channel": "routed",
                "exchange": int(e),
                "messages": int(n),
                "nbytes": int(nb),
                "round": r,
                "placed": ROUTED_PLACEMENT,
            }
            name = f"recv routed: {int(n)} message(s), {int(nb)} B"
            ts = min(max(ts - 1e-3, span.start), span.end)
            self.instant(name, "message", c.node, NODE_TID, ts, args)

    # ------------------------------------------------------------ sync_for layout
    def layout(self, invs: list[InvocationInfo]) -> None:
        """``self.minibatches[(op, inv, node)][clock][thread]``: the minibatches each
        ``sync_for`` worker ran (from hybrid mutex grants, else from the static layout)."""
        by_inv: dict[tuple[str, int], list[InvocationInfo]] = defaultdict(list)
        for i in invs:
            by_inv[(i.op, i.invocation)].append(i)
        threads = max(int(self.run.info.threads or 1), 1)
        for (op, inv), group in by_inv.items():
            if self.plans.get((op, inv)) is not None:
                continue
            total = sum(i.bodies for i in group)
            want = {i.node: i.bodies for i in group}
            clocks = max(i.rounds for i in group)
            pc = _per_clock(total, self.nodes, threads, clocks, want)
            for i in group:
                out: dict[int, dict[int, list[int]]] = defaultdict(dict)
                if i.mutex_grants:
                    m = self.run.mutex_grants(op, inv, i.node)
                    for k in np.argsort(m.seq, kind="stable"):
                        c, t = int(m.clock[k]), int(m.thread[k])
                        out[c].setdefault(t, []).append(int(m.minibatch[k]))
                elif pc is not None:
                    w = self.nodes * threads * pc
                    for c in range(clocks):
                        for t in range(threads):
                            lo = c * w + (i.node * threads + t) * pc
                            out[c][t] = list(range(lo, min(lo + pc, total)))
                self.minibatches[(op, inv, i.node)] = out


def _per_clock(
    total: int, nodes: int, threads: int, clocks: int, want: dict[Any, Any]
) -> int | None:
    """Minibatches per worker and clock that reproduce the recorded clocks and per-node
    bodies under ``sync_for``'s static layout (the smallest if several do; None if none)."""
    for pc in range(1, max(total, 1) + 1):
        w = nodes * threads * pc
        if math.ceil(total / w) != clocks:
            continue
        got = {
            p: sum(
                min(max(total - (c * w + p * threads * pc), 0), threads * pc) for c in range(clocks)
            )
            for p in want
        }
        if got == want:
            return pc
    return None


def _thread_tasks(plan: Any, rnd: int, node: int) -> dict[int, list[Any]]:
    """Task groups of ``node`` in round ``rnd`` by thread, in plan order."""
    out: dict[int, list[Any]] = {}
    if plan is None or rnd >= len(plan.rounds) or node >= len(plan.rounds[rnd]):
        return out
    for t in plan.rounds[rnd][node]:
        out.setdefault(int(t.thread), []).append(t)
    return out


def _at_body(spans: list[tuple[float, float, Any]], index: int) -> float | None:
    """Where loop ``index`` ran inside its task group's slice, by its place in the group
    (None: no drawn group holds it)."""
    for at, dur, task in spans:
        if task is None or index < 0:
            continue
        hit = np.flatnonzero(np.asarray(task.indices) == index)
        if len(hit):
            return float(at + dur * (int(hit[0]) + 0.5) / len(task.indices))
    return None


def _clip(r: Any, span: _Span) -> int:
    return min(max(int(r), 0), len(span.rounds) - 1)


def _round_at(span: _Span, ts: float) -> int:
    starts = [s for s, _ in span.rounds]
    return max(int(np.searchsorted(starts, ts, side="right")) - 1, 0)


def _anchors(seq: np.ndarray, rnd: np.ndarray, span: _Span) -> np.ndarray:
    """(seq, ts, round) of round-tagged events, spread over their round on the node's timeline
    in sequence order (so ts grows with seq; messages are placed between them)."""
    out = np.zeros((len(seq), 3))
    out[:, 0] = seq
    for r in np.unique(rnd):
        sel = np.flatnonzero(rnd == r)
        out[sel, 1] = _spread(*span.rounds[_clip(r, span)], len(sel))
        out[sel, 2] = _clip(r, span)
    return out


def chrome_events(run: RunTrace) -> list[dict[str, Any]]:
    """The trace events of one run: metadata first, then every event by time."""
    invs = run.invocations()
    t0 = run.info.started_at
    starts: dict[tuple[str, int], float] = {}
    for i in invs:
        key = (i.op, i.invocation)
        starts[key] = min(starts.get(key, math.inf), i.committed_at - i.seconds)
    b = _Builder(run)
    for key in starts:
        try:
            b.plans[key] = run.plan(*key)
        except KeyError:
            b.plans[key] = None
    b.layout(invs)
    track_end: dict[int, float] = defaultdict(float)
    spans: dict[tuple[str, int, int], _Span] = {}
    anchors: dict[tuple[str, int, int], np.ndarray] = {}
    phases = _phases(run, len(invs))
    ordered = sorted(invs, key=lambda i: (starts[(i.op, i.invocation)], i.node))
    for i in ordered:
        key3 = (i.op, i.invocation, i.node)
        begin = (starts[(i.op, i.invocation)] - t0) * 1e6
        pre = [p for kind in PRE_PHASES for p in phases.get((*key3, kind), [])]
        attempts: dict[str, int] = defaultdict(int)
        for p in sorted(pre, key=lambda p: p.started_at):  # before the rounds, as they ran
            attempts[p.kind] += 1
            lo = track_end[i.node]  # never before what the track already holds
            at = min(max((p.started_at - t0) * 1e6, lo), max(begin, lo))
            track_end[i.node] = b.phase(p, at, attempts[p.kind])
        at = max(begin, track_end[i.node])
        rounds = []
        for sec in i.round_seconds or (i.seconds,):
            d = max(sec * 1e6, MIN_ROUND_US)
            rounds.append((at, d))
            at += d
        span = spans[key3] = _Span(rounds[0][0], tuple(rounds))
        track_end[i.node] = span.end
        anchors[key3] = b.invocation(i, span, b.plans[(i.op, i.invocation)])
        for p in phases.get((*key3, "digests"), [])[:1]:  # after the rounds, before the commit
            track_end[i.node] = b.phase(p, span.end)
    commits: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for i in sorted(invs, key=lambda i: (i.node, i.seq)):
        prev = commits[i.node][-1][0] if commits[i.node] else -1
        b.messages(i, spans, anchors[(i.op, i.invocation, i.node)], prev)
        commits[i.node].append((i.seq, spans[(i.op, i.invocation, i.node)].end))
    routed = run.routed()
    last: dict[tuple[str, int], int] = {}
    for c in routed:
        if len(c.exchange):
            k2 = (c.op, c.invocation)
            last[k2] = max(last.get(k2, -1), int(c.exchange.max()))
    for c in routed:
        got = spans.get((c.op, c.invocation, c.node))
        if got is not None and len(c.exchange):
            b.routed(c, got, last[(c.op, c.invocation)])
    # a checkpoint is written when its invocation ends: drawn there, as long as it took
    for op, inv, node, sec, nbytes in run.checkpoint_times():
        after = spans.get((op, inv, node))
        if after is not None:
            cp: dict[str, Any] = {"seconds": sec, "bytes": nbytes}
            name = f"checkpoint after {op}#{inv}"
            b.slice(name, "checkpoint", node, CHECKPOINT_TID, after.end, max(sec * 1e6, 1.0), cp)
    for ev in run.events(kinds=[ObjectiveLogged]):
        if not isinstance(ev, ObjectiveLogged):  # narrows the type; kinds= filtered already
            continue
        done = [end for seq, end in commits.get(ev.node, []) if seq < ev.seq]
        ts = max(done, default=0.0)
        if not math.isfinite(ev.value):  # JSON has no NaN: a marker instead of a counter value
            args = {"iteration": ev.iteration, "value": repr(ev.value)}
            b.instant(f"{ev.name} = {ev.value!r}", "objective", ev.node, NODE_TID, ts, args)
            continue
        b.events.append(
            {
                "name": ev.name,
                "cat": "objective",
                "ph": "C",
                "ts": round(ts, 3),
                "pid": ev.node,
                "args": {ev.name: ev.value},
            }
        )
    b.events.sort(key=lambda e: (e["ts"], -e.get("dur", 0.0)))
    return _metadata(b, spans) + b.events


def _metadata(b: _Builder, spans: dict[Any, Any]) -> list[dict[str, Any]]:
    nodes = sorted({e["pid"] for e in b.events} | {node for _, _, node in spans})
    meta: list[dict[str, Any]] = []
    for node in nodes:
        meta.append(_meta("process_name", node, 0, "name", f"node {node}"))
        meta.append(_meta("process_sort_index", node, 0, "sort_index", node))
        meta.append(_meta("thread_name", node, NODE_TID, "name", f"node {node}"))
        meta.append(_meta("thread_sort_index", node, NODE_TID, "sort_index", -1))
        for thread in sorted(b.threads[node]):
            name = "checkpoints" if thread == CHECKPOINT_TID else f"thread {thread}"
            meta.append(_meta("thread_name", node, thread, "name", name))
            meta.append(_meta("thread_sort_index", node, thread, "sort_index", thread))
    return meta


def _meta(name: str, pid: int, tid: int, key: str, value: Any) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": {key: value}}


def export_chrome(
    trace: Trace | RunTrace,
    run_id: str | None,
    path: str | os.PathLike[str],
    *,
    force: bool = True,
    label: str | None = None,
    damaged: str | None = None,
) -> int:
    """Write run ``run_id`` (None: the latest) of ``trace`` to ``path``; returns the event count.

    ``damaged`` is what verification found wrong with the run, when the caller exports
    it anyway: the file then says so (``otherData.damaged``), so no viewer of it can take
    its orders for the recorded ones.

    ``path`` may replace an existing regular file only if ``force``; a link, device,
    directory or trace store is never replaced (:class:`engine.OutputPathError`, which
    names the path as ``label`` if given).
    """
    run = trace if isinstance(trace, RunTrace) else trace.run(run_id)
    doc = {
        "traceEvents": chrome_events(run),
        "displayTimeUnit": "ms",
        "otherData": {
            "run_id": run.run_id,
            "app": run.info.app,
            "status": run.info.status,
            "placement": "lock grants, mutex grants and messages are placed by recorded "
            "order within their round; sends are not recorded",
        },
    }
    if run.info.schema >= 7:  # what a schema-7 trace no longer shows
        doc["otherData"]["routed"] = ROUTED_NOTE  # type: ignore[index]
    if damaged is not None:
        doc["otherData"]["damaged"] = damaged  # type: ignore[index]
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False)
    write_file(path, text, force=force, label=label)
    return len(doc["traceEvents"])


__all__ = ["CHECKPOINT_TID", "NODE_TID", "chrome_events", "export_chrome"]
