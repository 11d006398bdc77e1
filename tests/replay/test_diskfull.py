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
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import tracer
from replay import _environment
from replay._cli import cli
from tests import cli as tcli
from tests.conftest import run_cli

HERE = Path(__file__).parent
KILLED = f"{HERE / 'crash_apps.py'}:killed"


def _digests(*paths: Path) -> list[str]:
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]


def _cli(args: list[str]) -> subprocess.CompletedProcess[str]:
    res = CliRunner().invoke(cli, args)
    return subprocess.CompletedProcess(args, res.exit_code, res.stdout, res.stderr)


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trace of a run SIGKILLed after two invocations, its commits in its ``-wal``
    (a real process: it kills itself).  Read-only: tests copy it and its ``-wal``."""
    trace = tmp_path_factory.mktemp("killed") / "k.sqlite"
    argv = ["run", KILLED, "--ranks", "1", "-p", "kill_at=2", "-p", "rows=5000"]
    argv += ["--checkpoint-every", "1"]
    proc = run_cli([*argv, "--trace", str(trace)], env={"CRASH_APPS_KILL": "1"})
    assert proc.returncode == -9, proc.stderr  # killed: its commits are in the -wal
    return trace


def _half_checkpointed(tmp_path: Path, trace: Path) -> Path:
    """A crashed run's trace as a checkpoint that stopped half way leaves it: the main
    file's page 1 says the full size, its tail is missing, the ``-wal`` holds it all."""
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
    tmp_path: Path, killed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tracer._read.CRASH_AFTER_S", -1.0)  # its writer is dead
    trace = _half_checkpointed(tmp_path, killed)
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


def test_a_wal_that_lacks_the_tail_is_still_truncated(tmp_path: Path, killed: Path) -> None:
    trace = _half_checkpointed(tmp_path, killed)
    wal = Path(f"{trace}-wal")
    # cut into pages that the run never changed, which so are in the main file only
    from tracer._wal import wal_commits

    page = int.from_bytes(trace.read_bytes()[16:18], "big")
    held = sorted(wal_commits(trace, page).held)  # type: ignore[union-attr]
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


SGDMF = ["synthetic=true", "epochs=5", "rank=4"]


def _record_sgdmf(trace: Path, max_pages: int | None = None) -> BaseException | None:
    """Record sgdmf in this process, its store capped at ``max_pages`` pages (SQLite then
    fails a commit with SQLITE_FULL, "database or disk is full", as on a full disk)."""
    from sqlalchemy import Engine, event

    from replay._job import run_here

    def cap(dbapi_conn: sqlite3.Connection, _record: object) -> None:
        dbapi_conn.execute(f"PRAGMA max_page_count={max_pages}")

    if max_pages is not None:
        event.listen(Engine, "connect", cap)
    try:
        spec = {"app": "sgdmf", "params": SGDMF, "trace": str(trace), "checkpoint_every": 1}
        run_here(spec)
    except Exception as exc:  # noqa: BLE001 - what the run raised is part of the result
        return exc
    finally:
        if max_pages is not None:
            event.remove(Engine, "connect", cap)
    return None


