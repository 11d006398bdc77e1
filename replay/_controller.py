"""Making a run follow its trace: the replay controller and the outcome checker.

:class:`TraceController` builds, before each invocation starts, the schedule value the
recorded run followed (``engine.lowlevel.Schedule``): the plan each operator must use, the
lock-grant order of every node-round, the updates every SSP ``sync_for`` clock sees, the
node-mutex order of a Hybrid ``sync_for``, and — in single-node replay — that each node
runs its bodies on one thread.  It also answers the source of every receive.  :class:`ReplayChecker` is a recorder that compares every
digest and objective with the trace as soon as it is produced, so a replay stops at
the first difference instead of at the end.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import engine
from engine import DivergenceError
from engine.lowlevel import (
    GrantLog,
    MessageLog,
    MutexLog,
    Schedule,
    VisibilityLog,
    check_same_digest_kind,
    plan_digest,
)

from ._dualctl import same_value
from ._elements import first_difference


class ReplayFinished(Exception):
    """The trace of a crashed run is exhausted: everything it holds was reproduced."""


def _tasks_equal(a: Any, b: Any) -> bool:
    return (
        a.thread == b.thread
        and bool(a.locked) == bool(b.locked)
        and np.array_equal(np.asarray(a.indices), np.asarray(b.indices))
    )


#: Indices listed in a plan-difference message before "and N more".
SHOWN_INDICES = 8
#: Invocations whose lock grants and messages a replay reads in one go: two queries per
#: window instead of two per invocation and node (0.5 ms each, against a kernel epoch of
#: 20 ms), for the memory of that many invocations' orders.
READ_AHEAD = 64


def _listed(idx: list[int]) -> str:
    head = ", ".join(map(str, idx[:SHOWN_INDICES]))
    more = len(idx) - SHOWN_INDICES
    return head + (f" and {more} more" if more > 0 else "")


def plan_difference(
    r: int, node: int, want: Any, got: Any, held: set[int] | None = None
) -> tuple[str, str]:
    """(expected, actual) for the first task of ``node`` in round ``r`` that differs;
    ``held``: the nodes whose tasks ``got`` holds (None: every node's)."""
    owner: dict[int, tuple[int, int]] = {}
    for n in sorted(held) if held is not None else range(len(got)):
        for t, task in enumerate(got[n]):
            for j in np.asarray(task.indices).tolist():
                owner[j] = (n, t)
    wt, gt = want[node], got[node]
    for t in range(max(len(wt), len(gt))):
        if t < len(wt) and t < len(gt) and _tasks_equal(wt[t], gt[t]):
            continue
        where = f"task {t} of node {node} in round {r}"
        if t >= len(wt):
            extra = np.asarray(gt[t].indices).tolist()
            return f"{where} not to exist", f"an extra task with indices {_listed(extra)}"
        w = np.asarray(wt[t].indices).tolist()
        expected = f"{where} with {len(w)} bodies as recorded"
        if t >= len(gt):
            return expected, f"no such task (its indices {_listed(w)} went elsewhere)"
        g = np.asarray(gt[t].indices).tolist()
        moved: dict[str, list[int]] = {}
        for j in w:
            if owner.get(j) != (node, t):
                n_t = owner.get(j)
                dest = (
                    ("no task" if held is None else "a node this process does not hold")
                    if n_t is None
                    else f"node {n_t[0]}" + (f" task {n_t[1]}" if n_t[0] == node else "")
                )
                moved.setdefault(dest, []).append(j)
        parts = [f"indices {_listed(js)} moved to {dest}" for dest, js in moved.items()]
        added = sorted(set(g) - set(w))
        if added:
            parts.append(f"indices {_listed(added)} joined it")
        if not parts and w != g:
            k = next(i for i, (a, b) in enumerate(zip(w, g, strict=True)) if a != b)
            parts.append(f"the same indices in another order (position {k}: {g[k]}, not {w[k]})")
        if wt[t].thread != gt[t].thread:
            parts.append(f"thread {gt[t].thread}, not {wt[t].thread}")
        if bool(wt[t].locked) != bool(gt[t].locked):
            parts.append("locked" if gt[t].locked else "not locked")
        return expected, "; ".join(parts) or "a different task"
    return f"round {r} of node {node} as recorded", "a different round"


class TraceController(engine.ScheduleSource, engine.DebugHooks):
    """Enforces the orders of one recorded run."""

    def __init__(
        self,
        run: Any,
        *,
        single: bool,
        breakpoint_hook: Callable[..., Any] | None = None,
        travel: Any = None,
    ):
        self.run = run
        #: time travel (``replay._timetravel.FastForward``): where the replay starts
        self.travel = travel
        self.single = single
        self._plans: dict[tuple[str, int], Any] = {}
        self._digests: dict[int, tuple[Any, bytes]] = {}
        self._starts: dict[str, list[int]] = {}
        self._finished: dict[tuple[str, int], int] | None = None
        self._break = breakpoint_hook
        self._until: Callable[[str, int], None] | None = None
        #: the replay digests with the hash the trace's digests were made with
        self.digest_kind = run.digest_kind()
        self._ahead_key: tuple[str, int] | None = None
        self._ahead: tuple[dict[Any, Any], dict[Any, Any]] = ({}, {})

    # ------------------------------------------------------------ plans
    def recorded_plan(self, op: str, invocation: int) -> Any:
        # the plan in force from one plan start to the next is one row: decoded once
        # (a 100 000-body plan takes 4 ms), not once per invocation
        starts = self._plan_starts(op)
        k = bisect.bisect_right(starts, invocation) - 1
        key = (op, starts[k] if k >= 0 else invocation)
        if key not in self._plans:
            try:
                self._plans[key] = self.run.plan(op, invocation)
            except KeyError:
                self._plans[key] = None
        return self._plans[key]

    def schedule(
        self,
        op: str,
        invocation: int,
        kind: str,
        nodes: int,
        span: tuple[int, int] | None = None,
    ) -> Schedule:
        """Everything the recorded run decided in this invocation, read before it starts
        (so no query runs while its threads wait for their turns)."""
        if kind == "sync_for":
            visible: dict[tuple[int, int], tuple[int, ...]] = {}
            mutex: dict[tuple[int, int], list[tuple[int, int]]] = {}
            for node in range(nodes):
                for e in self.run.visibility(op, invocation, node):
                    visible[(node, e.clock)] = tuple(e.applied)
                g = self.run.mutex_grants(op, invocation, node)
                for c, t, m in zip(
                    g.clock.tolist(), g.thread.tolist(), g.minibatch.tolist(), strict=True
                ):
                    mutex.setdefault((node, c), []).append((t, m))
            return Schedule(
                op,
                invocation,
                visibility=VisibilityLog.build(visible),
                mutex=MutexLog.build(mutex),
                serial=self.single,
            )
        grants: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        messages: dict[tuple[int, str], np.ndarray] = {}
        got_grants, got_messages = self._window(op, invocation)
        for node in range(nodes):
            g = got_grants.get((invocation, node))
            for k, r in enumerate(g.round.tolist() if g is not None else ()):
                grants[(node, r)] = g.deviations(k)  # type: ignore[union-attr]
            m = got_messages.get((invocation, node))
            if not self.single and m is not None:  # one process: no MPI receives to order
                for ch in sorted(set(m.channel.tolist())):
                    messages[(node, ch)] = m.source[m.channel == ch]
        return Schedule(
            op,
            invocation,
            plan=self.recorded_plan(op, invocation),
            replanned=invocation in self._plan_starts(op),
            grants=GrantLog.build(grants),
            serial=self.single,
            messages=None if self.single else MessageLog.build(messages),
            partial=self._partial(op, invocation),
        )

    def _plan_starts(self, op: str) -> list[int]:
        if op not in self._starts:
            self._starts[op] = sorted(self.run.plan_starts(op))
        return self._starts[op]

    def _window(self, op: str, invocation: int) -> tuple[dict[Any, Any], dict[Any, Any]]:
        """Lock grants and messages of ``invocation``'s window of ``op``, read in one go
        when the replay reaches it (the window's invocations are read in two queries)."""
        first = invocation - invocation % READ_AHEAD
        if self._ahead_key != (op, first):
            self._ahead = self.run.schedule_window(op, first, first + READ_AHEAD)
            self._ahead_key = (op, first)
        return self._ahead

    def _partial(self, op: str, invocation: int) -> bool:
        """Whether the recorded run stopped inside this invocation (it never finished it)."""
        if self.run.info.status == "finished":
            return False
        if self._finished is None:
            done: dict[tuple[str, int], int] = {}
            for i in self.run.invocations():
                done[(i.op, i.invocation)] = done.get((i.op, i.invocation), 0) + 1
            self._finished = done
        return self._finished.get((op, invocation), 0) < self.run.info.ranks

    def check_plan(self, op: str, invocation: int, plan: Any) -> None:
        def diverged(event: str, expected: str, actual: str, node: int = -1) -> DivergenceError:
            return DivergenceError(
                node=node,
                op=op,
                invocation=invocation,
                event=event,
                what="plan",
                expected=expected,
                actual=actual,
            )

        rec = self.recorded_plan(op, invocation)
        if rec is None:
            if self.run.info.status != "finished":
                # the run died before it committed this plan: all it holds is replayed
                raise ReplayFinished()
            raise diverged(
                "plan",
                f"no invocation {invocation} of {op!r} (the recorded run ran it fewer times)"
                if self._starts.get(op)
                else "no operator of this name",
                f"an async_for named {op!r}",
            )
        if len(rec.rounds) != len(plan.rounds):
            raise diverged("plan", f"{len(rec.rounds)} rounds", f"{len(plan.rounds)} rounds")
        # a plan this rank has run keeps only its own nodes' tasks (``Plan.kept``): those
        # are compared task by task, the others by the digest of the whole plan
        kept = set(plan.kept) if plan.partial else None
        for r, (want, got) in enumerate(zip(rec.rounds, plan.rounds, strict=True)):
            if len(want) != len(got):
                raise diverged(f"round {r}", f"{len(want)} nodes", f"{len(got)} nodes")
            for node in range(len(want)) if kept is None else sorted(kept):
                wt, gt = want[node], got[node]
                if len(wt) != len(gt) or not all(map(_tasks_equal, wt, gt)):
                    expected, actual = plan_difference(r, node, want, got, kept)
                    raise diverged(f"round {r}", expected, actual + " (code or data changed)", node)
        if kept is None:
            return
        if plan_digest(plan) != self._recorded_digest(rec):
            raise diverged(
                "plan",
                "the recorded plan's tasks on every node",
                "other tasks on the nodes this process does not hold (it holds "
                + ", ".join(map(str, sorted(kept)))
                + "; code or data changed)",
            )

    def _recorded_digest(self, rec: Any) -> bytes:
        """The digest of a decoded recorded plan, taken once per plan object (kept here,
        not on the plan, where ``dataclasses.replace`` would carry it to another one)."""
        found = self._digests.get(id(rec))
        if found is None or found[0] is not rec:
            found = self._digests[id(rec)] = (rec, plan_digest(rec))
        return found[1]

    # ------------------------------------------------------------ debugging hooks
    def wrap_body(self, op: str, invocation: int, node: int, body: Any) -> Any:
        if self._break is None:
            return body
        return self._break(op, invocation, node, body)

    def set_body_hook(self, hook: Callable[..., Any] | None) -> None:
        """Wrap every loop body with ``hook(op, invocation, node, body)`` (breakpoints,
        history and watch probes)."""
        self._break = hook

    def set_until(self, hook: Callable[[str, int], None]) -> None:
        """Call ``hook(op, invocation)`` after every invocation (``--until``)."""
        self._until = hook

    def after_invocation(self, op: str, invocation: int) -> None:
        if self._until is not None:
            self._until(op, invocation)

    # ------------------------------------------------------------ time travel
    def fast_forward(self) -> tuple[str, int] | None:
        return None if self.travel is None else self.travel.fast_forward()

    def restore(self, op: str, invocation: int) -> Any:
        return self.travel.restore(op, invocation)

    def check_restored(self, op: str, invocation: int, digests: list[tuple[str, str]]) -> None:
        self.travel.check_restored(op, invocation, digests)

    def served_value(self, k: int, kind: str) -> Any:
        return self.travel.served_value(k, kind)

    def skipped(self, op: str, invocation: int) -> None:
        self.current = (op, invocation)
        self.travel.note_skipped(op, invocation)


class ReplayChecker(engine.Recorder):
    """Compares digests and objectives with the trace as they are produced.

    ``tee`` (optional) also records the replay itself into a new trace.
    """

    def __init__(
        self,
        run: Any,
        tee: engine.Recorder | None = None,
        on_progress: Callable[[int, int], None] | None = None,
        skipped: set[tuple[str, int]] | None = None,
        travel: Any = None,
    ) -> None:
        self.run = run
        #: the fast-forward of a replay from a checkpoint (``_timetravel.FastForward``)
        self.travel = travel
        #: invocations a time-travelling replay skipped (shared with its controller)
        self.skipped = skipped if skipped is not None else set()
        self.tee = tee or engine.Recorder()
        #: Called with (invocations checked, invocations in the trace) after each one.
        self.on_progress = on_progress
        self._digests: dict[tuple[str, int], dict[str, str]] = {}
        for d in run.digests():
            self._digests.setdefault((d.op, d.invocation), {})[d.dds] = d.digest
        self._objectives = run.objectives()
        self.checked_digests = 0
        self.checked_objectives = 0
        #: objective values logged before the checkpoint was restored: compared too, but
        #: computed from collective values the trace served, not from the program's DDS
        self.served_objectives = 0
        self._seen_invocations: set[tuple[str, int]] = set()
        #: The last invocation whose digests all matched (``None``: none yet).
        self.last_completed: tuple[str, int] | None = None
        #: when each objective value was logged, in seconds since the replay began
        self.objective_times: dict[str, list[float]] = {}
        self.started = time.perf_counter()

    # forwarded events
    def plan_made(self, op: str, plan: Any) -> None:
        self.tee.plan_made(op, plan)

    def schedule_done(self, sched: Schedule) -> None:
        self.tee.schedule_done(sched)

    def message_received(self, *args: Any) -> None:
        self.tee.message_received(*args)

    def close(self, status: str, error: str | None = None) -> None:
        self.tee.close(status, error)

    def __getattr__(self, name: str) -> Any:
        # hooks added for other operators (sync_for) pass through to the tee
        return getattr(self.tee, name)

    # checked events
    def invocation_done(self, op: str, invocation: int, node: int, info: dict[str, Any]) -> None:
        self.tee.invocation_done(op, invocation, node, info)
        if "digests" not in info:
            return
        want = self._digests.get((op, invocation))
        if want is None:
            if self.run.info.status != "finished":
                raise ReplayFinished()
            raise DivergenceError(
                node=node,
                op=op,
                invocation=invocation,
                event="end",
                what="invocation",
                expected="no such invocation (the recorded run ended before it)",
                actual="run it",
            )
        self._seen_invocations.add((op, invocation))
        for dds, got in info["digests"]:
            exp = want.get(dds)
            if exp is not None:
                check_same_digest_kind(exp, got)
            if exp != got:
                raise DivergenceError(
                    node=node,
                    op=op,
                    invocation=invocation,
                    event=f"digest of {dds}",
                    what="outcome",
                    expected=str(exp),
                    actual=got,
                    detail=first_difference(self.run, dds, op, invocation),
                )
            self.checked_digests += 1
        self.last_completed = (op, invocation)
        if self.on_progress is not None:
            self.on_progress(len(self._seen_invocations), len(self._digests))

    def objective(self, name: str, iteration: int, value: float) -> None:
        self.tee.objective(name, iteration, value)
        self.objective_times.setdefault(name, []).append(time.perf_counter() - self.started)
        rec = self._objectives.get(name, [])
        if iteration >= len(rec):
            if self.run.info.status != "finished":
                raise ReplayFinished()
            raise DivergenceError(
                node=-1,
                op="objective",
                invocation=iteration,
                event=name,
                what="objective",
                expected=f"{len(rec)} value(s)",
                actual=f"value {iteration} = {value!r}",
            )
        if not same_value(rec[iteration], value, signed_zero=False):  # SQLite: -0.0 is 0
            raise DivergenceError(
                node=-1,
                op="objective",
                invocation=iteration,
                event=name,
                what="objective",
                expected=repr(rec[iteration]),
                actual=repr(value),
            )
        travel = self.travel
        if travel is not None and travel.start.op is not None and not travel.restored:
            self.served_objectives += 1
        else:
            self.checked_objectives += 1

    def produced_everything(self) -> bool:
        """Whether every invocation the trace holds has been replayed (or skipped)."""
        return not (set(self._digests) - self._seen_invocations - self.skipped)

    def finish(self) -> None:
        """The program ended: it must have produced everything the trace holds."""
        missing = set(self._digests) - self._seen_invocations - self.skipped
        if missing:
            op, inv = min(missing, key=lambda k: (k[1], k[0]))
            raise DivergenceError(
                node=-1,
                op=op,
                invocation=inv,
                event="end",
                what="invocation",
                expected="this invocation",
                actual="the program ended before it",
            )


__all__ = ["ReplayChecker", "ReplayFinished", "TraceController"]
