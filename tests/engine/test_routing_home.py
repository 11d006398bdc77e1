"""Routes whose final exchange goes home, and the fetch that brings rows back
(``engine._machines.routing``), checked by a version simulation over two invocations of
different plans: every access sees the latest version, and after each final exchange
the homes hold every last value.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from engine._machines.planner import make_plan
from engine._machines.routing import (
    fetch,
    fetch_any,
    fetch_summary,
    held_touches,
    route,
    touches,
)
from tests.engine.test_planner import sgd_like_sets


# ====================================================================== the routes
def _touched(plan, sets, r: int, p: int) -> list[int]:
    out: list[int] = []
    for t in plan.rounds[r][p]:
        for j in t.indices.tolist():
            k = j - plan.start
            out += [*sets.reads_of(k).tolist(), *sets.writes_of(k).tolist()]
    return out


def _written(plan, sets, r: int, p: int) -> list[int]:
    return [
        g
        for t in plan.rounds[r][p]
        for j in t.indices.tolist()
        for g in sets.writes_of(j - plan.start).tolist()
    ]


def _run_invocation(plan, sets, have, latest, home, dirty: dict[int, int]) -> None:
    """One invocation on version tables: the fetch, the rounds and their routed
    write-backs, the final exchange home; then ``dirty`` (element id -> the node that
    wrote its last value) holds every element written so far."""
    t = touches(plan, sets)
    ids = np.asarray(sorted(dirty), dtype=np.int64)
    holder = np.asarray([dirty[g] for g in ids.tolist()], dtype=np.int64)
    msgs, uses = fetch(t, ids, home, holder)
    for k in range(len(msgs)):
        src, dst = int(msgs.src[k]), int(msgs.dst[k])
        assert src == int(home(msgs.rows(k)[:1])[0]) and src != dst
        for g in msgs.rows(k).tolist():
            assert have[src][g] == latest[g]  # the home holds the last value
            have[dst][g] = latest[g]
    routes = route(plan, sets, home=home)
    for r in range(len(plan.rounds)):
        for p in range(plan.nodes):
            for g in _touched(plan, sets, r, p):
                assert have[p][g] == latest[g], (r, p, g)
        for p in range(plan.nodes):
            for g in _written(plan, sets, r, p):
                latest[g] += 1
                have[p][g] = latest[g]
        m = routes.rounds[r]
        for k in range(len(m)):
            for g in m.rows(k).tolist():
                have[int(m.dst[k])][g] = have[int(m.src[k])][g]
    f = routes.final
    for k in range(len(f)):
        src, dst = int(f.src[k]), int(f.dst[k])
        assert (home(f.rows(k)) == dst).all() and src != dst
        for g in f.rows(k).tolist():
            assert have[src][g] == latest[g]
            have[dst][g] = latest[g]
    gids, writers = routes.holders
    dirty.update(zip(gids.tolist(), writers.tolist(), strict=True))


@given(
    seed=st.integers(0, 2**16),
    nodes=st.sampled_from([2, 3, 5]),
    strategies=st.tuples(*[st.sampled_from(["rotation", "tokens", "components"])] * 2),
)
def test_fetch_then_routes_then_home_keep_every_access_on_the_last_value(
    seed: int, nodes: int, strategies: tuple[str, str]
) -> None:
    """Two invocations of different plans: every body sees the latest version of what it
    touches (though no row is fetched to the node that wrote its last value, nor to a
    node that gets it from a routed write-back), and after each final exchange both an
    element's home and the node that wrote its last value hold that value."""
    sets = sgd_like_sets(120, 9, 14, seed=seed)
    plans = [make_plan(sets, nodes, seed=seed + k, strategy=s) for k, s in enumerate(strategies)]
    plans.append(plans[0])  # a plan again: its rows are where it left them
    elems = np.unique(np.concatenate([sets.r_ids, sets.w_ids])).tolist()
    latest = dict.fromkeys(elems, 0)
    have = [dict(latest) for _ in range(nodes)]
    order = {g: k for k, g in enumerate(elems)}

    def home(gids: np.ndarray) -> np.ndarray:
        return np.array([(order[g] * 7) % nodes for g in gids.tolist()], dtype=np.int64)

    dirty: dict[int, int] = {}
    for plan in plans:
        _run_invocation(plan, sets, have, latest, home, dirty)
        for g, writer in dirty.items():
            assert have[int(home(np.array([g]))[0])][g] == latest[g], g
            assert have[writer][g] == latest[g], g


