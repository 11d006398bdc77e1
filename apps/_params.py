"""Checks shared by the apps' parameter validation."""

from __future__ import annotations

import math

from ._errors import AppError


def require_finite(app: str, **values: float) -> None:
    """Raise a one-line :class:`AppError` naming the first of ``values`` that is NaN or
    infinite.

    A range check such as ``gamma <= 0`` lets NaN through (every comparison with NaN is
    false), and an infinite rate or prior passes ``> 0``: the run then trained a model of
    NaNs, exited 0, and printed numpy's RuntimeWarnings; a negative infinite scale failed
    inside numpy as the program's own error.  No app parameter means anything when it is
    not finite, so each app checks this before its ranges.
    """
    for name, value in values.items():
        if not math.isfinite(value):
            raise AppError(
                f"{app}: parameter {name}={value!r} is not a finite number; give a finite one"
            )


__all__ = ["require_finite"]
