"""Deferred write-back receives under mpiexec: a token plan's rows arrive where they are
first touched, and the bits are the in-process cluster's whatever the timing.

``python mpi_defer.py SEED...`` on P ranks runs :func:`program` (an SGD-like loop
planned with ``strategy="tokens"``, whose hand-offs often skip rounds) on COMM_WORLD and
once per SEED under seeded message jitter (tests/jitter.py), then once more with
``coalesce=False`` (one message per round and pair, as before coalescing), then
:func:`ring` plainly and under the same jitter: a rotation on sparser ratings, whose
rows that skip a rank ride the ring (``routing.relay``).  Each rank returns, per run,
the program's value: the tables, the digests, how many receives this rank deferred and
what it sent and received.
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

#: users, items, ratings of the synthetic data: a few popular items, as in MovieLens
USERS, ITEMS, RATINGS = 40, 60, 900


def program(
    strategy: str = "tokens", users: int = USERS, items_: int = ITEMS, ratings: int = RATINGS
) -> dict[str, Any]:
    """Two epochs of matrix factorisation on seeded ratings, planned as ``strategy``."""
    rng = np.random.default_rng(7)
    items = np.minimum(rng.zipf(1.6, ratings) - 1, items_ - 1)
    data = np.stack(
        [rng.integers(0, users, ratings), items, rng.integers(1, 6, ratings)], axis=1
    ).astype(np.float64)
    A = ap.dvector(ratings, shape=(3,), data=data, name="A")
    W = ap.dvector(users, shape=(4,), init=ap.init.normal(0.5, 0.1), name="W")
    H = ap.dvector(items_, shape=(4,), init=ap.init.normal(0.5, 0.1), name="H")

    def body(j: int) -> None:
        u, i, r = A[j]
        w, h = W[int(u)], H[int(i)]
        err = r - w @ h
        W[int(u)] = w + 0.05 * (err * h - 0.01 * w)
        H[int(i)] = h + 0.05 * (err * w - 0.01 * h)

    for _ in range(2):
        ap.async_for(0, ratings, body, name="sgd", strategy=strategy)
    cl = ap.current().cluster
    held = ap.current().ops["sgd"].plan  # what this process keeps of the plan it ran
    plan = ap.plan_of("sgd")  # every node's tasks (under MPI, gathered from the ranks)
    return {
        "W": W.gather().tolist(),
        "H": H.gather().tolist(),
        "rounds": len(plan.rounds),
        "kept": None if held.kept is None else list(held.kept),
        "own": [
            [t.indices.tolist() for rnd in held.rounds for t in rnd[q]] if q in held.kept else []
            for q in range(cl.size)
        ],
        "tasks": [[[t.indices.tolist() for t in ts] for ts in rnd] for rnd in plan.rounds],
        "bodies": held.bodies_per_node().tolist(),
        "deferred": getattr(cl, "deferred", 0),
        "traffic": cl.traffic.snapshot(),  # this process's nodes' (a rank's: its own)
    }


def ring() -> dict[str, Any]:
    """A rotation on sparse ratings: the 60 users move, and on 3 ranks some of their
    rows skip a rank and ride the ring."""
    return program("rotation", 60, 300, 500)


def case(world: MPI.Comm, *seeds: int) -> list[dict[str, Any]]:
    runs = plain_then_jittered(program, world, seeds)
    res = ap.run(program, comm=world, coalesce=False)  # as a trace from before coalescing
    runs.append({**res.value, "digests": res.digests})
    return runs + plain_then_jittered(ring, world, seeds)


def main() -> int:
    case(MPI.COMM_WORLD, *map(int, sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