def test_a_rotation_epoch_sends_far_less_than_every_row_to_every_node() -> None:
    """The final exchange carries each written row at most once (to its home), where it
    used to carry it to every node that lacked it."""
    sets = sgd_like_sets(3000, 60, 80)
    plan = make_plan(sets, 8, 1, strategy="rotation")
    written = np.unique(np.concatenate([w for per in plan.writes for w in per]))
    homes = route(plan, sets, home=lambda g: g % 8).final
    every = route(plan, sets).final
    assert len(np.unique(homes.gids)) == len(homes.gids) <= len(written)
    assert len(every.gids) > 4 * len(homes.gids)


@given(
    seed=st.integers(0, 2**16),
    nodes=st.sampled_from([2, 3, 5]),
    strategy=st.sampled_from(["rotation", "tokens", "components"]),
    dirty_seed=st.integers(0, 2**16),
)
def test_a_rank_keeping_its_share_of_the_touches_makes_its_fetch_messages(
    seed: int, nodes: int, strategy: str, dirty_seed: int
) -> None:
    """An MPI rank keeps only its node's touches and those of its home rows
    (``held_touches``, issue 35): the fetch messages it sends or receives are exactly
    those (rows, and due round) made from every node's touches, for any dirty rows and
    holders, and it keeps a share, not the whole."""
    sets = sgd_like_sets(120, 9, 14, seed=seed)
    plan = make_plan(sets, nodes, seed=seed, strategy=strategy)
    t = touches(plan, sets)
    elems = np.unique(np.concatenate([sets.r_ids, sets.w_ids]))
    order = {g: k for k, g in enumerate(elems.tolist())}

    def home(gids: np.ndarray) -> np.ndarray:
        return np.array([(order[g] * 7) % nodes for g in gids.tolist()], dtype=np.int64)

    rng = np.random.default_rng(dirty_seed)
    dirty = np.sort(rng.choice(elems, size=int(rng.integers(1, len(elems) + 1)), replace=False))
    holder = rng.integers(0, nodes, len(dirty))
    whole, uses = fetch(t, dirty, home, holder)
    # whether there is a fetch at all is decided alike on every rank, from a summary
    summary = fetch_summary(t, home)
    assert fetch_any(summary, dirty, holder) == (len(whole) > 0)
    assert fetch_any(summary, dirty, None) == (len(fetch(t, dirty, home)[0]) > 0)
    for g in dirty[:4].tolist():  # one dirty row, held by each node in turn
        one = np.array([g])
        for h in range(nodes):
            held_by = np.array([h])
            assert fetch_any(summary, one, held_by) == (len(fetch(t, one, home, held_by)[0]) > 0)
    shares = 0
    for me in range(nodes):
        mine = held_touches(t, [me], home)
        shares += len(mine.gid)
        got, got_uses = fetch(mine, dirty, home, holder)

        def of(m, u, me=me):  # type: ignore[no-untyped-def]
            return sorted(
                (int(m.src[k]), int(m.dst[k]), m.rows(k).tolist(), int(u[k]))
                for k in range(len(m))
                if me in (int(m.src[k]), int(m.dst[k]))
            )

        assert of(got, got_uses) == of(whole, uses), me
    # each pair is kept by at most two ranks: its node's and its row's home's
    assert shares <= 2 * len(t.gid)
