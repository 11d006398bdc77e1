"""Coalesced routes (``engine._machines.routing.coalesce``, ``route(coalesce=True)``).

A routed row need not leave in the round it was written: only arrive before the first
round its destination touches it.  So each pair of nodes sends the rows of consecutive
exchanges in one message, at the last exchange before the earliest round that needs one
of them.  Checked here against a version simulation of whole invocations over generated
plans (every strategy, three invocations, the fetch and the final exchange home):

* the value a message carries is the one the routes meant: the sender's version after
  the round that wrote it (nobody writes it on the sender's replica in between), or the
  last version for a row going home;
* every access of every planned body sees the latest version, with each deferred
  message taken in only at its due round, as an MPI rank does (``Cluster.settle``);
* every row a node is behind on is marked there, by the guard's rule (stale, in flight
  since the round it was written, not fetched): a body that leaves its plan cannot
  read an old value;
* fewer messages, the same rows, and the plan's critical path (bodies as time) what
  it was without coalescing.

Then the engine: the same bits and bytes with and without coalescing, and a body that
reads a row still in flight is a plan violation, re-planned to its serial loop's result.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine as ap
from engine._data.dds import SLOT_BITS
from engine._machines import routing
from engine._machines.planner import make_plan
from engine._machines.routing import coalesce, fetch, route, touches
from tests.engine import test_routing_home as routing_home
from tests.engine.test_planner import access_sets, sgd_like_sets

NEVER = np.iinfo(np.int64).max


# ====================================================================== the grouping
def _fewest(start: list[int], end: list[int]) -> int:
    """Fewest exchanges that meet every window (earliest deadline first)."""
    n, at = 0, None
    for s, e in sorted(zip(start, end, strict=True), key=lambda w: w[1]):
        if at is None or s > at:
            n, at = n + 1, e
    return n


@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 20), st.integers(0, 6)),
        max_size=40,
    )
)
def test_groups_meet_every_window_with_the_fewest_messages(sends) -> None:
    pair = np.array([p for p, _, _ in sends], dtype=np.int64)
    start = np.array([s for _, s, _ in sends], dtype=np.int64)
    end = start + np.array([w for _, _, w in sends], dtype=np.int64)
    grp, lo, hi = coalesce(start, end, pair)
    assert ((start <= lo) & (lo <= hi) & (hi <= end)).all()  # every window meets the group's
    for g in np.unique(grp).tolist():
        at = grp == g
        assert len(np.unique(pair[at])) == 1
        assert (lo[at] == start[at].max()).all() and (hi[at] == end[at].min()).all()
    for p in np.unique(pair).tolist():
        at = pair == p
        assert len(np.unique(grp[at])) == _fewest(start[at].tolist(), end[at].tolist())


# ====================================================================== the simulation
def _touched(plan, sets, r: int, p: int) -> set[int]:
    return set(routing_home._touched(plan, sets, r, p))


_written = routing_home._written


class _Sim:
    """Version tables of every node, driven as the engine drives an invocation."""

    def __init__(self, elems: list[int], nodes: int, home, row_bytes=None) -> None:
        self.row_bytes = row_bytes  # relayed routes (``routing.relay``) when given
        self.relayed = 0  # rows passed on by a node that does not touch them
        self.latest = dict.fromkeys(elems, 0)
        self.have = [dict(self.latest) for _ in range(nodes)]
        self.home = home
        self.dirty: dict[int, int] = {}
        self.messages = 0

    def invocation(self, plan, sets) -> None:
        P, R = plan.nodes, len(plan.rounds)
        have, latest = self.have, self.latest
        marked: list[list[tuple[int, int, int]]] = [[] for _ in range(P)]  # (from, until, g)
        inflight: list[tuple[int, int, dict[int, int]]] = []  # (due, dst, values)
        # the fetch: dirty rows from their homes, deferred to their first use
        ids = np.asarray(sorted(self.dirty), dtype=np.int64)
        holder = np.asarray([self.dirty[g] for g in ids.tolist()], dtype=np.int64)
        fm, fu = fetch(touches(plan, sets), ids, self.home, holder)
        self.messages += len(fm)
        got: list[set[int]] = [set() for _ in range(P)]
        for k in range(len(fm)):
            src, dst, u = int(fm.src[k]), int(fm.dst[k]), int(fu[k])
            vals = {g: have[src][g] for g in fm.rows(k).tolist()}
            got[dst].update(vals)
            if 0 < u < R:
                inflight.append((u, dst, vals))
                marked[dst] += [(0, u, g) for g in vals]
            else:
                have[dst].update(vals)
        for g, h in self.dirty.items():
            for p in range(P):
                if p != h and p != int(self.home(np.array([g]))[0]) and g not in got[p]:
                    marked[p].append((0, R, g))
        routes = route(plan, sets, home=self.home, coalesce=True, row_bytes=self.row_bytes)
        via = routes.via or [np.zeros(len(m.gids), dtype=bool) for m in routes.rounds]
        written_at: dict[tuple[int, int], int] = {}
        # the guard's marks of rows in flight: from the write-back of the round that
        # wrote them (``GuardPlan.pending``) until they are there
        late: list[list[tuple[int, int, int, int]]] = [[] for _ in range(R)]
        for x in range(R):
            m, uses, born = routes.rounds[x], routes.uses[x], routes.born[x]
            for k in range(len(m)):
                u = int(uses[k])
                arrive = u if x + 1 < u < R else x + 1
                b = born[int(m.ptr[k]) : int(m.ptr[k + 1])]
                v = via[x][int(m.ptr[k]) : int(m.ptr[k + 1])]
                for g, w, passed in zip(m.rows(k).tolist(), b.tolist(), v.tolist(), strict=True):
                    if w >= 0 and arrive > w + 1 and not passed:  # passed on: stays stale
                        late[w].append((int(m.dst[k]), w + 1, arrive, g))
        for r in range(R):
            keep = []
            for due, dst, vals in inflight:  # settle: in the order they were posted
                if due <= r:
                    have[dst].update(vals)
                else:
                    keep.append((due, dst, vals))
            inflight = keep
            for p in range(P):
                for g in _touched(plan, sets, r, p):
                    assert have[p][g] == latest[g], (r, p, g)
                    assert not any(a <= r < b and x == g for a, b, x in marked[p]), (r, p, g)
                behind = [g for g in latest if have[p][g] != latest[g]]
                on = {x for a, b, x in marked[p] if a <= r < b}
                assert set(behind) <= on, (r, p, sorted(set(behind) - on))
            now: set[int] = set()
            for p in range(P):
                for g in _written(plan, sets, r, p):
                    latest[g] += 1
                    have[p][g] = latest[g]
                    written_at[(g, r)] = latest[g]
                    now.add(g)
            # the guard arms a round's written rows on every node and frees them after it
            marked = [[e for e in per if e[2] not in now] for per in marked]
            m, uses, born = routes.rounds[r], routes.uses[r], routes.born[r]
            self.messages += len(m)
            for k in range(len(m)):
                src, dst, u = int(m.src[k]), int(m.dst[k]), int(uses[k])
                rows = m.rows(k)
                b = born[int(m.ptr[k]) : int(m.ptr[k + 1])]
                assert len(rows) and src != dst and r < u
                self.relayed += int(via[r][int(m.ptr[k]) : int(m.ptr[k + 1])].sum())
                vals = {}
                for g, w in zip(rows.tolist(), b.tolist(), strict=True):
                    # the value the routes meant: nobody wrote it on the sender since
                    want = latest[g] if w < 0 else written_at[(g, w)]
                    assert have[src][g] == want, (r, src, dst, g, w)
                    assert w <= r
                    vals[g] = have[src][g]
                if r + 1 < u < R:
                    inflight.append((u, dst, vals))
                else:
                    have[dst].update(vals)
            for p in range(P):
                marked[p] += [(r + 1, R, g) for g in routes.stale[r][p].tolist()]
            for dst, a, b_, g in late[r]:
                marked[dst].append((a, b_, g))
        for _, dst, vals in inflight:
            have[dst].update(vals)
        f = routes.final
        self.messages += len(f)
        for k in range(len(f)):
            src, dst = int(f.src[k]), int(f.dst[k])
            assert (self.home(f.rows(k)) == dst).all() and src != dst
            for g in f.rows(k).tolist():
                assert have[src][g] == latest[g]
                have[dst][g] = latest[g]
        gids, writers = routes.holders
        self.dirty.update(zip(gids.tolist(), writers.tolist(), strict=True))
        for g, w in self.dirty.items():
            assert have[int(self.home(np.array([g]))[0])][g] == latest[g], g
            assert have[w][g] == latest[g], g


def _home_of(elems: list[int], nodes: int):
    order = {g: k for k, g in enumerate(elems)}

    def home(gids: np.ndarray) -> np.ndarray:
        return np.array([(order[g] * 7) % nodes for g in gids.tolist()], dtype=np.int64)

    return home


def _row_bytes(size: int):
    """Rows of ``size`` bytes, those of dds 3 and up none (never relayed)."""
    return lambda g: np.where((np.asarray(g) >> SLOT_BITS) < 3, size, 0)


@given(
    seed=st.integers(0, 2**16),
    nodes=st.sampled_from([2, 3, 5, 8]),
    strategies=st.tuples(*[st.sampled_from(["rotation", "tokens", "components"])] * 2),
    row=st.sampled_from([None, 8, 64, 300]),
    ring=st.booleans(),
)
def test_coalesced_sgd_invocations_keep_every_access_on_the_last_value(
    seed: int, nodes: int, strategies: tuple[str, str], row: int | None, ring: bool
) -> None:
    """``row``: relayed routes of rows of that many bytes (None: not relayed)."""
    sets = sgd_like_sets(120, 9, 14, seed=seed)
    plans = [
        make_plan(sets, nodes, seed=seed + k, strategy=s, ring=ring)
        for k, s in enumerate(strategies)
    ]
    plans.append(plans[0])
    elems = np.unique(np.concatenate([sets.r_ids, sets.w_ids])).tolist()
    sim = _Sim(elems, nodes, _home_of(elems, nodes), None if row is None else _row_bytes(row))
    for plan in plans:
        sim.invocation(plan, sets)


@given(
    access_sets(),
    st.integers(1, 5),
    st.integers(1, 3),
    st.sampled_from(["auto", "components", "colouring"]),
    st.sampled_from([None, 8, 64]),
)
def test_coalesced_routes_of_any_plan_keep_every_access_on_the_last_value(
    sets, nodes, threads, strategy, row
) -> None:
    plan = make_plan(sets, nodes, threads, seed=1, strategy=strategy)
    elems = np.unique(np.concatenate([sets.r_ids, sets.w_ids, np.zeros(1, np.int64)])).tolist()
    sim = _Sim(elems, nodes, _home_of(elems, nodes), None if row is None else _row_bytes(row))
    sim.invocation(plan, sets)
    sim.invocation(plan, sets)


@pytest.mark.parametrize("nodes", [6, 8, 16])
def test_a_rotation_relays_rows_along_the_ring_in_time(nodes: int) -> None:
    """Rows a node touches d rounds after their writer ride the ring (each node passes
    them on) instead of a message of their own, when that adds at most RELAY_BYTES: the
    version simulation above checks every value and mark over three invocations."""
    sets = sgd_like_sets(1500, 300, 400)
    plan = make_plan(sets, nodes, 1, strategy="rotation")
    elems = np.unique(np.concatenate([sets.r_ids, sets.w_ids])).tolist()
    home = _home_of(elems, nodes)
    plain, relayed = _Sim(elems, nodes, home), _Sim(elems, nodes, home, _row_bytes(64))
    for _ in range(3):
        plain.invocation(plan, sets)
        relayed.invocation(plan, sets)
    assert relayed.relayed > 0
    assert relayed.messages < plain.messages, (relayed.messages, plain.messages)


def _path(plan, routes) -> float:
    """The plan's critical path with its routed messages as ``routes`` sends them."""
    from engine._machines.makespan import on_demand_path
    from engine._machines.routing import _loads

    e = [
        (x, s, d, u)
        for x, m in enumerate(routes.rounds)
        for s, d, u in zip(m.src, m.dst, routes.uses[x], strict=True)
    ]
    cols = [np.array([t[i] for t in e], dtype=np.int64) for i in range(4)]
    return on_demand_path(_loads(plan), *cols)


