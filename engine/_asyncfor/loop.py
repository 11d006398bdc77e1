"""``async_for``: serializable asynchronous execution of a loop body over a range.

First invocation of an operator (or a changed body / range): reconnaissance
execution, split over the nodes, then a plan built identically on every node.  Every
invocation then runs the plan round by round: each node runs its tasks on its
threads, then the rows it wrote flow to the nodes that touch them next (a ring: a
node waits for those rows only, never for the whole cluster).  Because tasks of one
round never conflict, the final state equals a serial loop over the plan's
serialization order.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._data import dds as _dds
from .._data import relaxed as _relaxed
from .._data import shard as _shard
from .._data.dds import ANY_OWN, LOCKED_BODY, SLOT_BITS, SLOT_MASK, _tls
from .._errors import (
    AccessOutsideReconError,
    BodyError,
    ClosureRuleError,
    DivergenceError,
    PeerRankFailed,
    SessionError,
    peer_error,
)
from .._machines.baton import BatonGrants
from .._machines.chaos import LOCKS
from .._machines.grants import (
    FreeGrants,
    TurnSequencer,
    handover_elements,
    recorded_ticket_order,
    thread_lengths,
)
from .._machines.grants import encode_grant_order as encode
from .._machines.messages import MessageOrder
from .._machines.planner import (
    REPLICATED,
    STRATEGIES,
    Plan,
    StrategyUnfit,
    Task,
    make_plan,
    placed,
    placement_like,
    remake_strategy,
    replicated_plan,
    serial_plan,
    wavefront_plan,
)
from .._machines.planparts import keep_nodes, own_parts, whole_plan
from .._machines.schedule import Schedule, serial_order
from .._runtime.checkpoint import end_invocation, skip_invocation
from .._runtime.session import Session, current
from .._runtime.transport import Cluster, Message
from .closure import Captures, agree_numbers, check_body
from .closure import finish as finish_closure
from .closure import guard as closure_guard
from .closure import verify as closure_verify
from .closure import watch as closure_watch
from .guard import POLICIES, Guard, GuardPlan, PlanViolation, Violation, install
from .kernel import BoundKernel, code_of, prepare, python_of, run_group, wrap_body
from .recon import (
    AccessSets,
    Done,
    NodeSets,
    concat_sets,
    declared_hint,
    node_sets,
    recon_range,
    recon_shares,
)


@dataclass
class OpState:
    """Per-operator cache: reconnaissance sets and the plan, reused while valid.

    ``stale`` marks a plan that the guard found violated and that was replaced only for
    one invocation (serial fallback): the next invocation re-plans."""

    name: str
    start: int
    stop: int
    code: Any
    #: every body's sets until the invocation that made the plan ends; then, outside
    #: test mode, only what the local nodes' tasks need (:func:`_keep_own_parts`)
    sets: AccessSets | NodeSets | None
    plan: Plan
    written_dds: list[Any]
    round_orders: list[dict[int, np.ndarray]] | None = None
    lock_cache: dict[tuple[int, int], Any] = field(default_factory=dict)
    guard_plan: GuardPlan | None = None
    stale: bool = False
    #: the ``strategy=`` the plan was made for; another one re-plans
    requested: str = "auto"
    #: per local node, the last invocation's (round, thread, start, end) of each thread's
    #: task groups, in seconds from that node's start of the round
    thread_times: dict[int, list[tuple[int, int, float, float]]] = field(default_factory=dict)


def _written_dds(sess: Session, plan: Plan) -> list[Any]:
    """The DDS some task of ``plan`` writes, in DDS order."""
    written = {
        int(d)
        for per_node in plan.writes
        for gids in per_node
        for d in np.unique(gids >> SLOT_BITS)
    }
    return [sess.dds[d] for d in sorted(written)]


def _recon(
    sess: Session, name: str, inv: int, body: Callable[[int], Any], start: int, stop: int
) -> AccessSets:
    cl = sess.cluster
    n = stop - start
    body = closure_guard(body, name, inv)  # every body runs once here: catch mutation through calls
    sess.set_mode("recon")
    _relaxed.enter_recon(sess)  # relaxed DDS: out of the sets (or in them, in test mode)
    try:

        def share(node: int, done: Done | None) -> AccessSets:
            lo = start + n * node // cl.size
            hi = start + n * (node + 1) // cl.size
            sets = recon_range(sess, name, inv, body, lo, hi, done)
            finish_closure(body)  # inside the share: a late violation is this node's failure
            return sets

        parts = recon_shares(cl, sess, f"reconnaissance of {name}", share)
    finally:
        sess.set_mode("driver")
    return concat_sets(parts)


def _plan(sess: Session, name: str, inv: int, sets: AccessSets, requested: str = "auto") -> Plan:
    """Plan ``sets`` with the ``requested`` strategy; one it cannot plan them with (the
    bodies' accesses do not have its shape, maybe only in this invocation) gives way
    to ``auto``, and a note says so once per operator."""
    cl = sess.cluster

    def plan(strategy: str) -> Plan:
        return make_plan(
            sets, cl.size, cl.threads, seed=sess.seed, strategy=strategy, ring=sess.ring
        )

    try:
        return plan(requested)
    except StrategyUnfit as unfit:
        _say_once(
            sess,
            (name, "unfit"),
            f"note: async_for {name!r} invocation {inv}: strategy={requested!r} cannot "
            f"plan it ({unfit}), so it was planned with strategy='auto' (printed once; "
            "the planner report names the strategy each plan used)",
        )
        return plan("auto")


def _state(
    sess: Session, name: str, start: int, stop: int, code: Any, sets: Any, plan: Plan
) -> OpState:
    return OpState(name, start, stop, code, sets, plan, _written_dds(sess, plan))


def _new_state(
    sess: Session,
    name: str,
    inv: int,
    body: Callable[[int], Any],
    start: int,
    stop: int,
    code: Any,
    requested: str = "auto",
    sched: Schedule | None = None,
) -> OpState:
    """Reconnaissance and planning for invocation ``inv`` (on the current DDS state), on
    the placement ``sched`` says (see :func:`_placement`)."""
    sess.announce(f"planning {name}")
    # reconnaissance runs bodies on every node's replica: they must be whole
    _dds.make_whole(sess=sess)
    t0 = time.perf_counter()
    wall = time.time()
    sets = _recon(sess, name, inv, body, start, stop)
    t_plan = time.perf_counter()
    sess.phase_done("reconnaissance", wall, t_plan - t0)
    strategy = remake_strategy(requested, sched.plan if sched is not None else None, sets)
    plan = _placement(_plan(sess, name, inv, sets, strategy), sched, name, inv)
    sess.phase_done("planning", wall + (t_plan - t0), time.perf_counter() - t_plan)
    st = _state(sess, name, start, stop, code, sets, plan)
    st.requested = requested
    sess.planner[name] = {
        "strategy": plan.strategy,
        "rounds": len(plan.rounds),
        "imbalance": round(plan.imbalance, 4),
        "barrier_imbalance": round(plan.barrier_imbalance, 4),
        "node_imbalance": round(plan.node_imbalance, 4),
        "bodies": plan.n,
        "recon_s": round(time.perf_counter() - t0, 6),
    }
    if plan.colours is not None:
        sess.planner[name]["colours"] = plan.colours
    if sess.progress is not None:
        sess.progress(
            f"plan {name}: {plan.strategy}, {len(plan.rounds)} round(s), "
            f"imbalance {plan.imbalance:.3f} ({time.perf_counter() - t0:.2f} s)"
        )
    return st


def _placement(plan: Plan, sched: Schedule | None, name: str, inv: int) -> Plan:
    """Where a fresh plan's tasks run: a chaos run draws one of its equally good
    placements; a replay takes the recorded run's placement when the plan in force there
    is this one up to placement (otherwise the plan stays, and ``check_plan`` reports the
    difference); a normal run keeps the planner's.  A replay also plans afresh where the
    recorded run did not (the first invocation after a checkpoint it fast-forwarded to):
    that plan takes the recorded placement too, or a chaos run's drawn one failed there."""
    if sched is None:
        return plan
    if sched.chaos is not None:
        where = sched.chaos.placement(name, inv, plan.nodes, plan.threads, len(plan.rounds))
        return placed(plan, *where)
    if sched.plan is not None:
        moved = placement_like(plan, sched.plan)
        if moved is not None:
            return moved
    return plan


def _follow_order(sess: Session, st: OpState, sched: Schedule | None) -> None:
    """Dual tests: plan the schedule's serialization order instead of the planner's choice
    (one plain loop on node 0 for a serial side, else the order's wavefront levels)."""
    if sched is None or sched.order is None or st.sets is None:
        return
    cl = sess.cluster
    # a state kept only its nodes' sets is planned afresh first (see ``async_for``)
    assert isinstance(st.sets, AccessSets), "an order is planned from every body's sets"
    if sched.serial:
        plan = serial_plan(st.sets, sched.order, cl.size)
    else:
        plan = wavefront_plan(st.sets, sched.order, cl.size, sched.order_threads or cl.threads)
    st.plan = plan
    st.written_dds = _written_dds(sess, plan)
    st.lock_cache.clear()
    st.guard_plan = None


def _replicated(sess: Session, st: OpState, plan: Plan | None = None) -> OpState:
    """The serial fallback: every node runs the invocation in one order on its replica."""
    if plan is None:
        # a plan built to equal one serial order (dual tests) keeps it; otherwise the
        # index order, the loop the user wrote
        order = st.plan.order
        if order is None:
            order = np.arange(st.start, st.stop, dtype=np.int64)
        plan = replicated_plan(st.start, order, sess.cluster.size)
    elif plan.order is None:  # a recorded plan: its single task holds the order
        tasks = [t.indices for rnd in plan.rounds for per in rnd for t in per]
        plan.order = np.concatenate(tasks) if tasks else np.empty(0, dtype=np.int64)
    new = _state(sess, st.name, st.start, st.stop, st.code, st.sets, plan)
    # the plan records no writes, and its bodies left their sets: any DDS may have been
    # written, so the checkpoint after it (``end_invocation``) must hold every one
    new.written_dds = list(sess.dds)
    new.stale = True
    return new


def async_for(
    start: int,
    stop: int,
    body: Callable[[int], Any],
    *,
    name: str,
    checked: bool | None = None,
    replan: str = "auto",
    strategy: str = "auto",
) -> None:
    """Run ``body(j)`` for every ``j`` in ``range(start, stop)``, serializably, in parallel.

    The result equals *some* serial order of the bodies (the plan's serialization
    order).  Inside the body only DDS elements may be written.  The plan, made by
    reconnaissance on the first invocation, is reused while the bodies stay inside it;
    every access that leaves it is caught, and ``replan`` says what happens then:
    ``"auto"`` undoes the invocation, re-plans and re-executes it (serially if the new
    plan fails too), ``"always"`` re-plans every invocation, ``"never"`` raises
    :class:`AccessOutsideReconError`.  ``strategy`` names the planner's strategy
    (``"components"``, ``"rotation"``, ``"colouring"``) instead of letting its cost model
    choose (``"auto"``).

    >>> import engine as ap
    >>> X = ap.dvector(8, shape=(), init=ap.init.zeros(), name="X")
    >>> def body(j):
    ...     X[j] = j * 2.0
    >>> ap.async_for(0, 8, body, name="double")
    >>> X.gather().tolist()
    [0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0]
    """
    sess = current()
    if sess.mode != "driver":
        raise SessionError(
            f"async_for {name!r} was called inside a loop body; nesting is not supported"
        )
    if not isinstance(name, str) or not name:
        raise TypeError("async_for needs name='...' to identify the operator in plans and traces")
    if replan not in POLICIES:
        raise ValueError(
            f"async_for {name!r}: replan must be one of {', '.join(POLICIES)}, got {replan!r}"
        )
    if strategy not in STRATEGIES:
        raise ValueError(
            f"async_for {name!r}: strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}"
        )
    start, stop = int(start), int(stop)
    if stop < start:
        raise ValueError(f"async_for {name!r}: stop ({stop}) < start ({start})")
    check_body(name, python_of(body))
    if isinstance(body, BoundKernel):
        prepare(body, name)  # a kernel numba cannot compile fails here, in one line
    # test mode checks every body against its own sets: the forward dual test needs the
    # run to equal one given serial order, not merely some serial order
    checked = (sess.checked if checked is None else checked) or sess.test_mode
    inv = sess.next_invocation(name)
    numbers = None  # what the body reads outside DDS must be the same on every rank
    if sess.cluster.is_mpi:
        numbers = Captures(python_of(body), body.args if isinstance(body, BoundKernel) else ())
    got = sess.agree(f"async_for {name!r} #{inv} over [{start}, {stop})", numbers and numbers.keys)
    agree_numbers(f"async_for {name!r} (invocation {inv})", numbers, got, sess.cluster.allgather)
    if skip_invocation(sess, name, inv):  # time travel: fast-forward to a checkpoint
        return
    st: OpState | None = sess.ops.get(name)
    code = code_of(body)
    sched = sess.schedules.schedule(name, inv, "async_for", sess.cluster.size, (start, stop))
    recorded = sched.plan if sched is not None and sched.replanned else None
    sess.cluster.messages = (
        sched.message_order() if sched is not None else MessageOrder(op=name, invocation=inv)
    )
    made = False
    if recorded is not None and recorded.strategy == REPLICATED:
        base = st or OpState(name, start, stop, code, None, recorded, [])
        st = _replicated(sess, base, recorded)
        made = True
    elif (
        st is None
        or st.start != start
        or st.stop != stop
        or st.code is not code
        or st.stale
        or replan == "always"
        or recorded is not None
        or st.requested != strategy
        # a dual test's serialization order is planned from every body's sets
        or (sched is not None and sched.order is not None and isinstance(st.sets, NodeSets))
    ):
        st = _new_state(sess, name, inv, body, start, stop, code, strategy, sched)
        made = True
    _follow_order(sess, st, sched)
    sess.ops[name] = st
    sess.hooks.check_plan(name, inv, st.plan)
    t1 = time.perf_counter()
    # checked and test mode: every body's fingerprints (closure rule); a normal run
    # compares what the bare body reaches before and after the invocation
    run_body = closure_guard(body, name, inv) if checked else body
    baseline = None if checked else closure_watch(body, name, inv)
    round_s, violation = _attempt(sess, st, run_body, inv, checked, replan, sched)
    if violation is not None and replan == "never":
        # after the ranks agreed on the first violation and undid the attempt: every rank
        # raises it (raised on the violating rank alone, the others would wait for ever)
        raise AccessOutsideReconError(
            violation.message() + declared_hint(sess, name) + "; the operator runs with "
            "replan='never' (use "
            "replan='auto' to re-plan such invocations, or make the accesses depend only "
            "on the loop index and read-only data)"
        )
    if violation is not None:
        _note(sess, violation, "re-planned it")
        st = sess.ops[name] = _new_state(sess, name, inv, body, start, stop, code, strategy, sched)
        _follow_order(sess, st, sched)
        round_s, again = _attempt(sess, st, run_body, inv, checked, replan, sched)
        if again is not None:
            _note(
                sess,
                again,
                "the new plan failed too (the accesses depend on values written in the same "
                "invocation), so it ran serially on every node",
            )
            st = sess.ops[name] = _replicated(sess, st)
            round_s, _ = _attempt(sess, st, run_body, inv, checked, replan, sched)
        made = True
    finish_closure(run_body)
    closure_verify(baseline)
    if made:
        sess.recorder.plan_made(name, st.plan)
    _keep_own_parts(sess, st)
    seconds = time.perf_counter() - t1
    sess.op_times.setdefault(name, []).append(seconds)
    if sess.capture_orders:
        sess.orders[(name, inv)] = last_order(name)
    sess.check_replicas(name, inv)
    digests = sess.record_digests(name, inv)
    per_node = st.plan.bodies_per_node()
    phases = sess.take_phases()
    for k, node in enumerate(sess.cluster.local_nodes):
        info = {
            "bodies": int(per_node[node]),
            "rounds": len(st.plan.rounds),
            "seconds": seconds,
            "round_seconds": round_s,
            "thread_times": st.thread_times.get(node, []),
            "phases": phases,
        }
        if k == 0:
            info["digests"] = digests
        sess.recorder.invocation_done(name, inv, node, info)
    # relaxed DDS are outside the reconnaissance sets, so not in ``written_dds``; a body may
    # still have changed them, and a checkpoint without them restores a wrong state
    written = [*st.written_dds, *_relaxed.active(sess)]
    end_invocation(sess, name, inv, written, seconds, bodies=int(sum(per_node)))
    sess.hooks.after_invocation(name, inv)


def _keep_own_parts(sess: Session, st: OpState) -> None:
    """Once an invocation ran its plan, the guard's plan is built and the plan is
    recorded, each node keeps the reconnaissance sets of its own tasks' bodies and its own
    part of the plan (issue 35: every body's sets and every node's tasks on every node are
    O(n) per node).  What runs later under this plan looks up only those: a node runs
    its own tasks, checked mode and the lock-split groups look at the bodies it runs, a
    replay compares its own tasks and the whole plan's digest.  What needs every body's
    sets (a new plan, a dual test's order) runs a reconnaissance again.  Test mode keeps
    them whole: the dual tests read them after the run."""
    if sess.test_mode or not isinstance(st.sets, AccessSets) or st.guard_plan is None:
        return
    if sess.cluster.size == 1:  # one node runs every body: nothing to leave out
        return
    st.sets = node_sets(st.sets, st.plan, sess.cluster.local_nodes)
    st.plan = keep_nodes(st.plan, sess.cluster.local_nodes)


def _say_once(sess: Session, key: tuple[str, str], line: str) -> None:
    """Print ``line`` from rank 0, once per ``key`` (operator, kind) and session."""
    if key in sess.noted or sess.cluster.rank != 0:
        return
    sess.noted.add(key)
    sess.warn(line)


def _note(sess: Session, v: Violation, what: str) -> None:
    """Say once per operator and process that the guard re-planned an invocation."""
    _say_once(
        sess,
        (v.op, what),
        f"note: {v.message()}{declared_hint(sess, v.op)}; {what} (replan='auto')",
    )


def _attempt(
    sess: Session,
    st: OpState,
    body: Callable[[int], Any],
    inv: int,
    checked: bool,
    policy: str,
    sched: Schedule | None,
) -> tuple[list[float], Violation | None]:
    """Execute one invocation under the guard.  On a violation, undo everything it
    changed (replicas, message counters, recorder calls) and return the violation."""
    if st.plan.strategy == REPLICATED:
        _dds.make_whole(sess=sess)  # every node runs every body on its own replica
        if _shard.sharded(sess):
            _shard.ensure_rows(sess, st.name, _shard.everything(sess))
        tape = sess.tape = sess.new_tape()
        try:
            round_s = _execute_replicated(sess, st, body, inv)
        finally:
            sess.tape = None
        if tape.active:  # (nothing listens otherwise: see below)
            sess.recorder.schedule_done(tape.schedule(st.name, inv, st.plan))
        for d in sess.dds:
            d._touch()
        return round_s, None
    assert st.sets is not None  # only a replicated plan comes without sets
    if st.guard_plan is None:
        # built once per plan, before the nodes keep only their own sets
        assert isinstance(st.sets, AccessSets), "a guard's plan is built from every body's sets"
        st.guard_plan = GuardPlan(sess, st.plan, st.sets)
    gp = st.guard_plan
    if gp.shard_needs:  # sharded rows this plan's tasks touch, where they run
        _shard.ensure_rows(sess, st.name, gp.shard_needs)
    guard = Guard(st.name, inv, policy, gp)
    fx = gp.fetch(sess)  # the rows earlier invocations wrote, from their homes
    guard.prepare(sess, fx.marked())
    if fx.any:
        fetch_rows(sess.cluster, fx.exchange)
    guard.mark_fetch(fx)
    snapshot = [  # a sharded node's row it does not hold yet: dropped again on undo
        (node, d, s, d.rows(node, s, absent_ok=True))
        for node in sess.cluster.local_nodes
        for d, s in gp.undo_slots
    ]
    mark = sess.cluster.mark()
    rx = _relaxed.Relaxation.of(sess)
    tape = sess.tape = sess.new_tape()
    try:
        round_s = _execute(sess, st, body, inv, checked, guard, sched, rx)
    finally:
        sess.tape = None
    if guard.first is None:
        # an inactive tape (no recorder: the base class records nothing) would build an
        # empty schedule value for nobody: ~130 us an invocation, 3% of an LDA iteration
        if tape.active:
            sess.recorder.schedule_done(tape.schedule(st.name, inv, st.plan))
        for d in st.written_dds:
            d._touch()
        for d, slots, writers in gp.holders:  # their last values went home only
            _dds.mark_dirty(d, slots, writers)
        return round_s, None
    for node, d, s, rows in snapshot:
        d.set_rows(node, s, rows)
    if rx is not None:
        rx.restore()
    sess.cluster.rewind(mark)
    first = guard.first
    if sess.cluster.is_mpi:
        first = _agree(sess.cluster, guard)
    return round_s, first


def _agree(cl: Cluster, guard: Guard) -> Violation:
    """What an undone attempt reports on every rank, whatever the timing: the earliest
    event by (round, node) of all ranks' first violations and failed bodies, a violation
    first in a tie (a rank may run rounds ahead before it hears of a stop).  A violation
    is returned (re-plan); a failed body raises, on its rank, its own error, and on the
    others :class:`PeerRankFailed`, as a step every rank runs together does."""
    fail = guard.failure
    mine = (guard.first, None if fail is None else (*fail[:2], peer_error(fail[2])))
    events: list[tuple[int, int, int, Violation | str | None]] = []
    for v, failed in cl.allgather(mine):
        if v is not None and v.node >= 0:
            events.append((*v.key(), 0, v))
        if failed is not None:
            events.append((failed[0], failed[1], 1, failed[2]))
    if not events:  # cannot happen: a rank stopped only for one of these
        raise RuntimeError("an attempt was undone, but no rank reported why")
    r, node, kind, what = min(events, key=lambda e: e[:3])
    if kind == 0:
        assert isinstance(what, Violation)
        return what
    if fail is not None and fail[:2] == (r, node):
        raise fail[2]
    raise PeerRankFailed(node, what if isinstance(what, str) else None)


def _execute(
    sess: Session,
    st: OpState,
    body: Callable[[int], Any],
    inv: int,
    checked: bool,
    guard: Guard,
    sched: Schedule | None,
    rx: _relaxed.Relaxation | None = None,
) -> list[float]:
    """Run every round of the plan; return the wall time of each round on this process.

    A node whose body leaves the plan stops running bodies; the stop travels with the
    write-back (``Cluster.exchange``), and a node that hears of it stops too.  A stopped
    node still takes part in every exchange of the attempt, so that nobody waits for it,
    and the final exchange agrees on the outcome once.  When every node is in this
    process it knows at once and the attempt ends after the round in which one stopped.
    On an MPI rank a body that raises stops its node the same way, and its error waits
    for the agreement (``_agree``): a stop of an earlier round elsewhere comes first.
    Relaxed DDS (``rx``) keep their round-start values and are reconciled after every
    write-back (a collective, on stopped nodes too)."""
    cl = sess.cluster
    plan = st.plan
    op_key = sess.op_key(st.name, inv)
    # DDS with rows a node must not read (``Guard.mark_fetch``) are checked like written ones
    written = set(map(id, st.written_dds)) | set(map(id, guard.marked))
    if checked:
        sess.set_mode("checked")
        _dds.CHECKER = _dds._Checker(st.name, st.sets, st.start, _tls)
    else:
        sess.set_mode("guard" if guard.single else "guard_t")
        for d in sess.dds:
            if id(d) not in written:
                _dds.set_mode(d, "guard_ro")
    install(guard)
    orders: list[dict[int, np.ndarray]] = []  # per round, per local node
    round_s: list[float] = []
    times: dict[int, list[tuple[int, int, float, float]]] = {p: [] for p in cl.local_nodes}
    stopped: set[int] = set()
    everyone_here = len(cl.local_nodes) == cl.size
    halted = False  # the local nodes run no more bodies of this attempt
    try:
        for r, rnd in enumerate(plan.rounds):
            t = time.perf_counter()
            if rx is not None:
                rx.begin_round()
            done: dict[int, np.ndarray] = {}
            guard.unmark_pending(r)  # rows routed for this round are here now
            halted = cl.settle(r) or halted  # (on MPI: their receives complete here)
            if not halted:
                guard.arm(r)
                for node in cl.local_nodes:
                    cl.bind(node)
                    guard.node = node
                    spans: list[tuple[int, float, float]] = []
                    t_node = time.perf_counter()
                    try:
                        done[node] = _run_node_round(
                            sess, st, body, inv, op_key, node, r, rnd[node], sched, spans
                        )
                    except PlanViolation:
                        done[node] = np.empty(0, dtype=np.int64)
                    except BodyError as exc:
                        if everyone_here and guard.first is None:
                            raise
                        # a stop like a violation's, so that nobody waits for this rank;
                        # raised once the ranks agree it came first (``_agree``).  In one
                        # process a violation already seen is of a lower node of this
                        # round, which ``_agree`` puts first: re-plan, as the ranks would
                        guard.failure = (r, node, exc)
                        done[node] = np.empty(0, dtype=np.int64)
                    times[node] += [(r, th, a - t_node, b - t_node) for th, a, b in sorted(spans)]
                    if guard.first is not None or guard.failure is not None:
                        stopped.add(node)
                guard.arm(r, code=False)
            orders.append(done)
            halted = write_back(cl, guard.exchanges, r, stopped=halted or bool(stopped))
            guard.mark_stale(r)
            guard.mark_pending(r)
            if rx is not None:
                rx.end_round()
            round_s.append(time.perf_counter() - t)
            if halted and everyone_here:
                break
        anyone = halted
        if not (halted and everyone_here):
            # replicas whole again: each element's last value to every node that lacks it;
            # and the one agreement of the attempt: did any node stop?
            t = time.perf_counter()
            anyone = write_back(cl, guard.exchanges, len(plan.rounds), stopped=halted)
            if round_s:
                round_s[-1] += time.perf_counter() - t
        if anyone and guard.first is None:
            guard.first = Violation(st.name, inv, -1, -1, "-", False, "another node left the plan")
    finally:
        guard.clear_stale()
        install(None)
        _dds.CHECKER = None
        sess.set_mode("driver")
        cl.bind(cl.local_nodes[0])
    st.round_orders = orders
    st.thread_times = times
    return round_s


def _execute_replicated(
    sess: Session, st: OpState, body: Callable[[int], Any], inv: int
) -> list[float]:
    """Every local node runs the plan's single order on its own replica."""
    cl = sess.cluster
    order = st.plan.order if st.plan.order is not None else np.empty(0, dtype=np.int64)
    op_key = sess.op_key(st.name, inv)
    t = time.perf_counter()
    sess.set_mode("exec")
    st.thread_times = {}
    try:
        for node in cl.local_nodes:
            cl.bind(node)
            t_node = time.perf_counter()
            with _running_bodies(st.name, inv, op_key, node):
                # breakpoints, history and watch probes see these bodies too
                _run_serial(wrap_body(sess.hooks, st.name, inv, node, body), order)
            st.thread_times[node] = [(0, 0, 0.0, time.perf_counter() - t_node)]
    finally:
        sess.set_mode("driver")
        cl.bind(cl.local_nodes[0])
    empty = np.empty(0, dtype=np.int64)
    st.round_orders = [{p: (order if p == 0 else empty) for p in cl.local_nodes}]
    return [time.perf_counter() - t]


@contextlib.contextmanager
def _running_bodies(op: str, inv: int, op_key: int, node: int) -> Iterator[None]:
    """Bind this thread to the invocation (for ``rng()``) while bodies run; a body's
    exception becomes a :class:`BodyError` naming the index, while the engine's own
    verdicts about the body (checked mode, replay divergence) pass through unchanged."""
    _tls.op_key = op_key
    try:
        yield
    except (AccessOutsideReconError, ClosureRuleError, DivergenceError):
        raise
    except Exception as exc:
        raise BodyError(op, inv, getattr(_tls, "index", -1), node, exc) from exc
    finally:
        _tls.op_key = None


def _run_serial(body: Callable[[int], Any], indices: np.ndarray) -> None:
    if type(body) is BoundKernel:  # one compiled loop over the group (engine/_asyncfor/kernel.py)
        run_group(body, indices)
        return
    tls = _tls
    for j in indices.tolist():
        tls.index = j
        body(j)


def _run_node_round(
    sess: Session,
    st: OpState,
    body: Callable[[int], Any],
    inv: int,
    op_key: int,
    node: int,
    r: int,
    tasks: list[Task],
    sched: Schedule | None,
    spans: list[tuple[int, float, float]],
) -> np.ndarray:
    """Run one node's tasks of one round; return the node's serialization order.

    Each thread that ran adds (thread, start, end) of its task groups to ``spans``
    (``time.perf_counter`` seconds; a handful per round, never per body)."""
    if not tasks:
        return np.empty(0, dtype=np.int64)
    forced = None
    body = wrap_body(sess.hooks, st.name, inv, node, body)  # a kernel: see kernel.py
    if sched is not None and sched.serial:
        # single-process replay: the node-round on one thread, in a recorded order
        forced = serial_order(sched, node, r, tasks)
        if sess.cluster.threads > 1 and _relaxed.active(sess):
            # outside the breakpoint wrapper: pdb stops in the body, with its copies bound
            body = _relaxed.per_planned_thread(body, tasks)
        tasks = [Task(0, forced)]
    if sess.cluster.threads == 1 or len(tasks) == 1 and not tasks[0].locked:
        _tls.gcode = ANY_OWN if forced is not None else tasks[0].thread + 1
        _tls.rthread = tasks[0].thread  # which copy of a relaxed DDS this thread works on
        start = time.perf_counter()
        try:
            with _running_bodies(st.name, inv, op_key, node):
                for t in tasks:
                    _run_serial(body, t.indices)
        finally:
            spans.append((0 if forced is not None else tasks[0].thread, start, time.perf_counter()))
        return np.concatenate([t.indices for t in tasks])
    return _run_threads(sess, st, body, inv, op_key, node, r, tasks, sched, spans)


def _gather_rows(
    indptr: np.ndarray, ids: np.ndarray, pos: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(row number, id) pairs of the CSR rows ``pos``, vectorised."""
    lens = indptr[pos + 1] - indptr[pos]
    offs = np.repeat(indptr[pos] - (np.cumsum(lens) - lens), lens) + np.arange(int(lens.sum()))
    return np.repeat(np.arange(len(pos)), lens), ids[offs]


def write_back(cl: Cluster, exchanges: list[list[Message]], r: int, *, stopped: bool) -> bool:
    """The write-back after round ``r`` (``r == len(exchanges) - 1``: the final one, after
    the last round): each row a node wrote goes to the nodes that touch it next
    (``engine._machines.routing``).

    Returns whether the local nodes must run no more bodies (they stopped following the
    plan, or heard that a node they depend on did); after the final one, whether any
    node anywhere stopped (``Cluster.exchange``).  A driver step of its own, called
    through this module, so that tests can substitute a broken barrier
    (``tests/mutants.py``) and prove that the dual tests notice.
    """
    messages = exchanges[r]
    defer = getattr(messages, "defer", None)  # rows due in a later round (``Exchange``)
    return cl.exchange(messages, stopped=stopped, last=r == len(exchanges) - 1, defer=defer)


def fetch_rows(cl: Cluster, messages: list[Message]) -> None:
    """The fetch exchange before an invocation's first round: each home sends the rows
    earlier invocations left dirty to the nodes that touch them first
    (``GuardPlan.fetch``), a message deferred to the round that first touches its rows
    where ``messages.defer`` says so.  A driver step of its own, so that tests can
    substitute a fetch that loses its rows (``tests/mutants.py``)."""
    cl.exchange(messages, defer=getattr(messages, "defer", None))


def locks_to_take(
    sets: AccessSets | NodeSets, start: int, planned: dict[int, np.ndarray]
) -> dict[int, np.ndarray]:
    """Per lock-split body, the element locks it takes: exactly the ones its plan calls for.

    The guard keeps checking bodies against ``planned``; this step is separate so that tests
    can substitute a wrong locking discipline (``tests/mutants.py``).
    """
    return planned


def _lock_ids(st: OpState, indices: np.ndarray, node: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Per body: the sorted element ids to lock (its writes, and its reads that someone
    in the group writes); and the union of ids written by the group (bodies of
    ``node``'s tasks)."""
    sets = st.sets
    assert sets is not None  # lock-split tasks exist only in plans made from sets
    pos = np.asarray(indices, dtype=np.int64) - st.start
    if isinstance(sets, NodeSets):  # the node's own bodies: their rows in its part
        pos = sets.rows(node, pos)
        sets = sets.part(node)[1]
    w_rows, w_ids = _gather_rows(sets.w_indptr, sets.w_ids, pos)
    r_rows, r_ids = _gather_rows(sets.r_indptr, sets.r_ids, pos)
    group_w = np.unique(w_ids)
    keep = np.isin(r_ids, group_w)
    rows = np.concatenate([w_rows, r_rows[keep]])
    gids = np.concatenate([w_ids, r_ids[keep]])
    order = np.lexsort((gids, rows))
    rows, gids = rows[order], gids[order]
    if len(gids):
        first = np.concatenate(([True], (rows[1:] != rows[:-1]) | (gids[1:] != gids[:-1])))
        rows, gids = rows[first], gids[first]
    bounds = np.searchsorted(rows, np.arange(len(pos) + 1))
    return [gids[bounds[k] : bounds[k + 1]] for k in range(len(pos))], group_w


def _run_threads(
    sess: Session,
    st: OpState,
    body: Callable[[int], Any],
    inv: int,
    op_key: int,
    node: int,
    r: int,
    tasks: list[Task],
    sched: Schedule | None,
    spans: list[tuple[int, float, float]],
) -> np.ndarray:
    locked = [t for t in tasks if t.locked]
    lock_of: dict[int, np.ndarray] = {}
    planned_locks = lock_of
    by_thread: dict[int, list[Task]] = {}
    for t in tasks:
        by_thread.setdefault(t.thread, []).append(t)
    # each thread's locked bodies in plan order: a ticket order is a merge of these
    seqs = {
        th: np.concatenate([t.indices for t in mine if t.locked])
        for th, mine in by_thread.items()
        if any(t.locked for t in mine)
    }
    lengths = thread_lengths(seqs)
    n_grants = 0
    # the grant gate of the lock-split bodies: free in a normal run (element locks, the
    # ticket order recorded), following a given order otherwise; one code path for both
    gate: FreeGrants | TurnSequencer | BatonGrants = FreeGrants({}, lock_of)
    baton: BatonGrants | None = None
    if locked:
        cached = st.lock_cache.get((r, node))
        if cached is None:
            all_idx = np.concatenate([t.indices for t in locked])
            per_body, group_w = _lock_ids(st, all_idx, node)
            cached = st.lock_cache[(r, node)] = (
                dict(zip(all_idx.tolist(), per_body, strict=True)),
                group_w.tolist(),
                sum(map(len, per_body)),
            )
        planned_locks = cached[0]
        n_grants = cached[2]
        assert st.sets is not None  # lock-split groups come from a plan made from sets
        lock_of = locks_to_take(st.sets, st.start, planned_locks)
        if lock_of is not planned_locks:  # a substituted step (tests/mutants.py)
            n_grants = sum(len(lock_of[j]) for j in lock_of)
        recorded = None if sched is None else sched.grant_order(node, r)
        where = {"node": node, "op": st.name, "invocation": inv}
        if recorded is not None:
            # replay: the recorded ticket order already orders every pair of bodies that
            # share a lock, so no element lock is taken
            turns, merged = recorded_ticket_order(
                recorded[0], recorded[1], seqs, node=node, op=st.name, invocation=inv, round=r
            )
            gate = TurnSequencer(turns, merged, where)
        elif sched is not None and sched.chaos is not None:
            # chaos: the bodies overlap, one baton passed at random at every access
            rng = sched.chaos.rng(st.name, inv, LOCKS, node, r, 0)
            gate = baton = BatonGrants(lock_of, lengths, rng, where)
        else:
            gate = FreeGrants({g: threading.Lock() for g in cached[1]}, lock_of)

    def work(thread: int, mine: list[Task]) -> None:
        start = time.perf_counter()
        try:
            _work(thread, mine)
        finally:
            _tls.baton = None
            spans.append((thread, start, time.perf_counter()))  # one append: atomic

    def _work(thread: int, mine: list[Task]) -> None:
        _tls.rthread = thread
        _tls.baton = baton
        with _running_bodies(st.name, inv, op_key, node):
            for t in mine:
                if not t.locked:
                    _tls.gcode = thread + 1
                    _run_serial(body, t.indices)
                    continue
                _tls.gcode = LOCKED_BODY
                for j in t.indices.tolist():
                    # the guard checks the program against the locks the plan calls
                    # for (a wrong locking discipline is the engine's bug, for the
                    # dual tests to find, not the program's)
                    _tls.held = set(planned_locks[j].tolist())
                    gate.acquire(thread, j)
                    try:
                        _tls.index = j
                        body(j)
                    except BaseException:
                        gate.abort(thread, j)
                        raise
                    gate.release(thread, j)

    pool = sess.cluster.pool(node)
    groups = sorted(by_thread.items())
    if sched is not None and sched.chaos is not None:  # which thread starts first
        groups = [groups[k] for k in sched.chaos.dispatch(st.name, inv, node, r, len(groups))]
    futures = [pool.submit(work, th, mine) for th, mine in groups]
    errors = [e for e in (f.exception() for f in futures) if e is not None]
    for e in errors:  # a body that left the plan explains the others' failures
        if isinstance(e, PlanViolation):
            raise e
    for e in errors:  # a real failure explains the waiters that stopped because of it
        if not (isinstance(e, DivergenceError) and e.what == "lock" and e.event == "lock turn"):
            raise e
    if errors:
        raise errors[0]
    unlocked = [t.indices for t in tasks if not t.locked]
    ticket_a = np.array(gate.tickets, dtype=np.int64).reshape(-1, 2)
    order = unlocked + [ticket_a[:, 0]]
    if locked:
        positions, threads = encode(ticket_a[:, 1], lengths)
        gids = handover_elements(ticket_a[:, 0], ticket_a[:, 1], positions, lock_of)
        assert sess.tape is not None  # set by _attempt for the whole invocation
        sess.tape.lock_grants(
            st.name,
            inv,
            node,
            r,
            len(ticket_a),
            n_grants,
            positions,
            threads,
            [_element_name(sess, g) for g in gids.tolist()],
        )
    return np.concatenate(order)


#: Longest element name a trace keeps (a ``dmap`` key's repr can be any length).
MAX_ELEMENT_NAME = 48


def _element_name(sess: Session, gid: int) -> str:
    """``W[943]``: the DDS and user-facing index (a ``dmap`` key's repr) of an element id."""
    if gid < 0:
        return "-"
    d = sess.dds[gid >> SLOT_BITS]
    key = d.key_of(gid & SLOT_MASK)
    shown = str(key) if isinstance(key, int | np.integer) else repr(key)
    name = f"{d.name}[{shown}]".replace("\n", " ")
    return name if len(name) <= MAX_ELEMENT_NAME else name[: MAX_ELEMENT_NAME - 2] + "…]"


def last_order(name: str) -> np.ndarray:
    """The serialization order of the last invocation of operator ``name`` (collective).

    Rounds in order; inside a round, nodes in order (their bodies never conflict);
    inside a node, unlocked tasks then locked bodies in lock-acquisition order.
    """
    sess = current()
    st = sess.ops.get(name)
    if st is None or st.round_orders is None:
        raise KeyError(f"no invocation of operator {name!r} has run in this session")
    per_proc = sess.cluster.allgather(st.round_orders)
    parts = []
    for r in range(len(st.round_orders)):
        merged: dict[int, np.ndarray] = {}
        for proc in per_proc:
            merged.update(proc[r])
        parts += [merged[p] for p in sorted(merged)]
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def plan_of(name: str) -> Plan:
    """The plan of operator ``name`` in the current session, every node's tasks.

    Under MPI this is a driver step, like every driver operation every rank runs it: once
    an invocation has run a plan a rank keeps only its own nodes' part
    (``_keep_own_parts``), so the ranks gather the whole plan here."""
    sess = current()
    st = sess.ops.get(name)
    if sess.cluster.is_mpi:
        sess.agree(f"plan_of({name!r})")
    if st is None:
        raise KeyError(f"no operator {name!r} has run in this session")
    plan: Plan = st.plan
    if sess.cluster.is_mpi and plan.kept is not None:
        return whole_plan(plan, sess.cluster.allgather(own_parts(plan)))
    return plan


__all__ = ["async_for", "last_order", "plan_of"]
