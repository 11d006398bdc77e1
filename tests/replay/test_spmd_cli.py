"""``replay run --ranks N``: a driver that differs between ranks stops with exit 1."""

from __future__ import annotations

from pathlib import Path

import pytest

import tracer

#: Every test runs ``replay run --ranks N`` in this process: mpiexec starts the ranks.
pytestmark = pytest.mark.mpi

APP = f"{Path(__file__).parent / 'env_apps.py'}:rank_state"


@pytest.mark.parametrize("ranks", [2, 3])
def test_rank_specific_driver_state_stops_the_run(ranks: int, tmp_path: Path, cli) -> None:
    trace = tmp_path / "t.sqlite"
    proc = cli("run", APP, "--ranks", str(ranks), "--trace", str(trace))
    assert proc.returncode == 1, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("replay: error")]
    assert len(errors) == 1, proc.stderr
    values = "; ".join(f"rank {r}: {56.0 + 0.5 * r!r}" for r in range(ranks))
    assert f"objective 'loss' at iteration 1 is {values};" in errors[0]
    info = tracer.open(trace, assume_finished=True).run().info
    assert info.status != "finished"
    assert tracer.open(trace).run().objectives() == {"loss": [28.0]}


def test_signed_zero_differs_but_nan_is_equal(cli) -> None:
    proc = cli("run", APP, "--ranks", "2", "--no-trace", "-p", "kind=signed_zero")
    assert proc.returncode == 1
    assert "iteration 0 is rank 0: 0.0; rank 1: -0.0;" in proc.stderr
    for kind in ("nan", "same"):
        proc = cli("run", APP, "--ranks", "2", "--no-trace", "-p", f"kind={kind}")
        assert proc.returncode == 0, proc.stderr


STEPS = f"{Path(__file__).parent / 'env_apps.py'}:rank_steps"


@pytest.mark.parametrize(
    "kind,ranks,needle",
    [
        ("loops", 2, "rank 1 at async_for 'add' #1 over [0, 8)"),
        ("loops", 3, "ranks 1, 2 at async_for 'add' #1 over [0, 8)"),
        ("range", 2, "rank 1 at async_for 'add' #0 over [0, 7)"),
        ("sync", 2, "rank 0 at sync_for 'mean' #0 over 'data'"),
        ("reduce", 3, "rank 2 at ap.reduce (collective call 0)"),
        ("evaluate", 2, "rank 1 got ap.evaluate = 1.0 (collective call 0)"),
        ("objective", 2, "rank 0 at ap.log_objective('extra') iteration 0"),
    ],
)
@pytest.mark.timeout(120)  # a hang (ranks waiting for each other) must fail, not block
def test_a_driver_whose_operations_differ_between_ranks_stops_at_once(
    kind: str, ranks: int, needle: str, cli
) -> None:
    """Ranks that reach different operations (a loop count, a branch, a range, a metric
    from one rank's Python state) waited for each other until killed; now every rank
    checks at each operation that all are at the same one: exit 1 and one line naming
    what each rank was doing."""
    proc = cli("run", STEPS, "--ranks", str(ranks), "--no-trace", "-p", f"kind={kind}")
    assert proc.returncode == 1, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("replay: error")]
    assert len(errors) == 1, proc.stderr
    assert "the driver diverged between MPI ranks" in errors[0] and needle in errors[0], errors


@pytest.mark.timeout(120)
def test_the_same_operations_on_every_rank_pass_the_check(cli) -> None:
    proc = cli("run", STEPS, "--ranks", "3", "--no-trace", "-p", "kind=same")
    assert proc.returncode == 0, proc.stderr


def test_under_your_own_mpiexec_the_error_is_said_once_every_time(tmp_path: Path) -> None:
    """Ranks that all raise the same error stop together: they used to abort, and
    mpiexec then sometimes dropped their output (status and not a word, 3 runs in 8),
    so it is tried three times."""
    from tests.conftest import run_mpi

    for k in range(3):
        trace = tmp_path / f"t{k}.sqlite"
        proc = run_mpi(["-m", "replay", "run", APP, "--trace", str(trace)], 2)
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("replay: error")]
        assert proc.returncode == 1 and len(errors) == 1, (proc.returncode, proc.stderr)
        assert "objective 'loss' at iteration 1" in errors[0], errors
        assert tracer.open(trace, assume_finished=True).run().info.status == "failed"
