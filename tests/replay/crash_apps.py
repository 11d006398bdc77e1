"""Apps whose recorded runs crash: the rank that runs body n // 2 kills itself.

The kill happens only while ``CRASH_APPS_KILL=1`` is set (the recording), so a replay
of the crashed trace runs the same code without dying; ``CRASH_APPS_INTERRUPT=1`` makes
that body raise ``KeyboardInterrupt`` instead (a user's Ctrl-C).
"""

from __future__ import annotations

import os
import signal

import numpy as np

import engine as ap


def killed(epochs: int = 4, kill_at: int = 0, n: int = 240, rows: int = 30) -> None:
    """SGD-like updates of two row vectors; a rank dies in a body of epoch ``kill_at``
    (``rows`` sizes the vectors, and so the checkpoints)."""
    rng = np.random.default_rng(0)
    pairs = rng.integers(0, rows, size=(n, 2))
    W = ap.dvector(rows, shape=(2,), init=ap.init.normal(0.5, 0.1), name="W")
    H = ap.dvector(rows, shape=(2,), init=ap.init.normal(0.5, 0.1), name="H")
    for epoch in range(epochs):

        def body(j: int) -> None:
            if (
                epoch == kill_at  # noqa: B023
                and j == n // 2
                and os.environ.get("CRASH_APPS_KILL") == "1"
                and ap.current().mode != "recon"
            ):
                os.kill(os.getpid(), signal.SIGKILL)
            if (
                epoch == kill_at  # noqa: B023
                and j == n // 2
                and os.environ.get("CRASH_APPS_INTERRUPT") == "1"
                and ap.current().mode != "recon"
            ):
                raise KeyboardInterrupt  # what Ctrl-C does to a 1-rank run's main thread
            u, i = int(pairs[j, 0]), int(pairs[j, 1])
            w, h = W[u], H[i]
            err = 1.0 - w @ h
            W[u] = w + 0.01 * err * h
            H[i] = h + 0.01 * err * w

        ap.async_for(0, n, body, name="sgd")
        ap.log_objective("norm", float(np.abs(W.gather()).sum()))
