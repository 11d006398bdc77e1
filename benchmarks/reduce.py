"""Bytes between nodes and time of one ``ap.reduce`` of 100,000 floats, exact (per-node
folds) against the index-order fold over gathered values (``exact_reduce=False``).

Bytes: the transport's traffic counters leave out driver collectives, so this counts
them itself: ``run_on_nodes`` returns each node's object, which under MPI is one
``allgather``, so each node's pickled object crosses to the P - 1 others.  Time: runs of
both kinds interleaved (the machine is shared), median of ``--repeat``; each time is the
whole ``ap.reduce`` call (the function on every element, the fold, the exchange).
Prints one JSON object as its last line.

Under ``mpiexec -n P`` (P > 1) it times the same reduce on the MPI cluster instead, where
the fold's allgather really pickles and sends every value: the slowest rank's seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import engine as ap  # noqa: E402

N = 100_000


def _values() -> list[float]:
    return [math.sin(i) * 10.0 ** (i % 31 - 15) for i in range(N)]


def one(nodes: int, exact: bool, values: list[float]) -> tuple[float, int, Any]:
    """(seconds, bytes crossing, result) of one reduce on ``nodes`` nodes."""
    crossed = [0]

    def prog() -> tuple[float, Any]:
        X = ap.dvector(N, data=range(N))
        cluster = ap.current().cluster
        real = cluster.run_on_nodes

        def counting(fn: Any) -> list[Any]:
            out = real(fn)
            crossed[0] += (nodes - 1) * sum(len(pickle.dumps(v, protocol=5)) for v in out)
            return out

        cluster.run_on_nodes = counting  # type: ignore[method-assign]
        t0 = time.perf_counter()
        got = ap.reduce(X, lambda i: values[int(i)])
        return time.perf_counter() - t0, got

    seconds, got = ap.run(prog, nodes=nodes, exact_reduce=exact).value
    return seconds, crossed[0], got


def on_mpi(comm: Any, repeat: int, values: list[float]) -> dict[str, Any]:
    """Median over ``repeat`` interleaved runs of the slowest rank's reduce seconds."""

    def prog() -> float:
        X = ap.dvector(N, data=range(N))
        comm.Barrier()
        t0 = time.perf_counter()
        ap.reduce(X, lambda i: values[int(i)])
        return float(comm.allreduce(time.perf_counter() - t0, op=MPI_MAX))

    from mpi4py import MPI

    MPI_MAX = MPI.MAX
    times: dict[str, list[float]] = {}
    for _ in range(repeat):
        for exact in (False, True):
            seconds = ap.run(prog, comm=comm, exact_reduce=exact).value
            times.setdefault(
                f"mpi_seconds_p{comm.Get_size()}_{'exact' if exact else 'fold'}", []
            ).append(seconds)
    return {k: round(statistics.median(v), 4) for k, v in times.items()}


def main() -> None:
    ap_ = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap_.add_argument("--repeat", type=int, default=7)
    args = ap_.parse_args()
    values = _values()
    if os.environ.get("PMI_SIZE", "1") != "1":
        from mpi4py import MPI

        got = on_mpi(MPI.COMM_WORLD, args.repeat, values)
        if MPI.COMM_WORLD.Get_rank() == 0:
            print(json.dumps(got))
        return
    out: dict[str, Any] = {"n": N, "fsum": math.fsum(values)}
    for p in (8, 64):
        for exact in (False, True):
            _, nbytes, got = one(p, exact, values)
            out[f"bytes_p{p}_{'exact' if exact else 'fold'}"] = nbytes
            out[f"result_p{p}_{'exact' if exact else 'fold'}"] = got
    times: dict[str, list[float]] = {}
    for _ in range(args.repeat):
        for p in (1, 8):
            for exact in (False, True):
                times.setdefault(f"seconds_p{p}_{'exact' if exact else 'fold'}", []).append(
                    one(p, exact, values)[0]
                )
    out.update({k: round(statistics.median(v), 4) for k, v in times.items()})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