@given(
    seed=st.integers(0, 2**16),
    nodes=st.sampled_from([3, 5, 8]),
    strategy=st.sampled_from(["rotation", "tokens", "colouring"]),
)
def test_coalescing_never_lengthens_the_critical_path(seed: int, nodes: int, strategy: str) -> None:
    """A group waits for its last round written only where the destination, timed by
    the uncoalesced messages (bodies as time), would not start its first round that
    needs a row any earlier."""
    sets = sgd_like_sets(300, 30, 60, seed=seed)
    plan = make_plan(sets, nodes, seed=seed, strategy=strategy)
    plain, coal = route(plan, sets), route(plan, sets, coalesce=True)
    assert _path(plan, coal) == _path(plan, plain)
    assert sum(map(len, coal.rounds)) <= sum(map(len, plain.rounds))
    relayed = route(plan, sets, coalesce=True, row_bytes=_row_bytes(64))
    assert _path(plan, relayed) <= _path(plan, coal)  # no carrier is due earlier
    assert sum(map(len, relayed.rounds)) <= sum(map(len, coal.rounds))


@pytest.mark.parametrize("nodes", [8, 16])
def test_a_rotation_sends_the_same_rows_in_fewer_messages(nodes: int) -> None:
    """Item rows a node touches d rounds after their writer: up to d exchanges in one."""
    sets = sgd_like_sets(1500, 300, 400)
    plan = make_plan(sets, nodes, 1, strategy="rotation")
    home = lambda g: g % nodes  # noqa: E731
    plain, coal = route(plan, sets, home=home), route(plan, sets, home=home, coalesce=True)
    assert plain.sent_rows() == coal.sent_rows()
    n_plain = sum(len(m) for m in plain.rounds) + len(plain.final)
    n_coal = sum(len(m) for m in coal.rounds) + len(coal.final)
    assert n_coal < 0.85 * n_plain, (n_coal, n_plain)


