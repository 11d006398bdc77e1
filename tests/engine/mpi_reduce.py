"""``ap.reduce`` under mpiexec: every rank prints the bits of ``reduce_cases.program()``
(``reduce_cases.bits``), which must be the in-process cluster's."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mpi4py import MPI  # noqa: E402
from reduce_cases import bits, program  # noqa: E402

import engine as ap  # noqa: E402


def main() -> None:
    comm = MPI.COMM_WORLD
    got = bits(ap.run(program, comm=comm).value)
    print(f"rank {comm.Get_rank()} bits {got}", flush=True)


if __name__ == "__main__":
    main()
