"""``replay run --ranks N``: a driver that differs between ranks stops with exit 1."""

from __future__ import annotations

from pathlib import Path

import pytest

import tracer
from tests.conftest import run_cli

APP = f"{Path(__file__).parent / 'env_apps.py'}:rank_state"


@pytest.mark.parametrize("ranks", [2, 3])
def test_rank_specific_driver_state_stops_the_run(ranks: int, tmp_path: Path) -> None:
    trace = tmp_path / "t.sqlite"
    proc = run_cli(["run", APP, "--ranks", str(ranks), "--trace", str(trace)])
    assert proc.returncode == 1, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("replay: error")]
    assert len(errors) == 1, proc.stderr
    values = "; ".join(f"rank {r}: {56.0 + 0.5 * r!r}" for r in range(ranks))
    assert f"objective 'loss' at iteration 1 is {values};" in errors[0]
    info = tracer.open(trace, assume_finished=True).run().info
    assert info.status != "finished"
    assert tracer.open(trace).run().objectives() == {"loss": [28.0]}


def test_signed_zero_differs_but_nan_is_equal() -> None:
    proc = run_cli(["run", APP, "--ranks", "2", "--no-trace", "-p", "kind=signed_zero"])
    assert proc.returncode == 1
    assert "iteration 0 is rank 0: 0.0; rank 1: -0.0;" in proc.stderr
    for kind in ("nan", "same"):
        proc = run_cli(["run", APP, "--ranks", "2", "--no-trace", "-p", f"kind={kind}"])
        assert proc.returncode == 0, proc.stderr
