"""A run that records is a run that every reader can read: the CLI and ``start_run`` refuse
exactly the ranks, threads and seeds that a reader of the run row refuses (one bound,
``tracer.RUN_LIMITS``, for both)."""

from __future__ import annotations

import shutil
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import tracer
from replay import _runcmds, chaos, testing
from replay._cli import cli

pytestmark = pytest.mark.timeout(120)

COLUMNS = sorted(tracer.RUN_LIMITS)


def _edges(col: str) -> list[int]:
    lo, hi = tracer.RUN_LIMITS[col]
    return [lo - 1, lo, hi, hi + 1]


@pytest.fixture(scope="module")
def one_row(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("limits") / "row.sqlite"
    tracer.start_run(str(path), "r0", {"app": "mlr", "ranks": 1, "threads": 1, "seed": 0})
    return path


def _reader_refuses(base: Path, tmp_path: Path, col: str, value: int) -> bool:
    path = tmp_path / f"{col}-{value}.sqlite"
    shutil.copyfile(base, path)
    stored = value if value < 2**63 else str(value)  # SQLite keeps it as REAL then
    with sqlite3.connect(path) as con:
        con.execute(f"UPDATE run SET {col} = ?", (stored,))
    con.close()
    try:
        with tracer.open(str(path)) as trace:
            info = trace.run().info
    except tracer.TraceFormatError as exc:
        assert f"column {col} holds" in str(exc)
        return True
    assert getattr(info, col) == value
    return False


def _started(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Stand-ins for everything that would start the program: each notes it and exits 0."""
    started: list[str] = []

    def stub(name: str) -> Any:
        def go(*_a: Any, **_k: Any) -> None:
            started.append(name)
            sys.exit(0)

        return go

    monkeypatch.setattr(_runcmds, "run_here", stub("run_here"))
    monkeypatch.setattr(_runcmds, "launch", stub("launch"))
    monkeypatch.setattr(_runcmds, "prefetch", lambda *a: None)
    monkeypatch.setattr(testing, "dual", stub("dual"))
    monkeypatch.setattr(chaos, "explore", stub("explore"))
    return started


def _cli_refuses(args: list[str], col: str, value: int, started: list[str], tmp_path: Path) -> bool:
    started.clear()
    res = CliRunner().invoke(cli, [*args, f"--{col}", str(value)])
    assert "Traceback" not in res.stderr, res.stderr
    if res.exit_code == 2:
        lo, hi = tracer.RUN_LIMITS[col]
        assert res.stderr.count("\n") == 1, res.stderr
        assert f"--{col} must be an integer in [{lo}, {hi}]" in res.stderr, res.stderr
        assert f"got {value}" in res.stderr, res.stderr
        assert started == [] and list(tmp_path.iterdir()) == []
        return True
    assert res.exit_code == 0 and len(started) == 1, (res.exit_code, res.stderr)
    return False


@pytest.mark.parametrize("col", COLUMNS)
def test_run_refuses_what_a_reader_refuses(
    col: str, one_row: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    started = _started(monkeypatch)
    for value in _edges(col):
        out = tmp_path / "out"
        out.mkdir()
        args = ["run", "mlr", "--trace", str(out / "t.sqlite")]
        writer = _cli_refuses(args, col, value, started, out)
        assert writer == _reader_refuses(one_row, work, col, value), (col, value)
        shutil.rmtree(out)
    assert not (tmp_path / "traces").exists()


@pytest.mark.parametrize("col", COLUMNS)
def test_start_run_writes_only_what_a_reader_reads(col: str, tmp_path: Path) -> None:
    for value in _edges(col):
        path = tmp_path / f"{value}.sqlite"
        try:
            tracer.start_run(str(path), "r", {"app": "mlr", col: value})
        except ValueError as exc:
            assert f"{col} must be in" in str(exc)
            refused = True
        else:
            with tracer.open(str(path)) as trace:
                assert getattr(trace.run().info, col) == value
            refused = False
        lo, hi = tracer.RUN_LIMITS[col]
        assert refused == (not lo <= value <= hi), (col, value)


@pytest.mark.parametrize(
    "args",
    [
        ["dual", "mlr", "--in-process"],
        ["dual", "mlr"],
        ["chaos", "mlr", "--runs", "1", "--chaos-seed", "0"],
        ["chaos", "mlr", "--runs", "1", "--chaos-seed", "0", "--in-process"],
    ],
    ids=["dual-in-process", "dual-mpi", "chaos-mpi", "chaos-in-process"],
)
@pytest.mark.parametrize("col", COLUMNS)
def test_dual_and_chaos_refuse_before_starting(
    args: list[str], col: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    started = _started(monkeypatch)
    lo, hi = tracer.RUN_LIMITS[col]
    assert _cli_refuses([*args, "--no-trace"], col, hi + 1, started, tmp_path)
    assert _cli_refuses([*args, "--no-trace"], col, lo - 1, started, tmp_path)
    assert not _cli_refuses([*args, "--no-trace"], col, hi, started, tmp_path)


def test_demo_refuses_ranks_beyond_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    started = _started(monkeypatch)
    _, hi = tracer.RUN_LIMITS["ranks"]
    assert _cli_refuses(["demo"], "ranks", hi + 1, started, tmp_path)
