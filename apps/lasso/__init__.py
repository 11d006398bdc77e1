"""Lasso by STRADS-style coordinate descent with ``async_for`` (``replay run lasso``)."""

from __future__ import annotations

from ._app import kkt_violation as kkt_violation
from ._app import objective as objective
from ._app import train as train

__all__ = ["kkt_violation", "objective", "train"]
