"""Programs whose dual tests cannot test what they declare (issue 34): a relaxed
dvector used as an exact capacity counter, and SSP least squares."""

from __future__ import annotations

import numpy as np

import engine as ap


def capacity(n: int = 40, slots: int = 10, iterations: int = 1) -> None:
    """Bodies claim a slot while ``claims`` is below ``slots``: serially ``slots`` claims;
    with ``claims`` relaxed, bodies of one round all see the round-start count."""
    claims = ap.dvector(1, shape=(), dtype=np.int64, relaxed=True, name="claims")
    got = ap.dvector(n, shape=(), dtype=np.int64, name="got")

    def body(j: int) -> None:
        if claims[0] < slots:
            claims[0] += 1
            got[j] = 1

    for _ in range(iterations):
        ap.async_for(0, n, body, name="claim")
        ap.log_objective("claims", float(claims.gather()[0]))


def lsq(epochs: int = 3, n: int = 64, minibatch: int = 4, staleness: int = 2) -> None:
    """Least squares by SSP ``sync_for``: the loss depends on which updates a clock sees."""
    rng = np.random.default_rng(0)
    a = rng.normal(size=(n, 3))
    y = a @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=n)
    X = ap.dvector(n, shape=(4,), data=np.column_stack([a, y]), name="X")
    w = ap.dvector(1, shape=(3,), name="w")

    def body(batch: ap.Batch) -> None:
        v = batch.values
        cur = w[0]
        err = v[:, :3] @ cur - v[:, 3]
        w[0] = cur - 0.05 * (v[:, :3].T @ err) / len(v)

    for _ in range(epochs):
        ap.sync_for(X, minibatch, body, sync="ssp", staleness=staleness, name="fit")
        cur = w.gather()[0]
        ap.log_objective("loss", float(np.mean((a @ cur - y) ** 2)))
