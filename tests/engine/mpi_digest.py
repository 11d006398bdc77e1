"""Digests of numeric DDS against their definition, in process or under mpiexec.

Rank 0 prints ``OK <digests>``: the digest of each DDS must be blake2b-128 of its head and
the bytes of the array ``gather()`` returns, whatever the placement (a dvector's
contiguous runs, a rank that owns no rows, a dmap whose owners interleave).
"""

from __future__ import annotations

import hashlib

import numpy as np

import engine as ap


def expected(d: ap.dvector | ap.dmap, head: bytes) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{d.kind}:{d.name}:{d.shape}:{np.dtype(d._dtype).str}".encode() + head)
    h.update(np.ascontiguousarray(d.gather()).tobytes())
    return h.hexdigest()


def prog() -> list[str]:
    out = []
    ds = [
        (ap.dvector(7, shape=(3,), init=ap.init.normal(0, 1), name="W"), b"7"),
        (ap.dvector(2, shape=(), dtype=np.int64, name="tiny"), b"2"),  # fewer rows than ranks
        (ap.dvector(5, shape=(2, 2), dtype=np.float32, name="f32"), b"5"),
    ]
    keys = [f"k{i}" for i in range(9)]
    M = ap.dmap(shape=(2,), keys=keys, name="M")
    ds.append((M, repr(M._keys).encode()))

    def body(i: int) -> None:
        W, T, F = ds[0][0], ds[1][0], ds[2][0]
        W[i] = W[i] * 2.0 + i
        T[i % 2] = T[i % 2] + i
        F[i % 5] = F[i % 5] + np.float32(i)
        M[keys[i]] = M[keys[i]] + i

    for _ in range(2):
        ap.async_for(0, 7, body, name="upd")
        for d, head in ds:
            got, want = d.digest(), expected(d, head)
            if got != want:
                raise SystemExit(f"{d.name}: digest {got} != definition {want}")
            out.append(got)
    return out


if __name__ == "__main__":
    from mpi4py import MPI

    res = ap.run(prog, comm=MPI.COMM_WORLD)  # every rank checks its digests itself
    if MPI.COMM_WORLD.Get_rank() == 0:
        print("OK", ",".join(res.value))
