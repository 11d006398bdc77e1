"""The colouring strategy: independent colour classes, the cost model's choice, and runs
that equal their colour-by-colour serial order (in-process, dual tests, MPI record/replay)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine as ap
import tracer
from benchmarks.gauss_seidel import power_law_graph
from engine._asyncfor.recon import AccessSets, csr_from_lists
from engine._machines import planner as _planner
from engine._machines.colouring import colour_bodies, colour_lower_bound
from engine._machines.planner import conflicts, make_plan
from replay import testing
from tests.conftest import MPI_TIMEOUT
from tests.engine.test_planner import access_sets, check_plan, gid, make_sets
from tracer._plans import decode_plan, encode_plan

ROOT = Path(__file__).resolve().parent.parent.parent
GS_APP = f"{ROOT / 'benchmarks' / 'gauss_seidel.py'}:propagate"


def graph_sets(n: int, degree: int, seed: int = 7) -> AccessSets:
    """A Gauss–Seidel sweep's sets: body v reads its neighbours and writes itself."""
    indptr, nbr = power_law_graph(n, degree, seed)
    reads = [[gid(0, int(u)) for u in nbr[indptr[v] : indptr[v + 1]]] for v in range(n)]
    rp, ri = csr_from_lists([len(r) for r in reads], [g for r in reads for g in r])
    wp, wi = csr_from_lists([1] * n, [gid(0, v) for v in range(n)])
    return AccessSets(0, n, rp, ri, wp, wi)


def round_of(plan) -> dict[int, int]:
    return {
        int(j): r
        for r, per_node in enumerate(plan.rounds)
        for tasks in per_node
        for t in tasks
        for j in t.indices
    }


# ============================================================= the plan, as data
@given(access_sets(), st.integers(1, 4), st.integers(1, 3))
def test_every_colour_class_is_independent_and_every_body_runs_once(sets, nodes, threads) -> None:
    plan = make_plan(sets, nodes, threads, strategy="colouring")
    assert plan.strategy == "colouring" and plan.colours == len(plan.rounds)
    check_plan(sets, plan)  # every body exactly once; no conflict across tasks of a round
    assert not plan.has_locks()
    where = round_of(plan)
    for a in range(sets.n):
        for b in range(a + 1, sets.n):
            if where[a + sets.start] == where[b + sets.start]:
                # stronger than check_plan: not even one task holds two conflicting bodies
                assert not conflicts(sets, a, b), f"bodies {a} and {b} share a colour"
    # the serial order is colour by colour
    colour = colour_bodies(sets)
    order = plan.serial_order() - sets.start
    assert np.all(np.diff(colour[order]) >= 0)
    assert colour.max(initial=0) + 1 >= colour_lower_bound(sets)


@given(access_sets())
def test_colouring_depends_on_the_sets_alone(sets) -> None:
    assert np.array_equal(colour_bodies(sets), colour_bodies(sets))
    copy = AccessSets(
        sets.start,
        sets.n,
        *(a.copy() for a in (sets.r_indptr, sets.r_ids, sets.w_indptr, sets.w_ids)),
    )
    a = make_plan(sets, 3, 2, strategy="colouring")
    b = make_plan(copy, 3, 2, strategy="colouring")
    assert [[[t.indices.tolist() for t in ts] for ts in r] for r in a.rounds] == [
        [[t.indices.tolist() for t in ts] for ts in r] for r in b.rounds
    ]


@settings(max_examples=30)
@given(access_sets(), st.integers(1, 4), st.integers(1, 3))
def test_a_colouring_plan_survives_the_trace_without_explicit_orders(sets, nodes, threads) -> None:
    plan = make_plan(sets, nodes, threads, strategy="colouring")
    row = encode_plan(plan)
    assert row["strategy"] == "colouring" and row["n_explicit"] == 0  # ascending tasks

    class Row:
        pass

    r = Row()
    r.__dict__.update(row)
    back = decode_plan(r)
    assert back.strategy == "colouring" and len(back.rounds) == len(plan.rounds)
    assert np.array_equal(back.serial_order(), plan.serial_order())
    for ra, rb in zip(plan.rounds, back.rounds, strict=True):
        for ta, tb in zip(ra, rb, strict=True):
            assert [(t.thread, t.locked, t.indices.tolist()) for t in ta] == [
                (t.thread, t.locked, t.indices.tolist()) for t in tb
            ]


@pytest.mark.parametrize("nodes,threads", [(2, 1), (3, 2)])
def test_cost_model_picks_colouring_on_one_dense_component(nodes: int, threads: int) -> None:
    sets = graph_sets(6000, 4)
    plan = make_plan(sets, nodes, threads)
    assert plan.strategy == "colouring"
    assert plan.colours is not None and plan.colours <= 8
    assert plan.imbalance < 1.05 and plan.node_imbalance < 1.05
    # components would leave one node with everything
    assert make_plan(sets, nodes, threads, strategy="components").node_imbalance >= nodes - 0.01


def test_cost_model_keeps_components_where_the_graph_partitions() -> None:
    reads = [[gid(0, j ^ 1)] for j in range(3000)]  # 1,500 independent pairs
    writes = [[gid(0, j)] for j in range(3000)]
    sets = make_sets(reads, writes)
    assert make_plan(sets, 3, 1).strategy == "components"
    assert make_plan(sets, 3, 1, strategy="colouring").colours == 2  # possible, but dearer


def test_one_node_never_pays_for_colour_rounds() -> None:
    assert make_plan(graph_sets(3000, 4), 1, 2).strategy == "components"


