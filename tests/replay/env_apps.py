"""Test apps whose outcome depends on the interpreter's environment or on one rank's
Python state (the hash seed decides the iteration order of a set of strings)."""

from __future__ import annotations

import os
import zlib

import engine as ap


def _ordered(words: str, op: str) -> list[str]:
    """The words in an order that depends on ``PYTHONHASHSEED`` (for ``op`` != "sorted")."""
    bag = set(words.split(","))
    if op == "set":
        return list(bag)
    if op == "dict":
        return list(dict.fromkeys(bag))
    if op == "sorted":  # a control: the same order under every hash seed
        return sorted(bag)
    if op == "setops":
        return [w for w in bag | {"zz"} if w != "zz"]
    raise ValueError(f"unknown op {op!r}")


def hash_order(words: str = "alpha,beta,gamma,delta,epsilon", op: str = "set") -> None:
    """Writes rows and sums floats in the iteration order of a set of strings."""
    order = _ordered(words, op)
    X = ap.dvector(len(order), shape=(), name="X")

    def body(j: int) -> None:
        X[j] = float(zlib.crc32(order[j].encode()) % 1000) / 7.0

    ap.async_for(0, len(order), body, name="words")
    acc = 0.0
    for w in order:  # float accumulation: its order changes the rounding and the value
        acc = acc * 0.37 + len(w) / 3.0 + zlib.crc32(w.encode()) % 97
    ap.log_objective("acc", acc)
    ap.log_objective("joined", float(zlib.crc32(",".join(order).encode())))


#: Driver state outside DDS: every MPI rank has its own copy of this list.
_seen: list[float] = []


def rank_state(epochs: int = 2, kind: str = "state") -> None:
    """Logs an objective that may depend on the rank, read without mpi4py (``PMI_RANK``).

    ``kind``: ``state`` (a module-level list gets rank-dependent data on iteration 1),
    ``signed_zero`` (rank 1 logs -0.0, the others 0.0), ``nan`` (NaN everywhere: equal
    bits), ``same`` (a correct SPMD driver).
    """
    rank = int(os.environ.get("PMI_RANK", "0"))
    X = ap.dvector(8, shape=(), name="X")

    def body(j: int) -> None:
        X[j] = X[j] + j

    for it in range(epochs):
        ap.async_for(0, 8, body, name="add")
        value = float(X.gather().sum())
        if kind == "state":
            _seen.append(0.5 * rank if it == 1 else 0.0)
            value += sum(_seen)
        elif kind == "signed_zero":
            value = -0.0 if rank == 1 else 0.0
        elif kind == "nan":
            value = float("nan")
        ap.log_objective("loss", value)


def rank_steps(kind: str = "loops") -> None:
    """A driver whose *operations* depend on the rank (read without mpi4py, ``PMI_RANK``):
    without a check at every operation the ranks wait for each other forever.

    ``kind``: ``loops`` (rank-dependent number of async_for invocations), ``range`` (a
    rank-dependent loop range), ``sync`` (a sync_for that only rank 0 runs), ``reduce``
    (a reduce that only the last rank runs), ``evaluate`` (a rank-dependent metric that
    picks the loop count), ``objective`` (a log_objective only rank 0 makes), ``same``
    (a correct SPMD driver)."""
    rank = int(os.environ.get("PMI_RANK", "0"))
    size = int(os.environ.get("PMI_SIZE", "1"))
    X = ap.dvector(8, shape=(), init=ap.init.zeros(), name="X")
    data = ap.dvector(8, shape=(1,), init=ap.init.zeros(), name="data")

    def body(j: int) -> None:
        X[j] = X[j] + 1.0

    def batch_body(batch: ap.Batch) -> None:
        X[batch.number] = X[batch.number] + 1.0

    n = 1 + (rank if kind == "loops" else 0)
    if kind == "evaluate":
        n = int(ap.evaluate(lambda x: float(x.sum()) + rank, X)) + 1
    for _ in range(n):
        ap.async_for(0, 8 - (rank if kind == "range" else 0), body, name="add")
    if kind == "sync" and rank == 0:
        ap.sync_for(data, 2, batch_body, name="mean")
    if kind == "reduce" and rank == size - 1:
        ap.reduce(X)
    if kind == "objective" and rank == 0:
        ap.log_objective("extra", 1.0)
    ap.log_objective("sum", float(X.gather().sum()))
