"""``sync_for``: data-parallel execution of a body over the minibatches of a DDS.

Execution model (the same on an in-process cluster and on MPI ranks):

* **Workers and clocks.**  The data is cut into minibatches of ``minibatch``
  consecutive elements.  With P nodes of T threads there are P*T workers; in each
  *clock* every worker runs ``per_clock`` minibatches (see ``_synclayout`` for the
  exact static assignment).
* **Caches and deltas.**  A worker runs its bodies on its own cache, a copy of its
  node's replica of the *parameters* (the DDS the bodies write).  After the clock,
  the worker's delta is ``cache_after - cache_before`` of the rows it wrote; its node
  adds its threads' deltas up in thread order.
* **Aggregation.**  The owner of each row aggregates the nodes' deltas: by default
  the sum in node order divided by the number of nodes that ran at least one
  minibatch in the clock, i.e. threads' deltas add up and nodes' deltas average (a
  node that ran but did not touch the row counts as a zero delta; a node with no
  minibatch in a clock, which happens in the last clock, does not count);
  :func:`register_aggregation` replaces it for one DDS with a function of the stacked
  deltas in (node, thread) order.  The owner adds the aggregate to its rows and sends
  each node the new values it may read before the row is written again (``routing``;
  the last clock's update makes every replica whole).  A delta or update of no rows is
  not sent.  Arrival order never changes the arithmetic; it is reported to the
  recorder (``aggregation_order``).
* **Synchronisation** (``sync=``):

  - ``"bsp"``: every node waits for every update of a clock before the next one.
  - ``"ssp"``: a node may run up to ``staleness`` clocks ahead of the slowest node;
    a clock's reads include every update up to ``staleness + 1`` clocks back, and
    whichever newer ones had arrived (reported as ``ssp_visibility``).
    ``staleness=0`` is BSP, and a session with ``test_mode`` set forces it.
  - ``"hybrid"``: the threads of a node share one node cache with no per-row locks
    (Hogwild), but each body holds a node-level mutex, so a node's bodies run one at
    a time in an order that is reported to the recorder (``body_order``) and can be
    replayed; nodes synchronise as in BSP at the end of each clock (subiteration),
    each node counting as one worker in the average.

* **Reconnaissance.**  With ``re=True`` (default) the first invocation runs every body
  once in reconnaissance mode to learn which rows each minibatch reads and writes;
  caches are refreshed, and deltas and updates sent, for those rows only.  With
  ``re=False`` every numeric DDS the body references (closure or globals) is a
  parameter and moves whole every clock.
* **The guard and re-planning** (``replan=``).  Row sets may stop being valid: rows
  drawn from ``rng()`` (negative sampling), chosen by parameter values, or behind a
  flag that flips.  Every parameter access outside the running minibatch's rows is
  detected as it happens (``_syncguard``), in every run; the attempt finishes on every
  node (so no rank waits on another), the nodes agree on the verdict (an allgather
  under MPI), and then:

  - ``"auto"`` (default): every parameter DDS is restored to its state before the
    invocation, its reconnaissance re-runs, and it re-executes; if that attempt
    violates too (rows depend on values written in the same invocation), it runs
    once more with every parameter DDS moved whole, which is always correct.  The
    first re-plan of an operator prints one line on stderr.  The next invocation
    starts where this one ended: after a re-plan it runs reconnaissance up front
    (and stops doing so once two reconnaissances in a row agree); after a whole
    fallback it stays whole.
  - ``"always"``: reconnaissance before every invocation (whole fallback as above).
  - ``"never"``: restore, then raise :class:`AccessOutsideReconError` naming the
    operator, invocation, minibatch and element.

  Only the attempt that stands is reported to the recorder (events are kept per
  attempt on a ``engine._machines.tape.Tape`` and handed over as one schedule value).

Loop bodies draw random numbers from ``engine.rng()``, seeded by (run seed, operator,
invocation, minibatch number).  The data DDS is read-only inside the body.
"""

