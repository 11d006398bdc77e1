"""Run under mpiexec: async_for on MPI ranks equals a serial loop in the plan's order."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).parent))
from progs import make_program, serial_reference  # noqa: E402

import engine as ap  # noqa: E402


def case(comm: MPI.Comm, threads: int) -> int:
    """Rank 0 prints ``ranks=P threads=T OK rotation``; the exit status (1 on a mismatch)."""
    bad = 0
    for seed in range(6):
        reads, writes, extra, program = make_program(seed, n=80)
        res = ap.run(program, comm=comm, threads=threads, seed=seed)
        init, (x, y), orders, strategy = res.value
        rx, ry = serial_reference(reads, writes, extra, init, orders)
        ok = np.array_equal(x, rx) and np.array_equal(y, ry)
        ok = ok and all(sorted(o.tolist()) == list(range(80)) for o in orders)
        if comm.Get_rank() == 0 and not ok:
            print(f"seed {seed}: MISMATCH ({strategy})", flush=True)
        bad += not ok

    # SGD-like loop with rotation plans
    def sgd():
        rng = np.random.default_rng(1)
        n, n_users, n_items = 3000, 60, 80
        users, items = rng.integers(0, n_users, n), rng.integers(0, n_items, n)
        W = ap.dvector(n_users, shape=(4,), init=ap.init.normal(0.3, 0.1), name="W")
        H = ap.dvector(n_items, shape=(4,), init=ap.init.normal(0.3, 0.1), name="H")
        w0, h0 = W.gather(), H.gather()

        def body(j):
            w, h = W[users[j]], H[items[j]]
            err = 3.0 - w @ h
            W[users[j]] = w + 0.01 * (err * h - 0.05 * w)
            H[items[j]] = h + 0.01 * (err * w - 0.05 * h)

        ap.async_for(0, n, body, name="sgd")
        order = ap.last_order("sgd")
        Wr, Hr = w0.copy(), h0.copy()
        for j in order.tolist():
            w, h = Wr[users[j]].copy(), Hr[items[j]].copy()
            err = 3.0 - w @ h
            Wr[users[j]] = w + 0.01 * (err * h - 0.05 * w)
            Hr[items[j]] = h + 0.01 * (err * w - 0.05 * h)
        return np.array_equal(W.gather(), Wr) and np.array_equal(H.gather(), Hr), ap.plan_of(
            "sgd"
        ).strategy

    ok, strategy = ap.run(sgd, comm=comm, threads=threads).value
    bad += not ok or strategy != "rotation"
    if comm.Get_rank() == 0:
        print(f"ranks={comm.Get_size()} threads={threads} {'OK' if not bad else 'FAIL'} {strategy}")
    return 1 if bad else 0


def main() -> int:
    return case(MPI.COMM_WORLD, int(sys.argv[1]))


if __name__ == "__main__":
    sys.exit(main())
