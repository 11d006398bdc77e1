"""Routed write-backs under mpiexec -n 3: every rank sends its row of each round to
every other rank, each receive naming its source.  Prints ``OK`` when every replica holds
every round's rows after every round.

(A rank cannot be a round ahead of another here: each exchange ends with the allreduce of
the stopped flag, which completes only once every rank has received its round's rows.
Before write-backs were routed, wildcard receives had to tell a round-ahead rank's rows
from this round's: a dual test once reported a false FAIL from that.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mpi4py import MPI  # noqa: E402

from engine._runtime.transport import MpiCluster  # noqa: E402

ROUNDS = 4


class Rows:
    """The part of a DDS that a write-back touches: one float64 per slot."""

    _numeric = True
    _dtype = np.dtype(np.float64)
    _shape = ()

    def __init__(self, n: int) -> None:
        self.data = np.zeros(n)

    def rows(self, node: int, slots: np.ndarray) -> np.ndarray:
        return self.data[slots]

    def set_rows(self, node: int, slots: np.ndarray, block: np.ndarray) -> None:
        self.data[slots] = block

    def row_nbytes(self) -> int:
        return 8


def case(world: MPI.Comm) -> None:
    """Rank 0 prints ``OK``; an assertion names the rank and round whose rows were wrong."""
    me, size = world.Get_rank(), world.Get_size()
    assert size == 3, "run with mpiexec -n 3"
    cl = MpiCluster(world)
    dds = Rows(ROUNDS * size)

    def value(r: int, p: int) -> float:
        return 100.0 * r + p + 1

    for r in range(ROUNDS):
        rows = {p: [(dds, np.array([r * size + p]))] for p in range(size)}
        messages = [(p, q, rows[p]) for p in range(size) for q in range(size) if q != p]
        dds.data[r * size + me] = value(r, me)
        cl.exchange(messages)  # type: ignore[arg-type]
        want = [value(q, p) for q in range(r + 1) for p in range(size)]
        got = dds.data[: (r + 1) * size].tolist()
        assert got == want, f"rank {me} after round {r}: {got} != {want}"
    assert cl.traffic.sent_messages == ROUNDS * (size - 1), cl.traffic.snapshot()
    assert cl.traffic.received_messages == ROUNDS * (size - 1), cl.traffic.snapshot()
    world.Barrier()
    if me == 0:
        print("OK", flush=True)


if __name__ == "__main__":
    case(MPI.COMM_WORLD)