from __future__ import annotations

import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._asyncfor.closure import (
    BodyGuard,
    Captures,
    agree_numbers,
    check_body,
    finish,
    guard,
    verify,
    watch,
)
from .._asyncfor.recon import (
    AccessSets,
    Done,
    concat_sets,
    declared_hint,
    recon_range,
    recon_shares,
)
from .._data import shard as _shard
from .._data.dds import _DDS, SLOT_BITS, make_whole
from .._errors import DDSError, SessionError
from .._runtime.checkpoint import end_invocation, skip_invocation
from .._runtime.session import Session, current
from .dds import Batch, enter_sync_mode, make_batch
from .drive import drive_in_process, drive_mpi
from .guard import Violation, violation_error
from .layout import SyncLayout
from .node import NodeRun, SyncContext
from .reference import reference_sync_for

SYNC_MODELS = ("bsp", "ssp", "hybrid")
REPLANS = ("auto", "always", "never")

#: Attempt levels of one invocation: the operator's cached reconnaissance sets, sets
#: from a reconnaissance of this very invocation, every parameter DDS moved whole.
CACHED, FRESH, WHOLE = 0, 1, 2

_AGGREGATIONS: weakref.WeakKeyDictionary[_DDS, Callable[[np.ndarray], np.ndarray]] = (
    weakref.WeakKeyDictionary()
)


def register_aggregation(dds: _DDS, fn: Callable[[np.ndarray], np.ndarray] | None) -> None:
    """Aggregate ``dds``'s deltas in ``sync_for`` with ``fn`` instead of averaging.

    ``fn(deltas)`` gets one clock's deltas of the rows an owner aggregates, stacked
    as ``(workers, rows, *shape)`` in (node, thread) order (Hybrid: node order), and
    returns the ``(rows, *shape)`` delta to add.  ``fn=None`` restores the average.
    ``fn`` must compute its result from the deltas alone (closure rule, as for a body:
    it is called once per clock on each owner, so state it kept would change a
    different number of times on another placement or in a replay).

    >>> import engine as ap
    >>> G = ap.dvector(3, shape=(), name="agg_doc")
    >>> ap.register_aggregation(G, lambda deltas: deltas.sum(axis=0))
    """
    if not isinstance(dds, _DDS):
        raise TypeError(f"register_aggregation needs a DDS, got {type(dds).__name__}")
    if not dds._numeric:
        raise DDSError(f"{dds.name}: only numeric DDS have deltas to aggregate")
    if fn is None:
        _AGGREGATIONS.pop(dds, None)
    elif not callable(fn):
        raise TypeError(f"register_aggregation({dds.name}): fn must be callable or None")
    else:
        _AGGREGATIONS[dds] = fn


def _aggregation_of(d: _DDS) -> str:
    return f"the aggregation function of {d.name!r}"


def _aggregations(
    params: list[_DDS], name: str, inv: int, *, guarded: bool
) -> list[Callable[[np.ndarray], np.ndarray] | None]:
    """The aggregation function of each of ``params`` (None: the average).  Like a body,
    it may change nothing but DDS (closure rule: state it kept would differ between
    ranks, replays and the dual tests' serial side, which call it a different number of
    times): checked before it runs, and, when ``guarded`` (checked and test mode, the
    first invocation), while it runs."""
    out: list[Callable[[np.ndarray], np.ndarray] | None] = []
    for d in params:
        fn = _AGGREGATIONS.get(d)
        if fn is not None:
            subject = _aggregation_of(d)
            check_body(name, fn, subject)
            if guarded:
                fn = guard(fn, name, inv, kind="sync_for", what="deltas of shape", subject=subject)
        out.append(fn)
    return out


