"""A value from one rank's Python state stops the run on every rank, with one line: a
number a loop body reads, the data a DDS is made from, a value or key the driver writes.

Without the checks these runs finish with exit 0 and a result no serial run computes
(``rank_state_apps`` says why nothing downstream notices)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli

APP = f"{Path(__file__).parent / 'rank_state_apps.py'}:lr_app"

CASES = {
    "closure": ("async_for 'add' (invocation 0) reads 'lr' (float)", "0.1", "0.2"),
    "kernel": ("reads 'lr' (float, argument of _add_kernel)", "0.1", "0.2"),
    "helper": ("reads 'SCALE' (float, global in rank_state_apps.py) via _scaled()", "1.0", "2.0"),
    "sync": ("sync_for 'add' (invocation 0) reads 'lr' (float)", "0.1", "0.2"),
    "history": ("async_for 'add' (invocation 1) reads 'history' (list)", "[0]", "[]"),
    "method": ("async_for 'add' (invocation 0) reads 'self.lr' (float)", "0.1", "0.2"),
    "aggregation": (
        "sync_for 'add' (invocation 0) reads 'per_rank' (float) in the aggregation function of 'X'",
        "0.1",
        "0.2",
    ),
}


def _errors(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("replay: error")]


@pytest.mark.parametrize("where", sorted(CASES))
def test_a_per_rank_number_in_a_body_stops_the_run(where: str, tmp_path: Path) -> None:
    args = ["run", APP, "-p", f"where={where}", "--ranks", "2", "--timeout", "90"]
    proc = run_cli([*args, "--trace", str(tmp_path / "t.sqlite")], cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    (line,) = _errors(proc.stderr)
    what, v0, v1 = CASES[where]
    assert "the driver diverged between MPI ranks" in line and what in line, line
    assert f"which is {v0} on rank 0 and {v1} on rank 1" in line, line
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("where,name", [("shard", "X"), ("shard_objects", "O")])
def test_a_dds_made_from_per_rank_data_stops_the_run(where: str, name: str, tmp_path: Path) -> None:
    args = ["run", APP, "-p", f"where={where}", "--ranks", "2", "--no-trace", "--timeout", "90"]
    proc = run_cli(args, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    (line,) = _errors(proc.stderr)
    assert f"rank 0 created dvector '{name}' from data #" in line, line
    assert f"rank 1 created dvector '{name}' from data #" in line, line


BEFORE = "before creating dvector 'data' from data"
WRITES = {
    "driver_write": f"its DDS write 1 {BEFORE} was X[15] = 0.0 on rank 0 and X[15] = 1.0 on rank 1",
    "map_key": f"its DDS write 2 {BEFORE} was M['k0'] = [1. 2.] on rank 0 and M['k1'] = [1. 2.] "
    "on rank 1",
    "late_write": f"its last 8 of 72 DDS writes {BEFORE} differed (the first 64 agree) on ranks 0, 1",
}


@pytest.mark.parametrize("where", sorted(WRITES))
def test_a_per_rank_driver_write_stops_the_run(where: str, tmp_path: Path) -> None:
    args = ["run", APP, "-p", f"where={where}", "--ranks", "2", "--no-trace", "--timeout", "90"]
    proc = run_cli(args, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    (line,) = _errors(proc.stderr)
    assert WRITES[where] in line, line


def test_three_ranks_name_each_value_and_the_dual_test_says_the_same(tmp_path: Path) -> None:
    proc = run_cli(["run", APP, "--ranks", "3", "--no-trace", "--timeout", "90"], cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    (line,) = _errors(proc.stderr)
    assert "which is 0.1 on rank 0, 0.2 on rank 1 and 0.30000000000000004 on rank 2" in line
    proc = run_cli(["dual", APP, "--ranks", "2", "--no-trace", "--timeout", "90"], cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    (line,) = _errors(proc.stderr)
    assert "reads 'lr' (float), which is 0.1 on rank 0 and 0.2 on rank 1" in line


def test_the_same_numbers_and_a_per_rank_label_run(tmp_path: Path) -> None:
    args = ["run", APP, "-p", "where=same", "--ranks", "2", "--no-trace", "--timeout", "90"]
    proc = run_cli(args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "final s = 3.2" in proc.stdout


@pytest.mark.parametrize("where", ["closure", "sync"])
def test_a_run_stopped_by_the_rank_check_replays_alike_in_both_modes(
    where: str, tmp_path: Path
) -> None:
    """cluster replay reproduces the ranks' disagreement, one process cannot: both give
    the verdict of the recorded run's end (identical up to where it failed), exit 0."""
    trace = tmp_path / "t.sqlite"
    args = ["run", APP, "-p", f"where={where}", "--ranks", "2", "--timeout", "90"]
    assert run_cli([*args, "--trace", str(trace)], cwd=tmp_path).returncode == 1
    verdicts = {}
    for mode in ("cluster", "single"):
        extra = ["--timeout", "90"] if mode == "cluster" else []
        proc = run_cli([mode, str(trace), "--json", *extra], cwd=tmp_path)
        assert proc.returncode == 0, (mode, proc.stderr)
        res = json.loads(proc.stdout)
        verdicts[mode] = (res["identical"], res["complete"], res["replayed_up_to"])
    assert verdicts["cluster"] == verdicts["single"] == (True, False, None), verdicts
