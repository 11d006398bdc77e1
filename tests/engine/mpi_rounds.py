"""Round write-backs under mpiexec -n 3 when a fast rank is already a round ahead.

Rank 2's round-0 rows to rank 0 are held back until rank 1 has sent its round-1 rows to
rank 0, so rank 0 must tell rank 1's round-1 message from rank 2's round-0 message while
it waits for the latter.  (Under load this ordering happens by itself: a dual test once
reported a false FAIL from it.)  Prints ``OK`` when every replica holds every round's
rows after every round.
"""

from __future__ import annotations

import queue
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mpi4py import MPI  # noqa: E402

from engine._runtime.transport import MpiCluster, RoundWrites  # noqa: E402

ROUNDS = 4
SIGNAL = 7


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


class HoldBack:
    """``comm`` whose sends follow the schedule above; everything else passes through.

    Rank 2 hands every send to rank 0 to a thread that makes them, in order, once rank 1
    has sent its round-1 rows to rank 0."""

    def __init__(self, comm: Any, side: Any, rank: int) -> None:
        self._comm, self._side, self._rank = comm, side, rank
        self._exchange = -1
        self._queue: queue.Queue[tuple[np.ndarray, int] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._held_sends)
        if rank == 2:
            self._thread.start()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)

    def _held_sends(self) -> None:
        self._side.recv(source=1, tag=SIGNAL)
        while (item := self._queue.get()) is not None:
            data, tag = item
            self._comm.Isend([data, MPI.BYTE], 0, tag).Wait()

    def Isend(self, buf: Any, dest: int, tag: int) -> Any:  # noqa: N802 - MPI's name
        if self._rank == 2 and dest == 0:
            self._queue.put((np.array(buf[0], copy=True), tag))
            return MPI.REQUEST_NULL
        req = self._comm.Isend(buf, dest, tag)
        if self._rank == 1 and dest == 0:
            self._exchange += 1
            if self._exchange == 1:
                self._side.send(None, dest=2, tag=SIGNAL)
        return req

    def finish(self) -> None:
        if self._rank == 2:
            self._queue.put(None)
            self._thread.join()


def case(world: MPI.Comm) -> None:
    """Rank 0 prints ``OK``; an assertion names the rank and round whose rows were wrong."""
    me, size = world.Get_rank(), world.Get_size()
    assert size == 3, "run with mpiexec -n 3"
    side = world.Dup()
    cl = MpiCluster(world)
    proxy = HoldBack(cl.comm, side, me)
    cl.comm = proxy
    dds = Rows(ROUNDS * size)

    def value(r: int, p: int) -> float:
        return 100.0 * r + p + 1

    for r in range(ROUNDS):
        all_writes = [RoundWrites([(dds, np.array([r * size + p]))]) for p in range(size)]
        dds.data[r * size + me] = value(r, me)
        cl.exchange_rows({me: all_writes[me]}, all_writes)
        want = [value(q, p) for q in range(r + 1) for p in range(size)]
        got = dds.data[: (r + 1) * size].tolist()
        assert got == want, f"rank {me} after round {r}: {got} != {want}"
    proxy.finish()
    world.Barrier()
    if me == 0:
        print("OK", flush=True)


if __name__ == "__main__":
    case(MPI.COMM_WORLD)