@dataclass
class SyncState:
    """Per-operator cache: reconnaissance sets and layouts, reused while valid."""

    key: tuple[Any, ...]
    sets: AccessSets | None
    params: list[_DDS]
    layout: SyncLayout | None = None
    caches: dict[tuple[int, int, int], np.ndarray] = field(default_factory=dict)
    whole: SyncLayout | None = None  # the layout of the whole fallback
    start: int = CACHED  # replan="auto": the level the next invocation starts at
    warned: set[str] = field(default_factory=set)
    replans: int = 0
    wholes: int = 0
    #: per node, the sharded rows away from home that its minibatches read (from ``sets``)
    reads: tuple[AccessSets, dict[_DDS, list[np.ndarray]]] | None = None


def _whole_params(body: Callable[..., Any], sess: Session, name: str, data: _DDS) -> list[_DDS]:
    """The parameters of a ``re=False`` layout: every numeric DDS the body references.  A
    relaxed dvector among them is refused: without reconnaissance nothing tells a read
    from a write, and only ``async_for`` bodies may write one."""
    params = [d for d in _captured(body, sess) if d is not data]
    for d in params:
        if getattr(d, "_relaxed", False):
            raise DDSError(
                f"sync_for {name!r}: the body references {d.name!r}, a relaxed dvector; with "
                "re=False sync_for cannot tell whether it writes it, and only async_for "
                "bodies may write one: use re=True"
            )
    return params