# ====================================================================== the engine
N, USERS, ITEMS = 400, 40, 60


def _sgd(
    nodes: int,
    epochs: int,
    coalesce: bool,
    extra=None,
    replan: str = "auto",
    strategy: str = "colouring",
    n: int = N,
):
    """SGD-like updates on uniform ratings; from the second epoch on, body j also reads
    the item rows ``extra(j, i)`` (outside its sets: on a node they may be in flight).
    Colouring plans any sets (a re-plan too) in many rounds."""
    rng = np.random.default_rng(3)
    users, items = rng.integers(0, USERS, n), rng.integers(0, ITEMS, n)
    out: dict = {"orders": []}

    def prog() -> None:
        W = ap.dvector(USERS, shape=(3,), init=ap.init.normal(0, 0.3), name="W")
        H = ap.dvector(ITEMS, shape=(3,), init=ap.init.normal(0, 0.3), name="H")
        out["init"] = (W.gather().copy(), H.gather().copy())
        for it in range(epochs):

            def body(j: int) -> None:
                u, i = int(users[j]), int(items[j])
                w, h = W[u], H[i]
                more = extra(j, i) if it and extra is not None else []  # noqa: B023
                err = 1.0 - float(w @ h) - 0.01 * sum(float(H[k][0]) for k in more)
                W[u] = w + 0.05 * err * h
                H[i] = h + 0.05 * err * w

            ap.async_for(0, n, body, name="sgd", replan=replan, strategy=strategy)
            out["orders"].append(ap.last_order("sgd"))
            if it == 0:
                out["first"] = ap.current().ops["sgd"]
        out["final"] = (W.gather().copy(), H.gather().copy())
        out["traffic"] = ap.current().cluster.traffic.snapshot()

    res = ap.run(prog, nodes=nodes, coalesce=coalesce)
    out["digests"] = [d["digest"] for d in res.digests]
    return out, users, items


