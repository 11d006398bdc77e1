"""sync_for: BSP bitwise equal to a numpy reference, SSP under delays, Hybrid, aggregation,
reconnaissance traffic, errors, and all three models under mpiexec."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import engine as ap
from engine._syncfor.drive import SeededDelays, use_delays
from tests import mpibatch

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from mpi_syncfor import (  # noqa: E402
    VisibilityLog,
    bsp_reference,
    program,
    stale_clocks,
    weighted,
)


# ---------------------------------------------------------------- BSP == reference
@pytest.mark.parametrize(
    "nodes,threads", [(1, 1), (1, 3), (2, 1), (2, 2), (3, 1), (3, 3), (4, 1), (4, 2), (4, 3)]
)
@pytest.mark.parametrize("per_clock", [1, 2])
def test_bsp_equals_single_process_reference_bitwise(
    nodes: int, threads: int, per_clock: int
) -> None:
    out = ap.run(program(per_clock=per_clock), nodes=nodes, threads=threads, seed=3).value
    w, h = bsp_reference(out["init"], nodes=nodes, threads=threads, seed=3, per_clock=per_clock)
    assert out["coherent"]
    assert np.array_equal(out["W"], w) and np.array_equal(out["H"], h)
    assert not np.array_equal(out["W"], out["init"][0])  # it did something


@pytest.mark.parametrize("nodes,threads", [(2, 2), (3, 1)])
def test_re_false_gives_the_same_bsp_result(nodes: int, threads: int) -> None:
    a = ap.run(program(re=True), nodes=nodes, threads=threads).value
    b = ap.run(program(re=False), nodes=nodes, threads=threads).value
    assert np.array_equal(a["W"], b["W"]) and np.array_equal(a["H"], b["H"])
    assert b["planner"]["params"] == ["W", "H"] and not b["planner"]["re"]


def test_reconnaissance_moves_fewer_bytes_on_sparse_access() -> None:
    def bytes_per_clock(re: bool) -> float:
        prog = program(re=re, shape=(200, 300), invocations=1)
        return ap.run(prog, nodes=3).value["planner"]["bytes_per_clock"]

    sparse, whole = bytes_per_clock(True), bytes_per_clock(False)
    assert 0 < sparse < whole / 10, (sparse, whole)


def test_one_node_moves_nothing() -> None:
    assert ap.run(program(), nodes=1, threads=2).value["planner"]["bytes_moved"] == 0


# ---------------------------------------------------------------- aggregation
@pytest.mark.parametrize("nodes,threads", [(1, 2), (2, 1), (3, 2)])
def test_custom_aggregation_gets_deltas_in_node_then_thread_order(nodes, threads) -> None:
    out = ap.run(program(agg=weighted), nodes=nodes, threads=threads).value
    w, h = bsp_reference(out["init"], nodes=nodes, threads=threads, agg=weighted)
    assert np.array_equal(out["W"], w) and np.array_equal(out["H"], h)
    plain = ap.run(program(), nodes=nodes, threads=threads).value
    assert not np.array_equal(out["W"], plain["W"])


def test_aggregation_can_be_reset_and_is_checked() -> None:
    def prog():
        D = ap.dvector(8, shape=(1,), data=np.arange(8.0).reshape(8, 1), name="D")
        X = ap.dvector(2, shape=(1,), name="X")

        def body(batch):
            X[0] += batch.values.sum()

        ap.register_aggregation(X, lambda d: d.sum(axis=0))
        ap.sync_for(D, 2, body, name="sum")
        summed = X.gather()[0, 0]
        ap.register_aggregation(X, None)
        X[0] = 0.0
        ap.sync_for(D, 2, body, name="sum")
        averaged = X.gather()[0, 0]
        ap.register_aggregation(X, lambda d: d[0, :, 0])
        with pytest.raises(ap.DDSError, match="must return"):
            ap.sync_for(D, 2, body, name="sum")
        return summed, averaged

    summed, averaged = ap.run(prog, nodes=2, threads=2).value
    assert summed == 28.0  # every minibatch's delta counts in full
    assert averaged == 14.0  # one clock: threads add up (6 and 22), the 2 nodes average


# ---------------------------------------------------------------- SSP
def test_ssp_with_staleness_zero_is_bsp() -> None:
    with use_delays(SeededDelays(5, slow={0: 4.0})):
        ssp = ap.run(program(sync="ssp", staleness=0), nodes=3, threads=2).value
    bsp = ap.run(program(), nodes=3, threads=2).value
    assert np.array_equal(ssp["W"], bsp["W"]) and np.array_equal(ssp["H"], bsp["H"])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("staleness", [1, 2, 3])
def test_ssp_bound_holds_under_random_delays(seed: int, staleness: int) -> None:
    log = VisibilityLog()
    with use_delays(SeededDelays(seed, compute=(0.2, 3.0), latency=(0.0, 1.0), slow={1: 3.0})):
        out = ap.run(program(sync="ssp", staleness=staleness), nodes=3, recorder=log).value
    bad, stale = stale_clocks(log, staleness)
    assert bad == 0 and stale > 0
    assert out["coherent"] and out["planner"]["staleness"] == staleness
    assert len(log.visibility) == 2 * 3 * out["planner"]["rounds"]


def test_ssp_runs_are_reproducible_under_the_same_delays() -> None:
    def once():
        with use_delays(SeededDelays(9, slow={2: 2.5})):
            return ap.run(program(sync="ssp", staleness=2), nodes=3).value["W"]

    assert np.array_equal(once(), once())


def test_test_mode_turns_staleness_off() -> None:
    inner = program(sync="ssp", staleness=3)

    def prog():
        ap.current().test_mode = True
        return inner()

    with use_delays(SeededDelays(2, slow={0: 5.0})):
        ssp = ap.run(prog, nodes=2).value
    bsp = ap.run(program(), nodes=2).value
    assert ssp["planner"]["staleness"] == 0
    assert np.array_equal(ssp["W"], bsp["W"])


# ---------------------------------------------------------------- Hybrid
def regression_program(sync: str, epochs: int = 8):
    """Least squares on 240 noiseless samples; returns the error after every epoch."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(240, 5))
    truth = rng.normal(size=5)
    rows = np.hstack([X, (X @ truth)[:, None]])

    def prog():
        D = ap.dvector(len(rows), shape=(6,), data=rows, name="D")
        w = ap.dvector(1, shape=(5,), name="w")

        def body(batch):
            x, y = batch.values[:, :5], batch.values[:, 5]
            cur = w[0]
            w[0] = cur - 0.1 * x.T @ (x @ cur - y) / len(y)

        errs = []
        for _ in range(epochs):
            ap.sync_for(D, 8, body, sync=sync, name="ls")
            errs.append(float(np.linalg.norm(w.gather()[0] - truth)))
        return errs

    return prog


