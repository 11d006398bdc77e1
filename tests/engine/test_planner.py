"""Planner: plans cover every index once and never run conflicting bodies together."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine._asyncfor.recon import AccessSets, csr_from_lists, union_sorted
from engine._data.dds import SLOT_BITS
from engine._machines.planner import (
    balanced_blocks,
    conflicts,
    make_plan,
    rotation_spaces,
    wavefront_plan,
)


def gid(dds: int, slot: int) -> int:
    return (dds << SLOT_BITS) | slot


def make_sets(reads: list[list[int]], writes: list[list[int]], start: int = 0) -> AccessSets:
    rp, ri = csr_from_lists([len(r) for r in reads], [g for r in reads for g in r])
    wp, wi = csr_from_lists([len(w) for w in writes], [g for w in writes for g in w])
    return AccessSets(start, len(reads), rp, ri, wp, wi)


@st.composite
def access_sets(draw):
    n = draw(st.integers(1, 40))
    n_dds = draw(st.integers(1, 3))
    width = draw(st.integers(1, 12))
    elem = st.builds(gid, st.integers(0, n_dds - 1), st.integers(0, width - 1))
    reads = [draw(st.lists(elem, max_size=3)) for _ in range(n)]
    writes = [draw(st.lists(elem, max_size=2)) for _ in range(n)]
    return make_sets(reads, writes, start=draw(st.integers(0, 5)))


def check_plan(sets: AccessSets, plan) -> None:
    seen = np.concatenate(
        [t.indices for rnd in plan.rounds for tasks in rnd for t in tasks] or [np.empty(0, int)]
    )
    assert sorted(seen.tolist()) == list(range(sets.start, sets.start + sets.n))
    for rnd in plan.rounds:
        placed = [
            (node, ti, t.locked, int(j) - sets.start)
            for node, tasks in enumerate(rnd)
            for ti, t in enumerate(tasks)
            for j in t.indices
        ]
        for a in range(len(placed)):
            for b in range(a + 1, len(placed)):
                na, ta, la, ja = placed[a]
                nb, tb, lb, jb = placed[b]
                same_task = na == nb and ta == tb
                both_locked_here = na == nb and la and lb
                if not same_task and not both_locked_here:
                    assert not conflicts(sets, ja, jb), (
                        f"bodies {ja} and {jb} conflict but run together in one round"
                    )


@given(access_sets(), st.integers(1, 4), st.integers(1, 3), st.sampled_from(["auto", "components"]))
def test_plans_are_conflict_free_and_complete(sets, nodes, threads, strategy) -> None:
    plan = make_plan(sets, nodes, threads, seed=1, strategy=strategy)
    check_plan(sets, plan)
    assert plan.imbalance >= 1.0 - 1e-9


@given(access_sets(), st.integers(1, 4), st.integers(1, 3), st.randoms(use_true_random=False))
def test_wavefront_levels_respect_the_serial_order(sets, nodes, threads, rnd) -> None:
    order = list(range(sets.start, sets.start + sets.n))
    rnd.shuffle(order)
    plan = wavefront_plan(sets, np.array(order), nodes, threads)
    check_plan(sets, plan)
    round_of = {}
    for r, per_node in enumerate(plan.rounds):
        for tasks in per_node:
            for t in tasks:
                for j in t.indices.tolist():
                    round_of[j] = r
    for a in range(len(order)):
        for b in range(a + 1, len(order)):
            if conflicts(sets, order[a] - sets.start, order[b] - sets.start):
                assert round_of[order[a]] < round_of[order[b]]


def sgd_like_sets(n: int, users: int, items: int, seed: int = 0) -> AccessSets:
    rng = np.random.default_rng(seed)
    # popularity falls with the id, as in MovieLens (low ids are popular)
    pu = 1.0 / (np.arange(users) + 10.0)
    pi = 1.0 / (np.arange(items) + 10.0)
    u = rng.choice(users, n, p=pu / pu.sum())
    i = rng.choice(items, n, p=pi / pi.sum())
    reads = [[gid(0, j), gid(1, int(u[j])), gid(2, int(i[j]))] for j in range(n)]
    writes = [[gid(1, int(u[j])), gid(2, int(i[j]))] for j in range(n)]
    return make_sets(reads, writes)


@pytest.mark.parametrize("nodes", [2, 3, 4])
def test_sgd_access_pattern_gets_block_rotation(nodes: int) -> None:
    sets = sgd_like_sets(3000, 80, 120)
    assert rotation_spaces(sets) is not None
    plan = make_plan(sets, nodes, 1, seed=0)
    assert plan.strategy == "rotation"
    assert len(plan.rounds) == nodes
    check_plan(sets, plan) if nodes == 2 else None
    assert plan.imbalance < 1.25  # blocks balanced by counts, despite the skew


def test_sparse_conflicts_get_components() -> None:
    # bodies write their own element and read a neighbour's inside pairs: many tiny components
    reads = [[gid(0, j ^ 1)] for j in range(400)]
    writes = [[gid(0, j)] for j in range(400)]
    sets = make_sets(reads, writes)
    plan = make_plan(sets, 3, 1, seed=0)
    assert plan.strategy == "components"
    assert len(plan.rounds) == 1
    check_plan(sets, plan)
    assert plan.imbalance < 1.05


def test_lock_split_when_one_group_dominates() -> None:
    reads = [[gid(0, 0)] for _ in range(30)]
    writes = [[gid(0, 0)] for _ in range(30)]
    plan = make_plan(make_sets(reads, writes), 1, 3, seed=0)
    tasks = plan.rounds[0][0]
    assert len(tasks) == 3 and all(t.locked for t in tasks)


def test_balanced_blocks_split_counts_not_ids() -> None:
    # low ids are popular (as in MovieLens): contiguous id ranges would be badly skewed
    rng = np.random.default_rng(0)
    p = 1.0 / (np.arange(400) + 5.0)
    elems = rng.choice(400, 20000, p=p / p.sum())
    blocks = balanced_blocks(elems, 2, seed=0)
    share = np.bincount(blocks, minlength=2).max() / len(elems)
    contiguous = np.bincount((elems >= 200).astype(int)).max() / len(elems)
    assert contiguous > 0.75
    assert share < 0.52


@st.composite
def graphs(draw):
    size = draw(st.integers(1, 60))
    node = st.integers(0, size - 1)
    edges = draw(st.lists(st.tuples(node, node), max_size=90))
    keep = draw(st.integers(0, size))
    return keep, size, edges


@given(graphs())
def test_component_numbering_is_scipys(graph) -> None:
    """The planner numbers components itself (scipy's import cost every rank ~0.35 s):
    the numbers must be scipy's exactly, since plans order groups by them (a different
    numbering is a different plan, and old traces' plans would no longer be remade)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    from engine._machines.planner import _first_node_labels

    keep, size, edges = graph
    u = np.array([a for a, _ in edges], dtype=np.int64)
    v = np.array([b for _, b in edges], dtype=np.int64)
    adjacency = coo_matrix((np.ones(len(u), dtype=np.int8), (u, v)), shape=(size, size))
    want = connected_components(adjacency, directed=False)[1][:keep]
    assert _first_node_labels(keep, size, u, v).tolist() == want.tolist()


def test_component_numbering_follows_a_long_chain() -> None:
    """A path through every node in a shuffled order: the worst case for pointer chasing."""
    rng = np.random.default_rng(7)
    order = rng.permutation(5000)
    from engine._machines.planner import _first_node_labels

    labels = _first_node_labels(5000, 5000, order[:-1], order[1:])
    assert not labels.any()
    two = _first_node_labels(5000, 5000, order[:2499], order[1:2500])
    first = min(order[:2500])
    assert two[order[:2500]].tolist() == [two[first]] * 2500 and len(set(two.tolist())) == 2501


# ============================================================= critical path (makespan)
def test_the_critical_path_waits_only_for_messages_routed_to_a_node() -> None:
    from engine._machines.makespan import barrier_makespan, critical_path

    # node 0 is slow in round 0; node 1 waits for it only if a message says so
    loads = np.array([[5.0, 1.0], [1.0, 1.0], [1.0, 5.0]])
    none = np.empty(0, dtype=np.int64)
    assert critical_path(loads, none, none, none) == 7.0  # node 1: 1 + 1 + 5
    assert barrier_makespan(loads) == 11.0  # 5 + 1 + 5
    # 0 -> 1 after round 0: node 1 starts round 1 at 5, ends round 2 at 11
    one = np.array([0])
    assert critical_path(loads, one, np.array([0]), np.array([1])) == 11.0
    assert critical_path(loads, one, np.array([0]), np.array([1]), latency=2.0) == 13.0
    # a message after round 1 from node 1 to node 0 adds nothing: node 0 is later anyway
    assert critical_path(loads, np.array([1]), np.array([1]), np.array([0])) == 7.0
    # received only before round 2, where node 1 first reads it: it runs round 1 meanwhile
    from engine._machines.makespan import on_demand_path

    assert on_demand_path(loads, one, np.array([0]), np.array([1]), np.array([2])) == 10.0
    assert on_demand_path(loads, one, np.array([0]), np.array([1]), np.array([1])) == 11.0


@given(access_sets(), st.integers(1, 4), st.integers(1, 3), st.sampled_from(["auto", "components"]))
def test_the_critical_path_is_between_the_mean_and_the_barrier_time(
    sets, nodes, threads, strategy
) -> None:
    """No plan ends before its busiest node is done, nor after it would with barriers."""
    plan = make_plan(sets, nodes, threads, seed=1, strategy=strategy)
    per_node = plan.bodies_per_node()
    ideal = sets.n / nodes
    assert plan.imbalance >= per_node.max() / ideal - 1e-9
    assert plan.imbalance <= plan.barrier_imbalance + 1e-9


def test_a_rotation_without_barriers_is_a_ring() -> None:
    """In a rotation node p waits only for node p+1 (which hands it the next item block),
    so it beats the barrier figure on skewed data, yet cannot beat its busiest node."""
    sets = sgd_like_sets(3000, 80, 120)
    plan = make_plan(sets, 4, 1, seed=0, strategy="rotation")
    assert plan.imbalance < plan.barrier_imbalance
    assert plan.imbalance >= plan.node_imbalance - 1e-9


# ============================================================= tokens
@st.composite
def rotation_shaped_sets(draw):
    """Bodies that each touch one user row (DDS 1) and one item row (DDS 2), reading a
    record of their own (DDS 0); some only read their item."""
    n = draw(st.integers(1, 60))
    users = draw(st.integers(1, 12))
    items = draw(st.integers(1, 16))
    u = draw(st.lists(st.integers(0, users - 1), min_size=n, max_size=n))
    i = draw(st.lists(st.integers(0, items - 1), min_size=n, max_size=n))
    ro = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    reads = [[gid(0, j), gid(1, u[j]), gid(2, i[j])] for j in range(n)]
    writes = [[gid(1, u[j])] + ([] if ro[j] else [gid(2, i[j])]) for j in range(n)]
    return make_sets(reads, writes, start=draw(st.integers(0, 5)))


def replay_serially(sets: AccessSets, order) -> dict[int, list[int]]:
    """Each element's history of the bodies that wrote it, for bodies run in ``order``."""
    seen: dict[int, list[int]] = {}
    for j in order:
        for g in sets.writes_of(int(j) - sets.start).tolist():
            seen.setdefault(g, []).append(int(j))
    return seen


@given(rotation_shaped_sets(), st.integers(1, 5), st.integers(1, 2), st.integers(0, 3))
def test_token_plans_run_every_body_once_conflict_free_and_equal_their_order(
    sets, nodes, threads, seed
) -> None:
    if rotation_spaces(sets) is None or len(np.unique(sets.w_ids >> SLOT_BITS)) != 2:
        return  # every body read-only in the item space: not a token loop
    plan = make_plan(sets, nodes, threads, seed=seed, strategy="tokens")
    assert plan.strategy == "tokens"
    check_plan(sets, plan)  # every body once; no two nodes of a round conflict
    # deterministic: the same sets and seed give the same rounds
    again = make_plan(sets, nodes, threads, seed=seed, strategy="tokens")
    assert [[[t.indices.tolist() for t in ts] for ts in r] for r in plan.rounds] == [
        [[t.indices.tolist() for t in ts] for ts in r] for r in again.rounds
    ]
    # running the rounds with the nodes of each round in any order (here: last node
    # first) writes every element in the order of the plan's serial order
    if not plan.has_locks():
        shuffled = [j for rnd in plan.rounds for ts in reversed(rnd) for t in ts for j in t.indices]
        assert replay_serially(sets, shuffled) == replay_serially(sets, plan.serial_order())
    assert plan.imbalance >= plan.first_use_imbalance - 1e-9


def test_tokens_need_two_written_spaces_of_one_element_each() -> None:
    sets = make_sets([[gid(0, 0)], [gid(0, 0)]], [[gid(0, 0)], [gid(0, 0)]])
    with pytest.raises(ValueError, match="tokens needs bodies"):
        make_plan(sets, 2, strategy="tokens")


@given(
    st.lists(st.lists(st.integers(0, 9), min_size=6, max_size=6), min_size=1, max_size=5),
)
def test_the_hand_out_holds_each_token_once_and_serves_every_pair(work_rows) -> None:
    from engine._machines.tokens import hand_out

    work = np.array(work_rows, dtype=np.int64)
    node, token, level, start = hand_out(work)
    finish = start + work[node, token]
    # every (node, token) pair with work runs exactly once
    assert sorted(zip(node.tolist(), token.tolist(), strict=True)) == sorted(
        zip(*(a.tolist() for a in np.nonzero(work)), strict=True)
    )
    for owner in (node, token):  # a node runs, and a token is held, one task at a time
        for o in np.unique(owner):
            mine = np.flatnonzero(owner == o)
            s, f = start[mine], finish[mine]
            assert (s[1:] >= f[:-1]).all() and (np.diff(level[mine]) > 0).all()
    # never longer than one node doing everything, never shorter than the busiest node
    if len(node):
        assert work.sum(axis=1).max() <= finish.max() <= work.sum()


def test_tokens_balance_skewed_sgd_better_than_a_rotation() -> None:
    """The case the strategy is for: popular users and items (as in MovieLens) at P = 8.
    Body counts as time, a node waiting for a message only where it reads the rows."""
    sets = sgd_like_sets(6000, 120, 200, seed=3)
    rot = make_plan(sets, 8, seed=0, strategy="rotation")
    tok = make_plan(sets, 8, seed=0, strategy="tokens")
    assert tok.first_use_imbalance < rot.first_use_imbalance
    assert tok.first_use_imbalance < 1.1
    assert tok.barrier_imbalance >= tok.imbalance >= tok.first_use_imbalance


def test_auto_never_builds_a_token_plan(monkeypatch) -> None:
    """``auto`` compares components, rotation and colouring only: a token plan is built
    when asked for, never as a candidate (it never won on SGDMF and cost ~7% of the
    planning time), even where its critical path would be shorter."""
    from engine._machines import planner

    built: list[int] = []
    real = planner._plan_tokens

    def counting(*args: object, **kw: object) -> object:
        built.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(planner, "_plan_tokens", counting)
    monkeypatch.setattr(planner, "ROUND_OVERHEAD_BODIES", 1)  # hops nearly free
    sets = sgd_like_sets(6000, 60, 300, seed=3)
    assert make_plan(sets, 3, seed=0).strategy == "rotation" and not built
    tokens = make_plan(sets, 3, seed=0, strategy="tokens")
    assert built and tokens.strategy == "tokens"
    assert tokens.imbalance < make_plan(sets, 3, seed=0, strategy="rotation").imbalance


def test_a_followed_plan_is_remade_with_its_strategy_where_the_sets_allow_it() -> None:
    from engine._machines.planner import remake_strategy

    sgd = sgd_like_sets(200, 10, 12)
    rotation = make_plan(sgd, 3, strategy="rotation")
    tokens = make_plan(sgd, 3, strategy="tokens")
    assert remake_strategy("auto", rotation, sgd) == "rotation"
    assert remake_strategy("auto", tokens, sgd) == "tokens"
    assert remake_strategy("components", rotation, sgd) == "components"  # asked for
    assert remake_strategy("auto", None, sgd) == "auto"
    # the code or data changed and the sets no longer have the recorded plan's shape:
    # plan freely, and let check_plan say what differs (no ValueError from make_plan)
    shared = make_sets([[gid(1, 0), gid(1, 1)]] * 4, [[gid(1, 0), gid(1, 1)]] * 4)
    assert remake_strategy("auto", rotation, shared) == "auto"
    assert remake_strategy("auto", tokens, shared) == "auto"
    wavefront = wavefront_plan(sgd, np.arange(200), 3, 1)
    assert remake_strategy("auto", wavefront, sgd) == "auto"


@given(st.lists(st.lists(st.integers(0, 2**45), max_size=30), max_size=6))
def test_union_sorted_is_the_unique_of_the_concatenation(raw: list[list[int]]) -> None:
    # the sync_for layout's row unions (minibatch sets, node and owner rows, written rows)
    # must be exactly np.unique's: their order fixes which rows a delta carries where
    parts = [np.unique(np.array(p, dtype=np.int64)) for p in raw]
    got = union_sorted(parts)
    want = np.unique(np.concatenate(parts)) if parts else np.empty(0, dtype=np.int64)
    assert got.dtype == np.int64 and np.array_equal(got, want)
