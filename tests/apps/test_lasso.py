"""Lasso: the sklearn oracle on 1, 2 and 3 nodes, the STRADS scheduler's dependency check
and seeded priority sampling, bad parameters, a dual test and a cluster replay."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import engine as ap
from apps._errors import AppError
from apps.lasso import kkt_violation, train
from apps.lasso._app import choose_schedule
from apps.lasso._data import diabetes, standardise, synthetic
from apps.lasso._schedule import correlation_violations, independent, priorities, sample
from replay import testing
from tests.conftest import run_cli
from tests.oldparams import assert_replays, record_without
from tests.tui.tui_helpers import wait_text
from tui import BrowserApp

#: Diabetes at alpha = alpha_max / 10, with rounds wide enough to converge in ~260 rounds.
DIABETES: dict[str, object] = {"dataset": "diabetes", "threshold": 0.2, "floor": 0.5}
DIABETES_CLI = ["-p", "dataset=diabetes", "-p", "threshold=0.2", "-p", "floor=0.5"]
#: A small sparse high-dimensional problem (more features than samples).
SMALL: dict[str, object] = {
    "dataset": "synthetic",
    "samples": 100,
    "features": 200,
    "nonzeros": 5,
    "threshold": 0.3,
}
ORACLE = 1e-6


@pytest.fixture(scope="module")
def diabetes_one_node() -> ap.RunResult:
    return ap.run(train, DIABETES)


def test_diabetes_matches_sklearn_on_one_node(diabetes_one_node: ap.RunResult) -> None:
    res = diabetes_one_node
    assert res.value["converged"] and res.value["nonzeros"] == 5
    assert res.objectives["max_abs_diff_sklearn"] == [res.value["max_abs_diff_sklearn"]]
    assert res.value["max_abs_diff_sklearn"] <= ORACLE
    obj = res.objectives["objective"]
    assert len(obj) == res.value["iterations"] and len(res.objectives["kkt"]) == res.value["checks"]
    assert res.objectives["kkt"][-1] == res.value["kkt"]
    assert obj[-1] < obj[0] and res.planner["lasso"]["rounds"] == 1


@pytest.mark.parametrize("nodes", [2, 3])
def test_diabetes_is_the_same_on_two_and_three_nodes(
    nodes: int, diabetes_one_node: ap.RunResult
) -> None:
    res = ap.run(train, DIABETES, nodes=nodes)
    assert res.value["max_abs_diff_sklearn"] <= ORACLE
    # bodies only read the residual, so placement never changes a bit
    assert res.objectives == diabetes_one_node.objectives


@pytest.mark.parametrize("nodes", [1, 2, 3])
def test_small_synthetic_matches_sklearn(nodes: int) -> None:
    res = ap.run(train, SMALL, nodes=nodes)
    assert res.value["converged"] and res.value["features"] == 200
    assert res.value["max_abs_diff_sklearn"] <= ORACLE


def test_stop_is_the_kkt_test_on_the_final_coefficients() -> None:
    def prog() -> tuple[dict, np.ndarray]:
        out = train(**{**DIABETES, "compare": False})
        (beta,) = [d for d in ap.current().dds if d.name == "beta"]
        return out, beta.gather()

    out, beta = ap.run(prog).value
    X, y = diabetes()
    X = standardise(X)
    r = y - y.mean() - X @ beta  # all columns: not the driver's arithmetic, so not bitwise
    kkt = kkt_violation(X, r, beta, out["alpha"])
    assert kkt == pytest.approx(out["kkt"], rel=1e-3) and out["kkt"] <= 1e-10 * out["alpha"]


@pytest.mark.mpi  # an in-process command whose ranks start under mpiexec
def test_cli_two_ranks_reaches_the_oracle_and_agrees_with_in_process(
    diabetes_one_node: ap.RunResult, cli
) -> None:
    proc = cli("run", "lasso", "--ranks", "2", "--no-trace", "--json", *DIABETES_CLI)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["objectives"]["max_abs_diff_sklearn"][0] <= ORACLE
    assert out["objectives"] == diabetes_one_node.objectives
    assert out["planner"]["lasso"]["strategy"] == "components"


# ----------------------------------------------------------------- the scheduler
@st.composite
def problems(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, float, int]:
    seed = draw(st.integers(0, 2**32 - 1))
    n, p = draw(st.integers(5, 40)), draw(st.integers(2, 30))
    rho = draw(st.floats(0.0, 0.9))
    X = standardise(synthetic(n, p, 0, rho, 0.0, seed=seed)[0])
    cand = np.random.default_rng(seed).permutation(p)[: draw(st.integers(1, p))]
    return X, cand, draw(st.floats(0.05, 1.0)), draw(st.integers(1, p))


@given(problems())
def test_no_two_coordinates_of_a_round_are_correlated(
    case: tuple[np.ndarray, np.ndarray, float, int],
) -> None:
    X, cand, threshold, limit = case
    chosen = independent(cand, X, threshold, limit)
    assert correlation_violations(chosen, X, threshold) == 0
    assert 1 <= len(chosen) <= limit and set(chosen.tolist()) <= set(cand.tolist())
    corr = np.abs(X.T @ X) / X.shape[0]
    if len(chosen) < limit:  # greedy: every candidate left out clashes with one taken
        for j in set(cand.tolist()) - set(chosen.tolist()):
            assert corr[j, chosen].max() >= threshold


def test_correlated_features_are_never_in_one_round() -> None:
    X = standardise(synthetic(200, 40, 0, 0.8, 0.0)[0])  # blocks of 10 correlated at ~0.8
    chosen = independent(np.arange(40), X, 0.5, 40)
    assert len(np.unique(chosen // 10)) == len(chosen) == 4


def test_priorities_grow_with_change_and_keep_a_floor() -> None:
    prob = priorities(np.array([0.0, 1.0, -3.0, 0.0]), floor=0.2)
    assert prob.sum() == pytest.approx(1.0)
    assert prob[2] > prob[1] > prob[0] == prob[3] == pytest.approx(0.2 / 4)
    assert np.allclose(priorities(np.zeros(5), 0.1), 0.2)


def test_priority_sampling_is_reproducible_from_the_seed() -> None:
    prob = priorities(np.linspace(0.0, 1.0, 50), 0.1)
    a = sample(np.random.default_rng(7), prob, 10)
    assert np.array_equal(a, sample(np.random.default_rng(7), prob, 10))
    assert len(set(a.tolist())) == 10
    short = {**DIABETES, "iterations": 20, "compare": False}
    first, again = (ap.run(train, short, seed=3).objectives for _ in range(2))
    other = ap.run(train, short, seed=4).objectives
    assert first == again and first != other


# ----------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "params,message",
    [
        ({"dataset": "iris"}, "dataset must be diabetes or synthetic, got 'iris'"),
        ({"threshold": 0.0}, "threshold=0.0 (need 0 < threshold <= 1)"),
        ({"block": 0, "floor": 2.0}, "block=0 (need >= 1); floor=2.0 (need 0 < floor <= 1)"),
        ({"dataset": "synthetic", "features": 5, "nonzeros": 6}, "nonzeros=6"),
        ({"priority": "first"}, "priority must be next or last, got 'first'"),
        ({"check_every": 0}, "check_every=0 (need >= 1)"),
    ],
)
def test_bad_parameters_are_refused_before_any_work(params: dict, message: str) -> None:
    with pytest.raises(AppError, match="^lasso: ") as info:
        ap.run(train, params)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_bad_parameter_on_the_cli_gives_one_line_and_exit_2(cli) -> None:
    proc = cli("run", "lasso", "--no-trace", "-p", "threshold=0")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "threshold=0.0 (need 0 < threshold <= 1)" in lines[0], proc.stderr


# ----------------------------------------------------------------- dual tests and replay
def test_dual_forward_and_backward_on_two_nodes() -> None:
    results = testing.dual(train, {**SMALL, "iterations": 15, "compare": False}, nodes=2)
    for r in results.values():
        assert r.passed, r.report()
        assert r.bodies > 15


# recording and cluster replay run in-process (their ranks under mpiexec: marked mpi);
# pdb cannot be driven in-process under pytest, so `single --break` stays a real process
@pytest.mark.mpi
def test_record_then_replay_on_the_cluster_and_in_pdb(tmp_path: Path, cli) -> None:
    trace = tmp_path / "lasso.sqlite"
    params = ["-p", "iterations=25", "-p", "compare=false", *DIABETES_CLI]
    rec = cli("run", "lasso", "--ranks", "2", "--trace", trace, *params, "--json")
    assert rec.returncode == 0, rec.stderr
    checks = json.loads(rec.stdout)["result"]["checks"]  # kkt is logged per full check
    rep = cli("cluster", trace, "--json")
    assert rep.returncode == 0, rep.stderr
    out = json.loads(rep.stdout)
    assert out["identical"] and out["checked"]["objectives"] == 25 + checks
    # pdb inside one body of round 3, with the DDS values that body saw
    pdb = "p k, int(chosen[k]), float(beta[int(chosen[k])]) == 0.0\nc\n"
    single = run_cli(["single", str(trace), "--break", "lasso:3:0"], input=pdb)
    assert single.returncode == 0, single.stderr
    assert "stopped in lasso#3 index 0" in single.stdout + single.stderr
    assert re.search(r"\(Pdb\) \(0, \d+, (True|False)\)", single.stdout), single.stdout
    assert "identical" in single.stdout

    async def browse() -> str:  # the browser's overview shows the objectives
        async with BrowserApp([tmp_path]).run_test(size=(100, 30)) as pilot:
            await wait_text(pilot, "lasso", "2×1")
            await pilot.press("enter")
            first = await wait_text(pilot, "objective: 25 iteration(s)", "components")
            await pilot.press("c")
            return first + await wait_text(pilot, f"kkt: {checks} iteration(s)")

    assert "verdicts clu✓" in asyncio.run(browse())


# --- which schedule ------------------------------------------------------------------------
#: 20 features, fewer than a block of 32: ``auto`` draws uniformly.
NARROW = ["dataset=synthetic", "samples=40", "features=20", "nonzeros=3", "iterations=6"]
NARROW_PARAMS: dict[str, object] = {
    "dataset": "synthetic",
    "samples": 40,
    "features": 20,
    "nonzeros": 3,
    "iterations": 6,
    "compare": False,
}


@pytest.mark.parametrize(
    "asked,features,block,used",
    [
        ("auto", 10, 32, "uniform"),
        ("auto", 32, 32, "uniform"),
        ("auto", 33, 32, "priority"),
        ("auto", 10_000, 32, "priority"),
        ("priority", 10, 32, "priority"),
        ("uniform", 10_000, 32, "uniform"),
    ],
)
def test_auto_draws_by_priority_only_when_a_round_must_choose(
    asked: str, features: int, block: int, used: str
) -> None:
    got, why = choose_schedule(asked, features, block)
    assert got == used and why.startswith(used)
    assert (str(features) in why) == (asked == "auto")


@pytest.mark.parametrize("features", [10, 10_000])
def test_auto_draws_by_priority_at_any_size_with_next_change_priorities(features: int) -> None:
    got, why = choose_schedule("auto", features, 32, "next")
    assert got == "priority" and why.startswith("priority (by the next change")


@pytest.mark.parametrize("prio", ["last", "next"])
def test_the_schedule_a_run_used_is_in_its_result_and_uniform_is_floor_one(prio: str) -> None:
    narrow = {**NARROW_PARAMS, "priority": prio, "block": 32}
    runs = {s: ap.run(train, {**narrow, "schedule": s}) for s in ("auto", "uniform", "priority")}
    auto = "priority" if prio == "next" else "uniform"
    assert runs["auto"].value["schedule"] == choose_schedule("auto", 20, 32, prio)[1]
    assert runs["auto"].value["schedule"].startswith(auto)
    assert runs["priority"].value["schedule"] == "priority (asked for)"
    floor_one = ap.run(train, {**narrow, "schedule": "priority", "floor": 1.0})
    assert runs["uniform"].objectives == floor_one.objectives
    assert runs["uniform"].digests == floor_one.digests
    assert runs["auto"].objectives == runs[auto].objectives
    assert runs["uniform"].objectives != runs["priority"].objectives


def test_a_bad_schedule_is_one_line(cli) -> None:
    proc = cli("run", "lasso", "-p", "schedule=fastest", "--no-trace")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "schedule must be auto, priority or uniform" in proc.stderr


@pytest.mark.parametrize("declared", [True, False])
def test_a_trace_from_before_schedule_replays_by_priority(
    tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch, declared: bool
) -> None:
    """A trace recorded before ``schedule`` existed ran by priority; its params lack the
    key, and ``ADDED_PARAMS`` makes the replay use priority, not today's ``auto``
    (uniform for these 20 features).  Without the declaration it would diverge."""
    from apps.lasso import _app

    trace = tmp_path / "old.sqlite"
    before = ["compare=false", "schedule=priority", "priority=last", "check_every=1"]
    args = [a for p in [*NARROW, *before] for a in ("-p", p)]
    record_without(cli, monkeypatch, "schedule", "lasso", args, trace)
    if not declared:
        monkeypatch.setattr(_app, "ADDED_PARAMS", {})
    assert_replays(cli, trace, identical=declared)


# --- priorities from the next change, and the full check every check_every rounds ------------
@pytest.mark.parametrize("declared", [True, False])
def test_a_trace_from_before_priority_replays_by_the_last_change(
    tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch, declared: bool
) -> None:
    """Before ``priority`` existed every run drew by the last change and checked every
    round; ``ADDED_PARAMS`` replays such a trace so, not by today's next change."""
    from apps.lasso import _app

    trace = tmp_path / "old.sqlite"
    before = ["compare=false", "schedule=priority", "priority=last", "check_every=1"]
    args = [a for p in [*NARROW, *before] for a in ("-p", p)]
    record_without(cli, monkeypatch, "priority", "lasso", args, trace)
    if not declared:
        monkeypatch.setattr(_app, "ADDED_PARAMS", {"schedule": "priority"})
    assert_replays(cli, trace, identical=declared)


