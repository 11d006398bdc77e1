"""The built-in apps with a kill switch, for the ``replay resume`` tests.

``RESUME_KILL=RANK:INVOCATION:INDEX`` (set only while recording the run that must
crash) makes rank RANK SIGKILL itself in the INDEX-th loop body (from 0) it runs in the
INVOCATION-th loop invocation of the program (``sync_for``: the INDEX-th minibatch), or
with ``RESUME_KILL_AT=exchange`` as it enters that invocation's INDEX-th routed exchange;
``RESUME_HOW=interrupt`` raises ``KeyboardInterrupt`` there instead (a user's Ctrl-C).  Without it the apps are the built-in
ones, unchanged: the uninterrupted run and the resume run exactly their arithmetic.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import engine as ap


@contextmanager
def _kill_switch() -> Iterator[None]:
    spec = os.environ.get("RESUME_KILL")
    if not spec:
        yield
        return
    rank, inv, index = (int(x) for x in spec.split(":"))
    seen = [0]
    originals = {"async_for": ap.async_for, "sync_for": ap.sync_for}

    def wrap(name: str) -> Callable[..., Any]:
        op = originals[name]

        def call(*args: Any, **kw: Any) -> Any:
            mine = seen[0]
            seen[0] += 1
            if mine != inv:
                return op(*args, **kw)  # the same body object: the cached plan stays valid
            if os.environ.get("RESUME_KILL_AT") == "exchange":
                return _dying_exchange(rank, index, op, args, kw)
            args = list(args)
            k = 2  # the body: async_for(start, stop, body), sync_for(data, minibatch, body)
            body = args[k]
            ran = itertools.count()

            def dying(j: Any) -> Any:
                sess = ap.current()
                if sess.mode != "recon" and sess.cluster.rank == rank and next(ran) == index:
                    if os.environ.get("RESUME_HOW") == "interrupt":
                        raise KeyboardInterrupt  # what Ctrl-C does to a 1-rank run
                    os.kill(os.getpid(), signal.SIGKILL)
                return body(j)

            args[k] = dying
            return op(*args, **kw)

        return call

    ap.async_for = wrap("async_for")  # type: ignore[assignment]
    ap.sync_for = wrap("sync_for")  # type: ignore[assignment]
    try:
        yield
    finally:
        ap.async_for = originals["async_for"]  # type: ignore[assignment]
        ap.sync_for = originals["sync_for"]  # type: ignore[assignment]


def _dying_exchange(rank: int, index: int, op: Callable[..., Any], args: Any, kw: Any) -> Any:
    """``op(*args, **kw)``, in which rank ``rank`` SIGKILLs itself as it enters its
    ``index``-th routed exchange (from 0): the other ranks are inside that exchange,
    waiting for its rows."""
    cluster = ap.current().cluster
    real = cluster.exchange
    calls = itertools.count()

    def exchange(messages: Any, **kw: Any) -> bool:
        if cluster.rank == rank and next(calls) == index:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(messages, **kw)

    cluster.exchange = exchange  # type: ignore[method-assign]
    try:
        return op(*args, **kw)
    finally:
        del cluster.exchange  # the class's method again


def sgdmf(
    epochs: int = 4, rank: int = 4, synthetic: bool = True, kernel: bool = False
) -> dict[str, int]:
    """SGDMF (``async_for``) on 5,000 synthetic ratings; the Python body unless
    ``kernel`` (the kill switch wraps the body of its invocation in a Python function,
    which would run a kernel's Python function there, a mix of both paths)."""
    from apps.sgdmf import train

    with _kill_switch():
        return train(
            epochs=epochs, rank=rank, synthetic=synthetic, synthetic_ratings=5000, kernel=kernel
        )


def mlr(epochs: int = 4, minibatch: int = 50, synthetic: bool = True) -> dict[str, float]:
    """MLR (``sync_for``, BSP) on synthetic digits."""
    from apps.mlr import train

    with _kill_switch():
        return train(epochs=epochs, minibatch=minibatch, synthetic=synthetic)


def stale(epochs: int = 4) -> None:
    """Logs an objective read straight from a DDS in the driver, not through a collective
    operator: fast-forwarding cannot reproduce it, and ``resume`` must say so."""
    with _kill_switch():
        X = ap.dvector(4, shape=(1,), init=ap.init.zeros(), name="X")
        for _ in range(epochs):

            def body(j: int) -> None:
                X[j] = X[j] + 1.0

            ap.async_for(0, 4, body, name="inc")
            ap.log_objective("x0", float(X[0][0]))


def signed_zero(epochs: int = 4) -> None:
    """Logs -0.0, which the trace keeps as 0.0 (SQLite): fast-forwarding logs -0.0 again,
    and ``resume`` must take it for the value the crashed run logged."""
    with _kill_switch():
        X = ap.dvector(4, shape=(1,), init=ap.init.zeros(), name="X")
        for _ in range(epochs):

            def body(j: int) -> None:
                X[j] = X[j] + 1.0

            ap.async_for(0, 4, body, name="inc")
            ap.log_objective("z", -0.0)


def driver_reads(epochs: int = 5, how: str = "reduce", every: int = 2) -> None:
    """A driver that carries state from the DDS across epochs and branches on it: ``how``
    is ``direct`` (``X[0]`` read in the driver), ``reduce``, ``gather`` or ``late`` (a
    direct read only after the last loop); every ``every``-th epoch it runs one more loop
    when the running total is odd (a branch on a value the resume must reproduce)."""
    with _kill_switch():
        X = ap.dvector(6, shape=(), init=ap.init.zeros(), name="X")
        g = 0.0
        for it in range(epochs):
            scale = 1.0 + (int(g) % 3)

            def body(j: int) -> None:
                X[j] = X[j] * 0.5 + scale * (j + 1)  # noqa: B023 - read in this epoch

            ap.async_for(0, 6, body, name="step")
            if how == "direct":
                g = g + float(X[0])
            elif how == "gather":
                g = g + float(X.gather()[0])
            elif how == "reduce":
                g = g + ap.reduce(X, lambda x: float(x))
            if every and it % every == 0 and int(g) % 2 == 1:

                def extra(j: int) -> None:
                    X[j] = X[j] + 0.25

                ap.async_for(0, 6, extra, name="extra")
            ap.log_objective("g", g)
        if how == "late":
            ap.log_objective("last", float(X[0]))


def objects(epochs: int = 5) -> None:
    """Rows of Python objects (a sharded dvector on more than one rank) written in every
    epoch and read across homes, so a resume must restore rows that nodes hold away from
    their home as well as the homes' own."""
    with _kill_switch():
        A = ap.dvector(12, data=[(j, float(j)) for j in range(12)], name="A")
        W = ap.dvector(4, shape=(2,), init=ap.init.constant(0.5), name="W")
        for e in range(epochs):

            def body(j: int, e: int = e) -> None:
                r = A[j]
                A[j] = (r[0], r[1] * 0.5 + float(W[j % 4][0]))
                W[(j + e) % 4] = W[(j + e) % 4] + r[1] * 0.01

            ap.async_for(0, 12, body, name="b")

            def shift(j: int) -> None:
                r = A[(j + 3) % 12]
                W[j % 4] = W[j % 4] * 0.9 + r[1] * 0.001

            ap.async_for(0, 12, shift, name="s")
            ap.log_objective("w", ap.reduce(W, lambda x: float(x.sum())))


def _killable(train: Callable[..., Any]) -> Callable[..., Any]:
    """``train`` (a built-in app) behind the kill switch, with its parameters and their
    types (``-p`` converts by the signature, which ``functools.wraps`` carries over)."""

    @functools.wraps(train)
    def app(*args: Any, **kw: Any) -> Any:
        with _kill_switch():
            return train(*args, **kw)

    return app


#: Every built-in app unchanged (its own parameters and defaults) behind the kill switch:
#: ``resume_apps.py:app_NAME`` (tests/replay/test_timetravel_apps.py).  Made on first
#: use (module ``__getattr__``): every process that loads this file (each MPI rank) would
#: otherwise import all six apps, numba and scipy included, for the one it runs.
_BUILTIN = ("sgdmf", "mlr", "transe", "lasso", "word2vec", "lda")


def __getattr__(name: str) -> Callable[..., Any]:
    app = name.removeprefix("app_")
    if not name.startswith("app_") or app not in _BUILTIN:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    made = _killable(importlib.import_module(f"apps.{app}").train)
    globals()[name] = made
    return made
