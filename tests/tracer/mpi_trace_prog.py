"""One rank of a traced SGD-like run under mpiexec (used by test_trace_mpi.py).

``python mpi_trace_prog.py TRACE RUN_ID EPOCHS KILL_AT``: every rank records its node
into TRACE; with KILL_AT >= 0, rank 1 kills itself with SIGKILL inside a loop body of
that epoch.
"""

from __future__ import annotations

import os
import signal
import sys

import numpy as np
from mpi4py import MPI

import engine as ap
import tracer


def program(epochs: int, kill_at: int) -> None:
    rng = np.random.default_rng(0)
    n, users, items = 3000, 60, 90
    pairs = np.stack([rng.integers(0, users, n), rng.integers(0, items, n)], axis=1)
    W = ap.dvector(users, shape=(4,), init=ap.init.normal(0.5, 0.1), name="W")
    H = ap.dvector(items, shape=(4,), init=ap.init.normal(0.5, 0.1), name="H")
    for epoch in range(epochs):

        def body(j: int) -> None:
            u, i = int(pairs[j, 0]), int(pairs[j, 1])
            if epoch == kill_at and j == 2000 and ap.current().mode == "guard":  # noqa: B023
                os.kill(os.getpid(), signal.SIGKILL)
            w, h = W[u], H[i]
            err = 1.0 - w @ h
            W[u] = w + 0.01 * err * h
            H[i] = h + 0.01 * err * w

        ap.async_for(0, n, body, name="sgd")
        ap.log_objective("epoch", float(epoch))


def main(argv: list[str]) -> int:
    path, run_id, epochs, kill_at = argv[1], argv[2], int(argv[3]), int(argv[4])
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    rec = tracer.TraceRecorder(path, run_id, [rank], rank == 0)
    try:
        ap.run(program, {"epochs": epochs, "kill_at": kill_at}, comm=comm, recorder=rec)
    except BaseException as exc:
        rec.close("failed", repr(exc))
        raise
    rec.close("finished")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
