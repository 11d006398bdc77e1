"""The planner: turn reconnaissance sets into rounds of conflict-free task groups.

Pure functions of numpy arrays — no MPI, no clock — so every node computes the same
plan from the same sets, and tests can feed hand-made sets.

Two bodies conflict iff one writes an element the other reads or writes.  A plan is
a list of rounds; in each round every node gets a list of tasks (one per thread
slot).  Tasks on different nodes, and unlocked tasks on one node, never conflict.
A group too big for one thread is split into ``locked`` tasks that run concurrently
under per-element locks taken in global (element id) order.

Strategies:

* ``components`` — connected components of the conflict graph (Cyclades-style: per
  batch of consecutive indices; the batch size is chosen by the cost model), placed
  greedily largest-first.  Good for sparse conflict graphs.
* ``rotation`` — block rotation (STRADS static schedule / DSGD ring) for bodies that
  touch exactly one element of each of k written index spaces.  Each space is cut
  into P blocks of equal *access counts*; in round r node p runs the bodies whose
  blocks are (p, p+r_2, ..., p+r_k) mod P.  The space with the most elements stays
  (its blocks over a seeded permutation, so that popular low ids do not pile onto one
  node's rounds); the others move, cut in id order (``_rotation_blocks``).
* ``colouring`` — chromatic scheduling (GraphLab's chromatic engine) for dense conflict
  graphs that are one giant component (Gauss–Seidel sweeps): a greedy colouring of the
  conflict graph (``_colouring``); each colour class is one round, dealt to every
  node's threads by estimated work, largest first, each thread's share in ascending
  index order.  Bodies of one colour never conflict, so no task is locked, and the
  serial order is colour by colour.
* ``tokens`` — for bodies that touch one element of each of two written spaces (SGDMF):
  node p keeps user block p (LPT by access counts) and the second space is cut into
  4P blocks, *tokens*, handed to whichever node is free, by a static simulation with
  body counts as time (``tokens``); each task goes to the round of its depth in the
  dependency DAG, so routed write-back carries exactly the hand-offs.
* ``wavefront`` — levels of a given serial order: a body goes one level after the
  latest earlier conflicting body.  Running the levels in order reproduces that
  serial order exactly (used by the forward dual test).

``auto`` evaluates components, rotation and colouring with the same cost model, an
estimate of the makespan (sum over rounds of the busiest node's bodies plus a per-round
overhead), and keeps the cheapest; on equal cost rotation wins, then components.  It does
not try ``tokens``: compared with rotation by critical path (``makespan``: no barriers,
``ROUND_OVERHEAD_BODIES`` per message hop) it never won on an SGDMF data set or P we
measured, and building it added 0.1-0.25 s to every multi-node planning of
MovieLens-100K (about 7%); ask for it with ``strategy="tokens"``.

A plan's ``imbalance`` is its critical path over (bodies / P) (``makespan``);
``barrier_imbalance`` the sum over rounds of the busiest node's bodies over the same.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace

import numpy as np

from .._asyncfor.recon import AccessSets
from .._data.dds import SLOT_BITS
from .colouring import body_weights, colour_bodies, colour_lower_bound
from .makespan import barrier_makespan, critical_path, on_demand_path
from .routing import message_edges
from .tokens import TOKENS_PER_NODE, hand_out_bodies

#: Cost of one round (exchange + barrier) in body-equivalents; more rounds buy smaller
#: components but each one pays a network round trip.
ROUND_OVERHEAD_BODIES = 200
#: Smallest batch the components strategy tries, per node.
MIN_BATCH_PER_NODE = 64
#: A node's largest group is split across threads when it exceeds this multiple of
#: the node's per-thread share.
SPLIT_FACTOR = 1.25
#: Rotation is only tried for this many written index spaces or fewer (P^(k-1) rounds).
MAX_ROTATION_SPACES = 3

_NONE = np.empty(0, dtype=np.int64)


@dataclass(slots=True)
class Task:
    """Work of one thread: loop indices in execution order."""

    thread: int
    indices: np.ndarray
    locked: bool = False


@dataclass
class Plan:
    """Rounds of per-node task lists, plus what each node writes in each round."""

    strategy: str
    start: int
    n: int
    nodes: int
    threads: int
    rounds: list[list[list[Task]]]
    writes: list[list[np.ndarray]] = field(default_factory=list)
    imbalance: float = 1.0
    node_imbalance: float = 1.0
    #: the serial order this plan was built to equal (wavefront and serial plans), which
    #: an invocation that must fall back to serial execution keeps
    order: np.ndarray | None = None
    #: colour classes of a colouring plan (one round each); None for other strategies
    colours: int | None = None
    #: what ``imbalance`` was before routed write-back: sum over rounds of the busiest
    #: node's bodies / (n / P), the time if every round ended with a global barrier
    barrier_imbalance: float = 1.0
    #: the critical path with ``ROUND_OVERHEAD_BODIES`` per message hop, in bodies: what
    #: ``auto`` compares a token plan by (see ``make_plan``)
    path_cost: float = 0.0
    #: the critical path if a node waited for a message only before the first round that
    #: touches its rows (not before the round after it was sent) / (n / P)
    first_use_imbalance: float = 1.0
    #: the critical path if a node waited for every message in the round after it was
    #: sent (before deferred receives), over (bodies / nodes)
    exchange_imbalance: float = 1.0
    #: bodies per (round, node), kept for :func:`_measured`
    loads: np.ndarray | None = field(default=None, repr=False, compare=False)
    #: the nodes whose tasks and writes this plan still holds; None: every node's.  Once
    #: an invocation has run a plan, a rank keeps its own nodes' parts only
    #: (``engine._machines.planparts.keep_nodes``): reading another node's list raises
    kept: tuple[int, ...] | None = None
    #: bodies per node, every node's, when ``kept`` leaves some out
    counts: np.ndarray | None = field(default=None, repr=False, compare=False)
    #: ``planparts.plan_digest`` of every node's tasks, taken before any were dropped
    digest: bytes | None = field(default=None, repr=False, compare=False)

    @property
    def partial(self) -> bool:
        """True when this plan holds only some nodes' tasks (see ``kept``)."""
        return self.kept is not None and len(self.kept) < self.nodes

    def _whole(self, what: str) -> None:
        if self.partial:
            raise ValueError(
                f"{what} needs every node's tasks, and this plan holds only those of "
                f"node(s) {', '.join(map(str, self.kept or ()))} (a rank keeps its own once "
                "an invocation has run the plan); read the plan from the trace instead "
                "(RunTrace.plan, replay show)"
            )

    def serial_order(self) -> np.ndarray:
        """Indices in the plan's serialization order (valid when no task is locked)."""
        self._whole("serial_order()")
        parts = [t.indices for rnd in self.rounds for tasks in rnd for t in tasks]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def bodies_per_node(self) -> np.ndarray:
        """Total bodies each node runs over all rounds."""
        if self.counts is not None:
            return self.counts.copy()
        out = np.zeros(self.nodes, dtype=np.int64)
        for rnd in self.rounds:
            for p, tasks in enumerate(rnd):
                out[p] += sum(len(t.indices) for t in tasks)
        return out

    def has_locks(self) -> bool:
        """True when some task runs under per-element locks."""
        self._whole("has_locks()")
        return any(t.locked for rnd in self.rounds for tasks in rnd for t in tasks)