def _captured(body: Callable[..., Any], sess: Session) -> list[_DDS]:
    """Numeric DDS the body references through its closure or globals."""
    code = getattr(body, "__code__", None)
    if code is None:
        return [d for d in sess.dds if d._numeric]
    found: dict[int, _DDS] = {}

    def visit(value: Any) -> None:
        if isinstance(value, _DDS):
            found[value._id] = value
        elif isinstance(value, (tuple, list, dict)):
            for v in value.values() if isinstance(value, dict) else value:
                if isinstance(v, _DDS):
                    found[v._id] = v

    for cell in getattr(body, "__closure__", None) or ():
        try:
            visit(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    names: set[str] = set()
    stack = [code]
    while stack:
        c = stack.pop()
        names.update(c.co_names)
        stack += [k for k in c.co_consts if hasattr(k, "co_names")]
    glob = getattr(body, "__globals__", {})
    for n in names:
        if n in glob:
            visit(glob[n])
    return [found[i] for i in sorted(found) if found[i]._numeric]


def _recon(
    sess: Session, name: str, inv: int, body: Callable[[Batch], Any], data: _DDS, size: int
) -> AccessSets:
    cl = sess.cluster
    n = len(data)
    M = -(-n // size) if n else 0
    body = guard(body, name, inv, kind="sync_for", what="minibatch")
    sess.set_mode("recon")
    try:

        def share(node: int, done: Done | None) -> AccessSets:
            buf = data._bufs[node]

            def one(m: int) -> None:
                body(make_batch(data, buf, m, m * size, min((m + 1) * size, n)))

            lo, hi = M * node // cl.size, M * (node + 1) // cl.size
            sets = recon_range(sess, name, inv, one, lo, hi, done)
            finish(body)  # inside the share: a late violation is this node's failure
            return sets

        parts = recon_shares(cl, sess, f"reconnaissance of {name}", share)
    finally:
        sess.set_mode("driver")
    return concat_sets(parts)


def _params_from_sets(sess: Session, name: str, sets: AccessSets, data: _DDS) -> list[_DDS]:
    ids = np.unique(sets.w_ids >> SLOT_BITS).tolist()
    out = []
    for i in ids:
        d = sess.dds[i]
        if d is data:
            raise DDSError(
                f"sync_for {name!r}: the body writes its data DDS {data.name!r}, which is "
                "read-only inside sync_for; keep parameters in their own DDS"
            )
        if not d._numeric:
            raise DDSError(
                f"sync_for {name!r}: the body writes {d.name!r}, whose elements are Python "
                "objects; sync_for parameters must be numeric DDS (deltas are row differences)"
            )
        out.append(d)
    return out


def _lanes(sess: Session, params: list[_DDS], hybrid: bool) -> list[int]:
    T = sess.cluster.threads
    return [1 if hybrid or d not in _AGGREGATIONS else T for d in params]


def _layout(
    sess: Session,
    data: _DDS,
    minibatch: int,
    per_clock: int,
    params: list[_DDS],
    sets: AccessSets | None,
    lanes: list[int],
) -> SyncLayout:
    cl = sess.cluster
    return SyncLayout(
        n=len(data),
        size=minibatch,
        nodes=cl.size,
        threads=cl.threads,
        per_clock=per_clock,
        params=params,
        sets=sets,
        lanes=lanes,
    )


def _state(
    sess: Session,
    name: str,
    inv: int,
    data: _DDS,
    minibatch: int,
    per_clock: int,
    body: Callable[[Batch], Any],
    re: bool,
    hybrid: bool,
) -> tuple[SyncState, bool]:
    cl = sess.cluster
    code = getattr(body, "__code__", body)
    key = (id(data), len(data), minibatch, per_clock, code, re, cl.size, cl.threads)
    st: SyncState | None = sess.ops.get(f"sync_for:{name}")
    fresh = st is None or st.key != key
    if st is None or fresh:
        sets: AccessSets | None = None
        if re:
            sess.announce(f"reconnaissance {name}")
            sets = _recon(sess, name, inv, body, data, minibatch)
            params = _params_from_sets(sess, name, sets, data)
        else:
            params = _whole_params(body, sess, name, data)
        st = SyncState(key, sets, params)
        sess.ops[f"sync_for:{name}"] = st
    lanes = _lanes(sess, st.params, hybrid)
    if st.layout is None or st.layout.lanes != lanes:
        st.layout = _layout(sess, data, minibatch, per_clock, st.params, st.sets, lanes)
    return st, fresh


def _hold_reads(sess: Session, st: SyncState, name: str, minibatch: int, per_clock: int) -> None:
    """Collective: each node holds the rows of sharded DDS that reconnaissance saw the
    minibatches it runs read.  Reconnaissance fetched them to the node whose share of
    minibatches it ran, but minibatch m runs on node ``(m mod P*T*per_clock) //
    (T*per_clock)``: without this a body that reads another sharded dvector raised
    ShardMissError on 2 or more nodes (not on 1)."""
    sets = st.sets
    if sets is None or not _shard.sharded(sess):
        return
    if st.reads is None or st.reads[0] is not sets:
        cl = sess.cluster
        ms = np.arange(sets.start, sets.start + sets.n, dtype=np.int64)
        lanes = cl.threads * int(per_clock)
        runs_on = (ms % (cl.size * lanes)) // lanes
        nodes = np.repeat(runs_on, np.diff(sets.r_indptr))
        st.reads = (sets, _shard.needs_of(sess, nodes, sets.r_ids))
    _shard.ensure_rows(sess, f"sync_for {name} reads", st.reads[1])


def _rerecon(
    sess: Session,
    st: SyncState,
    name: str,
    inv: int,
    body: Callable[[Batch], Any],
    data: _DDS,
    minibatch: int,
    per_clock: int,
    hybrid: bool,
) -> bool:
    """Reconnaissance of invocation ``inv`` replaces the operator's sets; True when the
    sets changed."""
    old = st.sets
    sets = _recon(sess, name, inv, body, data, minibatch)
    same = old is not None and all(
        np.array_equal(getattr(old, a), getattr(sets, a))
        for a in ("r_indptr", "r_ids", "w_indptr", "w_ids")
    )
    if same:
        return False
    st.sets = sets
    st.params = _params_from_sets(sess, name, sets, data)
    lanes = _lanes(sess, st.params, hybrid)
    st.layout = _layout(sess, data, minibatch, per_clock, st.params, sets, lanes)
    return True


def _whole(
    sess: Session,
    st: SyncState,
    body: Callable[[Batch], Any],
    data: _DDS,
    minibatch: int,
    per_clock: int,
    hybrid: bool,
) -> SyncLayout:
    """The ``re=False`` layout: every parameter reconnaissance found or the body
    references, moved whole."""
    found = {d._id: d for d in st.params}
    # a relaxed dvector is read-only here: reconnaissance refuses a sync_for write to it
    found.update(
        (d._id, d)
        for d in _captured(body, sess)
        if d is not data and not getattr(d, "_relaxed", False)
    )
    params = [found[i] for i in sorted(found)]
    lanes = _lanes(sess, params, hybrid)
    w = st.whole
    if w is None or w.params != params or w.lanes != lanes:
        w = st.whole = _layout(sess, data, minibatch, per_clock, params, None, lanes)
    return w


#: per DDS id: (the DDS, the slots kept, per local node the rows of those slots)
Snapshot = dict[int, tuple[_DDS, np.ndarray, dict[int, np.ndarray]]]


def _snapshot(snap: Snapshot, layout: SyncLayout, nodes: list[int]) -> None:
    """Keep the local rows an attempt with ``layout`` may change (what its nodes write:
    deltas and updates touch no other row of any replica) and that are not kept yet.
    Taken before the attempt, after any earlier attempt was restored, so every row kept
    holds its value from before the invocation."""
    for k, d in enumerate(layout.params):
        rows = layout.written(k)
        got = snap.get(d._id)
        if got is None:
            snap[d._id] = (d, rows, {p: d._bufs[p][rows] for p in nodes})
            continue
        _, kept, copies = got
        new = np.setdiff1d(rows, kept, assume_unique=True)
        if not len(new):
            continue
        both = np.union1d(kept, new)
        at_kept, at_new = np.searchsorted(both, kept), np.searchsorted(both, new)
        for p in nodes:
            vals = np.empty((len(both), *d._bufs[p].shape[1:]), dtype=d._bufs[p].dtype)
            vals[at_kept] = copies[p]
            vals[at_new] = d._bufs[p][new]
            copies[p] = vals
        snap[d._id] = (d, both, copies)


def _restore(snap: Snapshot) -> None:
    for d, rows, copies in snap.values():
        for p, vals in copies.items():
            d._bufs[p][rows] = vals
        d._touch()


def _attempt(sess: Session, ctx: SyncContext) -> tuple[dict[int, NodeRun], int, Violation | None]:
    """Run one attempt of the invocation on every local node; return the node runs,
    the bytes every node sent, and the first violation of any node (all agree)."""
    cl = sess.cluster
    sess.mode = "sync"
    for d in sess.dds:
        enter_sync_mode(d)
    try:
        runs = {p: NodeRun(ctx, p) for p in cl.local_nodes}
        if cl.is_mpi:
            drive_mpi(ctx, runs[cl.rank])
        else:
            drive_in_process(ctx, runs)
    finally:
        sess.set_mode("driver")
        cl.bind(cl.local_nodes[0])
    found = [r.violations.first for r in runs.values() if r.violations.first is not None]
    moved = ctx.sent_bytes[0]
    if cl.is_mpi:  # every rank learns every verdict: they undo (or go on) together
        got = cl.allgather((moved, [(v.minibatch, v.node, v.element, v.write) for v in found]))
        moved = sum(g[0] for g in got)
        found = [Violation(*v) for g in got for v in g[1]]
    return runs, moved, min(found, key=Violation.key, default=None)


def _warn(sess: Session, st: SyncState, name: str, inv: int, v: Violation, level: int) -> None:
    """One line on stderr per operator and kind of re-plan (from the process of node 0)."""
    kind = "whole" if level == WHOLE else "replan"
    if kind in st.warned or sess.cluster.local_nodes[0] != 0:
        return
    st.warned.add(kind)
    did = "wrote" if v.write else "read"
    if level == WHOLE:
        then = (
            "the re-planned attempt did too (its rows depend on values written in the same "
            "invocation), so it ran with every parameter DDS moved whole"
        )
    else:
        then = "undid the invocation, re-ran reconnaissance and re-executed it"
    print(
        f"engine: sync_for {name!r} invocation {inv}: minibatch {v.minibatch} {did} "
        f"{v.element} outside its reconnaissance rows{declared_hint(sess, name)}; {then} "
        "(printed once; the planner "
        "report counts re-plans)",
        file=sys.stderr,
        flush=True,
    )


def sync_for(
    data: _DDS,
    minibatch: int,
    body: Callable[[Batch], Any],
    *,
    sync: str = "bsp",
    staleness: int = 2,
    re: bool = True,
    replan: str = "auto",
    name: str,
    per_clock: int = 1,
) -> None:
    """Run ``body(batch)`` on every minibatch of ``data``, data-parallel (BSP, SSP or Hybrid).

    ``batch`` is an :class:`engine.Batch`: ``batch.number`` (minibatch m holds the
    elements in slots ``m*minibatch ..``), ``batch.keys`` (their indices, or keys of a
    dmap), ``batch.values`` (a read-only ``(len, *shape)`` numpy block, or a list of
    Python objects); iterating it yields (key, value) pairs.  ``data`` is read-only.

    Each of the P*T worker threads runs ``per_clock`` minibatches per clock on its own
    cache of the parameters (the DDS the body writes); the owners then add the
    average of the workers' deltas (or what :func:`register_aggregation` says) and
    every replica gets the new values.  ``sync="bsp"`` synchronises every clock;
    ``"ssp"`` lets a node run up to ``staleness`` clocks ahead of the slowest, so its
    reads may miss recent updates (``staleness=0`` is BSP; ``test_mode`` forces 0);
    ``"hybrid"`` gives the threads of a node one shared cache with no row locks
    (Hogwild) but runs each body under a node mutex, so the interleaving is recorded
    and replayable, and synchronises nodes every clock.  ``re=True`` moves only the
    rows reconnaissance saw each minibatch touch; ``re=False`` moves every numeric DDS
    the body references, whole.  With ``re=True`` any access outside the rows
    reconnaissance saw is detected; ``replan="auto"`` then undoes the invocation,
    re-runs reconnaissance and re-executes it (moving parameters whole if that is not
    enough), ``"always"`` runs reconnaissance before every invocation, and ``"never"``
    raises :class:`engine.AccessOutsideReconError`.  See the ``engine._syncfor.loop``
    module docstring.

    >>> import engine as ap
    >>> xs = ap.dvector(6, shape=(1,), data=[[1.0], [2.0], [3.0], [4.0], [5.0], [6.0]],
    ...                 name="sync_doc_xs")
    >>> w = ap.dvector(1, shape=(1,), name="sync_doc_w")
    >>> def body(batch):
    ...     w[0] += 0.5 * (batch.values.mean(axis=0) - w[0])
    >>> ap.sync_for(xs, 2, body, sync="bsp", name="sync_doc_mean")
    >>> w.gather()[0].tolist()  # one worker: minibatches [1,2], [3,4], [5,6] in turn
    [3.8125]
    """
    sess = current()
    if sess.mode != "driver":
        raise SessionError(
            f"sync_for {name!r} was called inside a loop body; nesting is not supported"
        )
    if not isinstance(name, str) or not name:
        raise TypeError("sync_for needs name='...' to identify the operator in traces")
    if not isinstance(data, _DDS):
        raise TypeError(f"sync_for {name!r}: data must be a DDS, got {type(data).__name__}")
    if sync not in SYNC_MODELS:
        raise ValueError(f"sync_for {name!r}: sync must be one of {SYNC_MODELS}, got {sync!r}")
    for what, v, low in (("minibatch", minibatch, 1), ("per_clock", per_clock, 1)):
        if not isinstance(v, (int, np.integer)) or v < low:
            raise ValueError(f"sync_for {name!r}: {what} must be an int >= {low}, got {v!r}")
    if not isinstance(staleness, (int, np.integer)) or staleness < 0:
        raise ValueError(f"sync_for {name!r}: staleness must be an int >= 0, got {staleness!r}")
    if replan not in REPLANS:
        raise ValueError(f"sync_for {name!r}: replan must be one of {REPLANS}, got {replan!r}")
    inv = sess.next_invocation(name)
    numbers = None
    if sess.cluster.is_mpi:  # the numbers the body and aggregations read: the same on every rank
        numbers = Captures(body)
        for d, fn in sorted(_AGGREGATIONS.items(), key=lambda kv: kv[0]._id):
            if d._sess is sess:
                numbers.merge(Captures(fn), _aggregation_of(d))
    got = sess.agree(f"sync_for {name!r} #{inv} over {data.name!r}", numbers and numbers.keys)
    agree_numbers(f"sync_for {name!r} (invocation {inv})", numbers, got, sess.cluster.allgather)
    if skip_invocation(sess, name, inv):  # time travel: fast-forward to a checkpoint
        return
    make_whole(sess=sess)  # workers read and route the model from whole replicas
    if data._sharded:  # each node holds the minibatches it reads
        cl = sess.cluster
        needs = _shard.minibatch_needs(data, cl.size, cl.threads, int(minibatch), int(per_clock))
        _shard.ensure_rows(sess, f"sync_for {name}", needs)
    _shard.clear_missed()
    sched = sess.schedules.schedule(name, inv, "sync_for", sess.cluster.size)
    if sched is not None and sched.workers is not None:  # the dual tests' serial side
        run_body = guard(body, name, inv, kind="sync_for", what="minibatch")
        params = [d for d in _captured(body, sess) if d is not data]
        reference_sync_for(
            sess,
            inv,
            data,
            int(minibatch),
            run_body,
            sync=sync,
            name=name,
            per_clock=int(per_clock),
            params=params,
            aggs=(aggs := _aggregations(params, name, inv, guarded=True)),
            schedule=sched,
        )
        for guarded_fn in (run_body, *aggs):
            if guarded_fn is not None:
                finish(guarded_fn)
        return
    check_body(name, body)
    hybrid = sync == "hybrid"
    stale = int(staleness) if sync == "ssp" and not getattr(sess, "test_mode", False) else 0
    if sync == "ssp" and staleness > 0 and not stale:
        sess.note_exact("ssp", name, staleness=int(staleness))
    mb, pc = int(minibatch), int(per_clock)
    t0 = time.perf_counter()
    run_body = body
    if sess.checked or getattr(sess, "test_mode", False):
        run_body = guard(body, name, inv, kind="sync_for", what="minibatch")
    # a normal run: what the bare body and aggregations reach, compared after the invocation
    baselines: list[BodyGuard | None] = []
    if run_body is body:
        baselines.append(watch(body, name, inv, kind="sync_for", what="minibatch"))
        for d, fn in sorted(_AGGREGATIONS.items(), key=lambda kv: kv[0]._id):
            if d._sess is sess:
                subject = _aggregation_of(d)
                kw = {"kind": "sync_for", "what": "deltas of shape", "subject": subject}
                baselines.append(watch(fn, name, inv, **kw))
    st, fresh = _state(sess, name, inv, data, mb, pc, body, re, hybrid)
    guarded = fresh or run_body is not body
    again = (body, data, mb, pc, hybrid)
    level = CACHED
    if not re:
        level = WHOLE
    elif fresh:
        level = FRESH
    elif replan == "always" or (replan == "auto" and st.start == FRESH):
        level = FRESH
        if not _rerecon(sess, st, name, inv, *again[:3], pc, hybrid) and replan == "auto":
            st.start = CACHED  # two reconnaissances agree: the cached sets will do
    elif replan == "auto" and st.start == WHOLE:
        level = WHOLE
    recon_s = time.perf_counter() - t0
    if fresh or level == FRESH:
        sess.phase_done("reconnaissance", time.time() - recon_s, recon_s)
    cl = sess.cluster
    snap: Snapshot = {}
    t1 = time.perf_counter()
    layout: SyncLayout | None
    while True:
        if level == WHOLE and re:
            layout = _whole(sess, st, *again)
        else:
            layout = st.layout
        _hold_reads(sess, st, name, mb, pc)
        assert layout is not None
        if layout.sets is not None:  # guarded: this attempt may be undone
            _snapshot(snap, layout, cl.local_nodes)
        ctx = SyncContext(
            sess=sess,
            name=name,
            inv=inv,
            op_key=sess.op_key(name, inv),
            body=run_body,
            data=data,
            layout=layout,
            hybrid=hybrid,
            staleness=stale,
            aggs=_aggregations(layout.params, name, inv, guarded=guarded),
            caches=st.caches,
            events=sess.new_tape(),
            sched=sched,
        )
        runs, moved, violation = _attempt(sess, ctx)
        if violation is None:
            break
        _restore(snap)
        if replan == "never":
            raise violation_error(name, inv, violation, declared_hint(sess, name))
        st.replans += 1
        if level == CACHED and _rerecon(sess, st, name, inv, *again[:3], pc, hybrid):
            level = FRESH
        else:  # fresh sets violated (or recon saw nothing new): values decide the rows
            level = WHOLE
            st.wholes += 1
        if replan == "auto":
            st.start = level
        _warn(sess, st, name, inv, violation, level)
    for guarded_fn in (run_body, *ctx.aggs):
        if guarded_fn is not None:
            finish(guarded_fn)
    for baseline in baselines:
        verify(baseline)
    _shard.check_missed(sess)
    for d in layout.params:
        d._touch()
    seconds = time.perf_counter() - t1
    sess.op_times.setdefault(name, []).append(seconds)
    info = layout.describe()
    entry = sess.planner.setdefault(name, {"recon_s": round(recon_s, 6)})
    entry.update(
        strategy=sync,
        rounds=info["clocks"],
        imbalance=info["imbalance"],
        bodies=info["minibatches"],
        staleness=stale,
        re=bool(re),
        replan=replan,
        replans=st.replans,
        whole_fallbacks=st.wholes,
        params=[d.name for d in layout.params],
        bytes_moved=int(moved),
        bytes_per_clock=round(moved / info["clocks"], 3) if info["clocks"] else 0.0,
    )
    if fresh:
        entry["recon_s"] = round(recon_s, 6)
    sess.recorder.schedule_done(ctx.events.schedule(name, inv))
    _report(sess, name, inv, layout, runs, seconds, sync)
    end_invocation(sess, name, inv, list(layout.params), seconds)
    sess.hooks.after_invocation(name, inv)


def _report(
    sess: Session,
    name: str,
    inv: int,
    layout: SyncLayout,
    runs: dict[int, NodeRun],
    seconds: float,
    sync: str,
) -> None:
    digests = sess.record_digests(name, inv)
    per_node = layout.bodies_per_node()
    phases = sess.take_phases()
    for k, node in enumerate(sess.cluster.local_nodes):
        info: dict[str, Any] = {
            "bodies": int(per_node[node]),
            "rounds": layout.clocks,
            "seconds": seconds,
            "round_seconds": [round(x, 6) for x in runs[node].clock_seconds],
            "strategy": sync,
            "phases": phases,
        }
        if k == 0:
            info["digests"] = digests
        sess.recorder.invocation_done(name, inv, node, info)


__all__ = ["SYNC_MODELS", "Batch", "register_aggregation", "sync_for"]
