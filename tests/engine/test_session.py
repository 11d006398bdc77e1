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
