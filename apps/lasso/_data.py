"""Data for Lasso: scikit-learn's diabetes data, or a synthetic sparse high-dimensional problem.

The diabetes data (442 patients, 10 features) ship inside the scikit-learn wheel, so
nothing is downloaded.  The synthetic problem has far more features than samples and a
sparse ground truth: ``y = X beta* + noise`` where ``beta*`` has ``nonzeros`` entries.
Its features come in blocks of :data:`BLOCK` that share a latent factor (pairwise
correlation ``rho`` inside a block), so the scheduler's dependency check has real
conflicts to keep apart.  Both are generated from a fixed data seed, never the run's seed,
so every run of a data set trains on the same numbers.
"""

from __future__ import annotations

import numpy as np

from .._errors import AppError

#: Features per correlated block of the synthetic problem.
BLOCK = 10
#: Seed of the synthetic problem (part of the data set, not of the run).
DATA_SEED = 20261125


def diabetes() -> tuple[np.ndarray, np.ndarray]:
    """(X, y) of scikit-learn's diabetes data: 442 x 10 features and the disease progression."""
    try:
        from sklearn.datasets import load_diabetes
    except ImportError as exc:  # pragma: no cover - scikit-learn is a dependency
        raise AppError(
            "lasso needs scikit-learn for the diabetes data: pip install scikit-learn "
            "(or pass -p dataset=synthetic)"
        ) from exc
    d = load_diabetes()
    return np.asarray(d.data, dtype=np.float64), np.asarray(d.target, dtype=np.float64)


def synthetic(
    samples: int, features: int, nonzeros: int, rho: float, noise: float, seed: int = DATA_SEED
) -> tuple[np.ndarray, np.ndarray]:
    """(X, y) with ``y = X beta* + noise``; ``beta*`` has ``nonzeros`` entries of size 1..3."""
    rng = np.random.default_rng(seed)
    blocks = -(-features // BLOCK)
    shared = rng.standard_normal((samples, blocks))
    X = np.sqrt(1.0 - rho) * rng.standard_normal((samples, features))
    X += np.sqrt(rho) * np.repeat(shared, BLOCK, axis=1)[:, :features]
    beta = np.zeros(features)
    support = rng.choice(features, size=nonzeros, replace=False)
    beta[support] = rng.choice([-1.0, 1.0], size=nonzeros) * rng.uniform(1.0, 3.0, nonzeros)
    y = X @ beta + noise * rng.standard_normal(samples)
    return X, y


def standardise(X: np.ndarray) -> np.ndarray:
    """Columns with mean 0 and (population) standard deviation 1, so ``x_j . x_k / n``
    is the correlation of features j and k."""
    std = X.std(axis=0)
    flat = np.flatnonzero(std == 0)
    if len(flat):
        raise AppError(
            f"lasso: feature column {int(flat[0]) + 1} is constant (every row has the same "
            "value), so it cannot be standardised; remove it from the data"
        )
    return (X - X.mean(axis=0)) / std


__all__ = ["BLOCK", "DATA_SEED", "diabetes", "standardise", "synthetic"]
