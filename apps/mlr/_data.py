"""Data for MLR: scikit-learn's digits with a fixed train/test split, synthetic blobs, or
the user's table (``-p data=PATH``, read by :mod:`apps._tabular`).

The digits (1797 8x8 images, 10 classes) ship inside the scikit-learn wheel, so nothing
is downloaded.  Pixels are scaled to [0, 1].  The split is a seeded permutation that
does not depend on the run's seed, so every run trains and tests on the same images;
a user's table is split the same way.
"""

from __future__ import annotations

import numpy as np

from .._errors import AppError, DataFormatError
from .._tabular import class_labels, labels_of, read_table, read_test_table

#: Seed of the train/test permutation (fixed: the split is part of the data set).
SPLIT_SEED = 20240601
#: Share of the images held out for testing.
TEST_FRACTION = 0.25
#: Spread of synthetic samples around their class centre: larger makes classes overlap.
SYNTHETIC_NOISE = 0.35

Split = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def digits_split(test_fraction: float = TEST_FRACTION) -> Split:
    """(train X, train y, test X, test y) of the digits data; X in [0, 1], y in 0..9."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:  # pragma: no cover - scikit-learn is a dependency
        raise AppError(
            "mlr needs scikit-learn for the digits data: pip install scikit-learn "
            "(or pass -p synthetic=true)"
        ) from exc
    d = load_digits()
    return _split(d.data.astype(np.float64) / 16.0, d.target.astype(np.int64), test_fraction)


def synthetic_digits(n: int = 600, features: int = 64, classes: int = 10, seed: int = 0) -> Split:
    """Gaussian blobs shaped like the digits data (features in [0, 1]), split like it."""
    rng = np.random.default_rng(seed)
    centres = rng.random((classes, features))
    y = rng.integers(0, classes, n)
    X = np.clip(centres[y] + rng.normal(0.0, SYNTHETIC_NOISE, (n, features)), 0.0, 1.0)
    return _split(X, y.astype(np.int64), TEST_FRACTION)


def user_split(
    path: str, test_fraction: float = TEST_FRACTION, test: str = ""
) -> tuple[Split, np.ndarray]:
    """(the split of the user's table at ``path``, its labels): labels are the table's
    integer targets in sorted order, and class ``k`` of the split is label ``labels[k]``.
    With ``test`` (the user's test table) every row of ``path`` trains."""
    table = read_table(path, "mlr")
    y, labels = class_labels(table, "mlr")
    if test:
        held = read_test_table(test, "mlr", table.X.shape[1])
        return (table.X, y, held.X, labels_of(held, labels, "mlr")), labels
    split = _split(table.X, y, test_fraction)
    if len(split[1]) == 0 or len(split[3]) == 0:
        raise DataFormatError(
            f"mlr: data {path!r} has {len(y)} rows; need at least 3 to hold out a "
            f"{test_fraction:.0%} test set"
        )
    return split, labels


def _split(X: np.ndarray, y: np.ndarray, test_fraction: float) -> Split:
    if not 0.0 < test_fraction < 1.0:
        raise AppError(f"mlr: test fraction must be in (0, 1), got {test_fraction}")
    perm = np.random.default_rng(SPLIT_SEED).permutation(len(y))
    n_test = int(round(len(y) * test_fraction))
    test, train = perm[:n_test], perm[n_test:]
    return X[train], y[train], X[test], y[test]


__all__ = ["SPLIT_SEED", "TEST_FRACTION", "digits_split", "synthetic_digits", "user_split"]
