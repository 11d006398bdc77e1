"""Sharded dvectors under mpiexec: each rank holds its home rows of a Python-object
dvector and the rows its tasks touch, and gets every other row from its home when its
reconnaissance, a re-plan, ``map``, ``sync_for`` or a driver read needs it.

``python mpi_shard.py SEED...`` on P ranks runs the programs of :data:`PROGRAMS`
(tests/engine/shard_progs.py) on COMM_WORLD and once per SEED under seeded message
jitter (tests/jitter.py); each rank returns, per run, each program's value and digests,
and what its node holds.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).parents[2]))
import engine as ap  # noqa: E402
from tests.engine import shard_progs  # noqa: E402
from tests.jitter import Jitter  # noqa: E402

#: every kind of step, in orders that leave rows dirty, stale and away from home
PROGRAMS: list[list[tuple[str, int]]] = [
    [("own", 1), ("shift", 7), ("write", 3), ("chase", 1), ("map", 5), ("read", 13)],
    [("chase", 1), ("write", 2), ("chase", 1), ("sync", 1), ("iter", 1), ("put", 11)],
    [("write", 5), ("reduce", 1), ("shift", 3), ("write", 1), ("map", 2), ("chase", 1)],
    [("write", 4), ("lookup", 3), ("write", 2), ("lookup", 3), ("sync", 1), ("lookup", 7)],
]


def run(steps: list[tuple[str, int]], comm: Any) -> dict[str, Any]:
    def fn() -> dict[str, Any]:
        out = shard_progs.program(steps)
        A = next(d for d in ap.current().dds if d.name == "A")
        out["holding"] = shard_progs.holding(A)
        out["record"] = shard_progs.record(A)
        return out

    res = ap.run(fn, comm=comm)
    return {**res.value, "digests": res.digests}


def case(world: MPI.Comm, *seeds: int) -> list[list[dict[str, Any]]]:
    me = world.Get_rank()
    comms = [world] + [Jitter(world, np.random.default_rng([s, me])) for s in seeds]
    return [[run(steps, comm) for steps in PROGRAMS] for comm in comms]


def main() -> int:
    case(MPI.COMM_WORLD, *map(int, sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
