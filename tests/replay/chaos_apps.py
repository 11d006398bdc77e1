"""Driver programs for the chaos tests (module-level, so MPI ranks can import them)."""

from __future__ import annotations

from typing import Any

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


def bsp_mix(epochs: int = 2, n: int = 96, minibatch: int = 4) -> None:
    """BSP ``sync_for`` where every node adds to the same rows (aggregation matters)."""
    X = ap.dvector(n, shape=(2,), data=_data(n), name="X")
    W = ap.dvector(4, shape=(2,), name="W")

    def body(batch: ap.Batch) -> None:
        _mix(W, batch.values.mean(axis=0))

    for _ in range(epochs):
        ap.sync_for(X, minibatch, body, sync="bsp", name="bsp")
        ap.log_objective("sum", float(np.abs(W.gather()).sum()))


def chain(epochs: int = 2, n: int = 48, rows: int = 12) -> None:
    """``async_for`` whose bodies read a neighbour row and write their own: rows travel
    between nodes every round, and split groups share rows under locks."""
    X = ap.dvector(rows, shape=(), data=np.linspace(0.1, 1.0, rows), name="X")

    def body(j: int) -> None:
        k = j % rows
        X[k] = 0.5 * X[k] + np.sin(X[(k + 1) % rows] + j)

    for _ in range(epochs):
        ap.async_for(0, n, body, name="chain")
        ap.log_objective("sum", float(X.gather().sum()))


def mini_mf(
    epochs: int = 2, users: int = 12, items: int = 10, ratings: int = 90, strategy: str = "rotation"
) -> None:
    """A tiny SGD matrix factorisation: bodies touch a user row and an item row, so the
    planner rotates blocks over rounds and rows travel between nodes between rounds."""
    rng = np.random.default_rng(3)
    u = rng.integers(0, users, ratings)
    i = rng.integers(0, items, ratings)
    r = rng.normal(3.0, 1.0, ratings)
    W = ap.dvector(users, shape=(3,), init=ap.init.normal(0, 0.3), name="W")
    H = ap.dvector(items, shape=(3,), init=ap.init.normal(0, 0.3), name="H")

    def body(j: int) -> None:
        w, h = W[int(u[j])], H[int(i[j])]
        err = r[j] - float(w @ h)
        W[int(u[j])] = w + 0.05 * (err * h - 0.05 * w)
        H[int(i[j])] = h + 0.05 * (err * w - 0.05 * h)

    for _ in range(epochs):
        ap.async_for(0, ratings, body, name="sgd", strategy=strategy)
        ap.log_objective("w", float(np.abs(W.gather()).sum()))


def check(run: Any) -> str | None:
    """``replay chaos --check app``: every logged objective is finite."""
    bad = [k for k, v in run.objectives.items() if not np.all(np.isfinite(v))]
    return f"objective {bad[0]} is not finite" if bad else None
