"""``replan="never"`` under mpiexec: a body that leaves its plan raises
:class:`AccessOutsideReconError` on every rank, after the attempt is undone.

Raised on the violating rank alone, it left the other ranks waiting for that rank's
rows in the write-back for ever.  :func:`program` (also run in process by the test)
runs an invocation whose bodies read a row outside their sets in a later invocation,
with ``replan="never"``; the driver catches the error, which every rank must see, and
carries on with ``replan="auto"``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).parents[2]))
import engine as ap  # noqa: E402


def program() -> dict[str, Any]:
    n = 24
    X = ap.dvector(n, shape=(), data=np.arange(n, dtype=np.float64), name="X")
    far = ap.dvector(1, shape=(), dtype=np.int64, data=np.zeros(1, np.int64), name="far")

    def body(j: int) -> None:
        X[j] = X[j] * 0.5 + X[(j + int(far[0])) % n]

    ap.async_for(0, n, body, name="b", replan="never")
    far[0] = 7  # the next invocation's bodies read rows their sets do not hold
    caught = None
    try:
        ap.async_for(0, n, body, name="b", replan="never")
    except ap.AccessOutsideReconError as exc:
        caught = str(exc)
    after = X.gather().tolist()  # the failed attempt left nothing behind
    ap.async_for(0, n, body, name="b")  # replan="auto": re-planned, runs
    return {"caught": caught, "after": after, "X": X.gather().tolist()}


def case(world: MPI.Comm) -> dict[str, Any]:
    res = ap.run(program, comm=world)
    return {**res.value, "digests": res.digests}


def main() -> int:
    case(MPI.COMM_WORLD)
    return 0


if __name__ == "__main__":
    sys.exit(main())
