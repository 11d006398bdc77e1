"""A trace whose last checkpoint stopped half way (the disk filled up) reads as what it is.

A checkpoint copies the WAL's pages into the main file in page order, page 1 (whose
header gives the new page count) first.  When the disk fills up part way, the main
file is shorter than its header says while every committed row is still in the
``-wal``: SQLite reads that correctly, and so must every reader, without writing.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from replay._cli import cli
from tests.conftest import run_cli
from tracer import _wal as tracer_wal

HERE = Path(__file__).parent
KILLED = f"{HERE / 'crash_apps.py'}:killed"


def _digests(*paths: Path) -> list[str]:
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]


def _cli(args: list[str]) -> subprocess.CompletedProcess[str]:
    res = CliRunner().invoke(cli, args)
    return subprocess.CompletedProcess(args, res.exit_code, res.stdout, res.stderr)


def _half_checkpointed(tmp_path: Path) -> Path:
    """A crashed run's trace as a checkpoint that stopped half way leaves it: the main
    file's page 1 says the full size, its tail is missing, the ``-wal`` holds it all."""
    killed = tmp_path / "killed"
    trace = killed / "k.sqlite"
    argv = ["run", KILLED, "--ranks", "1", "-p", "kill_at=2", "-p", "rows=5000"]
    argv += ["--checkpoint-every", "1"]
    proc = run_cli([*argv, "--trace", str(trace)], env={"CRASH_APPS_KILL": "1"})
    assert proc.returncode == -9, proc.stderr  # killed: its commits are in the -wal
    wal = Path(f"{trace}-wal")
    assert wal.stat().st_size > 0
    before = trace.stat().st_size
    # what a completed checkpoint writes, on a copy
    full = tmp_path / "full"
    full.mkdir()
    shutil.copy(trace, full / trace.name)
    shutil.copy(wal, full / wal.name)
    con = sqlite3.connect(full / trace.name)
    assert con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
    con.close()
    whole = (full / trace.name).read_bytes()
    assert len(whole) > before
    # ... cut where the disk filled up: the pages it had before, page 1 already new
    crafted = tmp_path / "t.sqlite"
    crafted.write_bytes(whole[:before])
    shutil.copy(wal, f"{crafted}-wal")
    assert int.from_bytes(whole[28:32], "big") * int.from_bytes(whole[16:18], "big") == len(whole)
    return crafted


@pytest.mark.filterwarnings("ignore::replay._environment.ReplayEnvironmentWarning")
def test_a_half_checkpointed_trace_reads_as_the_crashed_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tracer._read.CRASH_AFTER_S", -1.0)  # its writer is dead
    trace = _half_checkpointed(tmp_path)
    wal = Path(f"{trace}-wal")
    before = _digests(trace, wal)
    proc = _cli(["show", str(trace), "--json"])
    assert proc.returncode == 0, proc.stderr
    (run,) = json.loads(proc.stdout)["runs"]
    assert run["status"] == "crashed"  # no process is alive: its row still says running
    # sgd#0 and #1 completed (each with its checkpoint), sgd#2 was killed
    assert run["operators"]["sgd"]["invocations"] == 2, run
    assert run["checkpoints"] == ["sgd#0", "sgd#1"], run
    proc = _cli(["show", str(trace)])
    assert proc.returncode == 0 and "crashed" in proc.stdout, proc.stderr
    proc = _cli(["verify", str(trace)])
    assert proc.returncode == 0 and proc.stdout.startswith("ok:"), proc.stdout + proc.stderr
    proc = _cli(["ls", str(tmp_path)])
    assert proc.returncode == 0 and "t.sqlite" in proc.stdout, proc.stderr
    proc = _cli(["export", str(trace), "-o", str(tmp_path / "t.json")])
    assert proc.returncode == 0, proc.stderr
    assert _digests(trace, wal) == before  # read, never written
    # the replays read it as any crashed run: identical up to where it stopped (they
    # then store a verdict, which is a write)
    for mode in ("single", "cluster"):
        proc = _cli([mode, str(trace), "--json"])
        assert proc.returncode == 0, proc.stderr
        res = json.loads(proc.stdout)
        assert res["identical"] and res["recorded_status"] == "crashed", res
        assert res["replayed_up_to"] == "sgd#1", res


def test_a_wal_that_lacks_the_tail_is_still_truncated(tmp_path: Path) -> None:
    trace = _half_checkpointed(tmp_path)
    wal = Path(f"{trace}-wal")
    # cut into pages that the run never changed, which so are in the main file only
    page = int.from_bytes(trace.read_bytes()[16:18], "big")
    held = sorted(tracer_wal.wal_commits(trace, page).held)  # type: ignore[union-attr]
    lacking = next(p for p in range(1, held[-1]) if p not in held)
    with trace.open("r+b") as fh:
        fh.truncate(page * (lacking - 1))
    before = _digests(trace, wal)
    for args in (["show", str(trace)], ["verify", str(trace)]):
        proc = _cli(args)
        assert proc.returncode == 2, proc.stdout
        assert "is truncated" in proc.stderr and "-wal does not hold the rest" in proc.stderr
    assert _digests(trace, wal) == before
    wal.unlink()  # no WAL at all: as before
    proc = _cli(["show", str(trace)])
    assert proc.returncode == 2 and f"is truncated ({trace.stat().st_size} bytes" in proc.stderr
