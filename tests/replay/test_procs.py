"""The CLI's MPI job never outlives it: SIGTERM, SIGKILL, limits and job directories."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from replay import _procs
from tests.conftest import ROOT

#: Seconds the whole scenario may take before the test fails instead of hanging.
DEADLINE = 90


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    return kids


def _descendants(pid: int) -> set[int]:
    kids, out, todo = _children(), set(), [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.add(k)
            todo.append(k)
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _job_dir(owner: int) -> Path | None:
    for d in Path(tempfile.gettempdir()).glob("replay-job-*"):
        try:
            if json.loads((d / "owner.json").read_text())["pid"] == owner:
                return d
        except (OSError, ValueError, KeyError):
            continue
    return None


def _run_row(trace: Path) -> tuple[str, str | None]:
    with sqlite3.connect(f"file:{trace}?mode=ro", uri=True) as db:
        return db.execute("SELECT status, error FROM run").fetchone()


def _start(trace: Path) -> tuple[subprocess.Popen[str], Path, set[int]]:
    """A 2-rank traced run that takes minutes; once both ranks run: (cli, job, pids)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    argv = ["run", "sgdmf", "--ranks", "2", "-p", "synthetic=true", "-p", "epochs=200"]
    cli = subprocess.Popen(
        [sys.executable, "-m", "replay", *argv, "--trace", str(trace)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        assert cli.poll() is None, cli.stderr.read() if cli.stderr else ""
        job = _job_dir(cli.pid)
        pids = _descendants(cli.pid)
        workers = [p for p in pids if "replay._worker" in _cmdline(p)]
        if job is not None and len(workers) >= 2 and trace.exists():
            try:
                if _run_row(trace)[0] == "running":
                    return cli, job, pids
            except (sqlite3.Error, TypeError):  # no table yet, or no run row yet
                pass
        time.sleep(0.2)
    cli.kill()
    pytest.fail("the 2-rank run did not start in time")


def _wait_gone(pids: set[int], seconds: float) -> set[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = {p for p in pids if _running(p)}
        if not left:
            return left
        time.sleep(0.1)
    return {p for p in pids if _running(p)}


def _reap(pids: set[int]) -> None:
    for p in pids:
        if _running(p):
            os.kill(p, signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_to_the_cli_kills_the_job_removes_its_dir_and_marks_the_run(
    tmp_path: Path, sig: signal.Signals
) -> None:
    trace = tmp_path / "t.sqlite"
    cli, job, pids = _start(trace)
    try:
        cli.send_signal(sig)
        status = cli.wait(timeout=20)
        assert status == 128 + sig, cli.stderr.read() if cli.stderr else ""
        assert not _wait_gone(pids, 5), [_cmdline(p) for p in pids if _running(p)]
        assert not job.exists()
        assert _run_row(trace) == ("interrupted", f"interrupted by {sig.name}")
    finally:
        cli.kill()
        _reap(pids)


def test_sigkill_of_the_cli_stops_the_ranks_and_marks_the_run_crashed(tmp_path: Path) -> None:
    trace = tmp_path / "t.sqlite"
    cli, job, pids = _start(trace)
    try:
        cli.kill()
        cli.wait(timeout=10)
        t0 = time.monotonic()
        left = _wait_gone(pids, 5)
        assert not left, [_cmdline(p) for p in left]
        assert time.monotonic() - t0 < 4
        # rank 0's watchdog removes the job dir; if the launcher killed it first (a loaded
        # machine), the next launch's sweep does, since the dir's owner is dead
        for _ in range(50):
            if not job.exists():
                break
            time.sleep(0.1)
        if job.exists():
            assert str(job) in _procs.sweep_stale(job.parent)
        assert not job.exists()
        status, error = _run_row(trace)
        assert status == "crashed" and f"pid {cli.pid}" in (error or "")
    finally:
        _reap(pids)


def test_sweep_removes_only_dirs_of_dead_owners(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale, live, foreign = (tmp_path / f"replay-job-{n}" for n in ("stale", "live", "none"))
    for d in (stale, live, foreign):
        d.mkdir()
    (stale / "owner.json").write_text(json.dumps({"pid": dead.pid, "start": "1"}))
    _procs.write_owner(live)
    assert _procs.sweep_stale(tmp_path) == [str(stale)]
    assert not stale.exists() and live.exists() and foreign.exists()


def test_alive_sees_through_zombies_and_reused_pids() -> None:
    me = _procs.identity()
    assert _procs.alive(me)
    assert not _procs.alive(dict(me, start="1"))  # same pid, another process
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    who = _procs.identity(child.pid)
    deadline = time.monotonic() + 10
    while _running(child.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _procs.alive(who)  # exited, not yet reaped: a zombie is dead
    child.wait()
    assert not _procs.alive(who)


@pytest.mark.parametrize("failures", [0, 2, 1000])
def test_a_job_directory_that_a_late_rank_still_writes_into_is_no_error(
    failures: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a rank that mpiexec has not reaped may add a file while the directory is removed:
    # rmtree then fails ("Directory not empty"); the removal is tried again and what is
    # left is the sweep's, never an internal error of the command
    real = _procs.shutil.rmtree
    left = [failures]

    def racing(path: str) -> None:
        if left[0] > 0:
            left[0] -= 1
            (Path(path) / f"late.{left[0]}").write_text("x")
            raise OSError(39, "Directory not empty", path)
        real(path)

    monkeypatch.setattr(_procs.shutil, "rmtree", racing)
    with _procs.job_directory() as tmp:
        assert json.loads((Path(tmp) / _procs.OWNER_FILE).read_text()) == _procs.identity()
    assert Path(tmp).exists() == (failures == 1000)
    if failures == 1000:  # the sweep can still tell whose it is
        assert (Path(tmp) / _procs.OWNER_FILE).exists()
        real(tmp)


_FAILING = """
import engine as ap
from replay._procs import shm_segments


def train():
    print("SEGMENTS", *[path for path, _ in shm_segments()], flush=True)
    X = ap.dvector(8, shape=(), init=ap.init.zeros(), name="X")

    def body(j):
        if ap.current().cluster.rank == ap.current().cluster.size - 1:
            raise ValueError("boom")  # not rank 0's: rank 0 records what its peer raised
        X[j] = 1.0

    ap.async_for(0, 8, body, name="b")
"""


@pytest.mark.mpi  # in-process, but the run starts its ranks under mpiexec
@pytest.mark.parametrize("ranks", [2, 3])
def test_an_aborted_job_leaves_no_shared_memory_behind(tmp_path: Path, cli, ranks: int) -> None:
    """A failing body aborts the MPI job (MPI_Abort), and MPICH then leaves its
    shared-memory file in /dev/shm (2-3 MB each, until reboot): the CLI removes the
    files its ranks reported mapping.  The trace, which rank 0 writes, records the
    failing rank's error, not only that a peer failed."""
    (tmp_path / "failing.py").write_text(_FAILING)
    trace = tmp_path / "t.sqlite"
    proc = cli(
        "run", "failing.py:train", "--ranks", str(ranks), "--trace", str(trace), cwd=tmp_path
    )
    assert proc.returncode == 1 and "boom" in proc.stderr, proc.stderr
    status, error = _run_row(trace)
    last = (error or "").strip().splitlines()[-1]
    # rank 0 records its peer's error ("rank R failed ...: BodyError ... boom"), or the
    # failing rank's own close lands first with its BodyError: either names the error
    assert status == "failed" and "boom" in last and "see its error" not in last, error
    assert f"rank {ranks - 1} failed" in last or f"on node {ranks - 1}" in last, error
    assert "ValueError: boom" in last, error
    # every path the ranks printed, found anywhere: the ranks' lines reach stdout through
    # mpiexec, which may interleave them mid-line ("SEGMENTS SEGMENTS/dev/shm/...")
    paths = set(re.findall(r"/dev/shm/mpich_shm_\w+", proc.stdout))
    assert paths and "SEGMENTS" in proc.stdout, proc.stdout
    assert not [p for p in paths if os.path.exists(p)]


def test_only_this_users_own_mpich_files_named_in_a_report_are_removed(tmp_path: Path) -> None:
    """A hello report is read from the job's output, which the program also writes: what
    it names is removed only if it is an MPICH segment path whose file has that inode."""
    import socket
    import uuid

    host = socket.gethostname()
    mine = Path(f"/dev/shm/mpich_shm_{uuid.uuid4().hex[:8]}_0")
    other = Path(f"/dev/shm/mpich_shm_{uuid.uuid4().hex[:8]}_1")
    outside = tmp_path / "mpich_shm_abc_0"
    for f in (mine, other, outside):
        f.write_bytes(b"x")
    try:
        ino = {f: f.stat().st_ino for f in (mine, other, outside)}
        hostile: list[object] = [
            "not a dict",
            {"host": host, "shm": "not a list"},
            {"host": host, "shm": [[str(outside), ino[outside]]]},  # not under /dev/shm
            {"host": host, "shm": [[f"{other}/../{other.name}", ino[other]]]},
            {"host": host, "shm": [[str(other), ino[other] + 1]]},  # another inode
            {"host": host, "shm": [[str(other), str(ino[other])], [str(other)], None]},
            {"host": "elsewhere", "shm": [[str(other), ino[other]]]},  # another host's
            {"host": host, "shm": [["/etc/passwd", Path("/etc/passwd").stat().st_ino]]},
        ]
        assert _procs.remove_segments(hostile) == 0  # type: ignore[arg-type]
        assert mine.exists() and other.exists() and outside.exists()
        assert _procs.remove_segments([{"host": host, "shm": [[str(mine), ino[mine]]]}]) == 1
        assert not mine.exists() and other.exists()
    finally:
        for f in (mine, other, outside):
            f.unlink(missing_ok=True)


_HANGING = """
import time

import engine as ap
from replay._procs import shm_segments


def train():
    print("SEGMENTS", *[path for path, _ in shm_segments()], flush=True)
    X = ap.dvector(8, shape=(), init=ap.init.zeros(), name="X")
    for epoch in range(2):

        def body(j, epoch=epoch):
            if epoch == 1 and ap.current().cluster.rank == 1 and ap.current().mode != "recon":
                time.sleep(600)  # a rank that hangs after the first checkpoint
            X[j] = X[j] + 1.0

        ap.async_for(0, 8, body, name="b")
"""


@pytest.mark.mpi  # in-process, but the run starts its ranks under mpiexec
def test_a_job_ended_by_timeout_is_marked_crashed_and_resumable_at_once(
    tmp_path: Path, cli
) -> None:
    """``--timeout`` kills every rank, so none is left to close the run: the CLI marks it
    crashed (it stayed ``running``, which ``replay resume`` refused for 30 s more), and
    leaves no process and no MPICH shared memory behind."""
    from replay._resume import resumable

    (tmp_path / "hanging.py").write_text(_HANGING)
    trace = tmp_path / "t.sqlite"
    argv = ["run", "hanging.py:train", "--ranks", "2", "--trace", str(trace)]
    proc = cli(*argv, "--checkpoint-every", "1", "--timeout", "10", cwd=tmp_path)
    assert proc.returncode == 2 and "did not finish within 10 s" in proc.stderr, proc.stderr
    status, error = _run_row(trace)
    assert status == "crashed" and "did not finish within 10 s" in (error or ""), error
    _, start = resumable(str(trace), None)  # no wait for a silent recorder
    assert (start.op, start.invocation) == ("b", 0), start
    paths = set(re.findall(r"/dev/shm/mpich_shm_\w+", proc.stdout))
    assert paths and not [p for p in paths if os.path.exists(p)], proc.stdout
    left = [p for p in _descendants(os.getpid()) if "replay._worker" in _cmdline(p)]
    assert not left, [_cmdline(p) for p in left]


def test_the_rank_that_died_first_is_named_not_the_one_mpiexec_names() -> None:
    """When a rank dies, hydra kills the others and then names any dead process (a
    SIGKILLed rank 2 of 3 was reported as rank 0 or 1 in about half the runs): the CLI
    names the rank on its host whose end it saw first.  Here three processes stand in for
    the ranks; the one of 'rank 2' dies, the others are killed 0.2 s later."""
    import socket

    from replay._job import _death_message, _first_dead, _rank_of

    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    host = socket.gethostname()
    hellos = [
        (r, {"pid": p.pid, "host": host, "host_id": _procs.host_id()}) for r, p in enumerate(procs)
    ]
    elsewhere = subprocess.Popen(["sleep", "60"])
    deaths = _procs.DeathOrder()
    try:
        for r, hello in hellos:
            deaths.watch(r, hello)
        # the same pid on another host (host_id) is not this process: not watched
        deaths.watch(3, {"pid": elsewhere.pid, "host": host, "host_id": "other/boot"})
        elsewhere.kill()
        elsewhere.wait()
        time.sleep(0.2)
        procs[2].kill()
        procs[2].wait()
        time.sleep(0.2)
        for p in procs[:2]:
            p.kill()
            p.wait()
        time.sleep(0.2)
        assert deaths.first() == 2
    finally:
        deaths.close()
        for p in (*procs, elsewhere):
            p.kill()
            p.wait()
    # hydra's report names rank 0, killed by its clean-up
    err = [f"=   PID {procs[0].pid} RUNNING AT {host}", "=   EXIT CODE: 9"]
    who = _rank_of(err, hellos)
    assert who == f"rank 0 (pid {procs[0].pid} on {host})"
    msg = _death_message(3, 9, err, 2.0, who, _first_dead(deaths.first(), hellos))
    assert msg.startswith(
        f"rank 2 (pid {procs[2].pid} on {host}) of the 3-rank job died after 2.0 s"
    )
    # the rank hydra names, also under another name of the host, keeps its exit status
    named = f"rank 2 (pid {procs[2].pid} on localhost)"
    assert "(Killed (signal 9))" in _death_message(
        3, 9, ["= EXIT STRING: Killed (signal 9)"], 2.0, named, _first_dead(2, hellos)
    )
    # a rank that died alone, as hydra names it, keeps hydra's exit status
    assert "(Killed (signal 9))" in _death_message(
        3, 9, err + ["= EXIT STRING: Killed (signal 9)"], 2.0, who, who
    )