def _serial(init, orders, users, items, extra):
    W, H = init[0].copy(), init[1].copy()
    for it, order in enumerate(orders):
        for j in np.asarray(order).tolist():
            u, i = int(users[j]), int(items[j])
            w, h = W[u].copy(), H[i].copy()
            more = extra(j, i) if it else []
            err = 1.0 - float(w @ h) - 0.01 * sum(float(H[k][0]) for k in more)
            W[u] = w + 0.05 * err * h
            H[i] = h + 0.05 * err * w
    return W, H


@pytest.mark.parametrize("nodes", [6, 8])
@pytest.mark.parametrize("strategy", ["colouring", "tokens", "rotation"])
def test_coalescing_changes_messages_not_bits_or_rows(
    nodes: int, strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(routing, "RELAY_BYTES", 0)  # coalescing alone: nothing relayed
    plain, _, _ = _sgd(nodes, 3, coalesce=False, strategy=strategy)
    coal, _, _ = _sgd(nodes, 3, coalesce=True, strategy=strategy)
    assert plain["first"].plan.strategy == strategy
    assert coal["digests"] == plain["digests"]
    a, b = plain["traffic"], coal["traffic"]
    assert b["sent_messages"] < a["sent_messages"]
    # the same rows: only the 8-byte headers of the messages saved differ
    assert a["sent_bytes"] - b["sent_bytes"] == 8 * (a["sent_messages"] - b["sent_messages"])
    assert b["sent_bytes"] == b["received_bytes"] and b["sent_messages"] == b["received_messages"]


@pytest.mark.parametrize("nodes", [6, 8])
@pytest.mark.parametrize("strategy", ["colouring", "tokens", "rotation"])
def test_relaying_changes_messages_not_bits(
    nodes: int, strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Relayed rows (``routing.relay``) against none relayed: the same bits, no more
    messages, and every byte sent received."""
    relayed, _, _ = _sgd(nodes, 3, coalesce=True, strategy=strategy)
    monkeypatch.setattr(routing, "RELAY_BYTES", 0)
    plain, _, _ = _sgd(nodes, 3, coalesce=True, strategy=strategy)
    assert relayed["digests"] == plain["digests"]
    a, b = plain["traffic"], relayed["traffic"]
    assert b["sent_messages"] <= a["sent_messages"]
    assert b["sent_bytes"] == b["received_bytes"] and b["sent_messages"] == b["received_messages"]
    if strategy == "rotation":
        assert b["sent_messages"] < a["sent_messages"]


def _in_flight(nodes: int) -> tuple[int, int]:
    """A body and an item row that is on its way to the body's node, written in an
    earlier round and not there yet, when the body runs (``GuardPlan.pending``)."""
    got, _, _ = _sgd(nodes, 1, coalesce=True)
    st = got["first"]
    gp, plan = st.guard_plan, st.plan
    for b, per in enumerate(gp.pending):
        for p, groups in per.items():
            for d, slots in groups:
                due = next(
                    u for u, a in enumerate(gp.arrive) if any(x is slots for _, x in a.get(p, []))
                )
                for t in range(b + 1, due):
                    if d.name == "H" and plan.rounds[t][p]:
                        return int(plan.rounds[t][p][0].indices[0]), int(slots[0])
    raise AssertionError("no row in flight")


def test_a_read_of_a_row_still_in_flight_is_a_plan_violation() -> None:
    j, row = _in_flight(8)
    with pytest.raises(ap.AccessOutsideReconError, match=f"H\\[{row}\\].*sent here for a later"):
        _sgd(8, 2, coalesce=True, extra=lambda k, i: [row] if k == j else [], replan="never")


@settings(max_examples=6, deadline=None)
@given(
    far=st.integers(1, ITEMS - 1),
    nodes=st.sampled_from([3, 6, 8]),
    strategy=st.sampled_from(["colouring", "auto"]),
)
def test_a_body_reading_rows_in_flight_is_replanned_and_equals_its_serial_loop(
    far: int, nodes: int, strategy: str
) -> None:
    """Also under ``auto`` on more ratings (a rotation, whose user rows ride the ring,
    relayed, when the violation undoes the rounds run so far): every replica comes
    back, relays included, and the re-plan is another strategy."""

    def extra(j: int, i: int) -> list[int]:
        return [(i + far) % ITEMS] if j % 7 == 0 else []

    n = N if strategy == "colouring" else 3000
    got, users, items = _sgd(nodes, 2, coalesce=True, extra=extra, strategy=strategy, n=n)
    assert got["first"].plan.strategy == ("colouring" if strategy == "colouring" else "rotation")
    W, H = _serial(got["init"], got["orders"], users, items, extra)
    np.testing.assert_array_equal(got["final"][0], W)
    np.testing.assert_array_equal(got["final"][1], H)
