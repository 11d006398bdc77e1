"""A communicator that counts its collective calls: how many times every rank met.

``benchmarks/ring.py`` measures with it how many collectives an ``async_for`` write-back
makes, and ``tests/engine/mpi_ring.py`` checks the same count; both import it from here
(a benchmark may not import tests).  It wraps any mpi4py communicator and needs nothing
of the engine, so it also wraps a baseline tree's run.
"""

from __future__ import annotations

from typing import Any

#: communicator methods that involve every rank (what is counted as a collective)
COLLECTIVES = frozenset(
    "Allreduce allreduce Allgather allgather Allgatherv Alltoall alltoall Barrier barrier "
    "Bcast bcast Gather gather Gatherv Scatter scatter Reduce reduce Ibarrier Iallreduce".split()
)


class Counting:
    """``comm`` that counts its collective calls (and its ``Dup``'s) in ``counts[0]``."""

    def __init__(self, comm: Any, counts: list[int]) -> None:
        self._comm, self.counts = comm, counts

    def Dup(self) -> Counting:  # noqa: N802 - MPI's name
        return Counting(self._comm.Dup(), self.counts)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._comm, name)
        if name not in COLLECTIVES:
            return attr

        def counted(*args: Any, **kw: Any) -> Any:
            self.counts[0] += 1
            return attr(*args, **kw)

        return counted


__all__ = ["COLLECTIVES", "Counting"]
