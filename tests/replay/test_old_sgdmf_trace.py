"""A trace recorded before the token planner (``auto`` chose rotation) still replays
identically, whatever ``auto`` would choose today.

``tests/data/sgdmf_rot_4.sqlite.gz`` was recorded on commit e4091a0 with ``replay run
sgdmf -p synthetic=true -p epochs=2 -p synthetic_ratings=2000 --ranks 4
--no-checkpoints``: a rotation plan of 4 rounds (imbalance then 1.05), two invocations.
Replay re-plans from its own reconnaissance and compares with the recorded plan; under
``auto`` it plans with the recorded plan's strategy (``planner.remake_strategy``), so a
change in what ``auto`` picks (a new strategy, another cost) cannot turn an old trace
into a divergence.  The tests make ``auto`` pick something else by making rounds free.
The app's source has changed since (held-out options): the replays pass
``--allow-changed-code``, which still compares every digest and plan.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests import cli as tcli

DATA = Path(__file__).parent.parent / "data"


def _trace(tmp_path: Path) -> Path:
    trace = tmp_path / "sgdmf_rot_4.sqlite"
    trace.write_bytes(gzip.decompress((DATA / "sgdmf_rot_4.sqlite.gz").read_bytes()))
    return trace


def test_an_old_rotation_trace_replays_in_one_process(tmp_path: Path, cli) -> None:
    proc = cli("single", str(_trace(tmp_path)), "--json", "--allow-changed-code")
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["identical"] is True and res["first_difference"] is None, res
    assert res["checked"] == {"digests": 6, "objectives": 2}


def test_it_replays_even_when_auto_would_choose_another_plan(
    tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine._machines import planner

    monkeypatch.setattr(planner, "ROUND_OVERHEAD_BODIES", 0)  # rounds cost nothing
    proc = cli("single", str(_trace(tmp_path)), "--json", "--allow-changed-code")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["identical"] is True


def test_without_the_recorded_strategy_that_replay_would_diverge(
    tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the test above guards against: planning with ``auto``'s choice of today."""
    import engine._asyncfor.loop as loop
    from engine._machines import planner

    monkeypatch.setattr(planner, "ROUND_OVERHEAD_BODIES", 0)
    monkeypatch.setattr(loop, "remake_strategy", lambda requested, recorded, sets: requested)
    proc = cli("single", str(_trace(tmp_path)), "--json", "--allow-changed-code")
    assert proc.returncode == 3, proc.stderr
    diff = json.loads(proc.stdout)["first_difference"]
    assert diff["expected"] == "4 rounds" and diff["actual"] != "4 rounds", diff


def test_it_replays_with_the_reduce_it_was_recorded_with(
    tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trace has no ``exact_reduce`` label: its RMSE was folded in index order, and
    a replay that summed exactly, as runs do now, would differ in the last bits."""
    import replay._replay as rp
    from replay._job import recorded_modes

    monkeypatch.setattr(
        rp, "recorded_modes", lambda info: {**recorded_modes(info), "exact_reduce": True}
    )
    proc = cli("single", str(_trace(tmp_path)), "--json", "--allow-changed-code")
    assert proc.returncode == 3, proc.stderr
    diff = json.loads(proc.stdout)["first_difference"]
    assert diff["what"] == "objective" and diff["event"] == "rmse", diff


@pytest.mark.mpi
def test_an_old_rotation_trace_replays_on_the_cluster(tmp_path: Path) -> None:
    proc = tcli.invoke(["cluster", _trace(tmp_path), "--json", "--allow-changed-code"])
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["identical"] is True and res["first_difference"] is None, res
    assert res["checked"] == {"digests": 6, "objectives": 2}
