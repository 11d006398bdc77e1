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

HERE = Path(__file__).parent
SGD = {"epochs": 2, "rank": 4, "synthetic": True}


@pytest.mark.parametrize("nodes", [2, 3])
@pytest.mark.parametrize("threads", [1, 2])
def test_sgdmf_passes_both_directions(nodes: int, threads: int) -> None:
    results = testing.dual(sgdmf, SGD, nodes=nodes, threads=threads, order="random")
    for r in results.values():
        assert r.passed, r.report()
        assert r.bodies == 2 * 20000


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
    from replay import testing as t

    real = t.wavefront_plan

    def merged(sets, order, nodes, threads):
        plan = real(sets, order, nodes, threads)
        if len(plan.rounds) > 1:  # run the first two levels as one round, reversed
            first = [ts for ts in plan.rounds[0]]
            second = plan.rounds[1]
            plan.rounds[0] = [b + a for a, b in zip(first, second, strict=True)]
            del plan.rounds[1]
            from engine._planner import _round_writes

            plan.writes = _round_writes(plan, sets)
        return plan

    monkeypatch.setattr(t, "wavefront_plan", merged)
    res = t.forward(lock_heavy, nodes=1, threads=1)
    assert not res.passed
    d = res.divergence
    assert d["op"] == "hot" and d["invocation"] == 0 and d["iteration"] == 0
    assert d["dds"] == "X" and isinstance(d["element"], int) and "index" in d
    assert d["serial"] != d["parallel"]
    text = res.report()
    assert "FAIL" in text and "element" in text and "serial gave" in text


def test_cli_pass_json_and_verdicts_in_the_trace(tmp_path: Path) -> None:
    trace = tmp_path / "d.sqlite"
    proc = run_cli(
        [
            "dual",
            "sgdmf",
            "-p",
            "synthetic=true",
            "-p",
            "epochs=1",
            "-p",
            "rank=4",
            "--ranks",
            "3",
            "--threads",
            "2",
            "--trace",
            str(trace),
            "--json",
        ]
    )
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["forward"] == {"passed": True, "divergence": None}
    assert res["backward"] == {"passed": True, "divergence": None}
    kinds = sorted(v.kind for v in tracer.open(trace).run().verdicts())
    assert kinds == ["dual-backward", "dual-forward"]


def test_cli_failure_names_the_place_and_exits_1(tmp_path: Path) -> None:
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