@pytest.mark.parametrize("nodes,threads", [(1, 3), (2, 2), (3, 3)])
def test_hybrid_converges_and_reports_its_body_order(nodes: int, threads: int) -> None:
    log = VisibilityLog()
    errs = ap.run(regression_program("hybrid"), nodes=nodes, threads=threads, recorder=log).value
    assert errs[-1] < 0.05 * errs[0] and errs[-1] < 0.05, errs
    for _node, _clock, ths, mbs in log.bodies:
        assert set(ths.tolist()) <= set(range(threads))
        for t in set(ths.tolist()):  # each thread runs its own minibatches, in order
            assert np.all(np.diff(mbs[ths == t]) == 1)
    total = sorted(m for _, _, _, mbs in log.bodies for m in mbs.tolist())
    assert total == sorted(list(range(30)) * 8)  # every minibatch of every epoch, once


def test_bsp_and_ssp_converge_too() -> None:
    for sync in ("bsp", "ssp"):
        errs = ap.run(regression_program(sync), nodes=2, threads=2).value
        assert errs[-1] < 0.05, (sync, errs)


# ---------------------------------------------------------------- the body's view
def test_batches_cover_the_data_once_with_keys_and_values() -> None:
    def prog():
        D = ap.dvector(7, shape=(2,), data=np.arange(14.0).reshape(7, 2), name="D")
        seen = ap.dvector(7, shape=(), name="seen")
        M = ap.dmap(shape=(), keys=["a", "b", "c"], name="M")
        objs = ap.dvector(5, data=[{"k": i} for i in range(5)], name="objs")
        hits = ap.dvector(5, shape=(), name="hits")

        def body(batch):
            assert not batch.values.flags.writeable
            for key, value in batch:
                seen[key] = value[0] + 100 * batch.number

        def obj_body(batch):
            assert batch.keys.tolist() == list(
                range(2 * batch.number, 2 * batch.number + len(batch))
            )
            for key, value in batch:
                hits[key] = value["k"] + 0.5 + M["a"]

        for X in (seen, hits):  # each row has one writer: the sum is its delta, exactly
            ap.register_aggregation(X, lambda d: d.sum(axis=0))
        ap.sync_for(D, 3, body, name="b")
        ap.sync_for(objs, 2, obj_body, name="o")
        return seen.gather(), hits.gather()

    seen, hits = ap.run(prog, nodes=2, threads=2, seed=1).value
    assert seen.tolist() == [0, 2, 4, 106, 108, 110, 212]
    assert hits.tolist() == [0.5, 1.5, 2.5, 3.5, 4.5]


@pytest.mark.parametrize("nodes,threads", [(1, 1), (3, 2)])
def test_dmap_data_and_parameters(nodes: int, threads: int) -> None:
    words = ["ab", "bc", "ab", "cd", "bc", "ab", "de", "cd"]

    def prog():
        docs = ap.dmap(name="docs")
        for i, w in enumerate(words):
            docs[f"doc{i}"] = w
        counts = ap.dmap(shape=(), keys=sorted(set(words)), name="counts")
        ap.register_aggregation(counts, lambda d: d.sum(axis=0))

        def body(batch):
            for _key, word in batch:
                counts[word] += 1.0

        ap.sync_for(docs, 3, body, name="count")
        return dict(counts.items())

    got = ap.run(prog, nodes=nodes, threads=threads).value
    assert got == {"ab": 3.0, "bc": 2.0, "cd": 2.0, "de": 1.0}


