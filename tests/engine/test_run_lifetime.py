"""A finished run leaves nothing of itself alive in the process.

A notebook or a test session runs one program after another in one process; a module
cache that kept a run's bodies (hence their closures, hence the run's DDS) kept every
earlier run's data alive: the closure rule's cache of what a body reaches held up to
256 bodies, so a process that ran a model of 1 GB ten times held 10 GB.  Each generated
program below runs twice; once both have ended, nothing may still reach the first run's
session or its DDS.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine as ap


@ap.kernel
def _bump(j: int, X: Any) -> None:
    X[j] = X[j] + 1.0


def _program(kind: str, n: int, refs: list[weakref.ref[Any]]) -> Any:
    def prog() -> float:
        refs.append(weakref.ref(ap.current()))
        X = ap.dvector(n, shape=(2,), init=ap.init.zeros(), name="X")
        refs.append(weakref.ref(X))
        if kind == "async_for":

            def body(i: int) -> None:
                X[i] = X[i] + i

            ap.async_for(0, n, body, name="loop")
        elif kind == "kernel":
            ap.async_for(0, n, _bump.bind(X), name="loop")
        elif kind == "sync_for":
            D = ap.dvector(n, shape=(2,), data=np.ones((n, 2)), name="D")
            refs.append(weakref.ref(D))

            def step(batch: ap.Batch) -> None:
                X[0] = X[0] + batch.values.sum(axis=0)

            ap.sync_for(D, 2, step, name="loop")
        else:  # the pre-training operators run a body too
            Y = ap.map(X, lambda r: r + 1.0, shape=(2,), name="Y")
            refs.append(weakref.ref(Y))
            return float(ap.reduce(Y, lambda r: float(r.sum())))
        return float(X.gather().sum())

    return prog


# every kind, a few placements each: a full collection in a large process (a CI worker
# that has run a thousand tests) costs about a second, and the test pays one per example
@pytest.mark.parametrize("kind", ["async_for", "kernel", "sync_for", "ops"])
@settings(max_examples=4, deadline=None)
@given(
    st.integers(2, 12),
    st.integers(1, 3),
    st.integers(1, 2),
    st.booleans(),
)
def test_nothing_of_a_finished_run_stays_alive(
    kind: str, n: int, nodes: int, threads: int, checked: bool
) -> None:
    first: list[weakref.ref[Any]] = []
    second: list[weakref.ref[Any]] = []
    a = ap.run(_program(kind, n, first), nodes=nodes, threads=threads, checked=checked)
    b = ap.run(_program(kind, n, second), nodes=nodes, threads=threads, checked=checked)
    assert a.value == b.value
    del a, b
    gc.collect()
    alive = [r() for r in first + second if r() is not None]
    assert not alive, f"still alive after both runs ended: {[type(x).__name__ for x in alive]}"
