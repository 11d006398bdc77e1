"""Dual tests whose parallel side runs under mpiexec (``replay._dualjob``).

The ``replay dual`` commands run in this process (tests/cli.py): the command starts the
ranks itself, so what is under test is still a real ``mpiexec``; the layer scan cannot
see that, hence the explicit ``mpi`` marks.  tests/replay/test_progress.py keeps a
``dual --ranks 2`` run of the console script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tracer
from replay import UsageError, testing
from tests import cli as tcli
from tests.replay import dual_apps
from tests.traces import SGDMF_SMALL

HERE = Path(__file__).parent
#: Seconds one MPI job of these tests may take before it is killed (a hang must fail).
JOB_TIMEOUT = 90


def _dual_json(args: list[str], cwd: Path) -> tuple[int, dict]:
    proc = tcli.invoke(["dual", *args, "--json", "--timeout", str(JOB_TIMEOUT)], cwd=cwd)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.mpi
def test_cli_sgdmf_runs_its_parallel_side_under_mpi_and_traces_it(tmp_path: Path) -> None:
    trace = tmp_path / "d.sqlite"
    params = SGDMF_SMALL
    code, res = _dual_json(["sgdmf", *params, "--ranks", "2", "--trace", str(trace)], tmp_path)
    assert code == 0
    assert res["parallel"] == "mpi"
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
    run = tracer.open(trace).run()
    assert run.info.ranks == 2 and run.info.status == "finished"
    assert sorted(v.kind for v in run.verdicts()) == ["dual-backward", "dual-forward"]


@pytest.mark.mpi
def test_cli_mlr_hybrid_sync_for_passes_under_mpi(tmp_path: Path) -> None:
    params = ["-p", "epochs=1", "-p", "sync=hybrid", "--threads", "2"]
    code, res = _dual_json(["mlr", *params, "--ranks", "2", "--no-trace"], tmp_path)
    assert code == 0, res
    assert res["parallel"] == "mpi"
    assert res["forward"]["passed"] and res["backward"]["passed"]


def test_cli_in_process_is_an_explicit_choice(tmp_path: Path) -> None:
    params = SGDMF_SMALL
    code, res = _dual_json(["sgdmf", *params, "--in-process", "--no-trace"], tmp_path)
    assert code == 0 and res["parallel"] == "in-process"
    code, res = _dual_json(["sgdmf", *params, "--ranks", "1", "--no-trace"], tmp_path)
    assert code == 0 and res["parallel"] == "in-process"


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_per_process_state_passes_in_process_and_fails_under_mpi(
    tmp_path: Path, ranks: int, cli
) -> None:
    """Each rank draws its own noise array, too large for the step check to compare by
    content; a body reads it.  In one process every node shares the array, so only the
    MPI dual test can see the bug."""
    app = f"{HERE / 'dual_apps.py'}:rank_noise"
    code, res = _dual_json([app, "--ranks", str(ranks), "--in-process", "--no-trace"], tmp_path)
    assert code == 0 and res["forward"]["passed"] and res["backward"]["passed"]
    code, res = _dual_json([app, "--ranks", str(ranks), "--no-trace"], tmp_path)
    assert code == 1 and res["parallel"] == "mpi"
    for direction in ("forward", "backward"):
        d = res[direction]["divergence"]
        # epoch 0 agrees; from epoch 1 the other ranks add their own noise
        assert (d["what"], d["op"], d["invocation"], d["dds"]) == ("digest", "decay", 1, "X")
        assert isinstance(d["element"], int) and d["serial"] != d["parallel"]
    proc = cli(
        "dual", app, "--ranks", str(ranks), "--no-trace", "--direction", "forward",
        "--timeout", str(JOB_TIMEOUT), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "forward: FAIL at iteration 1, op decay, invocation 1" in proc.stdout


# mpiexec is started by replay.testing.dual, not here: the scan cannot see it
@pytest.mark.mpi
def test_library_dual_on_mpi_with_an_importable_function() -> None:
    results = testing.dual(
        dual_apps.hot_rows, {"n": 40}, nodes=2, threads=2, parallel="mpi", timeout=JOB_TIMEOUT
    )
    for r in results.values():
        assert r.passed, r.report()
        assert r.bodies == 2 * 40
    # a file path target works too, and finds the per-process bug
    res = testing.backward(
        f"{HERE / 'dual_apps.py'}:rank_noise", nodes=3, parallel="mpi", timeout=JOB_TIMEOUT
    )
    assert not res.passed and res.divergence["invocation"] == 1


def test_library_mpi_needs_an_importable_driver() -> None:
    def nested() -> None:
        pass

    for fn in (nested, lambda: None):
        with pytest.raises(UsageError, match="module-level function"):
            testing.dual(fn, parallel="mpi")
    with pytest.raises(ValueError, match="parallel must be"):
        testing.dual(dual_apps.hot_rows, parallel="threads")
    with pytest.raises(UsageError, match="JSON"):
        testing.forward(dual_apps.hot_rows, {"n": object()}, parallel="mpi")
