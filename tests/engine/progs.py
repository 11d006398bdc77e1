"""Random loop programs shared by the in-process and MPI serializability tests."""

from __future__ import annotations

import numpy as np

import engine as ap


def make_program(seed: int, n: int = 60, m: int = 12, width: int = 3, max_reads: int = 3):
    """A loop over ``n`` bodies, each reading a few rows of X and Y and writing one or two.

    The arithmetic is non-commutative, so any order other than the plan's would show
    in the final state.  Returns (accesses, program) where program(serial=False) runs
    the loop with async_for and returns (X, Y, order).
    """
    rng = np.random.default_rng(seed)
    reads = [
        [
            (int(rng.integers(2)), int(rng.integers(m)))
            for _ in range(rng.integers(1, max_reads + 1))
        ]
        for _ in range(n)
    ]
    writes = [(int(rng.integers(2)), int(rng.integers(m))) for _ in range(n)]
    extra = [
        (int(rng.integers(2)), int(rng.integers(m))) if rng.random() < 0.3 else None
        for _ in range(n)
    ]

    def program(invocations: int = 2):
        X = ap.dvector(m, shape=(width,), init=ap.init.normal(0, 1), name="X")
        Y = ap.dvector(m, shape=(width,), init=ap.init.normal(0, 1), name="Y")
        D = (X, Y)
        init = (X.gather(), Y.gather())

        def body(j):
            acc = np.full(width, 0.5 + j * 1e-3)
            for d, s in reads[j]:
                acc = acc * 0.9 + np.sin(D[d][s])
            d, s = writes[j]
            D[d][s] = D[d][s] * 0.5 + acc
            if extra[j] is not None:
                d2, s2 = extra[j]
                D[d2][s2] += acc * 0.25

        orders = []
        for _ in range(invocations):
            ap.async_for(0, n, body, name="rand")
            orders.append(ap.last_order("rand"))
        return init, (X.gather(), Y.gather()), orders, ap.plan_of("rand").strategy

    return reads, writes, extra, program


def serial_reference(reads, writes, extra, init, orders, width: int = 3):
    """The same bodies as a plain numpy loop, visiting indices in ``orders``."""
    X, Y = init[0].copy(), init[1].copy()
    D = (X, Y)
    for order in orders:
        for j in order.tolist():
            acc = np.full(width, 0.5 + j * 1e-3)
            for d, s in reads[j]:
                acc = acc * 0.9 + np.sin(D[d][s])
            d, s = writes[j]
            D[d][s] = D[d][s] * 0.5 + acc
            if extra[j] is not None:
                d2, s2 = extra[j]
                D[d2][s2] = D[d2][s2] + acc * 0.25
    return X, Y