#: 100 x 200 with 5 nonzeros: the last change took 1,181 rounds (11,917 updates) to the
#: tolerance, the next change 75 (245 updates) on 2026-12-07.
SPARSE: dict[str, object] = {
    "dataset": "synthetic",
    "samples": 100,
    "features": 200,
    "nonzeros": 5,
    "compare": False,
}


def test_next_change_priorities_converge_in_a_tenth_of_the_rounds() -> None:
    fast = ap.run(train, SPARSE).value
    assert fast["converged"] and fast["iterations"] <= 100, fast
    # full checks: every round while a quarter of the features move, then every 10
    assert fast["checks"] < fast["iterations"] // 2, fast
    slow = ap.run(train, {**SPARSE, "priority": "last", "iterations": 100}).value
    assert not slow["converged"] and slow["checks"] == 100


@st.composite
def sparse_problems(draw: st.DrawFn) -> dict[str, object]:
    # sparse and wide, so that the moving coordinates are fewer than a quarter of them and
    # the rounds between full checks check only those
    features = draw(st.integers(2, 200))
    return {
        "dataset": "synthetic",
        "samples": draw(st.integers(5, 50)),
        "features": features,
        "nonzeros": draw(st.integers(0, min(features, 5))),
        "rho": draw(st.sampled_from([0.0, 0.3, 0.8])),
        "check_every": draw(st.integers(1, 15)),
        "tol": draw(st.sampled_from([1e-2, 1e-4, 1e-10])),
        "iterations": draw(st.integers(0, 60)),
        "block": draw(st.integers(1, 16)),
        "compare": False,
    }


@given(sparse_problems())
def test_a_run_stops_and_reports_only_on_the_full_check(params: dict[str, object]) -> None:
    """Between full checks only the moving coordinates are checked; whatever the problem,
    the check interval and the round limit, the kkt a run reports (and logs last) and its
    ``converged`` are those of all coordinates at its final coefficients."""

    def prog() -> tuple[dict, np.ndarray]:
        out = train(**params)
        (beta,) = [d for d in ap.current().dds if d.name == "beta"]
        return out, beta.gather()

    res = ap.run(prog)
    out, beta = res.value
    args = [params[k] for k in ("samples", "features", "nonzeros", "rho")]
    X, y = synthetic(*args, 1.0)  # type: ignore[arg-type]
    X = standardise(X)
    kkt = kkt_violation(X, y - y.mean() - X @ beta, beta, out["alpha"])
    assert kkt == pytest.approx(out["kkt"], rel=1e-6, abs=1e-12)
    assert out["converged"] == (out["kkt"] <= out["tolerance"])
    if out["iterations"]:
        assert res.objectives["kkt"][-1] == out["kkt"]
    if not out["converged"]:  # the round limit, or no update would move anything
        assert out["iterations"] == params["iterations"] or out["kkt"] < 1e-9
