"""Recording under ``mpiexec -n 2``: both ranks share one store; SIGKILL keeps the past."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import tracer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
#: Seconds before a hung MPI job fails the test instead of hanging CI.
TIMEOUT = 120


def mpirun(n: int, *args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "mpiexec"
    cmd = [str(exe) if exe.exists() else "mpiexec", "-n", str(n), sys.executable, *args]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"mpiexec -n {n} did not finish within {TIMEOUT} s")


def test_two_ranks_record_into_one_store(tmp_path: Path) -> None:
    path = tmp_path / "mpi.sqlite"
    tracer.start_run(path, "mpi", {"app": "sgd", "ranks": 2})
    res = mpirun(2, str(HERE / "mpi_trace_prog.py"), str(path), "mpi", "3", "-1")
    assert res.returncode == 0, res.stderr
    with tracer.open(path) as trace:
        run = trace.run()
        assert run.info.status == "finished"
        assert run.nodes() == [0, 1]
        op = run.operators()["sgd"]
        assert (op.strategy, op.invocations, op.bodies) == ("rotation", 3, 9000)
        assert run.objectives() == {"epoch": [0.0, 1.0, 2.0]}
        assert len(run.digests()) == 3 * 2
        # routed write-backs: after each round (and once after the last, home) a rank
        # sends the other at most one message, numbered by the sender's exchange (rounds
        # + 1 of them per invocation, and a fetch of what the previous one left at its
        # homes before the second and third); every message the summary counts is in the
        # per-exchange counts (schema 7 keeps no routed arrival one by one)
        exchanges = 3 * (op.rounds + 1) + 2
        logged = 0
        for node in (0, 1):
            assert len(run.messages(node).seq) == 0
            got = [c for c in run.routed() if c.node == node]
            seqs = [int(e) for c in got for e in c.exchange]
            assert seqs == sorted(set(seqs)) and all(0 <= q < exchanges for q in seqs)
            assert all(int(k) == 1 for c in got for k in c.count)  # one message a peer
            logged += sum(int(c.count.sum()) for c in got)
        assert 0 < op.messages == logged <= 2 * exchanges


def test_sigkill_of_one_rank_leaves_a_readable_crashed_trace(tmp_path: Path) -> None:
    path = tmp_path / "killed.sqlite"
    tracer.start_run(path, "k", {"app": "sgd", "ranks": 2})
    res = mpirun(2, str(HERE / "mpi_trace_prog.py"), str(path), "k", "5", "2")
    assert res.returncode != 0
    with tracer.open(path, assume_finished=True) as trace:
        run = trace.run()
        assert run.info.status == "crashed"
        for node in (0, 1):
            done = [i.invocation for i in run.invocations(node=node)]
            assert done == [0, 1]  # every invocation completed before the kill, none after
        # an objective is committed with the next invocation: the one logged after
        # invocation 1 was still buffered when the job died
        assert run.objectives()["epoch"] == [0.0]
        assert sum(1 for _ in run.events()) > 0
    assert tracer.mark_crashed(path, "k", "rank 1 was killed (SIGKILL)")
