"""Reductions whose bits must not depend on the cluster: shared by the in-process tests
and ``mpi_reduce.py`` (every MPI rank must get the in-process bits).

``program()`` reduces fixed, seeded lists that hold what breaks naive sums (huge
cancellation, mixed magnitudes, subnormals, signed zeros, infinities, NaN, ints beyond
float precision, float64 arrays) and what takes the gathering fold (a user's op, mixed
types, NaN under max); ``bits(results)`` is one line that differs when any result's
bits or type differ."""

from __future__ import annotations

import hashlib
import operator
import random
import struct
from typing import Any

import numpy as np

import engine as ap


def _lists() -> list[tuple[str, list[Any], Any]]:
    rng = random.Random(35)
    big = [rng.uniform(-1, 1) * 10.0 ** rng.randint(-300, 300) for _ in range(300)]
    cancel = big + [-x for x in big] + [1e-310, 3.0, -5e-324]
    rng.shuffle(cancel)
    arrays = [
        np.array([rng.uniform(-1, 1) * 10.0 ** rng.randint(-20, 20) for _ in range(4)])
        for _ in range(100)
    ]
    return [
        ("cancel", cancel, operator.add),
        ("mixed", [1e16, 1.0, 1.0, np.float64(0.1), 3, 2**60 + 1, -1e16] * 10, operator.add),
        ("negzero", [-0.0] * 7, operator.add),
        ("inf", [1.0, np.inf, 2.0], operator.add),
        ("both-inf", [np.inf, 1.0, -np.inf], operator.add),
        ("ints", [2**80, -3, 7] * 20, operator.add),
        ("arrays", arrays, operator.add),
        ("max", [1, 1.0, 3, 3.0, -0.0, 0.0] * 5, max),
        ("min", [0.0, -0.0, 2, 0, 5.5] * 5, min),
        ("own-op", [f"{i}," for i in range(40)], operator.add),
        ("float32", [np.float32(0.1)] * 30 + [0.1], operator.add),
        ("nan-max", [1.0, float("nan"), 2.0] * 5, max),
    ]


def program() -> list[Any]:
    out = []
    for _, values, op in _lists():
        X = ap.dvector(len(values), data=range(len(values)))
        out.append(ap.reduce(X, lambda i, v=values: v[int(i)], op=op))
    return out


def _bits(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return f"{v.dtype}{v.shape}:{v.tobytes().hex()}"
    if isinstance(v, float):
        return f"{type(v).__name__}:{struct.pack('<d', v).hex()}"
    return f"{type(v).__name__}:{v!r}"


def bits(results: list[Any]) -> str:
    return hashlib.blake2b("|".join(map(_bits, results)).encode(), digest_size=12).hexdigest()
