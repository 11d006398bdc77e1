"""SGD matrix factorisation on MovieLens-100K (``replay run sgdmf``)."""

from __future__ import annotations

from ._app import rmse as rmse
from ._app import train as train

__all__ = ["rmse", "train"]
