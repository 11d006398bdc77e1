"""Test apps whose unrecorded runs really are non-deterministic."""

from __future__ import annotations

import random
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


#: Longest sleep of one sync_for body (seconds): random per body, from a generator of its
#: own (seeded from the OS), so only the timing differs between runs.  Not the global
#: ``random`` module: the closure guard stops a body drawing from that.
SLEEP_S = 0.006
JITTER = random.Random()


def _sync_data(n: int) -> np.ndarray:
    return np.sin(np.arange(2 * n, dtype=np.float64) * 0.37).reshape(n, 2)


def _mix(W: ap.dvector, v: np.ndarray) -> None:
    """A non-linear update of every row of W: its result depends on what W held."""
    for k in range(len(W)):
        w = W[k]
        W[k] = w + 0.3 * (np.tanh(v * (k + 1) + 2.0 * w) - w)


def ssp_delays(epochs: int = 2, n: int = 480, minibatch: int = 10, staleness: int = 2) -> None:
    """SSP ``sync_for`` whose bodies sleep a random time: which updates a clock sees
    depends on how far the nodes drift apart, so the result does too."""
    X = ap.dvector(n, shape=(2,), data=_sync_data(n), name="X")
    W = ap.dvector(4, shape=(2,), name="W")

    def body(batch: ap.Batch) -> None:
        time.sleep(JITTER.random() * SLEEP_S)
        _mix(W, batch.values.mean(axis=0))

    for _ in range(epochs):
        ap.sync_for(X, minibatch, body, sync="ssp", staleness=staleness, name="ssp")
        ap.log_objective("sum", float(np.abs(W.gather()).sum()))


def hybrid_threads(epochs: int = 2, n: int = 360, minibatch: int = 5, per_clock: int = 4) -> None:
    """Hybrid ``sync_for``: a node's threads share one cache and take turns on the node
    mutex in whatever order the scheduler gives, so the result depends on that order."""
    X = ap.dvector(n, shape=(2,), data=_sync_data(n), name="X")
    W = ap.dvector(4, shape=(2,), name="W")

    def body(batch: ap.Batch) -> None:
        time.sleep(JITTER.random() * SLEEP_S / 6)
        _mix(W, batch.values.mean(axis=0))

    for _ in range(epochs):
        ap.sync_for(X, minibatch, body, sync="hybrid", per_clock=per_clock, name="hybrid")
        ap.log_objective("sum", float(np.abs(W.gather()).sum()))
