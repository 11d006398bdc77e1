"""Dual tests: the library on the apps, the CLI verdicts, and divergence localisation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import engine as ap
import tracer
from apps.sgdmf import train as sgdmf
from replay import testing
from tests.conftest import run_cli
from tests.traces import SGDMF_SMALL

HERE = Path(__file__).parent
#: 5,000 of the synthetic set's 300 x 500 ratings: every user and item still meets
#: several bodies, so the plans split hot rows across nodes and threads as with 20,000
SGD = {"epochs": 2, "rank": 4, "synthetic": True, "synthetic_ratings": 5000}


# in-process, but 3-4 s each on 2 cores: out of the fast layer
@pytest.mark.e2e
@pytest.mark.parametrize("nodes", [2, 3])
@pytest.mark.parametrize("threads", [1, 2])
def test_sgdmf_passes_both_directions(nodes: int, threads: int) -> None:
    results = testing.dual(sgdmf, SGD, nodes=nodes, threads=threads, order="random")
    for r in results.values():
        assert r.passed, r.report()
        assert r.bodies == 2 * 5000


def lock_heavy() -> None:
    X = ap.dvector(4, shape=(2,), init=ap.init.normal(0, 1), name="X")

    def body(j):
        k = j % 4
        X[k] = X[k] * 0.9 + np.sin(j + X[(k + 1) % 4])

    for _ in range(2):
        ap.async_for(0, 120, body, name="hot")
        ap.log_objective("norm", float(np.abs(X.gather()).sum()))


@pytest.mark.parametrize("nodes,threads", [(1, 3), (2, 3), (3, 2)])
def test_lock_split_programs_pass_both_directions(nodes: int, threads: int) -> None:
    testing.assert_dual(lock_heavy, nodes=nodes, threads=threads, order="random", order_seed=4)


def test_a_forward_failure_is_localised_to_element_and_index(monkeypatch) -> None:
    """Break the parallel side on purpose: a wavefront plan that drops a level boundary."""
    from engine._asyncfor import loop
    from replay import testing as t

    real = loop.wavefront_plan

    def merged(sets, order, nodes, threads):
        plan = real(sets, order, nodes, threads)
        if len(plan.rounds) > 1:  # run the first two levels as one round, reversed
            first = [ts for ts in plan.rounds[0]]
            second = plan.rounds[1]
            plan.rounds[0] = [b + a for a, b in zip(first, second, strict=True)]
            del plan.rounds[1]
            from engine._machines.planner import _round_writes

            plan.writes = _round_writes(plan, sets)
        return plan

    monkeypatch.setattr(loop, "wavefront_plan", merged)
    from replay._progress import parse_phase, reporting

    lines: list[str] = []
    with reporting(lines.append):  # as under `replay dual`: the re-run is a named phase
        res = t.forward(lock_heavy, nodes=1, threads=1)
    assert "locating the first difference in X after hot#0" in map(parse_phase, lines), lines
    assert not res.passed
    d = res.divergence
    assert d["op"] == "hot" and d["invocation"] == 0 and d["iteration"] == 0
    assert d["dds"] == "X" and isinstance(d["element"], int) and "index" in d
    assert d["serial"] != d["parallel"]
    text = res.report()
    assert "FAIL" in text and "element" in text and "serial gave" in text


@pytest.mark.mpi  # in this process (tests/cli.py), but its 3 ranks are mpiexec's
def test_cli_pass_json_and_verdicts_in_the_trace(tmp_path: Path, cli) -> None:
    trace = tmp_path / "d.sqlite"
    args = [*SGDMF_SMALL, "--ranks", "3"]
    proc = cli("dual", "sgdmf", *args, "--threads", "2", "--trace", trace, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(proc.stdout)
    assert res["forward"] == {
        "passed": True,
        "divergence": None,
        "not_tested": [],
        "serial_fallbacks": [],
        "next": None,
    }
    assert res["backward"] == {
        "passed": True,
        "divergence": None,
        "not_tested": [],
        "serial_fallbacks": [],
        "next": None,
    }
    kinds = sorted(v.kind for v in tracer.open(trace).run().verdicts())
    assert kinds == ["dual-backward", "dual-forward"]


def test_cli_failure_names_the_place_and_exits_1(tmp_path: Path) -> None:
    """The real console script (the smoke test of ``dual``'s exit status 1)."""
    app = f"{HERE / 'nondet_apps.py'}:uses_wall_clock"
    proc = run_cli(["dual", app, "--direction", "forward", "--no-trace"], cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "forward: FAIL at iteration 0, op clock, invocation 0" in proc.stdout
    assert (
        "element" in proc.stdout and "serial gave" in proc.stdout and "parallel gave" in proc.stdout
    )


@pytest.mark.parametrize("sync", ["bsp", "ssp", "hybrid"])
@pytest.mark.parametrize("nodes,threads", [(2, 1), (2, 2), (3, 1), (3, 2)])
def test_mlr_passes_both_directions(sync: str, nodes: int, threads: int) -> None:
    from apps.mlr import train as mlr

    results = testing.dual(mlr, {"epochs": 2, "sync": sync}, nodes=nodes, threads=threads)
    for r in results.values():
        assert r.passed, r.report()
        assert r.bodies > 0


def test_objectives_are_compared_in_the_order_they_were_logged() -> None:
    """zloss is logged before acc and diverges first (iteration 1); acc only at 2."""
    from tests.replay import dual_apps

    for r in testing.dual(dual_apps.zloss_then_acc).values():
        d = r.divergence
        assert (d["what"], d["objective"], d["iteration"]) == ("objective", "zloss", 1)
        assert "objective zloss, iteration 1" in r.report()
    # both diverge at iteration 1: the one logged first is the first divergence
    res = testing.forward(dual_apps.zloss_then_acc, {"acc_from": 1})
    assert res.divergence["objective"] == "zloss"


def test_an_objective_before_a_later_digest_is_the_first_divergence(tmp_path: Path, cli) -> None:
    app = f"{HERE / 'dual_apps.py'}:objective_then_digest"
    proc = cli("dual", app, "--in-process", "--no-trace", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "forward: FAIL at objective probe, iteration 0" in proc.stdout
    assert "backward: FAIL at objective probe, iteration 0" in proc.stdout
    proc = cli("dual", app, "--in-process", "--no-trace", "--json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    res = json.loads(proc.stdout)
    for direction in ("forward", "backward"):
        d = res[direction]["divergence"]
        assert (d["what"], d["objective"], d["iteration"]) == ("objective", "probe", 0)
        assert d["serial"] == 8.0 and d["parallel"] != 8.0
    assert res["parallel"] == "in-process"


# testing.forward runs the parallel side under mpiexec
@pytest.mark.mpi
def test_a_digest_divergence_still_names_iteration_invocation_index_and_element() -> None:
    from tests.replay import dual_apps

    # serial side: no rank, so rank 0's noise; a 2-node in-process run agrees with it
    assert testing.forward(dual_apps.rank_noise).passed
    res = testing.forward(dual_apps.rank_noise, parallel="mpi", nodes=2, timeout=60)
    d = res.divergence
    assert d["what"] == "digest" and (d["op"], d["invocation"], d["iteration"]) == ("decay", 1, 1)
    assert d["dds"] == "X" and d["element"] == d["index"] and d["serial"] != d["parallel"]
    assert f"element {d['element']}" in res.report() and "serial gave [" in res.report()


@pytest.mark.mpi  # in this process (tests/cli.py), but its 3 ranks are mpiexec's
def test_a_token_plan_passes_both_directions_on_3_ranks(tmp_path: Path, cli) -> None:
    """SGDMF's loop with ``strategy="tokens"``: the parallel side runs a token plan (12
    tokens over 3 nodes, some node-rounds empty) and both directions hold bit for bit."""
    trace = tmp_path / "d.sqlite"
    app = f"{HERE / 'dual_apps.py'}:token_sgdmf"
    proc = cli("dual", app, "-p", "epochs=1", "--ranks", "3", "--trace", trace, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(proc.stdout)
    assert res["forward"]["passed"] is True and res["backward"]["passed"] is True, res
    shown = json.loads(cli("show", str(trace), "--json").stdout)
    plans = [r["operators"]["sgd"] for r in shown["runs"] if "sgd" in r["operators"]]
    assert "tokens" in [p["strategy"] for p in plans], plans


def _chained(epochs: int = 2, n: int = 8) -> None:
    """Body j writes X[P[j]] and sets P for body j+1: in the first invocation a target
    depends on a value written in the same invocation, so both plans fail and it runs
    as a serial fallback on every node; after that a plan holds."""
    X = ap.dvector(2 * n, shape=(), name="X")
    P = ap.dvector(n, shape=(), dtype=np.int64, data=np.arange(n), name="P")
    for _ in range(epochs):

        def body(j: int) -> None:
            t = int(P[j])
            X[t] = X[t] + 1.0 + j
            P[(j + 1) % n] = n + (t + 3) % n

        ap.async_for(0, n, body, name="b")


@pytest.mark.parametrize("nodes", [2, 3])
def test_a_pass_names_the_invocations_the_parallel_side_ran_serially(nodes: int) -> None:
    """Both plans of b#0 fail, so the parallel side runs it serially on every node: the
    dual test compares it, but tests nothing parallel there.  The PASS said only
    ``(16 bodies compared)``; it now names b#0 as a serial fallback (and only b#0)."""
    results = testing.dual(_chained, nodes=nodes)
    for direction in ("forward", "backward"):
        r = results[direction]
        assert r.passed, r.report()
        assert r.serial_fallbacks == ["b#0"], r
        assert r.as_dict()["serial_fallbacks"] == ["b#0"]
        assert "b#0 ran as a serial fallback (both plans failed), not in parallel" in r.report()
    plain = testing.dual(_chained, {"n": 1}, nodes=nodes)  # one body: nothing to fail
    assert all(r.serial_fallbacks == [] for r in plain.values())
    assert all("serial fallback" not in r.report() for r in plain.values())
