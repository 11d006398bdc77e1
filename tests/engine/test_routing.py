"""Routed write-back (engine._machines.routing), checked against a simulation.

Each replica holds a version number per element; a body's write makes a new version on
its node.  For any plan the planner makes, every access of every body must see the
latest version after the routed write-backs of the rounds before it; the elements a node
is told are stale are exactly the ones it is behind on; after the final exchange every
replica is whole.  And the routes never send what nobody needs: no message is empty, no
row goes to its own writer, and no row travels to a node that does not touch it before it
is written again (apart from the final exchange).  Then the engine end to end: random
programs, whose bodies may read outside their sets, equal their serial loop.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import engine as ap
from engine._data.dds import SLOT_BITS
from engine._machines.planner import make_plan, wavefront_plan
from engine._machines.routing import message_edges, route
from tests.engine.test_planner import access_sets, rotation_shaped_sets, sgd_like_sets


def _simulate(sets, plan) -> None:
    P = plan.nodes
    elems = np.unique(np.concatenate([sets.r_ids, sets.w_ids, np.zeros(1, np.int64)]))
    latest = dict.fromkeys(elems.tolist(), 0)
    have = [dict(latest) for _ in range(P)]
    routes = route(plan, sets)
    start = plan.start
    for r, per_node in enumerate(plan.rounds):
        # the next write of each element after round r (for the "no useless row" check)
        for p, tasks in enumerate(per_node):
            for t in tasks:
                for j in t.indices.tolist():
                    k = j - start
                    for g in [*sets.reads_of(k).tolist(), *sets.writes_of(k).tolist()]:
                        assert have[p][g] == latest[g], (r, p, j, g)
        for p, tasks in enumerate(per_node):
            for t in tasks:
                for j in t.indices.tolist():
                    for g in sets.writes_of(j - start).tolist():
                        latest[g] += 1
                        have[p][g] = latest[g]
        msgs = routes.rounds[r]
        for k in range(len(msgs)):
            src, dst, rows = int(msgs.src[k]), int(msgs.dst[k]), msgs.rows(k).tolist()
            assert rows and src != dst
            for g in rows:
                have[dst][g] = have[src][g]
        for p in range(P):
            behind = sorted(g for g in elems.tolist() if have[p][g] != latest[g])
            marked = routes.stale[r][p].tolist()
            # marked: stale since this round; behind may also hold earlier rounds' marks
            assert set(marked) <= set(behind), (r, p)
            assert all(latest[g] == have[_writer(plan, sets, r, g)][g] for g in marked)
    for k in range(len(routes.final)):
        src, dst = int(routes.final.src[k]), int(routes.final.dst[k])
        assert src != dst and len(routes.final.rows(k))
        for g in routes.final.rows(k).tolist():
            assert have[src][g] == latest[g]
            have[dst][g] = latest[g]
    for p in range(P):
        assert have[p] == latest, p


def _writer(plan, sets, r: int, g: int) -> int:
    for p, tasks in enumerate(plan.rounds[r]):
        for t in tasks:
            for j in t.indices.tolist():
                if g in sets.writes_of(j - plan.start).tolist():
                    return p
    raise AssertionError((r, g))


def _accessors_between(plan, sets, g: int, lo: int, hi: int) -> set[int]:
    """Nodes touching ``g`` in rounds lo..hi (inclusive)."""
    out = set()
    for r in range(lo, min(hi, len(plan.rounds) - 1) + 1):
        for p, tasks in enumerate(plan.rounds[r]):
            for t in tasks:
                for j in t.indices.tolist():
                    k = j - plan.start
                    if g in sets.reads_of(k).tolist() or g in sets.writes_of(k).tolist():
                        out.add(p)
    return out


def _check_no_useless_rows(sets, plan) -> None:
    routes = route(plan, sets)
    R = len(plan.rounds)
    for r, msgs in enumerate(routes.rounds):
        for k in range(len(msgs)):
            for g in msgs.rows(k).tolist():
                later = [s for s in range(r + 1, R) if _writes_in(plan, sets, s, g)]
                nxt = later[0] if later else R - 1
                assert int(msgs.dst[k]) in _accessors_between(plan, sets, g, r + 1, nxt)


def _writes_in(plan, sets, r: int, g: int) -> bool:
    return any(
        g in sets.writes_of(j - plan.start).tolist()
        for tasks in plan.rounds[r]
        for t in tasks
        for j in t.indices.tolist()
    )


@given(
    access_sets(),
    st.integers(1, 5),
    st.integers(1, 3),
    st.sampled_from(["auto", "components", "colouring"]),
)
def test_every_access_sees_the_latest_write_and_replicas_end_whole(
    sets, nodes, threads, strategy
) -> None:
    plan = make_plan(sets, nodes, threads, seed=1, strategy=strategy)
    _simulate(sets, plan)
    _check_no_useless_rows(sets, plan)


@given(access_sets(), st.integers(1, 5), st.randoms(use_true_random=False))
def test_routes_of_wavefront_plans(sets, nodes, rnd) -> None:
    order = np.arange(sets.start, sets.start + sets.n)
    rnd.shuffle(order)
    plan = wavefront_plan(sets, np.asarray(order), nodes, 2)
    _simulate(sets, plan)


@given(rotation_shaped_sets(), st.integers(1, 5), st.integers(1, 2))
def test_token_plans_route_every_row_to_where_it_is_read_next(sets, nodes, threads) -> None:
    from engine._machines.planner import rotation_spaces

    if rotation_spaces(sets) is None or len(np.unique(sets.w_ids >> SLOT_BITS)) != 2:
        return
    plan = make_plan(sets, nodes, threads, seed=0, strategy="tokens")
    _simulate(sets, plan)
    _check_no_useless_rows(sets, plan)


@given(access_sets(), st.integers(2, 4), st.sampled_from(["auto", "components", "colouring"]))
def test_message_edges_are_the_exchanges_of_the_routes(sets, nodes, strategy) -> None:
    """What the critical path waits for is exactly who sends whom a row in each exchange;
    a row is first used no earlier than the round after it was sent."""
    plan = make_plan(sets, nodes, 1, seed=1, strategy=strategy)
    routes = route(plan, sets)
    want = sorted(
        (r, int(m.src[k]), int(m.dst[k]))
        for r, m in enumerate(routes.rounds)
        for k in range(len(m))
    )
    rnd, src, dst, use = message_edges(plan, sets, first_use=True)
    assert list(zip(rnd.tolist(), src.tolist(), dst.tolist(), strict=True)) == want
    assert (use > rnd).all() and (use < len(plan.rounds)).all()


@pytest.mark.parametrize(("nodes", "ring"), [(2, True), (4, True), (8, True), (4, False)])
def test_a_rotation_sends_each_moving_row_to_one_node_and_staying_rows_nowhere(
    nodes: int, ring: bool
) -> None:
    """SGD touches one user row (dds 1) and one item row (dds 2) per body, and writes both:
    a block of the space that stays (the one with more rows: items; before ``ring``, the
    first: users) stays on its node for the whole rotation, and a row of the other
    written in a round goes only to the node that touches it next."""
    sets = sgd_like_sets(3000, 60, 80)
    plan = make_plan(sets, nodes, 1, strategy="rotation", ring=ring)
    assert plan.strategy == "rotation"
    routes = route(plan, sets)
    stays = 2 if ring else 1
    for msgs in routes.rounds:
        rows = msgs.gids
        assert len(np.unique(rows)) == len(rows)  # no row to two nodes
        assert not ((rows >> SLOT_BITS) == stays).any()  # no staying row travels
    written = sum(len(w) for per in plan.writes for w in per)
    assert sum(len(m.gids) for m in routes.rounds) <= written
    unique = len(np.unique(np.concatenate([w for per in plan.writes for w in per])))
    assert len(routes.final.gids) <= unique * (nodes - 1)  # the final exchange: at most all
    if nodes > 2:  # what every round's broadcast to every node used to move
        assert routes.sent_rows() < written * (nodes - 1) / 2


def _chain(n: int, far: int, invocations: int, replan: str = "auto", **kw):
    """Gauss-Seidel along a chain (colouring: two rounds); from the second invocation on,
    body j also reads X[(j + far) % n], which its first sets did not hold, so on another
    node that row may have been written in round 0 and not sent."""
    out: dict[str, list] = {"orders": []}

    def prog() -> None:
        X = ap.dvector(n, shape=(), init=ap.init.normal(0, 1), name="X")
        out["init"] = X.gather().copy()
        for it in range(invocations):

            def body(j: int) -> None:
                extra = float(X[(j + far) % n]) if it > 0 else 0.0  # noqa: B023
                X[j] = X[j] * 0.5 + (float(X[j - 1]) if j else 0.0) * 0.25 + extra * 0.125

            ap.async_for(0, n, body, name="chain", strategy="colouring", replan=replan)
            out["orders"].append(ap.last_order("chain"))
        out["final"] = X.gather().copy()

    ap.run(prog, **kw)
    return out


def _chain_serial(init, orders, n: int, far: int) -> np.ndarray:
    x = np.array(init, dtype=np.float64)
    for it, order in enumerate(orders):
        for j in np.asarray(order).tolist():
            extra = float(x[(j + far) % n]) if it > 0 else 0.0
            x[j] = x[j] * 0.5 + (float(x[j - 1]) if j else 0.0) * 0.25 + extra * 0.125
    return x


def test_a_read_of_a_row_that_was_not_sent_is_a_plan_violation() -> None:
    with pytest.raises(ap.AccessOutsideReconError, match="did not send here"):
        _chain(16, 1, 2, replan="never", nodes=3)


@given(
    n=st.integers(6, 30),
    far=st.integers(1, 29),
    nodes=st.integers(2, 4),
    threads=st.integers(1, 2),
)
def test_a_body_reading_what_was_not_sent_is_replanned_and_equals_its_serial_loop(
    n: int, far: int, nodes: int, threads: int
) -> None:
    got = _chain(n, far % n or 1, 3, nodes=nodes, threads=threads)
    want = _chain_serial(got["init"], got["orders"], n, far % n or 1)
    np.testing.assert_array_equal(got["final"], want)


@given(
    n=st.integers(20, 300),
    nodes=st.integers(2, 5),
    seed=st.integers(0, 50),
    strategy=st.sampled_from(["tokens", "rotation", "colouring", "components"]),
)
def test_a_message_is_due_at_the_first_round_its_destination_touches_its_rows(
    n: int, nodes: int, seed: int, strategy: str
) -> None:
    """``Routes.uses``: the destination touches none of a message's rows between the
    round after it was sent and its due round, and some row in the due round.  A receive
    deferred to that round (``Cluster.settle``) therefore cannot come late, and the guard
    marks the rows as not there in between (``Guard.mark_pending``)."""
    sets = sgd_like_sets(n, 8, 12, seed=seed)
    plan = make_plan(sets, nodes, seed=seed, strategy=strategy)
    routes = route(plan, sets)
    touched: dict[tuple[int, int], set[int]] = {}  # (round, node) -> element ids
    for r, per_node in enumerate(plan.rounds):
        for p, tasks in enumerate(per_node):
            got = touched.setdefault((r, p), set())
            for t in tasks:
                for j in t.indices.tolist():
                    k = j - plan.start
                    got.update(sets.reads_of(k).tolist(), sets.writes_of(k).tolist())
    assert len(routes.uses) == len(routes.rounds)
    for r, msgs in enumerate(routes.rounds):
        assert len(routes.uses[r]) == len(msgs)
        for k in range(len(msgs)):
            dst, due = int(msgs.dst[k]), int(routes.uses[r][k])
            rows = set(msgs.rows(k).tolist())
            assert r < due < len(plan.rounds)
            for s in range(r + 1, due):
                assert not rows & touched.get((s, dst), set()), (r, k, s)
            assert rows & touched[(due, dst)], (r, k, due)
