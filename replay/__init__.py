"""Record/replay, dual tests and the ``replay`` command line for the engine."""

from __future__ import annotations

from ._errors import LaunchError as LaunchError
from ._errors import ReplayError as ReplayError
from ._errors import UsageError as UsageError

__all__ = ["LaunchError", "ReplayError", "UsageError"]
