"""Small programs for the time-travel tests: object DDS written by loop bodies."""

from __future__ import annotations

import engine as ap


class Box:
    """Not plain data: a checkpoint must refuse a DDS holding it."""

    def __init__(self, v: int) -> None:
        self.v = v

    def __repr__(self) -> str:
        return f"Box({self.v})"


def objects(epochs: int = 3, plain: bool = True) -> None:
    """An object dvector rewritten by every invocation, and a numeric one."""
    X = ap.dvector(8, name="X")
    Y = ap.dvector(8, shape=(2,), init=ap.init.zeros(), name="Y")
    for e in range(epochs):
        step = float(e)

        def body(j: int) -> None:  # runs within this iteration: noqa B023 below
            X[j] = (j, step * 0.5, "s", [j, -0.0]) if plain else Box(j)  # noqa: B023
            Y[j] = Y[j] + step  # noqa: B023

        ap.async_for(0, 8, body, name="obj")
        ap.log_objective("total", float(ap.reduce(Y, lambda y: float(y.sum()))))
