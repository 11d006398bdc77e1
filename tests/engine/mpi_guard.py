"""Run under mpiexec: the plan guard's programs on MPI ranks (``python mpi_guard.py T``).

Each program of ``test_guard`` runs on the ranks of COMM_WORLD with T threads; rank 0
prints one JSON object with, per program, whether the result equals a serial loop over
the order the engine reports, the result's bytes (hex) and the serialization orders,
for comparison with the in-process cluster of the same shape.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).parent))
from test_guard import (  # noqa: E402
    _chain_program,
    _flag_program,
    _flag_serial,
    _lasso_data,
    _lasso_program,
)

import engine as ap  # noqa: E402


def case(comm: MPI.Comm, threads: int) -> dict[str, Any]:
    """Per program, what rank 0 prints (every rank returns its own)."""
    out: dict[str, Any] = {}
    init, final, orders = ap.run(_flag_program(), comm=comm, threads=threads).value
    out["flag"] = {
        "serial": final.tobytes() == _flag_serial(init, orders).tobytes(),
        "bytes": final.tobytes().hex(),
        "orders": [o.tolist() for o in orders],
    }
    x, strategy, order = ap.run(_chain_program(), comm=comm, threads=threads).value
    out["chain"] = {"values": x.tolist(), "strategy": strategy, "order": order.tolist()}
    X, y = _lasso_data()
    beta, orders = ap.run(_lasso_program(X, y, 0.05, 120, True), comm=comm, threads=threads).value
    out["lasso"] = {"bytes": beta.tobytes().hex(), "orders": [o.tolist() for o in orders]}
    return out


def main() -> int:
    comm = MPI.COMM_WORLD
    out = case(comm, int(sys.argv[1]))
    if comm.Get_rank() == 0:
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
