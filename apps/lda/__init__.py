"""LDA by STRADS-style collapsed Gibbs sampling with ``async_for`` over word blocks and
relaxed topic totals (``replay run lda``)."""

from __future__ import annotations

from ._app import planted_recovery as planted_recovery
from ._app import train as train

__all__ = ["planted_recovery", "train"]
