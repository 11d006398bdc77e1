"""Initialisers for numeric DDS: ``ap.init.normal(0, 0.1)`` and friends.

An initialiser is called once per DDS with a generator seeded from (run seed, DDS
name), so every node, replay and serial run builds the same initial values.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Initializer = Callable[[np.random.Generator, tuple[int, ...], np.dtype], np.ndarray]


def zeros() -> Initializer:
    """All elements zero."""
    return lambda rng, shape, dtype: np.zeros(shape, dtype=dtype)


def constant(value: float) -> Initializer:
    """All elements equal to ``value``."""
    return lambda rng, shape, dtype: np.full(shape, value, dtype=dtype)


def normal(mean: float = 0.0, std: float = 1.0) -> Initializer:
    """Independent normal draws with the given mean and standard deviation."""
    return lambda rng, shape, dtype: rng.normal(mean, std, size=shape).astype(dtype, copy=False)


def uniform(low: float = 0.0, high: float = 1.0) -> Initializer:
    """Independent uniform draws in ``[low, high)``."""
    return lambda rng, shape, dtype: rng.uniform(low, high, size=shape).astype(dtype, copy=False)


__all__ = ["Initializer", "constant", "normal", "uniform", "zeros"]
