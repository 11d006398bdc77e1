"""tests/mpibatch.py: many cases in one mpiexec launch, each reported on its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import mpibatch

CASES = str(Path(__file__).parent / "mpi_batchcases.py")


def test_cases_report_on_their_own_and_a_failure_does_not_stop_the_next(
    tmp_path: Path,
) -> None:
    batch = mpibatch.Batch(2, tmp_path)
    for what in ("ok", "print", "raise", "exit", "status", "ok-again"):
        batch.add(what, CASES, what.removesuffix("-again"))
    assert batch.values("ok") == [[0, 1], [0, 1]]
    with pytest.raises(AssertionError, match="after the batch ran"):
        batch.add("late", CASES, "ok")
    assert batch.values("ok-again") == [[0, 1], [0, 1]]
    proc = batch.result("print")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "out 0\nout 1\n", "err 0\nerr 1\n")
    assert batch.values("print") == [{"rank": 0}, {"rank": 1}]
    proc = batch.result("raise")
    assert proc.returncode == 1 and proc.args == ["mpibatch case 'raise'"]
    assert "case 'raise' raised on rank 0" in proc.stderr
    assert "ValueError: bad value on rank 1" in proc.stderr
    proc = batch.result("exit")
    assert proc.returncode == 1 and "SystemExit: rank 1 gives up" in proc.stderr
    assert batch.result("status").returncode == 3
    with pytest.raises(AssertionError, match="no case 'nope'"):
        batch.result("nope")


def test_a_case_that_strands_the_other_ranks_ends_the_launch_and_is_named(
    tmp_path: Path,
) -> None:
    batch = mpibatch.Batch(2, tmp_path)
    batch.grace = 2
    batch.add("first", CASES, "ok")
    batch.add("stranding", CASES, "strand")
    batch.add("after", CASES, "ok")
    assert batch.values("first") == [[0, 1], [0, 1]]
    for name in ("stranding", "after"):
        with pytest.raises(pytest.fail.Exception) as info:
            batch.result(name)
        msg = str(info.value)
        assert f"MPI case {name!r} has no result" in msg
        assert "case 'stranding' did not finish (started on ranks [0, 1], finished on [1]" in msg
        assert "RuntimeError: rank 1 fails before it sends" in msg


def test_a_launch_past_its_timeout_names_the_case_that_did_not_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mpibatch, "LAUNCH_TIMEOUT", 8)
    monkeypatch.setattr(mpibatch, "CASE_TIMEOUT", 1)
    batch = mpibatch.Batch(2, tmp_path)
    batch.grace = 0
    batch.add("quick", CASES, "ok")
    batch.add("slow", CASES, "sleep")
    assert batch.timeout == 10
    assert batch.values("quick") == [[0, 1], [0, 1]]
    with pytest.raises(pytest.fail.Exception, match="timed out after 10 s: case 'slow' did not"):
        batch.result("slow")
