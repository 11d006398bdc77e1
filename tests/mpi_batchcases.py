"""Cases for tests/test_mpibatch.py: ``case(comm, what)`` does ``what`` on every rank."""

from __future__ import annotations

import sys
import time
from typing import Any


def case(comm: Any, what: str) -> Any:
    """``what``: ``ok`` returns the rank; ``print`` prints to stdout and stderr; ``raise``
    raises on every rank; ``exit`` exits with a message; ``status`` returns 3 on rank 1;
    ``strand`` raises on rank 1 while rank 0 waits for it; ``sleep`` sleeps 60 s."""
    rank = comm.Get_rank()
    if what == "ok":
        return comm.allgather(rank)
    if what == "print":
        print(f"out {rank}")
        print(f"err {rank}", file=sys.stderr)
        return {"rank": rank}
    if what == "raise":
        raise ValueError(f"bad value on rank {rank}")
    if what == "exit":
        raise SystemExit(f"rank {rank} gives up")
    if what == "status":
        return 3 if rank == 1 else 0
    if what == "strand":
        if rank == 1:
            raise RuntimeError("rank 1 fails before it sends")
        return comm.recv(source=1)
    if what == "sleep":
        time.sleep(60)
    raise AssertionError(what)
