"""A driver whose execution depends on every mode flag, for the run-mode tests (issue 34).

Each epoch runs an ``async_for`` over a relaxed dvector (relaxation is on in a normal run
and off in checked and test mode, which changes the plan) and a ``sync_for`` (SSP or
Hybrid: staleness and the node mutex order change what a minibatch reads).  Module-level,
so MPI ranks can import it: ``replay run tests/replay/mode_apps.py:train``.

``MODE_APPS_INTERRUPT=K`` (set only while recording the run that must stop) raises
``KeyboardInterrupt`` (what Ctrl-C does) at the start of epoch K, for ``replay resume``.
"""

from __future__ import annotations

import os

import numpy as np

import engine as ap

#: Relaxed slots; body ``j`` adds into slot ``j % SLOTS``.
SLOTS = 3


def train(
    epochs: int = 3, n: int = 24, groups: int = 6, sync: str = "ssp", relaxed: bool = True
) -> None:
    """``epochs`` x (relaxed ``async_for`` "acc" + ``sync_for`` "mix")."""
    X = ap.dvector(n, shape=(2,), name="X")
    Y = ap.dvector(groups, shape=(), name="Y")
    S = ap.dvector(SLOTS, shape=(), init=ap.init.constant(0.5), relaxed=relaxed, name="S")
    D = ap.dvector(
        n, shape=(2,), data=np.sin(np.arange(2 * n, dtype=np.float64) * 0.37).reshape(n, 2),
        name="D",
    )  # fmt: skip
    W = ap.dvector(4, shape=(2,), name="W")

    def acc(j: int) -> None:
        k = j % SLOTS
        X[j] = [S[k], Y[j % groups]]
        S[k] += ap.rng().normal()
        Y[j % groups] += float(S[k])

    def mix(batch: ap.Batch) -> None:
        v = batch.values.mean(axis=0)
        for k in range(len(W)):
            w = W[k]
            W[k] = w + 0.3 * (np.tanh(v * (k + 1) + 2.0 * w + float(S[k % SLOTS])) - w)

    stop = os.environ.get("MODE_APPS_INTERRUPT")
    for epoch in range(epochs):
        if stop is not None and int(stop) == epoch:
            raise KeyboardInterrupt
        ap.async_for(0, n, acc, name="acc", strategy="colouring")
        ap.sync_for(D, 4, mix, sync=sync, staleness=2, name="mix")
        ap.log_objective("S", float(S.gather().sum()))
        ap.log_objective("W", float(np.abs(W.gather()).sum()))
