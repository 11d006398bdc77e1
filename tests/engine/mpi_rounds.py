"""Routed write-backs under mpiexec -n 3: every rank sends its row of each round to
every other rank, each receive naming its source.  Prints ``OK`` when every replica holds
every round's rows after every round, and the stop flag travelled as the ring promises.

(A rank can be rounds ahead of another here: no exchange but an attempt's last makes a
collective.  Each receive names its source and MPI keeps one source's messages in order,
so a round-ahead rank's rows are taken a round later.  Before write-backs were routed,
wildcard receives had to tell a round-ahead rank's rows from this round's: a dual test
once reported a false FAIL from that.)
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
    assert cl.agreements == 0, "an exchange that is not an attempt's last made a collective"
    stops(cl, dds, me)
    world.Barrier()
    if me == 0:
        print("OK", flush=True)


def stops(cl: MpiCluster, dds: Rows, me: int) -> None:
    """The stop flag goes where the messages go, and only there; the last exchange tells
    every rank.  Rank 2 stops; in a chain 2 -> 1 -> 0, rank 1 hears of it at once and
    rank 0 one exchange later; a last exchange of no messages still tells everyone."""
    one = [(dds, np.array([0]))]
    heard = [
        cl.exchange([(2, 1, one), (1, 0, one)], stopped=me == 2),  # type: ignore[list-item]
        cl.exchange([(1, 0, one)], stopped=me in (1, 2)),  # type: ignore[list-item]
    ]
    want = {0: [False, True], 1: [True, True], 2: [True, True]}[me]
    assert heard == want, f"rank {me} heard of the stop as {heard}, not {want}"
    assert cl.exchange([], stopped=False, last=True) is False, "nobody stopped in between"
    assert cl.exchange([], stopped=me == 1, last=True) is True, f"rank {me} missed a stop"
    assert cl.agreements == 2, cl.agreements


if __name__ == "__main__":
    case(MPI.COMM_WORLD)
