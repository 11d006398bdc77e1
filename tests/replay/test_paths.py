"""Paths the CLI reads and writes: FIFOs are refused unopened, traces never overwritten,
and a trace cannot ask for more ranks or threads than the limits allow."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sqlite3
import time
from pathlib import Path

import pytest

from replay._errors import UsageError
from replay._paths import check_output
from tests.tracer.tracehelp import reseal
from tests.traces import SGDMF_1
from tracer import special_kind

#: Seconds a command on a FIFO may take: a regression must fail, not hang (the commands
#: run in this process: pytest-timeout stops a test blocked opening a FIFO).
FIFO_TIMEOUT = 30


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "x.sqlite"
    os.mkfifo(path)
    return path


@pytest.fixture
def trace(trace_library) -> Path:
    """A 1-rank SGDMF trace, shared read-only (the tests copy it to change it)."""
    return trace_library.get(*SGDMF_1)


def _digest(path: Path) -> str:
    return hashlib.blake2b(path.read_bytes()).hexdigest()


def test_special_kind_uses_stat_only(fifo: Path, tmp_path: Path) -> None:
    assert special_kind(fifo) == "a FIFO (named pipe)"
    assert special_kind(tmp_path) is None
    assert special_kind(tmp_path / "missing") is None


@pytest.mark.parametrize(
    "args",
    [
        ["show", "{f}"],
        ["export", "{f}", "-o", "{d}/out.json"],
        ["cluster", "{f}"],
        ["single", "{f}"],
        ["ls", "{f}"],
        ["run", "sgdmf", "-p", "synthetic=true", "--trace", "{f}"],
        ["dual", "sgdmf", "--in-process", "-p", "synthetic=true", "--trace", "{f}"],
    ],
    ids=lambda a: a[0],
)
@pytest.mark.timeout(FIFO_TIMEOUT)
def test_every_command_refuses_a_fifo(fifo: Path, args: list[str], cli) -> None:
    argv = [a.format(f=fifo, d=fifo.parent) for a in args]
    res = cli(*argv)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("replay: error:"), res.stderr
    assert "x.sqlite" in lines[0]
    assert "FIFO" in lines[0] or "already exists" in lines[0]  # --trace: never overwritten
    assert not (fifo.parent / "out.json").exists()


@pytest.mark.timeout(FIFO_TIMEOUT)
def test_cluster_trace_out_refuses_a_fifo(fifo: Path, trace: Path, cli) -> None:
    res = cli("cluster", str(trace), "--trace-out", str(fifo))
    assert res.returncode == 2 and "already exists" in res.stderr


@pytest.mark.timeout(FIFO_TIMEOUT)
def test_ls_skips_a_fifo_and_says_why(fifo: Path, trace: Path, cli) -> None:
    other = fifo.parent / "t.sqlite"
    other.write_bytes(trace.read_bytes())
    res = cli("ls", str(fifo.parent))
    assert res.returncode == 0, res.stderr
    assert "t.sqlite" in res.stdout and "sgdmf" in res.stdout
    row = next(line for line in res.stdout.splitlines() if "x.sqlite" in line)
    assert "skipped" in row and "FIFO" in row  # an unreadable file is a row saying why
    assert res.stderr.strip() == "replay: note: skipped 1 unreadable file(s)"
    res = cli("ls", str(fifo.parent), "--json")
    doc = json.loads(res.stdout)
    assert [Path(e["path"]).name for e in doc["errors"]] == ["x.sqlite"]
    assert len(doc["traces"]) == 1


def test_browse_shows_a_fifo_as_unreadable_and_q_quits(fifo: Path) -> None:
    from tui import BrowserApp

    async def main() -> None:
        app = BrowserApp([fifo])
        async with app.run_test(size=(100, 24)) as pilot:
            deadline = time.monotonic() + FIFO_TIMEOUT
            text = ""
            while "unreadable" not in text and time.monotonic() < deadline:
                await pilot.pause(0.1)
                text = " ".join(str(w.render()) for w in app.screen.query("*"))
            assert "unreadable" in text
            await pilot.press("q")
            await pilot.pause()
        assert app.return_code in (0, None)

    asyncio.run(asyncio.wait_for(main(), FIFO_TIMEOUT))


def test_export_refuses_to_overwrite_the_trace_it_reads(trace: Path, tmp_path: Path, cli) -> None:
    before = _digest(trace)
    for out in (str(trace), str(trace.parent / ".." / trace.parent.name / trace.name)):
        res = cli("export", str(trace), "--format", "chrome", "-o", out, "--force")
        assert res.returncode == 2 and "trace being read" in res.stderr, res.stderr
    link = tmp_path / "link.json"  # the shared trace's directory is not ours to write
    link.symlink_to(trace)
    res = cli("export", str(trace), "-o", str(link), "--force")
    assert res.returncode == 2 and "trace being read" in res.stderr
    assert _digest(trace) == before


def test_export_needs_force_for_an_existing_file_and_never_replaces_a_trace(
    trace: Path, tmp_path: Path, cli
) -> None:
    out = tmp_path / "out.json"
    out.write_text("keep")
    res = cli("export", str(trace), "-o", str(out))
    assert res.returncode == 2 and "--force" in res.stderr and len(res.stderr.splitlines()) == 1
    assert out.read_text() == "keep"
    res = cli("export", str(trace), "-o", str(out), "--force")
    assert res.returncode == 0, res.stderr
    assert "traceEvents" in json.loads(out.read_text())
    other = tmp_path / "other.sqlite"
    other.write_bytes(trace.read_bytes())
    res = cli("export", str(trace), "-o", str(other), "--force")
    assert res.returncode == 2 and "never overwritten" in res.stderr
    assert _digest(other) == _digest(trace)


def test_check_output_unit(tmp_path: Path, fifo: Path) -> None:
    check_output(tmp_path / "new.json")
    with pytest.raises(UsageError, match="FIFO"):
        check_output(fifo)
    with pytest.raises(UsageError, match="directory"):
        check_output(tmp_path, force=True)


@pytest.fixture
def big_trace(trace: Path, tmp_path: Path) -> Path:
    path = tmp_path / "big.sqlite"
    path.write_bytes(trace.read_bytes())
    with sqlite3.connect(path) as db:
        db.execute("UPDATE run SET ranks = 999")
    db.close()
    reseal(path)  # the chain would refuse the edit first: test the limit behind it
    return path


@pytest.mark.parametrize("cmd", ["cluster", "single"])
@pytest.mark.timeout(30)
def test_a_trace_asking_for_999_ranks_is_refused_quickly(big_trace: Path, cmd: str, cli) -> None:
    t0 = time.monotonic()
    res = cli(cmd, str(big_trace), "--max-ranks", "8")
    assert time.monotonic() - t0 < 30
    assert res.returncode == 2
    (line,) = res.stderr.strip().splitlines()
    assert "999" in line and "limit of 8" in line and "--max-ranks" in line


@pytest.mark.timeout(30)
def test_max_threads_bounds_the_recorded_threads(trace: Path, tmp_path: Path, cli) -> None:
    path = tmp_path / "threads.sqlite"
    path.write_bytes(trace.read_bytes())
    with sqlite3.connect(path) as db:
        db.execute("UPDATE run SET threads = 500")
    db.close()
    reseal(path)
    res = cli("single", str(path), "--max-threads", "4")
    assert res.returncode == 2
    assert "500" in res.stderr and "limit of 4" in res.stderr and "--max-threads" in res.stderr


def test_max_ranks_raises_the_limit(trace: Path, tmp_path: Path, cli) -> None:
    # a 1-rank trace claiming 3 ranks: allowed past the limit, then replayed in-process
    path = tmp_path / "three.sqlite"
    path.write_bytes(trace.read_bytes())
    with sqlite3.connect(path) as db:
        db.execute("UPDATE run SET ranks = 3")
    db.close()
    reseal(path)
    refused = cli("single", str(path), "--max-ranks", "2")
    assert refused.returncode == 2 and "--max-ranks" in refused.stderr
    allowed = cli("single", str(path), "--max-ranks", "3")
    assert "--max-ranks" not in allowed.stderr
    assert allowed.returncode in (0, 3), allowed.stderr  # past the check: it replays
