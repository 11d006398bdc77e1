"""MLR: the digits split, accuracy with BSP on 2 ranks, SSP and Hybrid from the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

import engine as ap
from apps.mlr import evaluate, train
from apps.mlr._data import digits_split, synthetic_digits


def test_digits_split_is_fixed_disjoint_and_scaled() -> None:
    Xtr, ytr, Xte, yte = digits_split()
    assert Xtr.shape == (1348, 64) and Xte.shape == (449, 64)
    assert set(ytr.tolist()) == set(range(10)) == set(yte.tolist())
    assert 0.0 <= Xtr.min() and Xtr.max() <= 1.0
    again = digits_split()
    assert all(np.array_equal(a, b) for a, b in zip((Xtr, ytr, Xte, yte), again, strict=True))
    rows = {r.tobytes() for r in Xtr}
    assert sum(r.tobytes() in rows for r in Xte) < 5  # a few digits are pixel-identical


def test_synthetic_data_looks_like_digits() -> None:
    Xtr, ytr, Xte, yte = synthetic_digits(n=200, seed=3)
    assert Xtr.shape[1] == 64 and len(Xtr) + len(Xte) == 200
    assert 0.0 <= Xtr.min() and Xtr.max() <= 1.0 and ytr.max() <= 9


def test_evaluate_on_a_perfect_model() -> None:
    X = np.eye(3, 4)
    W = np.hstack([np.eye(3, 4) * 50, np.zeros((3, 1))])
    loss, acc = evaluate(W, X, np.arange(3))
    assert acc == 1.0 and loss < 1e-6


@pytest.fixture(scope="module")
def bsp_two_nodes() -> ap.RunResult:
    """Ten BSP epochs on two in-process nodes (the CLI's 2-rank run must equal it)."""
    return ap.run(train, {"epochs": 10}, nodes=2)


def test_bsp_on_two_nodes_reaches_093_and_logs_every_epoch(bsp_two_nodes: ap.RunResult) -> None:
    res = bsp_two_nodes
    acc, loss = res.objectives["test_accuracy"], res.objectives["loss"]
    assert len(acc) == len(loss) == 10
    assert acc[-1] >= 0.93, acc
    assert loss[-1] < loss[0]
    assert res.planner["mlr"]["strategy"] == "bsp" and res.planner["mlr"]["params"] == ["W"]


@pytest.mark.parametrize("sync,threads", [("ssp", 1), ("hybrid", 2)])
def test_ssp_and_hybrid_learn_on_synthetic_data(sync: str, threads: int) -> None:
    res = ap.run(train, {"epochs": 4, "sync": sync, "synthetic": True}, nodes=2, threads=threads)
    assert res.objectives["test_accuracy"][-1] > 0.8, res.objectives


# in-process commands whose ranks start under mpiexec (the layer scan cannot see it)
@pytest.mark.mpi
def test_cli_two_ranks_bsp_matches_in_process_and_reaches_093(
    bsp_two_nodes: ap.RunResult, cli
) -> None:
    proc = cli("run", "mlr", "--ranks", "2", "--json", "-p", "epochs=10")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["objectives"]["test_accuracy"][-1] >= 0.93
    assert out["objectives"] == bsp_two_nodes.objectives  # MPI and in-process BSP agree bit for bit


@pytest.mark.mpi
@pytest.mark.parametrize("args", [["-p", "sync=ssp"], ["-p", "sync=hybrid", "--threads", "2"]])
def test_cli_ssp_and_hybrid_run(args: list[str], cli) -> None:
    proc = cli("run", "mlr", "--ranks", "2", "--json", "-p", "epochs=3", *args)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["params"]["sync"] == args[1].split("=")[1]
    assert out["objectives"]["test_accuracy"][-1] > 0.85


def test_cli_rejects_an_unknown_sync_model_in_one_line(cli) -> None:
    proc = cli("run", "mlr", "-p", "sync=async")
    assert proc.returncode == 2
    assert "sync must be bsp, ssp or hybrid" in proc.stderr
    assert "Traceback" not in proc.stderr


# --- placement does not change what an epoch learns ------------------------------------------
SYN = {"epochs": 3, "synthetic": True}


def test_one_worker_gives_the_same_bits_summed_or_averaged() -> None:
    summed = ap.run(train, SYN)
    averaged = ap.run(train, {**SYN, "aggregate": "average"})
    assert summed.objectives == averaged.objectives and summed.digests == averaged.digests


@pytest.fixture(scope="module")
def one_worker() -> ap.RunResult:
    return ap.run(train, {"epochs": 3})


@pytest.mark.parametrize("nodes,threads,sync", [(3, 2, "bsp"), (3, 1, "ssp"), (2, 2, "hybrid")])
def test_summed_deltas_learn_as_one_worker_does_and_averaged_ones_lag(
    nodes: int, threads: int, sync: str, one_worker: ap.RunResult
) -> None:
    """On the digits, the loss three epochs reach on several workers, summed, is one
    worker's to 20% (SSP lags) and the accuracy within 0.005 (BSP, Hybrid); averaged, the loss is 30% higher
    (each clock then makes one step of the workers' average)."""
    one = one_worker.objectives["loss"][-1]
    runs = {
        agg: ap.run(
            train, {"epochs": 3, "sync": sync, "aggregate": agg}, nodes=nodes, threads=threads
        )
        for agg in ("sum", "average")
    }
    assert abs(runs["sum"].objectives["loss"][-1] - one) < 0.2 * one
    acc = runs["sum"].value["test_accuracy"] - one_worker.value["test_accuracy"]
    if sync != "ssp":  # stale reads lag after 3 epochs (-0.018 here, -0.0022 after 10)
        assert abs(acc) <= 0.005, acc
    assert runs["average"].objectives["loss"][-1] > 1.3 * one


def test_a_bad_aggregate_is_one_line(cli) -> None:
    proc = cli("run", "mlr", "-p", "synthetic=true", "-p", "aggregate=median", "--no-trace")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "aggregate must be sum or average" in proc.stderr


def test_the_placement_benchmark_order_zero_is_the_apps_own_run(tmp_path) -> None:
    """benchmarks/placement.py trains on tables it writes; its order 0 must be the very
    run ``replay run mlr`` makes (same images, same order, same held-out set), or its
    noise floor would measure something else."""
    from benchmarks.placement import fit, tables

    trains, test = tables(tmp_path, 2)
    own = ap.run(lambda: train(epochs=2), nodes=1)
    got = fit(trains[0], test, 1, 1, epochs=2)
    assert got == {
        "accuracy": own.objectives["test_accuracy"][-1],
        "loss": own.objectives["loss"][-1],
    }
    shuffled = fit(trains[1], test, 1, 1, epochs=2)
    assert shuffled["loss"] != got["loss"]  # another order is another trajectory
