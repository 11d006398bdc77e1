"""Message timing is not a result: runs under mpiexec with seeded random delays before
every send and receive must give what the in-process cluster gives.

``python mpi_jitter.py THREADS SEED`` on P ranks.  Every rank wraps its communicator so
that each point-to-point call first sleeps 0 to 10 milliseconds drawn from (SEED, rank), which
makes the orders a loaded machine produces (a rank a round ahead of another, a slow
sender) common instead of rare.  Checked: async_for programs against a serial loop over
their recorded orders, and a BSP sync_for program against the in-process cluster, bitwise.
Prints ``OK`` on rank 0 when everything held.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[2]))
from mpi_syncfor import program as syncfor_program  # noqa: E402
from progs import make_program, serial_reference  # noqa: E402

import engine as ap  # noqa: E402
from tests.jitter import Jitter  # noqa: E402


def sgd(comm: Any, threads: int, strategy: str) -> bool:
    """Matrix-factorisation SGD planned by ``strategy``; rotation and colouring plans have
    several rounds, so a fast rank can be a round ahead of a slow one."""
    rng = np.random.default_rng(1)
    n, n_users, n_items = 600, 30, 40
    users, items = rng.integers(0, n_users, n), rng.integers(0, n_items, n)

    def prog() -> bool:
        W = ap.dvector(n_users, shape=(4,), init=ap.init.normal(0.3, 0.1), name="W")
        H = ap.dvector(n_items, shape=(4,), init=ap.init.normal(0.3, 0.1), name="H")
        Wr, Hr = W.gather(), H.gather()

        def body(j: int) -> None:
            w, h = W[users[j]], H[items[j]]
            err = 3.0 - w @ h
            W[users[j]] = w + 0.01 * (err * h - 0.05 * w)
            H[items[j]] = h + 0.01 * (err * w - 0.05 * h)

        for _ in range(3):
            ap.async_for(0, n, body, name="sgd", strategy=strategy)
            for j in ap.last_order("sgd").tolist():
                w, h = Wr[users[j]].copy(), Hr[items[j]].copy()
                err = 3.0 - w @ h
                Wr[users[j]] = w + 0.01 * (err * h - 0.05 * w)
                Hr[items[j]] = h + 0.01 * (err * w - 0.05 * h)
        return bool(np.array_equal(W.gather(), Wr) and np.array_equal(H.gather(), Hr))

    return bool(ap.run(prog, comm=comm, threads=threads).value)


def case(world: MPI.Comm, threads: int, seed: int) -> int:
    """Rank 0 prints ``OK`` or what differed; the exit status."""
    me = world.Get_rank()
    assert MPI.Query_thread() == MPI.THREAD_MULTIPLE, "late delivery needs MPI_THREAD_MULTIPLE"
    comm = Jitter(world, np.random.default_rng([seed, me]))
    bad: list[str] = []
    for s in range(3):
        reads, writes, extra, prog = make_program(s, n=80)
        init, (x, y), orders, strategy = ap.run(prog, comm=comm, threads=threads, seed=s).value
        rx, ry = serial_reference(reads, writes, extra, init, orders)
        if not (np.array_equal(x, rx) and np.array_equal(y, ry)):
            bad.append(f"async_for program {s} ({strategy}) is not its serial order")
    for strategy in ("rotation", "colouring"):
        if not sgd(comm, threads, strategy):
            bad.append(f"async_for SGD ({strategy} plan) is not its serial order")
    bsp = syncfor_program(sync="bsp", invocations=3)
    got = ap.run(bsp, comm=comm, threads=threads, seed=seed).value
    want = ap.run(bsp, nodes=world.Get_size(), threads=threads, seed=seed).value
    for k in ("W", "H"):
        if not np.array_equal(got[k], want[k]):
            bad.append(f"BSP sync_for: {k} differs from the in-process cluster")
    every = world.allgather(bad)
    if me == 0:
        for r, msgs in enumerate(every):
            for m in msgs:
                print(f"rank {r}: {m}", flush=True)
        if not any(every):
            print("OK", flush=True)
    return 1 if any(every) else 0


def main() -> int:
    return case(MPI.COMM_WORLD, int(sys.argv[1]), int(sys.argv[2]))


if __name__ == "__main__":
    sys.exit(main())
