"""Small programs for the time-travel tests: object DDS written by loop bodies."""

from __future__ import annotations

import engine as ap


class Box:
    """Not plain data: a checkpoint must refuse a DDS holding it."""

    def __init__(self, v: int) -> None:
        self.v = v

    def __repr__(self) -> str:
        return f"Box({self.v})"


def objects(epochs: int = 3, plain: bool = True, boxed_from: int = 0) -> None:
    """An object dvector rewritten by every invocation, and a numeric one; unless
    ``plain``, its elements are :class:`Box` objects from invocation ``boxed_from`` on."""
    X = ap.dvector(8, name="X")
    Y = ap.dvector(8, shape=(2,), init=ap.init.zeros(), name="Y")
    for e in range(epochs):
        step = float(e)

        def body(j: int) -> None:  # runs within this iteration: noqa B023 below
            if plain or e < boxed_from:  # noqa: B023
                X[j] = (j, step * 0.5, "s", [j, -0.0])  # noqa: B023
            else:  # a count kept in the box: its value depends on every earlier write
                old = X[j]
                X[j] = Box(j + (old.v if isinstance(old, Box) else 0))
            Y[j] = Y[j] + step  # noqa: B023

        ap.async_for(0, 8, body, name="obj")
        ap.log_objective("total", float(ap.reduce(Y, lambda y: float(y.sum()))))
