"""Run under mpiexec: a driver whose objective differs between ranks fails on every rank."""

from __future__ import annotations

import sys

from mpi4py import MPI

import engine as ap
from tests.replay.env_apps import rank_state


def case(comm: MPI.Comm) -> None:
    """Rank 0 prints one line per rank and run: ``ok`` or where the ranks diverged."""
    rank = comm.Get_rank()
    lines = []
    for kind in ("same", "nan", "state", "signed_zero", "same"):
        try:
            res = ap.run(rank_state, {"kind": kind}, comm=comm)
            lines.append(f"rank {rank} {kind}: ok {len(res.objectives['loss'])}")
        except ap.DriverDivergenceError as exc:
            lines.append(f"rank {rank} {kind}: diverged at {exc.iteration}: {exc.values}")
    every = comm.gather(lines)  # one writer: ranks' prints would interleave
    if rank == 0:
        print("\n".join(line for part in every for line in part), flush=True)


def main() -> int:
    case(MPI.COMM_WORLD)
    return 0


if __name__ == "__main__":
    sys.exit(main())
