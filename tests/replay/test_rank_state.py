"""A value from one rank's Python state stops the run on every rank, with one line: a
number a loop body reads, the data a DDS is made from, a value or key the driver writes.

Without the checks these runs finish with exit 0 and a result no serial run computes
(``rank_state_apps`` says why nothing downstream notices).

The commands run in this process (tests/cli.py); their ranks are still ``mpiexec``'s, so
every test here is ``mpi``.  A run stopped in a loop body is recorded once per module and
shared: the replay tests read a private copy of it (``single``/``cluster`` store verdicts).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

import pytest

from tests import cli as tcli
from tests.conftest import run_cli
from tests.traces import settle

pytestmark = pytest.mark.mpi

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


Recorded = Callable[[str], tuple[Path, CompletedProcess[str]]]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    """``recorded(where)``: the trace and result of the traced 2-rank run of that case,
    recorded on first use (read it only: copy it to replay it)."""
    made: dict[str, tuple[Path, CompletedProcess[str]]] = {}

    def get(where: str) -> tuple[Path, CompletedProcess[str]]:
        if where not in made:
            cwd = tmp_path_factory.mktemp(f"rank-state-{where}")
            trace = cwd / "t.sqlite"
            args = ["run", APP, "-p", f"where={where}", "--ranks", "2", "--timeout", "90"]
            proc = tcli.invoke([*args, "--trace", trace], cwd=cwd)
            settle(trace)
            made[where] = (trace, proc)
        return made[where]

    return get


@pytest.mark.parametrize("where", sorted(CASES))
def test_a_per_rank_number_in_a_body_stops_the_run(where: str, recorded: Recorded) -> None:
    _, proc = recorded(where)
    assert proc.returncode == 1, proc.stderr
    (line,) = _errors(proc.stderr)
    what, v0, v1 = CASES[where]
    assert "the driver diverged between MPI ranks" in line and what in line, line
    assert f"which is {v0} on rank 0 and {v1} on rank 1" in line, line
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("where,name", [("shard", "X"), ("shard_objects", "O")])
def test_a_dds_made_from_per_rank_data_stops_the_run(
    where: str, name: str, tmp_path: Path, cli
) -> None:
    args = ["run", APP, "-p", f"where={where}", "--ranks", "2", "--no-trace", "--timeout", "90"]
    proc = cli(*args, cwd=tmp_path)
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
def test_a_per_rank_driver_write_stops_the_run(where: str, tmp_path: Path, cli) -> None:
    args = ["run", APP, "-p", f"where={where}", "--ranks", "2", "--no-trace", "--timeout", "90"]
    proc = cli(*args, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    (line,) = _errors(proc.stderr)
    assert WRITES[where] in line, line


def test_three_ranks_name_each_value_and_the_dual_test_says_the_same(tmp_path: Path, cli) -> None:
    proc = cli("run", APP, "--ranks", "3", "--no-trace", "--timeout", "90", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    (line,) = _errors(proc.stderr)
    assert "which is 0.1 on rank 0, 0.2 on rank 1 and 0.30000000000000004 on rank 2" in line
    proc = cli("dual", APP, "--ranks", "2", "--no-trace", "--timeout", "90", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    (line,) = _errors(proc.stderr)
    assert "reads 'lr' (float), which is 0.1 on rank 0 and 0.2 on rank 1" in line


def test_the_same_numbers_and_a_per_rank_label_run(tmp_path: Path) -> None:
    """The real console script (a smoke test of the checks' process): a run whose ranks
    agree finishes, exit 0."""
    args = ["run", APP, "-p", "where=same", "--ranks", "2", "--no-trace", "--timeout", "90"]
    proc = run_cli(args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "final s = 3.2" in proc.stdout


@pytest.mark.parametrize("where", ["closure", "sync"])
def test_a_run_stopped_by_the_rank_check_replays_alike_in_both_modes(
    where: str, tmp_path: Path, recorded: Recorded, cli
) -> None:
    """cluster replay reproduces the ranks' disagreement, one process cannot: both give
    the verdict of the recorded run's end (identical up to where it failed), exit 0."""
    shared, run = recorded(where)
    assert run.returncode == 1, run.stderr
    trace = tmp_path / "t.sqlite"
    shutil.copyfile(shared, trace)
    verdicts = {}
    for mode in ("cluster", "single"):
        extra = ["--timeout", "90"] if mode == "cluster" else []
        proc = cli(mode, trace, "--json", *extra, cwd=tmp_path)
        assert proc.returncode == 0, (mode, proc.stderr)
        res = json.loads(proc.stdout)
        verdicts[mode] = (res["identical"], res["complete"], res["replayed_up_to"])
    assert verdicts["cluster"] == verdicts["single"] == (True, False, None), verdicts
