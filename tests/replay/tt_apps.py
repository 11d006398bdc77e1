"""Small programs for the time-travel tests: object DDS written by loop bodies."""

from __future__ import annotations

import numpy as np

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


def merged(epochs: int = 3, n: int = 24) -> None:
    """Elements no single body writes: relaxed counts (merged at round end), a
    ``sync_for`` row (aggregated), next to rows one body writes (``W``)."""
    data = np.column_stack([np.arange(n) % 4, np.linspace(0.0, 1.0, n)])
    X = ap.dvector(n, shape=(2,), data=data, name="X")
    W = ap.dvector(4, shape=(), name="W")
    T = ap.dvector(4, shape=(), dtype=np.int64, relaxed=True, name="T")
    V = ap.dvector(1, shape=(2,), name="V")

    def body(j: int) -> None:
        k = int(X[j][0])
        T[k] += 1
        W[k] = W[k] * 0.5 + X[j][1]

    def step(batch: ap.Batch) -> None:
        V[0] = V[0] + batch.values.mean(axis=0)

    for _ in range(epochs):
        ap.async_for(0, n, body, name="count")
        ap.sync_for(X, 4, step, name="mean")
        ap.log_objective("t", float(T.gather().sum()))


def counted(writers: str = "1,6", n: int = 8, epochs: int = 2) -> None:
    """Bodies ``writers`` (comma-separated indices) each add ``2**j`` to the relaxed
    count ``T[0]``; every body writes its own row of ``W``: one round, so the count
    after an invocation is the round-end merge of every writer's delta."""
    adds = [int(j) for j in writers.split(",") if j]
    T = ap.dvector(1, shape=(), dtype=np.int64, relaxed=True, name="T")
    W = ap.dvector(n, shape=(), name="W")
    for _ in range(epochs):

        def body(j: int) -> None:
            W[j] = W[j] + 1.0
            if j in adds:
                T[0] += 2**j

        ap.async_for(0, n, body, name="count")


def changes(actions: str = "bdn") -> None:
    """Element 1 of a numeric dvector ``X``, an object dvector ``O`` and a map ``M``,
    changed once per epoch as ``actions`` says: ``b`` a loop body writes a new value,
    ``s`` it writes the value it holds, ``d`` the driver writes a new value before the
    loop, ``n`` nothing."""
    X = ap.dvector(4, shape=(), name="X")
    O = ap.dvector(4, name="O")  # noqa: E741
    M = ap.dmap(shape=(), name="M")
    for k in range(4):
        O[k] = ("start", k)
        M[k] = 0.0
    for e, act in enumerate(actions):
        if act == "d":
            X[1], O[1], M[1] = 100.0 + e, ("driver", e), 100.0 + e

        def body(j: int) -> None:
            if j != 1 or act not in "bs":  # noqa: B023
                return
            new = act == "b"  # noqa: B023
            X[j] = float(e + 1) if new else X[j]  # noqa: B023
            O[j] = ("body", e) if new else O[j]  # noqa: B023
            M[j] = float(e + 1) if new else M[j]  # noqa: B023

        ap.async_for(0, 4, body, name="touch")


def fallback(epochs: int = 3, n: int = 8) -> None:
    """Each body writes ``X[P[j]]`` and sets the next body's ``P``: in the first
    invocation a body's target depends on a value written in the same invocation, so
    both plans fail and it runs as a serial fallback (every node, every body); after
    that the targets stay put and a plan holds."""
    X = ap.dvector(2 * n, shape=(), name="X")
    P = ap.dvector(n, shape=(), dtype=np.int64, data=np.arange(n), name="P")
    for _ in range(epochs):

        def body(j: int) -> None:
            t = int(P[j])
            X[t] = X[t] + 1.0 + j
            P[(j + 1) % n] = n + (t + 3) % n

        ap.async_for(0, n, body, name="b")
