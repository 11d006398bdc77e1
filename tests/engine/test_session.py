"""The session's SPMD cross-check: every rank must log bitwise equal objectives."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import pytest

import engine as ap
from tests.conftest import run_mpi
from tests.replay.env_apps import rank_state

HERE = Path(__file__).parent


def test_in_process_runs_have_one_driver_and_never_diverge() -> None:
    for kind in ("same", "nan", "signed_zero"):
        res = ap.run(rank_state, {"kind": kind}, nodes=3)
        assert len(res.objectives["loss"]) == 2


def test_divergence_error_groups_ranks_by_bits() -> None:
    exc = ap.DriverDivergenceError("loss", 4, [0.0, -0.0, 0.0, math.nan])
    assert isinstance(exc, ap.EngineError) and "DriverDivergenceError" in ap.__all__
    text = str(exc)
    assert "objective 'loss' at iteration 4" in text and "\n" not in text
    assert "ranks 0, 2: 0.0" in text and "rank 1: -0.0" in text and "rank 3: nan" in text
    assert struct.pack("<d", -0.0) != struct.pack("<d", 0.0)  # what makes 1 differ from 0


@pytest.mark.parametrize("ranks", [2, 3])
def test_every_rank_raises_and_the_next_run_works(ranks: int) -> None:
    proc = run_mpi([str(HERE / "mpi_spmd.py")], ranks)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = sorted(proc.stdout.splitlines())
    state = [0.5 * r for r in range(ranks)]
    expect = []
    for r in range(ranks):
        expect += [f"rank {r} same: ok 2"] * 2 + [f"rank {r} nan: ok 2"]
        expect.append(f"rank {r} state: diverged at 1: {[56.0 + s for s in state]}")
        zeros = [-0.0 if q == 1 else 0.0 for q in range(ranks)]
        expect.append(f"rank {r} signed_zero: diverged at 0: {zeros}")
    assert lines == sorted(expect), proc.stdout + proc.stderr


def test_objective_times_count_from_where_wall_time_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """``RunResult.objective_times`` and ``wall_s`` start at the same instant: an
    objective logged as the driver's last step is never later than the run's end, however
    long setting up the session took (it counted from the session's creation, so a 2-rank
    run could report an objective 4 ms after its own wall time)."""
    import time

    from engine._runtime import session

    made = session.Session.__init__

    def slow(self, *a, **k) -> None:  # type: ignore[no-untyped-def]
        made(self, *a, **k)
        time.sleep(0.05)

    monkeypatch.setattr(session.Session, "__init__", slow)

    def prog() -> None:
        ap.log_objective("last", 1.0)

    res = ap.run(prog)
    assert 0 <= res.objective_times["last"][0] <= res.wall_s
