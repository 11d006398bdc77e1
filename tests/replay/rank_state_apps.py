"""Drivers that take a number from one rank's Python state and hand it to a loop body.

Each rank computes ``0.1 * (1 + rank)`` where a correct driver would compute one value
for all (an unseeded random number, the time or the process id behave the same way,
only less predictably).  ``where`` says how the body gets it.  Nothing downstream can
tell: each rank's bodies write the rows its node owns, those rows are exchanged as
written, and the objective is a collective, so it is the same on every rank.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

import engine as ap

RANK = int(os.environ.get("PMI_RANK", "0"))
#: Read by :func:`_scaled`, a helper the body calls: a global one call away.
SCALE = 1.0
#: Identical driver writes before the last one, more than the session keeps to name one.
WRITES = 70


@ap.kernel
def _add_kernel(j: int, X: Any, lr: float) -> None:
    X[j] = X[j] + lr


def _scaled(x: float) -> float:
    return x * SCALE


class _Trainer:
    """A bound method as the body: it reads ``self.lr``; ``self.started`` differs per
    rank too, but the body never reads it."""

    def __init__(self, X: Any, lr: float) -> None:
        self.X, self.lr, self.started = X, lr, 1000.0 * RANK

    def step(self, j: int) -> None:
        self.X[j] = self.X[j] + self.lr


def lr_app(where: str = "closure", epochs: int = 2, n: int = 16) -> None:
    """``where``: closure, kernel (a kernel argument), helper (a global a helper reads),
    sync (a ``sync_for`` body), shard (``X`` created from per-rank data, as MPI programs
    load a shard per rank), shard_objects (the same with Python objects), same (one value
    everywhere; the body still captures a per-rank label, which is no number and may
    differ), driver_write (the driver writes a per-rank value to ``X``), map_key (the
    driver inserts a per-rank key), late_write (a per-rank value after 70 identical
    writes), history (the body reads ``len(history)``, a list only rank 0 appends to), method
    (the body is a bound method reading ``self.lr``), aggregation (a ``sync_for`` whose
    aggregation function reads the per-rank number)."""
    global SCALE
    if where == "shard":
        X = ap.dvector(n, shape=(), data=np.full(n, float(RANK)), name="X")
    else:
        X = ap.dvector(n, shape=(), init=ap.init.zeros(), name="X")
    if where == "shard_objects":
        ap.dvector(n, shape=None, data=[{"rank": RANK}] * n, name="O")
    X[n - 1] = float(RANK) if where == "driver_write" else 0.0  # every rank holds a replica
    M = ap.dmap(shape=(2,), name="M")
    if where == "map_key":
        M[f"k{RANK}"] = [1.0, 2.0]
    for k in range(WRITES):  # many identical driver writes, then one that may differ
        M[k] = [float(k), 0.0]
    M[WRITES] = [float(RANK if where == "late_write" else 0), 0.0]
    per_rank = 0.1 * (1 + RANK)
    lr = 0.1 if where in ("same", "helper", "history", "aggregation") else per_rank
    if where == "helper":
        SCALE = 1.0 + RANK
    tag = f"[rank {RANK}]"
    data = ap.dvector(n, shape=(1,), data=np.ones((n, 1)), name="data")
    history: list[int] = []
    for epoch in range(epochs):

        def body(j: int) -> None:
            if j < 0:
                print(tag)  # never runs; a captured string may differ between ranks
            X[j] = X[j] + _scaled(lr) * 0.5 ** len(history)

        def sync_body(batch: Any) -> None:
            X[0] += lr * float(batch.values.sum())

        if where == "kernel":
            ap.async_for(0, n, _add_kernel.bind(X, lr), name="add")
        elif where in ("sync", "aggregation"):
            if where == "aggregation":
                ap.register_aggregation(X, lambda deltas: deltas.sum(axis=0) * per_rank)
            ap.sync_for(data, 4, sync_body, sync="bsp", name="add")
        elif where == "method":
            ap.async_for(0, n, _Trainer(X, lr).step, name="add")
        else:
            ap.async_for(0, n, body, name="add")
        ap.log_objective("s", float(X.gather().sum()))
        if where == "history" and RANK == 0:  # as ``if rank == 0: log(...)`` code does
            history.append(epoch)
