"""The final exchange goes home under mpiexec: a later invocation touches rows that
another rank wrote in the one before, and driver reads, ``map`` and ``reduce`` read rows
that were left at their homes; every rank gives the in-process cluster's bits.

``python mpi_home.py SEED...`` on P ranks runs :func:`program` on COMM_WORLD and once
per SEED under seeded message jitter (tests/jitter.py); each rank returns, per run, the
program's value and the digests.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).parents[2]))
import engine as ap  # noqa: E402
from tests.jitter import plain_then_jittered  # noqa: E402

N = 24


def program() -> dict[str, Any]:
    """Invocations whose nodes touch what other nodes wrote, with readers in between."""
    X = ap.dvector(N, shape=(3,), init=ap.init.normal(0.0, 1.0), name="X")
    Y = ap.dvector(N, shape=(), init=ap.init.normal(0.0, 1.0), name="Y")
    idx = ap.dvector(N, shape=(), data=np.arange(N, dtype=np.float64), name="idx")
    flag = ap.dvector(1, shape=(), init=ap.init.zeros(), name="flag")

    def own(j: int) -> None:
        X[j] = X[j] * 0.5 + 1.0

    def shifted(j: int) -> None:  # reads rows other nodes wrote in ``own``
        extra = float(X[(j + 11) % N][2]) if flag[0] > 0 else 0.0
        Y[j] = Y[j] + float(X[(j + 7) % N][0]) + extra

    seen: list[Any] = []
    ap.async_for(0, N, own, name="own")
    ap.async_for(0, N, shifted, name="shifted")  # (its reconnaissance makes X whole)
    ap.async_for(0, N, own, name="own")
    seen.append([X[i].tolist() for i in range(N)])  # driver reads: every rank, every row
    ap.async_for(0, N, shifted, name="shifted")
    ap.async_for(0, N, own, name="own")
    seen.append(ap.reduce(idx, lambda i: float(X[int(i)][1]), initial=0.0))
    ap.async_for(0, N, own, name="own")
    flag[0] = 1.0  # ``shifted`` now reads outside its sets: the guard re-plans
    ap.async_for(0, N, shifted, name="shifted")
    ap.async_for(0, N, own, name="own")
    seen.append(ap.map(idx, lambda i: float(Y[(int(i) + 3) % N])).gather().tolist())
    return {"X": X.gather().tolist(), "Y": Y.gather().tolist(), "seen": seen}


def alone() -> float:
    """Rank 0 alone reads a row the loop left at its home (a driver that is not SPMD)."""
    X = ap.dvector(N, shape=(), init=ap.init.zeros(), name="X")

    def body(j: int) -> None:
        X[j] = X[j] + j

    ap.async_for(0, N, body, name="add")
    seen = float(X[N - 1]) if ap.current().cluster.rank == 0 else 0.0
    ap.async_for(0, N, body, name="add")
    return seen


def case(world: MPI.Comm, *seeds: int) -> list[dict[str, Any]]:
    runs = plain_then_jittered(program, world, seeds)
    try:
        ap.run(alone, comm=world)
        runs.append({"alone": "ran"})
    except ap.DriverStepsDivergedError as exc:
        runs.append({"alone": str(exc)})
    return runs


def main() -> int:
    case(MPI.COMM_WORLD, *map(int, sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
