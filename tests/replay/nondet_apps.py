"""Test apps whose unrecorded runs really are non-deterministic."""

from __future__ import annotations

import time

import numpy as np

import engine as ap


def hot_locks(epochs: int = 2, n: int = 600, rows: int = 4) -> None:
    """Every body updates one of a few hot rows: one group, split across the node's
    threads under per-element locks, so grant order decides the result."""
    X = ap.dvector(rows, shape=(3,), init=ap.init.normal(0, 1), name="X")

    def body(j: int) -> None:
        k = j % rows
        v = X[k]
        time.sleep(0)  # let another thread in: interleavings vary from run to run
        X[k] = v * 0.99 + np.sin(j + v)

    for _ in range(epochs):
        ap.async_for(0, n, body, name="hot")
        ap.log_objective("sum", float(np.abs(X.gather()).sum()))


def uses_wall_clock(epochs: int = 2) -> None:
    """A non-deterministic body: it reads the clock."""
    X = ap.dvector(8, shape=(), name="X")

    def body(j: int) -> None:
        X[j] = time.perf_counter_ns() % 1000

    for _ in range(epochs):
        ap.async_for(0, 8, body, name="clock")