def test_a_hot_element_skips_the_colouring_entirely(monkeypatch) -> None:
    # every body writes element 0: the bound (n colours) rules colouring out unrun
    sets = make_sets([[] for _ in range(500)], [[gid(0, 0)] for _ in range(500)])
    assert colour_lower_bound(sets) == 500

    def never(sets):
        raise AssertionError("the greedy colouring ran although it could not win")

    monkeypatch.setattr(_planner, "colour_bodies", never)
    assert make_plan(sets, 2, 1).strategy != "colouring"


def test_async_for_rejects_an_unknown_strategy() -> None:
    def prog():
        X = ap.dvector(4, shape=(), name="X")

        def body(j):
            X[j] = 1.0

        ap.async_for(0, 4, body, name="w", strategy="chromatic")

    with pytest.raises(ValueError, match="strategy must be one of auto, components"):
        ap.run(prog)


# ============================================================= runs
def gs_program(n: int, degree: int, sweeps: int, strategy: str, seen: list | None = None):
    """Non-commutative Gauss–Seidel sweeps; returns the initial state, the final state and
    each sweep's serialization order (for a plain numpy reference)."""
    indptr, nbr = power_law_graph(n, degree, 3)
    neighbours = [nbr[indptr[v] : indptr[v + 1]].tolist() for v in range(n)]

    def prog():
        X = ap.dvector(n, shape=(2,), init=ap.init.normal(0, 1), name="X")
        x0 = X.gather()

        def body(v):
            acc = np.array([0.5 + v * 1e-3, -0.25])
            for u in neighbours[v]:
                acc = acc * 0.9 + np.sin(X[u])
            X[v] = X[v] * 0.5 + acc / (1 + len(neighbours[v]))

        orders = []
        for _ in range(sweeps):
            ap.async_for(0, n, body, name="gs", strategy=strategy)
            orders.append(ap.last_order("gs"))
            if seen is not None:
                seen.append(ap.plan_of("gs").strategy)
            ap.log_objective("norm", float(np.abs(X.gather()).sum()))
        return x0, X.gather(), orders, ap.plan_of("gs")

    def reference(x0: np.ndarray, orders: list[np.ndarray]) -> np.ndarray:
        x = x0.copy()
        for order in orders:
            for v in order.tolist():
                acc = np.array([0.5 + v * 1e-3, -0.25])
                for u in neighbours[v]:
                    acc = acc * 0.9 + np.sin(x[u])
                x[v] = x[v] * 0.5 + acc / (1 + len(neighbours[v]))
        return x

    return prog, reference


@pytest.mark.parametrize("nodes,threads", [(2, 1), (2, 2), (3, 1), (3, 2)])
def test_a_coloured_run_equals_its_colour_by_colour_order_bitwise(nodes: int, threads: int) -> None:
    prog, reference = gs_program(400, 3, 2, "colouring")
    x0, x, orders, plan = ap.run(prog, nodes=nodes, threads=threads, seed=1).value
    assert plan.strategy == "colouring" and plan.colours >= 3
    for order in orders:
        assert np.array_equal(order, plan.serial_order())  # colour by colour
        assert sorted(order.tolist()) == list(range(400))
    assert np.array_equal(x, reference(x0, orders))
    # and another colour-respecting order of the same bodies gives another result: the
    # check above can fail
    shuffled = [o[::-1] for o in orders]
    assert not np.array_equal(x, reference(x0, shuffled))


def test_the_planner_reports_colours_rounds_and_imbalance() -> None:
    prog, _ = gs_program(3000, 4, 1, "auto")
    res = ap.run(prog, nodes=2)
    info = res.planner["gs"]
    assert info["strategy"] == "colouring"
    assert info["colours"] == info["rounds"] >= 3
    assert 1.0 <= info["imbalance"] < 1.05


@pytest.mark.parametrize("nodes,threads", [(2, 1), (3, 2)])
def test_dual_tests_pass_on_a_colouring_plan(nodes: int, threads: int) -> None:
    seen: list[str] = []
    prog, _ = gs_program(300, 3, 2, "colouring", seen)

    def driver():
        prog()

    results = testing.dual(driver, nodes=nodes, threads=threads, order="random", order_seed=2)
    for r in results.values():
        assert r.passed, r.report()
        assert r.bodies == 2 * 300
    assert "colouring" in seen  # the backward test's parallel side ran the colouring plan


# in-process commands whose ranks start under mpiexec (the layer scan cannot see it); the
# MPI jobs' own --timeout bounds them as run_cli's timeout did
@pytest.mark.mpi
def test_mpi_record_then_replay_both_ways(tmp_path: Path, cli) -> None:
    trace = tmp_path / "lp.sqlite"
    params = ["-p", "vertices=3000", "-p", "labels=4", "-p", "sweeps=2"]
    limit = ["--timeout", str(MPI_TIMEOUT)]
    proc = cli("run", GS_APP, *params, "--ranks", "2", "--trace", trace, "--json", *limit)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    info = res["planner"]["lp"]
    assert info["strategy"] == "colouring" and info["colours"] == info["rounds"] >= 3
    assert info["imbalance"] < 1.05
    op = tracer.open(trace).run().operators()["lp"]
    assert op.strategy == "colouring" and op.lock_grants == 0
    for mode in ("cluster", "single"):
        proc = cli(mode, trace, "--json", *(limit if mode == "cluster" else []))
        out = json.loads(proc.stdout)
        assert proc.returncode == 0 and out["identical"], out
        assert out["checked"]["digests"] == 2
