"""Driver programs for the dual tests: importable by MPI ranks (module-level functions)."""

from __future__ import annotations

import os

import numpy as np

import engine as ap


def hot_rows(epochs: int = 2, n: int = 60) -> None:
    """A correct program with conflicts: bodies share a few hot rows."""
    X = ap.dvector(4, shape=(2,), init=ap.init.normal(0, 1), name="X")

    def body(j: int) -> None:
        k = j % 4
        X[k] = X[k] * 0.9 + np.sin(j + X[(k + 1) % 4])

    for _ in range(epochs):
        ap.async_for(0, n, body, name="hot")
        ap.log_objective("norm", float(np.abs(X.gather()).sum()))


def rank_noise(epochs: int = 3, n: int = 24) -> None:
    """Wrong on a cluster, right in one process: from the second epoch on the body adds
    noise from an array each rank draws with its own seed (``PMI_RANK``, as per-rank
    seeding code does).  The array holds 80 KB, past ``AGREE_ARRAY_BYTES``, so the ranks'
    step check compares only its dtype and shape (it is data; it belongs in a DDS).  An
    in-process cluster shares the array, so every node adds the same noise; under mpiexec
    each rank's bodies add their own from epoch 1 on, and only the dual test sees it."""
    X = ap.dvector(n, shape=(2,), init=ap.init.normal(0, 1), name="X")
    rank = int(os.environ.get("PMI_RANK", "0"))
    noise = np.zeros(10_000)
    for _ in range(epochs):

        def body(j: int, noise: np.ndarray = noise) -> None:
            X[j] = X[j] * 0.5 + np.sin(j + X[j]) + noise[j]

        ap.async_for(0, n, body, name="decay")
        ap.log_objective("loss", float(np.abs(X.gather()).sum()))
        noise = np.random.default_rng(rank).normal(0.0, 1e-3, size=10_000)


def _parallel() -> bool:
    """True on the parallel side (more than one node), False on the serial side."""
    return ap.current().cluster.size > 1


def zloss_then_acc(epochs: int = 3, n: int = 8, acc_from: int = 2) -> None:
    """Objectives logged as ``zloss`` then ``acc`` (not alphabetical); the parallel
    side's ``zloss`` differs from iteration 1, its ``acc`` from ``acc_from``; the DDS
    never differ."""
    X = ap.dvector(n, shape=(), name="X")
    bump = 1e-9 if _parallel() else 0.0

    def body(j: int) -> None:
        X[j] = X[j] + 1.0

    for it in range(epochs):
        ap.async_for(0, n, body, name="inc")
        total = float(X.gather().sum())
        ap.log_objective("zloss", total + (bump if it >= 1 else 0.0))
        ap.log_objective("acc", total + (bump if it >= acc_from else 0.0))


def objective_then_digest(n: int = 8) -> None:
    """An objective that differs (iteration 0) before the digest of a later invocation
    differs (``inc`` #1): the report must name the objective."""
    X = ap.dvector(n, shape=(), name="X")
    parallel = _parallel()

    def first(j: int) -> None:
        X[j] = X[j] + 1.0

    def second(j: int) -> None:
        X[j] = X[j] + (2.0 if parallel else 1.0)

    ap.async_for(0, n, first, name="inc")
    ap.log_objective("probe", float(X.gather().sum()) + (1e-9 if parallel else 0.0))
    ap.async_for(0, n, second, name="inc")


def differs_in_a_body(epochs: int = 3, n: int = 8) -> None:
    """From the second invocation on, the parallel side's body for index 5 adds a little
    more: a divergence in one body, with its loop index (``inc#1``, index 5)."""
    X = ap.dvector(n, shape=(), name="X")
    parallel = _parallel()
    for it in range(epochs):

        def body(j: int, it: int = it) -> None:
            X[j] = X[j] + (1.0 + 1e-9 if parallel and it >= 1 and j == 5 else 1.0)

        ap.async_for(0, n, body, name="inc")


def token_sgdmf(epochs: int = 1, ratings: int = 3000, rank: int = 8) -> None:
    """SGDMF (``apps.sgdmf``'s epoch and data, no decay) planned with ``strategy="tokens"``."""
    from apps.sgdmf._app import build, epoch, rmse

    A, W, H = build(rank, 0.1, synthetic=True, synthetic_ratings=ratings)
    for _ in range(epochs):
        epoch(A, W, H, 0.02, 0.05, strategy="tokens")
        ap.log_objective("rmse", rmse(A, W, H))
