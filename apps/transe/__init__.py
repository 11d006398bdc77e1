"""TransE knowledge-graph embeddings with ``async_for`` (``replay run transe``)."""

from __future__ import annotations

from ._app import evaluate as evaluate
from ._app import train as train
from ._eval import filtered_ranks as filtered_ranks

__all__ = ["evaluate", "filtered_ranks", "train"]