# ============================================================= conflict structure
def _conflict_edges(sets: AccessSets) -> tuple[np.ndarray, np.ndarray, int]:
    """Body/element incidence restricted to written elements: (bodies, elems, n_elems)."""
    n = sets.n
    w_rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(sets.w_indptr))
    r_rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(sets.r_indptr))
    written = np.unique(sets.w_ids)
    keep = np.isin(sets.r_ids, written)
    rows = np.concatenate([w_rows, r_rows[keep]])
    gids = np.concatenate([sets.w_ids, sets.r_ids[keep]])
    elems = np.searchsorted(written, gids)
    return rows, elems, len(written)


def component_labels(sets: AccessSets, batch: int | None = None) -> np.ndarray:
    """Connected component of every body (within batches of ``batch`` consecutive bodies)."""
    n = sets.n
    rows, elems, m = _conflict_edges(sets)
    if batch is not None and batch < n:
        elems = elems + (rows // batch) * m
        m = m * ((n + batch - 1) // batch)
    return _first_node_labels(n, n + m, rows, n + elems)


def _first_node_labels(keep: int, size: int, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The connected component of each node below ``keep`` in the graph of ``size`` nodes
    and the edges ``u[i]-v[i]``, numbered in the order of each component's smallest node:
    the numbering of ``scipy.sparse.csgraph.connected_components`` (whose import, ~0.35 s,
    every rank paid at its first plan).

    On the nodes the edges touch, every node points at a smaller node of its component or
    at itself; an edge whose ends lead to different roots hooks the larger root under the
    smaller, and pointer jumping makes every pointer a root again.  Pointers only
    decrease, so this ends with each node pointing at the smallest node of its component.
    """
    touched = np.zeros(size, dtype=bool)
    touched[u] = True
    touched[v] = True
    nodes = np.flatnonzero(touched)
    dense = np.cumsum(touched) - 1  # node -> its place among the touched nodes
    cu, cv = dense[u], dense[v]
    up = np.arange(len(nodes), dtype=np.int64)
    while True:
        ru, rv = up[cu], up[cv]
        apart = ru != rv
        if not apart.any():
            break
        cu, cv, ru, rv = cu[apart], cv[apart], ru[apart], rv[apart]
        np.minimum.at(up, np.maximum(ru, rv), np.minimum(ru, rv))
        while True:
            jumped = up[up]
            if np.array_equal(jumped, up):
                break
            up = jumped
    smallest = np.arange(keep, dtype=np.int64)  # an untouched node is its own component
    kept = nodes < keep
    smallest[nodes[kept]] = nodes[up[kept]]
    return np.unique(smallest, return_inverse=True)[1].astype(np.int32)


def conflicts(sets: AccessSets, a: int, b: int) -> bool:
    """The DESIGN §5 test: W_a ∩ (R_b ∪ W_b) ≠ ∅ or W_b ∩ (R_a ∪ W_a) ≠ ∅."""
    ra, wa = set(sets.reads_of(a).tolist()), set(sets.writes_of(a).tolist())
    rb, wb = set(sets.reads_of(b).tolist()), set(sets.writes_of(b).tolist())
    return bool(wa & (rb | wb)) or bool(wb & (ra | wa))


# ============================================================= placement helpers
def _lpt(sizes: np.ndarray, bins: int) -> np.ndarray:
    """Greedy largest-first placement; returns the bin of every item (ties: lowest bin)."""
    order = np.argsort(-sizes, kind="stable")
    heap = [(0, b) for b in range(bins)]
    out = np.empty(len(sizes), dtype=np.int64)
    for g in order.tolist():
        load, b = heapq.heappop(heap)
        out[g] = b
        heapq.heappush(heap, (load + int(sizes[g]), b))
    return out


def _groups_to_tasks(groups: list[np.ndarray], threads: int) -> list[Task]:
    """Assign one node's conflict-free groups of a round to its threads."""
    groups = [g for g in groups if len(g)]
    if not groups:
        return []
    if threads == 1:
        return [Task(0, np.concatenate(groups) if len(groups) > 1 else groups[0])]
    sizes = np.array([len(g) for g in groups], dtype=np.int64)
    total = int(sizes.sum())
    big = int(np.argmax(sizes))
    tasks: list[Task] = []
    rest = groups
    if sizes[big] > SPLIT_FACTOR * total / threads and sizes[big] >= 2:
        chunks = np.array_split(groups[big], min(threads, len(groups[big])))
        tasks += [Task(t, c, locked=True) for t, c in enumerate(chunks)]
        rest = groups[:big] + groups[big + 1 :]
    if rest:
        where = _lpt(np.array([len(g) for g in rest], dtype=np.int64), threads)
        for t in range(threads):
            mine = [g for g, w in zip(rest, where, strict=True) if w == t]
            if mine:
                tasks.append(Task(t, np.concatenate(mine)))
    return tasks


def _finish(
    strategy: str,
    sets: AccessSets,
    nodes: int,
    threads: int,
    rounds_groups: list[list[list[np.ndarray]]],
    *,
    per_thread: bool = False,
) -> Plan:
    """Build a Plan from per-round, per-node lists of groups (positions, not indices).

    ``per_thread``: the groups are already one per thread and their bodies pairwise
    independent (colouring), so group t is thread t's unlocked task."""
    start = sets.start
    rounds: list[list[list[Task]]] = []
    loads = []
    for rnd in rounds_groups:
        tasks = []
        for groups in rnd:
            if per_thread:
                tl = [Task(t, g + start) for t, g in enumerate(groups) if len(g)]
            else:
                tl = _groups_to_tasks([g + start for g in groups], threads)
            tasks.append(tl)
        loads.append([sum(len(g) for g in groups) for groups in rnd])
        rounds.append(tasks)
    plan = Plan(strategy, start, sets.n, nodes, threads, rounds)
    plan.writes = _round_writes(plan, sets)
    ld = np.array(loads, dtype=np.float64).reshape(len(rounds), nodes)
    ideal = sets.n / nodes if sets.n else 1.0
    plan.loads = ld
    plan.barrier_imbalance = barrier_makespan(ld) / ideal if sets.n else 1.0
    plan.imbalance = plan.exchange_imbalance = plan.barrier_imbalance  # until _measured
    per_node = ld.sum(axis=0)
    plan.node_imbalance = float(per_node.max() / per_node.mean()) if sets.n else 1.0
    return plan


def _measured(plan: Plan, sets: AccessSets) -> Plan:
    """``plan`` with its critical-path figures (``imbalance`` and the rest), which need
    the routes' message edges: computed for the plan a caller gets, not for every
    candidate ``make_plan`` weighs (on MovieLens-100K each costs ~0.3 s)."""
    ld, nodes = plan.loads, plan.nodes
    if ld is None or not sets.n:
        return plan
    ideal = sets.n / nodes
    found = message_edges(plan, sets, first_use=True) if nodes > 1 else (_NONE,) * 4
    e_rnd, e_src, e_dst, e_use = found
    plan.exchange_imbalance = critical_path(ld, e_rnd, e_src, e_dst) / ideal
    hop = ROUND_OVERHEAD_BODIES if nodes > 1 else 0
    plan.path_cost = critical_path(ld, e_rnd, e_src, e_dst, latency=hop)
    # a node receives each message just before the first round that touches its rows
    # (``Cluster.settle``): the imbalance the plan runs with
    plan.first_use_imbalance = (
        on_demand_path(ld, e_rnd, e_src, e_dst, e_use) / ideal
        if nodes > 1
        else plan.exchange_imbalance
    )
    plan.imbalance = plan.first_use_imbalance
    return plan


def placed(plan: Plan, nodes: list[int], threads: dict[tuple[int, int], list[int]]) -> Plan:
    """``plan`` with node ``p``'s work moved to node ``nodes[p]`` in every round, and in
    round ``r`` the thread labels of node ``p``'s tasks renamed by ``threads[(r, p)]``
    (missing: unchanged).  Both must be permutations.  The result is an equally good plan:
    the same tasks in the same order per node, so the same loads, conflicts and serial
    outcome (nodes of a round never conflict), on other ranks and threads."""
    if sorted(nodes) != list(range(plan.nodes)):
        raise ValueError(f"not a permutation of {plan.nodes} nodes: {nodes}")
    rounds: list[list[list[Task]]] = []
    writes: list[list[np.ndarray]] = []
    for r, rnd in enumerate(plan.rounds):
        moved: list[list[Task]] = [[] for _ in rnd]
        moved_w: list[np.ndarray] = [np.empty(0, np.int64) for _ in rnd]
        for p, tasks in enumerate(rnd):
            rename = threads.get((r, p))
            if rename is not None and sorted(rename) != list(range(plan.threads)):
                raise ValueError(f"not a permutation of {plan.threads} threads: {rename}")
            moved[nodes[p]] = [
                Task(t.thread if rename is None else rename[t.thread], t.indices, t.locked)
                for t in tasks
            ]
            if plan.writes:
                moved_w[nodes[p]] = plan.writes[r][p]
        rounds.append(moved)
        writes.append(moved_w)
    return replace(plan, rounds=rounds, writes=writes if plan.writes else [])


def _node_shape(plan: Plan, p: int) -> tuple[tuple[tuple[int, bool, bytes], ...], ...]:
    """Node ``p``'s work in every round with its thread labels numbered by first use:
    equal for two nodes iff one's work is the other's up to a renaming of threads."""
    out = []
    for rnd in plan.rounds:
        first: dict[int, int] = {}
        out.append(
            tuple(
                (
                    first.setdefault(t.thread, len(first)),
                    bool(t.locked),
                    np.asarray(t.indices, dtype=np.int64).tobytes(),
                )
                for t in rnd[p]
            )
        )
    return tuple(out)


def placement_like(fresh: Plan, want: Plan) -> Plan | None:
    """``fresh`` moved to ``want``'s placement (see :func:`placed`), when ``want`` differs
    from it only there, else None.  Replay uses it to follow a recorded placement (a chaos
    run's) while still checking that its own planning made the same tasks."""
    if (fresh.nodes, fresh.threads, len(fresh.rounds)) != (
        want.nodes,
        want.threads,
        len(want.rounds),
    ):
        return None
    free: dict[tuple[object, ...], list[int]] = {}
    for q in range(want.nodes):
        free.setdefault(_node_shape(want, q), []).append(q)
    nodes = []
    for p in range(fresh.nodes):
        left = free.get(_node_shape(fresh, p))
        if not left:
            return None
        nodes.append(left.pop(0))
    threads: dict[tuple[int, int], list[int]] = {}
    for r, rnd in enumerate(fresh.rounds):
        for p, tasks in enumerate(rnd):
            rename: dict[int, int] = {}
            for a, b in zip(tasks, want.rounds[r][nodes[p]], strict=True):
                rename.setdefault(a.thread, b.thread)
            rest = iter(sorted(set(range(fresh.threads)) - set(rename.values())))
            full = [rename[t] if t in rename else next(rest) for t in range(fresh.threads)]
            threads[(r, p)] = full
    return placed(fresh, nodes, threads)


def _round_writes(plan: Plan, sets: AccessSets) -> list[list[np.ndarray]]:
    """Sorted unique element ids each node writes in each round."""
    out = []
    counts = np.diff(sets.w_indptr)
    for rnd in plan.rounds:
        per_node = []
        for tasks in rnd:
            if not tasks:
                per_node.append(np.empty(0, dtype=np.int64))
                continue
            pos = np.concatenate([t.indices for t in tasks]) - plan.start
            starts = sets.w_indptr[pos]
            lens = counts[pos]
            idx = np.repeat(starts - np.cumsum(lens) + lens, lens) + np.arange(lens.sum())
            per_node.append(np.unique(sets.w_ids[idx]))
        out.append(per_node)
    return out


# ============================================================= strategies
def _plan_components(sets: AccessSets, nodes: int, threads: int) -> tuple[float, Plan]:
    n = sets.n
    best: tuple[float, int] | None = None
    batch = n
    min_batch = max(MIN_BATCH_PER_NODE * nodes, 1)
    tried_labels: dict[int, np.ndarray] = {}
    while True:
        labels = component_labels(sets, batch)
        tried_labels[batch] = labels
        cost = 0.0
        for b0 in range(0, n, batch):
            lab = labels[b0 : b0 + batch]
            _, sizes = np.unique(lab, return_counts=True)
            where = _lpt(sizes, nodes)
            cost += float(np.bincount(where, weights=sizes, minlength=nodes).max())
            cost += ROUND_OVERHEAD_BODIES if nodes > 1 else 0
        if best is None or cost < best[0]:
            best = (cost, batch)
        elif cost > best[0]:
            break
        if nodes == 1 or batch <= min_batch:
            break
        batch = max(batch // 4, min_batch)
    cost, batch = best
    labels = tried_labels[batch]
    rounds = []
    for b0 in range(0, n, batch):
        lab = labels[b0 : b0 + batch]
        uniq, inv, sizes = np.unique(lab, return_inverse=True, return_counts=True)
        where = _lpt(sizes, nodes)
        order = np.argsort(inv, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        groups = [order[bounds[g] : bounds[g + 1]] + b0 for g in range(len(uniq))]
        # execution order per node: largest group first, bodies in index order
        per_node: list[list[np.ndarray]] = [[] for _ in range(nodes)]
        for g in np.argsort(-sizes, kind="stable").tolist():
            per_node[where[g]].append(groups[g])
        rounds.append(per_node)
    return cost, _finish("components", sets, nodes, threads, rounds)


def rotation_spaces(sets: AccessSets) -> tuple[np.ndarray, np.ndarray] | None:
    """If every body touches exactly one element of each written space, return
    (spaces, elem[k, body]) — the gid each body touches in each space; else None."""
    n = sets.n
    if n == 0 or len(sets.w_ids) == 0:
        return None
    w_sp = sets.w_ids >> SLOT_BITS
    spaces = np.unique(w_sp)
    if len(spaces) > MAX_ROTATION_SPACES:
        return None
    r_sp = sets.r_ids >> SLOT_BITS
    r_rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(sets.r_indptr))
    w_rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(sets.w_indptr))
    elem = np.empty((len(spaces), n), dtype=np.int64)
    for k, s in enumerate(spaces.tolist()):
        seen = np.full(n, -1, dtype=np.int64)
        for rows, ids, sp in ((r_rows, sets.r_ids, r_sp), (w_rows, sets.w_ids, w_sp)):
            sel = sp == s
            rs, gs = rows[sel], ids[sel]
            if len(rs) and np.bincount(rs, minlength=n).max() > 1:
                return None  # rows are de-duplicated, so two ids means two elements
            clash = (seen[rs] >= 0) & (seen[rs] != gs)
            if clash.any():
                return None
            seen[rs] = gs
        if (seen < 0).any():
            return None
        elem[k] = seen
    return spaces, elem


def balanced_blocks(elems: np.ndarray, parts: int, seed: int) -> np.ndarray:
    """Block (0..parts-1) of each body's element: equal access counts over a seeded permutation."""
    uniq, inv, counts = np.unique(elems, return_inverse=True, return_counts=True)
    perm = np.random.default_rng(seed).permutation(len(uniq))
    # an element goes to the block its access-count midpoint falls in, so a popular
    # element cannot drag a whole block's worth of followers with it
    cum = np.cumsum(counts[perm]) - counts[perm]
    mid2 = 2 * cum + counts[perm]
    block_of_perm = np.minimum((mid2 * parts) // max(2 * int(counts.sum()), 1), parts - 1)
    block = np.empty(len(uniq), dtype=np.int64)
    block[perm] = block_of_perm
    return block[inv]


def homed_blocks(elems: np.ndarray, parts: int) -> np.ndarray:
    """Block (0..parts-1) of each body's element: equal access counts in id order, the
    order of the elements' homes (``engine._data.dds.homes``: id ranges)."""
    uniq, inv, counts = np.unique(elems, return_inverse=True, return_counts=True)
    mid2 = 2 * (np.cumsum(counts) - counts) + counts
    return np.minimum((mid2 * parts) // max(2 * int(counts.sum()), 1), parts - 1)[inv]


def _rotation_blocks(elem: np.ndarray, P: int, seed: int, ring: bool) -> np.ndarray:
    """Per written space (row ``k`` of ``elem``) each body's block; the first row is the
    space that stays (block = node), the others move one node a round.

    ``ring`` (runs since 2026-12-07): the space with the most elements stays, cut over a
    seeded permutation; the others move, cut in id order.  Moving the space with fewer
    rows moves fewer bytes, and on rating data its rows (users) are touched by more
    bodies each, so fewer of them skip a node on the way (fewer routed messages of their
    own); in id order a block starts and ends its tour next to the nodes that own most
    of its rows, so the fetch before an invocation and the final exchange home take
    few messages.  MovieLens-100K at P = 64: 12,562 -> 9,822 messages and 48,665 ->
    42,317 rows an epoch, critical path 1.190 -> 1.208.  Without ``ring``: the first
    space by id stays and every space is cut over a seeded permutation."""
    k = len(elem)
    if not ring:
        return np.stack([balanced_blocks(elem[j], P, seed + j) for j in range(k)])
    sizes = [len(np.unique(elem[j])) for j in range(k)]
    stay = int(np.argmax(sizes))  # the first of the largest
    order = [stay, *(j for j in range(k) if j != stay)]
    rows = [balanced_blocks(elem[stay], P, seed)]
    rows += [homed_blocks(elem[j], P) for j in order[1:]]
    return np.stack(rows)


def _plan_rotation(
    sets: AccessSets, nodes: int, threads: int, seed: int, ring: bool = True
) -> tuple[float, Plan | None]:
    found = rotation_spaces(sets)
    if found is None:
        return float("inf"), None
    spaces, elem = found
    n, P = sets.n, nodes
    blocks = _rotation_blocks(elem, P, seed, ring)
    node = blocks[0]
    rnd = np.zeros(n, dtype=np.int64)
    for k in range(1, len(spaces)):
        rnd = rnd * P + (blocks[k] - node) % P
    n_rounds = P ** (len(spaces) - 1)
    key = rnd * P + node
    order = np.argsort(key, kind="stable")
    bounds = np.searchsorted(key[order], np.arange(n_rounds * P + 1))
    rounds = []
    cost = 0.0
    for r in range(n_rounds):
        per_node = []
        for p in range(P):
            c = r * P + p
            per_node.append([order[bounds[c] : bounds[c + 1]]])
        cost += max(len(g[0]) for g in per_node) + (ROUND_OVERHEAD_BODIES if P > 1 else 0)
        rounds.append(per_node)
    return cost, _finish("rotation", sets, nodes, threads, rounds)


def _plan_tokens(sets: AccessSets, nodes: int, threads: int, seed: int) -> Plan | None:
    """Token scheduling (``tokens``) for bodies that touch exactly one element of each of
    two written spaces: user blocks of the first space balanced over the nodes by LPT of
    access counts, the second cut into ``TOKENS_PER_NODE`` x P blocks of equal access
    counts over a seeded permutation; None when the sets do not have that shape."""
    found = rotation_spaces(sets)
    if found is None or len(found[0]) != 2:
        return None
    _, elem = found
    users, user_of, counts = np.unique(elem[0], return_inverse=True, return_counts=True)
    node_of = _lpt(counts, nodes)[user_of]
    n_tokens = TOKENS_PER_NODE * nodes
    token_of = balanced_blocks(elem[1], n_tokens, seed + 1)
    h = hand_out_bodies(node_of, token_of, nodes, n_tokens)
    return _finish("tokens", sets, nodes, threads, h.rounds(h.level))


def _balanced_slots(members: np.ndarray, weights: np.ndarray, slots: int) -> list[np.ndarray]:
    """Deal independent bodies to ``slots`` (node x thread) by estimated work, largest
    first; each slot runs its bodies in ascending index order (any order is serial-equal,
    and ascending runs cost the trace nothing)."""
    if slots == 1 or len(members) == 0:
        return [members] + [members[:0]] * (slots - 1)
    where = _lpt(weights[members], slots)
    return [members[where == s] for s in range(slots)]


def _plan_colouring(
    sets: AccessSets, nodes: int, threads: int, bound: float = float("inf")
) -> tuple[float, Plan | None]:
    """One round per colour class; ``(inf, None)`` when even the fewest colours the sets
    allow could not beat ``bound`` (then the greedy colouring is not run at all)."""
    n = sets.n
    overhead = ROUND_OVERHEAD_BODIES if nodes > 1 else 0
    if colour_lower_bound(sets) * overhead + n / nodes >= bound:
        return float("inf"), None
    colour = colour_bodies(sets)
    n_colours = int(colour.max()) + 1
    weights = body_weights(sets)
    by_colour = np.argsort(colour, kind="stable")  # ascending positions inside a class
    bounds = np.searchsorted(colour[by_colour], np.arange(n_colours + 1))
    rounds = []
    cost = 0.0
    for c in range(n_colours):
        chunks = _balanced_slots(by_colour[bounds[c] : bounds[c + 1]], weights, nodes * threads)
        per_node = [chunks[p * threads : (p + 1) * threads] for p in range(nodes)]
        cost += max(sum(len(g) for g in groups) for groups in per_node) + overhead
        rounds.append(per_node)
    plan = _finish("colouring", sets, nodes, threads, rounds, per_thread=True)
    plan.colours = n_colours
    return cost, plan


def wavefront_plan(sets: AccessSets, order: np.ndarray, nodes: int, threads: int) -> Plan:
    """Levels of the serial ``order`` (absolute indices); running them in order equals it."""
    pos = np.asarray(order, dtype=np.int64) - sets.start
    n = sets.n
    level = np.zeros(n, dtype=np.int64)
    last_write: dict[int, int] = {}
    last_read: dict[int, int] = {}
    for k in pos.tolist():
        w = sets.writes_of(k).tolist()
        r = sets.reads_of(k).tolist()
        lv = 0
        for g in w:
            lv = max(lv, last_write.get(g, -1) + 1, last_read.get(g, -1) + 1)
        for g in r:
            lv = max(lv, last_write.get(g, -1) + 1)
        level[k] = lv
        for g in w:
            last_write[g] = lv
        for g in r:
            if last_read.get(g, -1) < lv:
                last_read[g] = lv
    rounds = []
    lv_of_order = level[pos]
    for lv in range(int(level.max()) + 1 if n else 0):
        # members of one level are pairwise conflict-free, so any split is a valid
        # set of groups; they keep the serial order inside each chunk
        members = pos[lv_of_order == lv]
        chunks = np.array_split(members, nodes * threads)
        rounds.append([chunks[p * threads : (p + 1) * threads] for p in range(nodes)])
    plan = _measured(_finish("wavefront", sets, nodes, threads, rounds), sets)
    plan.order = np.asarray(order, dtype=np.int64)
    return plan


def serial_plan(sets: AccessSets, order: np.ndarray, nodes: int) -> Plan:
    """One round, one task on node 0, running ``order`` (absolute indices) as a plain loop."""
    pos = np.asarray(order, dtype=np.int64) - sets.start
    rounds = [[[pos]] + [[] for _ in range(nodes - 1)]] if sets.n else []
    plan = _measured(_finish("serial", sets, nodes, 1, rounds), sets)
    plan.order = np.asarray(order, dtype=np.int64)
    return plan


#: Strategy name of an invocation that every node ran serially on its own replica
#: (the plan guard's last resort; see ``engine._asyncfor.guard``).
REPLICATED = "replicated"


def replicated_plan(start: int, order: np.ndarray, nodes: int) -> Plan:
    """Every node runs ``order`` (absolute indices) on its own replica: no write-back is
    needed because every replica performs every write.  Recorded like any plan, as one
    task on node 0."""
    order = np.asarray(order, dtype=np.int64)
    n = len(order)
    rounds = [[[Task(0, order)]] + [[] for _ in range(nodes - 1)]] if n else []
    writes = [[np.empty(0, dtype=np.int64) for _ in range(nodes)] for _ in rounds]
    plan = Plan(REPLICATED, start, n, nodes, 1, rounds, writes, float(nodes), float(nodes))
    plan.barrier_imbalance = float(nodes)
    plan.order = order
    return plan


# ============================================================= entry point
#: What ``make_plan(strategy=...)`` accepts.
STRATEGIES = ("auto", "components", "rotation", "colouring", "tokens")


class StrategyUnfit(ValueError):
    """``make_plan(strategy=...)`` named a strategy that cannot plan these sets."""


def remake_strategy(requested: str, recorded: Plan | None, sets: AccessSets) -> str:
    """The ``strategy=`` to plan ``sets`` with when following a run whose plan in force
    was ``recorded``: under ``auto``, that plan's own strategy, so that a trace recorded
    before ``auto``'s choice changed (a new strategy, another cost) is remade as it ran
    rather than reported as a divergence.  A plan no strategy makes (wavefront, serial,
    replicated), an explicit ``requested``, or sets the recorded strategy cannot plan
    (the code or data changed: ``check_plan`` then reports the difference) leave
    ``requested``."""
    if requested != "auto" or recorded is None or recorded.strategy not in STRATEGIES:
        return requested
    if recorded.strategy in ("rotation", "tokens"):
        found = rotation_spaces(sets)
        if found is None or (recorded.strategy == "tokens" and len(found[0]) != 2):
            return requested
    return str(recorded.strategy)


def make_plan(
    sets: AccessSets,
    nodes: int,
    threads: int = 1,
    *,
    seed: int = 0,
    strategy: str = "auto",
    ring: bool = True,
) -> Plan:
    """Plan ``sets`` for ``nodes`` nodes of ``threads`` threads each.  ``ring=False``
    cuts a rotation's blocks as runs did before 2026-12-07 (``_rotation_blocks``)."""
    if strategy not in STRATEGIES:
        raise ValueError(
            f"unknown strategy {strategy!r}; use auto, components, rotation, colouring or tokens"
        )
    if sets.n == 0:
        return _finish("components", sets, nodes, threads, [])
    if strategy == "tokens":
        tokens = _plan_tokens(sets, nodes, threads, seed)
        if tokens is None:
            raise StrategyUnfit(
                "tokens needs bodies that touch exactly one element of each of two written DDS"
            )
        return _measured(tokens, sets)
    candidates: list[tuple[float, int, Plan]] = []
    if strategy in ("auto", "rotation"):
        cost, plan = _plan_rotation(sets, nodes, threads, seed, ring)
        if plan is not None:
            candidates.append((cost, 0, plan))
        elif strategy == "rotation":
            raise StrategyUnfit(
                "rotation needs bodies that touch exactly one element of each written DDS"
            )
    if strategy in ("auto", "components"):
        cost, plan = _plan_components(sets, nodes, threads)
        candidates.append((cost, 1, plan))
    if strategy in ("auto", "colouring"):
        bound = min((c[0] for c in candidates), default=float("inf"))
        cost, plan = _plan_colouring(sets, nodes, threads, bound)
        if plan is not None:
            candidates.append((cost, 2, plan))
    candidates.sort(key=lambda c: (c[0], c[1]))
    return _measured(candidates[0][2], sets)


__all__ = [
    "REPLICATED",
    "STRATEGIES",
    "Plan",
    "StrategyUnfit",
    "Task",
    "balanced_blocks",
    "component_labels",
    "homed_blocks",
    "conflicts",
    "make_plan",
    "placed",
    "placement_like",
    "remake_strategy",
    "replicated_plan",
    "rotation_spaces",
    "serial_plan",
    "wavefront_plan",
]
