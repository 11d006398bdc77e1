"""Digests of numeric DDS against their definition, in process or under mpiexec.

Rank 0 prints ``OK <digests>``: the digest of each DDS must be the run's hash (argv[1]:
``xxh3-chunks``, ``xc:`` and the xxh3-128 of the head, the length and the xxh3-128 of
each 8 KiB chunk; ``xxh3-128``, written ``x3:`` and 32 hex digits; or ``blake2b-128``,
32 bare hex digits) of its head and the bytes of the array ``gather()`` returns, whatever
the placement (a dvector's contiguous runs, a rank that owns no rows, a dmap whose owners
interleave, a dvector whose ranks' rows end inside a chunk).
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

import numpy as np
import xxhash

import engine as ap
from engine._runtime.session import current

#: the hash a digest is made with (set from argv in a job)
KIND = "xxh3-chunks"


def expected(d: ap.dvector | ap.dmap, head: bytes) -> str:
    text = f"{d.kind}:{d.name}:{d.shape}:{np.dtype(d._dtype).str}".encode() + head
    data = np.ascontiguousarray(d.gather()).tobytes()
    if KIND == "xxh3-chunks":
        size = 8192
        chunks = [xxhash.xxh3_128_digest(data[a : a + size]) for a in range(0, len(data), size)]
        return "xc:" + xxhash.xxh3_128_hexdigest(
            text + len(data).to_bytes(8, "little") + b"".join(chunks)
        )
    if KIND == "xxh3-128":
        return "x3:" + xxhash.xxh3_128(text + data).hexdigest()
    return hashlib.blake2b(text + data, digest_size=16).hexdigest()


def prog() -> list[str]:
    out = []
    ds = [
        (ap.dvector(7, shape=(3,), init=ap.init.normal(0, 1), name="W"), b"7"),
        (ap.dvector(2, shape=(), dtype=np.int64, name="tiny"), b"2"),  # fewer rows than ranks
        (ap.dvector(5, shape=(2, 2), dtype=np.float32, name="f32"), b"5"),
        # 3001 rows of 56 bytes: 20.5 chunks, every rank's rows end inside a chunk
        (ap.dvector(3001, shape=(7,), init=ap.init.normal(0, 1), name="big"), b"3001"),
    ]
    keys = [f"k{i}" for i in range(9)]
    M = ap.dmap(shape=(2,), keys=keys, name="M")
    ds.append((M, repr(M._keys).encode()))

    def body(i: int) -> None:
        W, T, F, B = ds[0][0], ds[1][0], ds[2][0], ds[3][0]
        W[i] = W[i] * 2.0 + i
        T[i % 2] = T[i % 2] + i
        F[i % 5] = F[i % 5] + np.float32(i)
        M[keys[i]] = M[keys[i]] + i
        B[i * 428] = B[i * 428] + i

    sess = current()
    for inv in range(2):
        ap.async_for(0, 7, body, name="upd")
        # the digests taken after the invocation, every DDS in one go (one Gatherv under
        # MPI), and each DDS's own: both must be the definition's
        taken = {e["dds"]: e["digest"] for e in sess.digests if e["invocation"] == inv}
        for d, head in ds:
            got, want = d.digest(), expected(d, head)
            if got != want or taken[d.name] != want:
                raise SystemExit(f"{d.name}: digest {got}, {taken[d.name]} != definition {want}")
            out.append(got)
    return out


def case(comm: Any, kind: str) -> None:
    """Rank 0 prints ``OK <digests>``; a digest that is not its definition exits."""
    global KIND
    KIND = kind
    res = ap.run(prog, comm=comm, digest=KIND)  # every rank checks its digests itself
    if comm.Get_rank() == 0:
        print("OK", ",".join(res.value))


if __name__ == "__main__":
    from mpi4py import MPI

    case(MPI.COMM_WORLD, sys.argv[1])
