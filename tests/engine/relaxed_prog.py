"""A driver with relaxed float sums and integer counts, for the relaxed-DDS tests (also run
by the CLI under mpiexec: ``replay run tests/engine/relaxed_prog.py:train``)."""

from __future__ import annotations

from typing import Any

import numpy as np

import engine as ap

#: Relaxed slots; body ``j`` counts into slot ``j % SLOTS``.
SLOTS = 4


def train(
    n: int = 48,
    groups: int = 12,
    iterations: int = 3,
    relaxed: bool = True,
    strategy: str = "colouring",
) -> Any:
    """``iterations`` invocations of ``n`` bodies in ``n // groups`` colouring rounds (bodies
    ``j`` and ``j + groups`` share a row of ``Y``; with ``groups=1`` and ``components`` they
    form one group, split over the threads under element locks).  Each body keeps in
    ``X[j]`` what it saw of the relaxed ``S`` (float sums) and ``C`` (counts), then adds to
    them."""
    X = ap.dvector(n, shape=(2,), name="X")
    Y = ap.dvector(groups, shape=(), name="Y")
    S = ap.dvector(SLOTS, shape=(), init=ap.init.constant(0.5), relaxed=relaxed, name="S")
    C = ap.dvector(SLOTS, shape=(), dtype=np.int64, relaxed=relaxed, name="C")

    def body(j: int) -> None:
        r = ap.rng()
        k = j % SLOTS
        X[j] = [S[k], C[k]]
        S[k] += r.normal()
        S[(k + 1) % SLOTS] -= 0.25 * r.random()
        C[k] += 1
        Y[j % groups] += float(C[k])

    for _ in range(iterations):
        ap.async_for(0, n, body, name="acc", strategy=strategy)
        ap.log_objective("S", float(S.gather().sum()))
        ap.log_objective("C", float(C.gather().sum()))
    return {"X": X.gather(), "S": S.gather(), "C": C.gather(), "plan": ap.plan_of("acc")}