@pytest.fixture(scope="module")
def full_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, BaseException | None]:
    """A run whose store filled up before its last commits, and what it raised (recorded
    once: tests take :func:`_copy_of` it)."""
    tmp = tmp_path_factory.mktemp("full-store")
    whole = tmp / "whole.sqlite"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", _environment.ReplayEnvironmentWarning)
        assert _record_sgdmf(whole) is None
        trace = tmp / "t.sqlite"
        # full before the last commits
        raised = _record_sgdmf(trace, max_pages=whole.stat().st_size // 4096 - 8)
    return trace, raised


def _copy_of(trace: Path, dst: Path) -> Path:
    """``trace`` and its journal files, copied to ``dst`` (the commits not yet
    checkpointed are in the ``-wal``)."""
    for suffix in ("", "-wal", "-journal"):
        if Path(f"{trace}{suffix}").exists():
            shutil.copy(f"{trace}{suffix}", f"{dst}{suffix}")
    return dst


@pytest.mark.filterwarnings("ignore::replay._environment.ReplayEnvironmentWarning")
def test_a_run_stopped_by_a_full_store_says_disk_full_and_resumes(
    tmp_path: Path, full_store: tuple[Path, BaseException | None]
) -> None:
    trace = _copy_of(full_store[0], tmp_path / "t.sqlite")
    raised = full_store[1]
    assert isinstance(raised, tracer.TraceWriteError) and raised.disk_full, raised
    assert "database or disk is full" in str(raised)
    with tracer.open(trace) as store:
        run = store.run()
        assert run.info.status == "crashed", run.info
        assert run.info.error == f"disk full: {raised}"
        done = [i.invocation for i in run.invocations()]
        assert done and done == list(range(len(done))) and len(done) < 5, done
    proc = _cli(["show", str(trace)])
    assert proc.returncode == 0 and " crashed " in proc.stdout, proc.stderr
    proc = _cli(["verify", str(trace)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = tcli.invoke(["resume", str(trace)])
    assert proc.returncode == 0, proc.stderr
    short = run.info.run_id[:12]
    assert f"run {short} stopped because its trace could not be written: disk full: " in (
        proc.stdout
    )
    assert "loop body" not in proc.stdout + proc.stderr


def test_a_run_failed_by_a_trace_write_error_is_not_blamed_on_a_body(
    tmp_path: Path, full_store: tuple[Path, BaseException | None]
) -> None:
    """What the recorder wrote before it knew a full disk from a failing program."""
    trace = _copy_of(full_store[0], tmp_path / "t.sqlite")
    raised = full_store[1]
    assert raised is not None
    error = f"Traceback (most recent call last):\n  ...\ntracer._errors.TraceWriteError: {raised}\n"
    con = sqlite3.connect(trace)
    con.execute("UPDATE run SET status = 'failed', error = ?", (error,))
    con.commit()
    con.close()
    proc = tcli.invoke(["resume", str(trace)])
    assert proc.returncode == 0, proc.stderr
    assert f"stopped because its trace could not be written: {raised}" in proc.stdout
    assert "loop body" not in proc.stdout + proc.stderr


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 768 KiB file system (tmpfs: needs root, as CI has)."""
    where = tmp_path / "disk"
    where.mkdir()
    try:
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=768k", "tmpfs", str(where)],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as exc:
        pytest.skip(f"no mount command to make a small file system: {exc}")
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a 768 KiB tmpfs (needs root): {proc.stderr.strip()}")
    try:
        yield where
    finally:  # lazily if this process still holds a file there
        if subprocess.run(["umount", str(where)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.filterwarnings("ignore::replay._environment.ReplayEnvironmentWarning")
def test_a_run_that_fills_the_disk_is_a_crashed_run(
    small_disk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = small_disk / "t.sqlite"
    wal = Path(f"{trace}-wal")
    argv = ["run", "sgdmf", "-p", "synthetic=true", "-p", "epochs=10", "-p", "rank=4"]
    proc = tcli.invoke([*argv, "--checkpoint-every", "1", "--trace", str(trace)])
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.endswith("database or disk is full\n"), proc.stderr
    # what the full disk left: the last checkpoint stopped half way through the WAL
    head = trace.read_bytes()[:100]
    pages = int.from_bytes(head[16:18], "big") * int.from_bytes(head[28:32], "big")
    assert wal.stat().st_size > 0 and trace.stat().st_size < pages
    before = _digests(trace, wal)
    monkeypatch.setattr("tracer._read.CRASH_AFTER_S", 1e9)  # the row says it all
    proc = _cli(["show", str(trace), "--json"])
    assert proc.returncode == 0, proc.stderr
    (run,) = json.loads(proc.stdout)["runs"]
    assert run["status"] == "crashed", run
    assert run["error"].startswith("disk full: cannot write trace ") and run["error"].endswith(
        ": database or disk is full"
    )
    done = run["operators"]["sgd"]["invocations"]
    # the disk may fill between an invocation's commit and its checkpoint's
    last = run["checkpoints"][-1]
    assert 0 < done < 10 and last in (f"sgd#{done - 1}", f"sgd#{done - 2}"), run
    proc = _cli(["verify", str(trace)])
    assert proc.returncode == 0 and proc.stdout.startswith("ok:"), proc.stdout + proc.stderr
    assert _digests(trace, wal) == before
    proc = _cli(["single", str(trace), "--json"])  # its verdict does not fit: a warning
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["identical"] and res["replayed_up_to"] == f"sgd#{done - 1}", res
    # with room again (a copy elsewhere), it resumes as a crashed run does
    room = tmp_path / "room"
    room.mkdir()
    shutil.copy(trace, room / trace.name)
    shutil.copy(wal, room / wal.name)
    proc = tcli.invoke(["resume", str(room / trace.name)])
    assert proc.returncode == 0, proc.stderr
    assert "stopped because its trace could not be written: disk full: " in proc.stdout
    assert f"after the checkpoint at {last} as run " in proc.stdout
