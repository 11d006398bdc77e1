"""Gauss–Seidel workloads over a synthetic power-law graph.

Every body updates one vertex from its neighbours, so neighbouring vertices conflict, and
the power-law degrees make the conflict graph one giant component.

* ``train`` — a lock-heavy linear solve: ``replay run benchmarks/gauss_seidel.py:train
  --ranks 3 --threads 2``.  Its default ``strategy=components`` keeps the giant component
  on one node, split across threads under per-element locks: each body takes its own lock
  and one per neighbour, so a few sweeps grant over a million locks (what
  ``benchmarks/replay.py`` and ``benchmarks/trace.py`` need to measure replay of lock
  grants).  ``-p strategy=auto`` lets the planner choose colouring instead.
* ``propagate`` — label propagation with a label-compatibility matrix (LinBP-style), the
  planner's own choice (colouring: each colour class is a round of independent vertices
  spread over every node): ``replay run benchmarks/gauss_seidel.py:propagate --ranks 2``.
  ``benchmarks/colouring.py`` measures its 2-rank / 1-rank sweep time.
"""

from __future__ import annotations

import numpy as np

import engine as ap


def power_law_graph(n: int, m: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR (indptr, neighbours) of an undirected graph whose degrees follow a power law:
    each vertex links to ``m`` earlier vertices chosen with probability ~ 1/rank
    (a seeded, vectorised stand-in for preferential attachment)."""
    rng = np.random.default_rng(seed)
    src = np.repeat(np.arange(1, n), m)
    # targets ~ Zipf over earlier vertices: u * src**(k) with k near 1 favours low ids
    dst = np.floor(src * rng.random(len(src)) ** 2.5).astype(np.int64)
    a = np.concatenate([src, dst])
    b = np.concatenate([dst, src])
    keep = a != b
    pairs = np.unique(np.stack([a[keep], b[keep]], axis=1), axis=0)
    indptr = np.searchsorted(pairs[:, 0], np.arange(n + 1))
    return indptr.astype(np.int64), pairs[:, 1].astype(np.int64)


def train(
    vertices: int = 12000,
    degree: int = 4,
    sweeps: int = 10,
    seed: int = 7,
    strategy: str = "components",
) -> dict:
    """Solve (D + L) x = b with ``sweeps`` Gauss–Seidel sweeps; logs the residual norm."""
    indptr, nbr = power_law_graph(vertices, degree, seed)
    deg = np.diff(indptr).astype(np.float64)
    rhs = np.random.default_rng(seed + 1).random(vertices)
    X = ap.dvector(vertices, shape=(1,), init=ap.init.zeros(), name="x")
    neighbours = [nbr[indptr[v] : indptr[v + 1]].tolist() for v in range(vertices)]
    diag = deg + 1.0

    def body(v: int) -> None:
        s = rhs[v]
        for u in neighbours[v]:
            s += X[u][0]
        X[v] = np.array([s / diag[v]])

    res = float("nan")
    for _ in range(sweeps):
        ap.async_for(0, vertices, body, name="gs", strategy=strategy)
        x = X.gather()[:, 0]
        lap = np.add.reduceat(x[nbr], indptr[:-1]) if len(nbr) else np.zeros(vertices)
        res = float(np.linalg.norm(diag * x - lap - rhs))
        ap.log_objective("residual", res)
    return {"vertices": vertices, "edges": len(nbr) // 2, "residual": res}


def propagate(
    vertices: int = 20000,
    degree: int = 4,
    labels: int = 16,
    sweeps: int = 5,
    alpha: float = 0.2,
    seed: int = 7,
    strategy: str = "auto",
) -> dict:
    """Label propagation by Gauss–Seidel sweeps: each vertex's label distribution becomes
    the compatibility-weighted mean of its neighbours', pulled towards its prior (one-hot
    on 5% seed vertices, uniform elsewhere).  Logs ``change``, the L1 change of a sweep."""
    if vertices < 2 or degree < 1 or labels < 2 or sweeps < 0 or not 0.0 <= alpha <= 1.0:
        raise ValueError(
            "propagate needs vertices >= 2, degree >= 1, labels >= 2, sweeps >= 0 and "
            f"0 <= alpha <= 1 (got {vertices}, {degree}, {labels}, {sweeps}, {alpha})"
        )
    indptr, nbr = power_law_graph(vertices, degree, seed)
    rng = np.random.default_rng(seed + 1)
    prior = np.full((vertices, labels), 1.0 / labels)
    seeded = rng.random(vertices) < 0.05
    prior[seeded] = np.eye(labels)[rng.integers(0, labels, int(seeded.sum()))]
    # a row-stochastic compatibility matrix: mostly "same label", some mixing
    compat = 0.7 * np.eye(labels) + 0.3 * rng.dirichlet(np.ones(labels), labels)
    F = ap.dvector(vertices, shape=(labels,), init=lambda _r, _s, dt: prior.astype(dt), name="F")
    neighbours = [nbr[indptr[v] : indptr[v + 1]].tolist() for v in range(vertices)]
    inv_deg = 1.0 / np.maximum(np.diff(indptr), 1)

    def body(v: int) -> None:
        acc = np.zeros(labels)
        for u in neighbours[v]:
            acc += F[u]
        p = (1.0 - alpha) * (compat.T @ (acc * inv_deg[v])) + alpha * prior[v]
        F[v] = p / p.sum()

    before = F.gather()
    change = float("nan")
    for _ in range(sweeps):
        ap.async_for(0, vertices, body, name="lp", strategy=strategy)
        after = F.gather()
        change = float(np.abs(after - before).sum())
        ap.log_objective("change", change)
        before = after
    return {"vertices": vertices, "edges": len(nbr) // 2, "change": change}
