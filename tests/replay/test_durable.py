"""A trace file copied after any command holds everything that command wrote.

SQLite keeps recent writes in ``T.sqlite-wal`` until a checkpoint folds them into the
main file; ``cp T.sqlite elsewhere`` copies only the main file.  So every command that
writes a trace (recording, verdicts, marking a run interrupted) checkpoints on close,
and each step below copies the bare ``.sqlite`` and reads the copy.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import tracer
from tests.conftest import run_cli
from tests.traces import SGDMF_SMALL

HERE = Path(__file__).parent
SMALL = SGDMF_SMALL


def _copy(trace: Path, dest: Path) -> tracer.Trace:
    dest.mkdir()
    shutil.copy(trace, dest / trace.name)  # the main file only, never its -wal
    return tracer.open(dest / trace.name)


@pytest.mark.mpi  # in-process, but --ranks 2 and cluster start mpiexec
def test_copies_hold_the_run_and_every_verdict(tmp_path: Path, cli) -> None:
    trace = tmp_path / "t.sqlite"
    proc = cli("run", "sgdmf", *SMALL, "--ranks", "2", "--trace", str(trace))
    assert proc.returncode == 0, proc.stderr
    with _copy(trace, tmp_path / "after-run") as copy:
        run = copy.run()
        assert run.info.status == "finished" and run.invocations()
        assert run.verdicts() == []
    expected: list[tuple[str, bool]] = []
    for n, mode in enumerate(("cluster", "single")):
        proc = cli(mode, str(trace))
        assert proc.returncode == 0, proc.stderr
        expected.append((mode, True))
        with _copy(trace, tmp_path / f"after-{n}-{mode}") as copy:
            got = [(v.kind, v.passed) for v in copy.run().verdicts()]
            assert got == expected
    proc = cli("show", str(trace), "--json")
    assert proc.returncode == 0, proc.stderr
    (run,) = json.loads(proc.stdout)["runs"]
    assert [(v["kind"], v["passed"]) for v in run["verdicts"]] == expected
    for v in run["verdicts"]:
        assert isinstance(v["created_at"], float) and v["detail"]["complete"] is True
    proc = cli("show", str(trace))
    assert "verdict cluster: PASS at" in proc.stdout and "verdict single: PASS" in proc.stdout


def test_a_copy_of_an_interrupted_run_says_interrupted(tmp_path: Path) -> None:
    trace = tmp_path / "i.sqlite"
    app = f"{HERE / 'crash_apps.py'}:killed"
    argv = ["run", app, "--ranks", "1", "-p", "kill_at=1", "--trace", str(trace)]
    # a real process: the run is stopped by a KeyboardInterrupt (a user's Ctrl-C)
    proc = run_cli(argv, env={"CRASH_APPS_INTERRUPT": "1"})
    assert proc.returncode == 130, proc.stderr
    with _copy(trace, tmp_path / "copy") as copy:
        run = copy.run()
        assert run.info.status == "interrupted" and run.info.ended_at is not None
        assert [i.op for i in run.invocations()][:1] == ["sgd"]


def test_a_copy_holds_the_dual_verdicts(tmp_path: Path, cli) -> None:
    trace = tmp_path / "d.sqlite"
    proc = cli("dual", "sgdmf", *SMALL, "--in-process", "--trace", str(trace))
    assert proc.returncode == 0, proc.stderr
    with _copy(trace, tmp_path / "copy") as copy:
        kinds = sorted(v.kind for v in copy.run().verdicts())
        assert kinds == ["dual-backward", "dual-forward"]


def test_show_reports_the_sync_for_mode(tmp_path: Path, cli) -> None:
    for mode in ("ssp", "hybrid"):
        trace = tmp_path / f"{mode}.sqlite"
        argv = ["run", "mlr", "-p", "synthetic=true", "-p", "epochs=1", "-p", f"sync={mode}"]
        proc = cli(*argv, "--threads", "2", "--trace", str(trace))
        assert proc.returncode == 0, proc.stderr
        proc = cli("show", str(trace), "--json")
        assert proc.returncode == 0, proc.stderr
        (run,) = json.loads(proc.stdout)["runs"]
        assert mode in {op["strategy"] for op in run["operators"].values()}
        assert f" {mode} " in cli("show", str(trace)).stdout
