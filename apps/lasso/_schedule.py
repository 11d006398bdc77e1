"""The STRADS scheduler for coordinate descent: priority sampling and a dependency check.

Both are pure functions of numpy arrays and a generator, so the driver (every rank,
identically) calls them, and tests call them by hand.

* :func:`priorities`: coordinate ``j`` is drawn with probability growing with
  ``|delta_j|``, the change of its last update, plus a floor that keeps every coordinate
  in play (a coordinate that stayed at zero may need to move once others did).
* :func:`next_change`: the change each coordinate's next update would make, from the
  gradient ``X^T r / n`` the driver's optimality check computes anyway.  Drawing by it
  (``priority=next``) puts the coordinates furthest from their optimum first and leaves
  out the ones an update would not move (a coordinate at zero inside ``[-alpha, alpha]``),
  where STRADS's last change is a stale guess of it that needs a floor to find them.
* :func:`independent`: greedily, in draw order, a candidate joins the round only if its
  correlation with every coordinate already in the round is below the threshold.  Updating
  strongly correlated coordinates from the same residual overshoots (the parallel
  coordinate-descent divergence that STRADS's dependency check avoids).
"""

from __future__ import annotations

import numpy as np


def priorities(change: np.ndarray, floor: float) -> np.ndarray:
    """Sampling probabilities: ``(1 - floor) * |change| / sum|change| + floor / p``.

    With no change anywhere (nothing updated yet, or converged), every coordinate is
    equally likely."""
    a = np.abs(np.asarray(change, dtype=np.float64))
    total = float(a.sum())
    p = len(a)
    if p == 0:
        return a
    if not np.isfinite(total) or total == 0.0:
        return np.full(p, 1.0 / p)
    prob = (1.0 - floor) * (a / total) + floor / p
    return prob / prob.sum()


def next_change(grad: np.ndarray, beta: np.ndarray, alpha: float) -> np.ndarray:
    """``S(g_j + beta_j, alpha) - beta_j`` per coordinate (``S`` soft-thresholds): what an
    update from the current residual would change ``beta_j`` by, on standardised columns
    (``x_j . x_j / n = 1``).  Zero exactly where the update would leave ``beta_j`` as is."""
    z = grad + beta
    return np.sign(z) * np.maximum(np.abs(z) - alpha, 0.0) - beta


def violation(grad: np.ndarray, beta: np.ndarray, alpha: float) -> float:
    """Largest violation of the Lasso optimality conditions given the gradient
    ``g = X^T r / n``: ``|g_j - alpha sign(beta_j)|`` where ``beta_j != 0``,
    ``max(|g_j| - alpha, 0)`` elsewhere; 0.0 for no coordinates."""
    nz = beta != 0
    v = np.where(nz, np.abs(grad - alpha * np.sign(beta)), np.maximum(np.abs(grad) - alpha, 0.0))
    return float(v.max()) if len(v) else 0.0


def sample(rng: np.random.Generator, prob: np.ndarray, count: int) -> np.ndarray:
    """``count`` distinct coordinates drawn by ``prob`` (all of them when count >= p), in
    draw order."""
    count = min(int(count), len(prob))
    return rng.choice(len(prob), size=count, replace=False, p=prob).astype(np.int64)


def independent(candidates: np.ndarray, X: np.ndarray, threshold: float, limit: int) -> np.ndarray:
    """The round: at most ``limit`` candidates, taken in order, each with
    ``|x_j . x_k| / n < threshold`` against every coordinate taken before it (``X`` has
    standardised columns, so that is the absolute correlation).  Returned sorted."""
    cand = np.asarray(candidates, dtype=np.int64)
    if len(cand) == 0:
        return cand
    cols = X[:, cand]
    corr = np.abs(cols.T @ cols) / X.shape[0]
    blocked = np.zeros(len(cand), dtype=bool)
    taken: list[int] = []
    for a in range(len(cand)):
        if blocked[a]:
            continue
        taken.append(a)
        if len(taken) == limit:
            break
        blocked |= corr[a] >= threshold
    return np.sort(cand[taken])


def correlation_violations(chosen: np.ndarray, X: np.ndarray, threshold: float) -> int:
    """Pairs of distinct coordinates in ``chosen`` whose absolute correlation reaches
    ``threshold`` (what :func:`independent` keeps at zero)."""
    cols = X[:, np.asarray(chosen, dtype=np.int64)]
    corr = np.abs(cols.T @ cols) / X.shape[0]
    np.fill_diagonal(corr, 0.0)
    return int(np.count_nonzero(np.triu(corr >= threshold, 1)))


__all__ = [
    "correlation_violations",
    "independent",
    "next_change",
    "priorities",
    "sample",
    "violation",
]
