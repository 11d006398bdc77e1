"""A lock-heavy workload: Gauss–Seidel sweeps over a synthetic power-law graph.

Run it as ``replay run benchmarks/gauss_seidel.py:train --ranks 3 --threads 2``.  Every
body updates one vertex from its neighbours, so neighbouring vertices conflict; the
power-law degrees make the conflict graph one giant component, which the planner splits
across threads under per-element locks.  Each body takes its own lock and one per
neighbour, so a few sweeps grant over a million locks (what ``benchmarks/replay.py`` and
``benchmarks/trace.py`` need to measure replay of lock grants).
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


def train(vertices: int = 12000, degree: int = 4, sweeps: int = 10, seed: int = 7) -> dict:
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
        ap.async_for(0, vertices, body, name="gs")
        x = X.gather()[:, 0]
        lap = np.add.reduceat(x[nbr], indptr[:-1]) if len(nbr) else np.zeros(vertices)
        res = float(np.linalg.norm(diag * x - lap - rhs))
        ap.log_objective("residual", res)
    return {"vertices": vertices, "edges": len(nbr) // 2, "residual": res}