def test_rng_depends_on_minibatch_not_on_placement() -> None:
    def prog():
        D = ap.dvector(12, shape=(1,), name="D")
        R = ap.dvector(12, shape=(), name="R")

        def body(batch):
            g = ap.rng()
            for k in batch.keys.tolist():
                R[k] = g.random()

        ap.register_aggregation(R, lambda d: d.sum(axis=0))
        ap.sync_for(D, 2, body, name="r")
        return R.gather()

    base = ap.run(prog, seed=4).value
    for nodes, threads in [(2, 1), (3, 2)]:
        assert np.array_equal(ap.run(prog, nodes=nodes, threads=threads, seed=4).value, base)


def test_each_owner_reports_the_arrival_order_of_every_clock() -> None:
    log = VisibilityLog()
    out = ap.run(program(invocations=1), nodes=3, recorder=log).value
    clocks = out["planner"]["rounds"]
    assert sorted((n, c) for n, c, _ in log.arrivals) == sorted(
        (n, c) for n in range(3) for c in range(clocks)
    )
    assert all(sorted(s.tolist()) == [0, 1, 2] for _, _, s in log.arrivals)


# ---------------------------------------------------------------- errors
def test_misuse_is_reported_clearly() -> None:
    def prog():
        D = ap.dvector(4, shape=(1,), name="D")
        objs = ap.dvector(2, data=["x", "y"], name="objs")
        W = ap.dvector(2, shape=(1,), name="W")

        def writes_data(batch):
            D[0] = 1.0

        def writes_objects(batch):
            objs[0] = "z"

        def fails(batch):
            if batch.number == 1:
                raise ZeroDivisionError("boom")
            W[0] += 1.0

        def nested(batch):
            ap.sync_for(D, 1, lambda b: None, name="inner")

        with pytest.raises(ap.DDSError, match="data DDS 'D'"):
            ap.sync_for(D, 2, writes_data, name="a")
        with pytest.raises(ap.DDSError, match="Python objects"):
            ap.sync_for(D, 2, writes_objects, name="b")
        with pytest.raises(ap.DDSError, match="cannot write 'D'"):
            ap.sync_for(D, 2, writes_data, re=False, name="c")
        with pytest.raises(ap.BodyError, match="index 1 .*ZeroDivisionError"):
            ap.sync_for(D, 2, fails, re=False, name="d")
        with pytest.raises(ap.BodyError, match="nesting"):
            ap.sync_for(D, 2, nested, name="e")
        with pytest.raises(ValueError, match="sync must be one of"):
            ap.sync_for(D, 2, fails, sync="async", name="f")
        with pytest.raises(ValueError, match="minibatch"):
            ap.sync_for(D, 0, fails, name="g")
        with pytest.raises(TypeError, match="data must be a DDS"):
            ap.sync_for([1, 2], 1, fails, name="h")
        with pytest.raises(TypeError, match="name="):
            ap.sync_for(D, 1, fails, name="")

    ap.run(prog, nodes=2)


def test_closure_rule_applies() -> None:
    def prog():
        D = ap.dvector(4, shape=(1,), name="D")
        total = 0.0

        def body(batch):
            nonlocal total
            total += 1.0

        ap.sync_for(D, 2, body, name="bad")

    with pytest.raises(ap.ClosureRuleError, match="total"):
        ap.run(prog)


def test_public_api() -> None:
    assert {"sync_for", "register_aggregation", "Batch", "SyncProtocolError"} <= set(ap.__all__)


# ---------------------------------------------------------------- MPI
MPI_SHAPES = [(2, 1), (2, 2), (3, 1), (3, 2)]


@pytest.fixture(scope="module")
def syncfor_mpi(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[int, mpibatch.Batch]:
    """tests/engine/mpi_syncfor.py for each selected shape, one mpiexec launch per rank count."""
    tmp = tmp_path_factory.mktemp("syncfor-mpi")
    batches = {n: mpibatch.Batch(n, tmp / str(n)) for n in (2, 3)}
    for p in mpibatch.selected(request, test_all_models_under_mpiexec):
        batches[p["ranks"]].add(f"syncfor-{p['threads']}", HERE / "mpi_syncfor.py", p["threads"])
    return batches


@pytest.mark.parametrize("ranks,threads", MPI_SHAPES)
def test_all_models_under_mpiexec(
    ranks: int, threads: int, syncfor_mpi: dict[int, mpibatch.Batch]
) -> None:
    proc = syncfor_mpi[ranks].result(f"syncfor-{threads}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ranks={ranks} threads={threads} OK" in proc.stdout, proc.stdout + proc.stderr
