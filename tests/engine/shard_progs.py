"""Programs over a sharded dvector of Python objects (tests/engine/test_shard.py, and
under mpiexec tests/engine/mpi_shard.py).

Each step reaches the rows of ``A`` in a way the engine must serve from the node that
holds them, or fetch first: bodies that read their own rows, rows of other homes
(reconnaissance reads a row its node does not hold), rows chosen by a value another
body wrote (the plan goes stale and the guard re-plans), writes of object rows (routed,
left dirty), ``map`` and ``reduce`` whose function reads any row, driver reads, writes
and iteration, and ``sync_for`` over ``A`` whose body reads its minibatch or rows of
other minibatches (which reconnaissance fetched to another node than the one that runs it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

import engine as ap

N = 20
M = 6

KINDS = ("own", "shift", "chase", "write", "map", "reduce", "read", "put", "iter", "sync", "lookup")


def program(steps: list[tuple[str, int]], sharded: bool | None = None) -> dict[str, Any]:
    """Run ``steps`` ((kind, k) pairs); return every value the driver saw and the
    digests' inputs (the gathered DDS)."""
    A = ap.dvector(
        N, data=[(j % N, float(j) * 0.5, f"r{j}") for j in range(N)], name="A", sharded=sharded
    )
    W = ap.dvector(M, shape=(2,), init=ap.init.constant(0.25), name="W")
    idx = ap.dvector(N, shape=(), data=np.arange(N, dtype=np.float64), name="idx")
    seen: list[Any] = []
    for kind, k in steps:
        if kind == "own":  # A by the loop index: home rows in reconnaissance

            def own(j: int) -> None:
                r = A[j]
                W[j % M] = W[j % M] * 0.5 + r[1]

            ap.async_for(0, N, own, name="own")
        elif kind == "shift":  # rows of other homes, from reconnaissance on

            def shift(j: int, k: int = k) -> None:
                r = A[(j + k) % N]
                W[(j + k) % M] = W[(j + k) % M] + r[1] * 0.125

            ap.async_for(0, N, shift, name=f"shift{k}")
        elif kind == "chase":  # a row named by a value ``write`` changes: stale plans

            def chase(j: int) -> None:
                nxt = A[j][0]
                W[j % M] = W[j % M] + A[nxt][1] * 0.0625

            ap.async_for(0, N, chase, name="chase")
        elif kind == "write":  # object rows written: routed, then dirty away from home

            def write(j: int, k: int = k) -> None:
                r = A[j]
                w = float(W[(j + k) % M][0])
                A[j] = ((r[0] + k) % N, round(r[1] * 0.5 + w, 6), r[2])

            ap.async_for(0, N, write, name=f"write{k}")
        elif kind == "map":  # the function reads rows that no loop brought its node
            seen.append(ap.map(idx, lambda i, k=k: A[(int(i) * 7 + k) % N][1]).gather().tolist())
        elif kind == "reduce":
            seen.append(ap.reduce(A, lambda r: r[1], initial=0.0))
        elif kind == "read":
            seen.append(A[k % N])
        elif kind == "put":
            A[k % N] = (k % N, float(k), f"put{k}")
        elif kind == "iter":
            seen.append([r[0] for r in A])
        elif kind == "sync":

            def sync_body(batch: ap.Batch) -> None:
                for key, r in batch:
                    W[int(key) % M] = W[int(key) % M] + r[1] * 0.01

            ap.sync_for(A, 3, sync_body, name="sync")
        elif kind == "lookup":

            def lookup_body(batch: ap.Batch, k: int = k) -> None:
                for key, _ in batch:
                    W[int(key) % M] = W[int(key) % M] + A[(int(key) * 5 + k) % N][1] * 0.01

            ap.sync_for(A, 3, lookup_body, name=f"lookup{k}")
    return {"A": [list(r) for r in A.gather()], "W": W.gather().tolist(), "seen": seen}


def record(A: Any) -> dict[str, list[list[list[int]]]]:
    """Per reason, per node: the rows this process records that node as holding, each
    with its home (an MPI rank keeps another node's rows homed at it only)."""
    from engine._data.dds import homes

    return {
        why: [[[r, h] for r, h in zip(c.tolist(), homes(A, c).tolist(), strict=True)] for c in per]
        for why, per in A._cache.items()
    }


def holding(A: Any) -> list[tuple[int, int, int]]:
    """Per local node: (rows held, home rows, rows the record says it holds away from
    home); and checks that what it holds is its home rows and those."""
    out = []
    for p, buf in A._bufs.items():
        if not isinstance(buf, dict):  # ``sharded=False``: a whole replica
            out.append((len(buf), len(A.owned(p)), len(buf) - len(A.owned(p))))
            continue
        home = set(A.owned(p).tolist())
        record: set[int] = set()
        for per_node in A._cache.values():
            record |= set(per_node[p].tolist())
        assert home <= set(buf), (p, sorted(home - set(buf)))
        assert set(buf) == home | record, (p, sorted(set(buf) ^ (home | record)))
        out.append((len(buf), len(home), len(record)))
    return out
