"""Multinomial logistic regression (softmax regression) trained with ``sync_for``.

The serial program is minibatch SGD over the training images; the changes for the
engine are that the images and the weight matrix are DDS and the loop over minibatches
is a ``sync_for``.  ``W`` holds one row per class (64 pixel weights, then the bias),
so each owner aggregates the rows of its classes.  Every epoch logs the training
``loss`` (mean cross-entropy plus the L2 penalty) and the ``test_accuracy`` on the
held-out images, both computed on the driver from the gathered weights, so they are
identical on every rank.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import engine as ap

from .._errors import AppError
from .._params import require_finite
from ._data import digits_split, synthetic_digits, user_split

#: What ``replay run --save`` writes and ``replay export --model`` reads back from a
#: checkpoint: saved array name -> the DDS it is (the rest of ``train``'s ``model`` entry
#: is data the trace does not hold).
MODEL_DDS = {"weights": "W"}
#: Classes of the digits data.
CLASSES = 10
#: The synchronisation models ``-p sync=`` accepts.
SYNC_MODELS = ("bsp", "ssp", "hybrid")
#: How the owners combine the workers' deltas of ``W`` each clock (``-p aggregate=``):
#: ``sum`` (each clock is as many SGD steps as minibatches ran in it, so an epoch makes the
#: same progress on any placement) or ``average`` (one averaged step per clock).
#: Measured on the digits, 10 epochs, against one worker (test accuracy 0.9644, loss
#: 0.1278), BSP, accuracy difference / loss: 2 x 1 sum +0.0000/0.1281, average
#: -0.0022/0.1616; 3 x 1 +0.0000/0.1282 against -0.0134/0.1903; 3 x 2 -0.0067/0.1264
#: against -0.0134/0.1895; 8 x 1 -0.0111/0.1242 against -0.0245/0.3032; 16 x 1
#: -0.0045/0.1291 against -0.0356/0.4362 (one test image is 0.0022).
AGGREGATES = ("sum", "average")
#: Parameters added after traces were recorded, with the value that replays such a trace
#: as it ran (``replay._apps.recorded_params``): before ``aggregate``, deltas were averaged.
ADDED_PARAMS = {"aggregate": "average"}


def summed(deltas: np.ndarray) -> np.ndarray:
    """The workers' deltas of one clock added up, in (node, thread) order."""
    return deltas.sum(axis=0)


def evaluate(W: np.ndarray, X: np.ndarray, y: np.ndarray, reg: float = 0.0) -> tuple[float, float]:
    """(mean cross-entropy + reg/2 * |weights|^2, accuracy) of weights ``W`` on (X, y)."""
    F = X.shape[1]
    z = X @ W[:, :F].T + W[:, F]
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    loss = -float(logp[np.arange(len(y)), y].mean()) + 0.5 * reg * float((W[:, :F] ** 2).sum())
    return loss, float((z.argmax(axis=1) == y).mean())


def train(
    epochs: int = 10,
    minibatch: int = 10,
    lr: float = 0.5,
    sync: str = "bsp",
    staleness: int = 2,
    reg: float = 1e-4,
    re: bool = True,
    per_clock: int = 1,
    aggregate: str = "sum",
    synthetic: bool = False,
    data: str = "",
    test: str = "",
) -> dict[str, Any]:
    """Fit softmax regression with minibatch SGD; logs ``loss`` and ``test_accuracy`` per epoch.

    ``per_clock`` minibatches run on each worker's cache between synchronisations
    (1: every step is averaged across workers).  ``data`` is the user's own table instead
    of the digits (CSV/TSV, NPY/NPZ or LibSVM, integer class labels last; see
    :mod:`apps._tabular`), split 75/25 by a fixed seed, or tested on the table ``test``;
    the result's ``classes`` lists the label of every class index.  ``aggregate`` is how
    the owners combine the workers' deltas each clock: ``sum`` (so that placement does
    not change the progress an epoch makes; see :data:`AGGREGATES`) or ``average``; on
    one worker both are the same bits.
    """
    require_finite("mlr", lr=lr, reg=reg)
    if epochs < 0 or minibatch < 1 or lr <= 0 or reg < 0 or staleness < 0 or per_clock < 1:
        raise AppError(
            "mlr: need epochs >= 0, minibatch >= 1, lr > 0, reg >= 0, staleness >= 0, "
            f"per_clock >= 1 (got {epochs}, {minibatch}, {lr}, {reg}, {staleness}, {per_clock})"
        )
    if test and not data:
        raise AppError("mlr: test needs data (the digits come with their own test split)")
    if sync not in SYNC_MODELS:
        raise AppError(f"mlr: sync must be bsp, ssp or hybrid, got {sync!r}")
    if aggregate not in AGGREGATES:
        raise AppError(f"mlr: aggregate must be sum or average, got {aggregate!r}")
    labels = np.arange(CLASSES)
    if data:
        (Xtr, ytr, Xte, yte), labels = user_split(data, test=test)
    else:
        Xtr, ytr, Xte, yte = synthetic_digits() if synthetic else digits_split()
    F, C = Xtr.shape[1], len(labels)
    D = ap.dvector(len(ytr), shape=(F + 1,), data=np.hstack([Xtr, ytr[:, None]]), name="digits")
    W = ap.dvector(C, shape=(F + 1,), init=ap.init.zeros(), name="W")
    if aggregate == "sum":
        ap.register_aggregation(W, summed)

    def body(batch: ap.Batch) -> None:
        v = batch.values
        x, y = v[:, :F], v[:, F].astype(np.int64)
        Wm = np.stack([W[k] for k in range(C)])
        z = x @ Wm[:, :F].T + Wm[:, F]
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        p[np.arange(len(y)), y] -= 1.0
        p /= len(y)
        grad = np.empty_like(Wm)
        grad[:, :F] = p.T @ x + reg * Wm[:, :F]
        grad[:, F] = p.sum(axis=0)
        new = Wm - lr * grad
        for k in range(C):
            W[k] = new[k]

    loss = acc = float("nan")
    for _ in range(epochs):
        ap.sync_for(
            D,
            minibatch,
            body,
            sync=sync,
            staleness=staleness,
            re=re,
            per_clock=per_clock,
            name="mlr",
        )
        Wm = W.gather()
        loss, _ = evaluate(Wm, Xtr, ytr, reg)
        _, acc = evaluate(Wm, Xte, yte)
        ap.log_objective("loss", loss)
        ap.log_objective("test_accuracy", acc)
    return {
        "train": len(ytr),
        "test": len(yte),
        "loss": loss,
        "test_accuracy": acc,
        # class k of the weights is label classes[k]
        "classes": labels.tolist(),
        # one row per class: 64 pixel weights, then the bias
        "model": {"weights": W},
    }
