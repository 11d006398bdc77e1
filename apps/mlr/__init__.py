"""Multinomial logistic regression on scikit-learn's digits with ``sync_for`` (``replay run mlr``)."""

from __future__ import annotations

from ._app import evaluate as evaluate
from ._app import train as train

__all__ = ["evaluate", "train"]
