"""Driver programs for the chaos tests (module-level, so MPI ranks can import them)."""

from __future__ import annotations

import numpy as np

import engine as ap


def _data(n: int) -> np.ndarray:
    return np.sin(np.arange(2 * n, dtype=np.float64) * 0.37).reshape(n, 2)


def _mix(W: ap.dvector, v: np.ndarray) -> None:
    """A non-linear update of every row of W: its result depends on what W held."""
    for k in range(len(W)):
        w = W[k]
        W[k] = w + 0.3 * (np.tanh(v * (k + 1) + 2.0 * w) - w)


def ssp_mix(epochs: int = 2, n: int = 120, minibatch: int = 5, staleness: int = 2) -> None:
    """SSP ``sync_for``: what a clock reads depends on which updates it sees."""
    X = ap.dvector(n, shape=(2,), data=_data(n), name="X")
    W = ap.dvector(4, shape=(2,), name="W")

    def body(batch: ap.Batch) -> None:
        _mix(W, batch.values.mean(axis=0))

    for _ in range(epochs):
        ap.sync_for(X, minibatch, body, sync="ssp", staleness=staleness, name="ssp")
        ap.log_objective("sum", float(np.abs(W.gather()).sum()))


def hybrid_mix(epochs: int = 2, n: int = 96, minibatch: int = 4, per_clock: int = 3) -> None:
    """Hybrid ``sync_for``: the result depends on the node mutex order."""
    X = ap.dvector(n, shape=(2,), data=_data(n), name="X")
    W = ap.dvector(4, shape=(2,), name="W")

    def body(batch: ap.Batch) -> None:
        _mix(W, batch.values.mean(axis=0))

    for _ in range(epochs):
        ap.sync_for(X, minibatch, body, sync="hybrid", per_clock=per_clock, name="hybrid")
        ap.log_objective("sum", float(np.abs(W.gather()).sum()))
