"""``engine.run`` and ``replay.testing`` refuse a cluster shape or seed a trace cannot
hold, at once and naming the argument.

``nodes=10**6`` (a typo, or a number meant for elsewhere) ran an in-process cluster of a
million nodes for many minutes instead of failing; ``seed=-1`` failed inside numpy with
"expected non-negative integer", naming no argument.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine as ap
import tracer
from engine._runtime.transport import MAX_NODES, MAX_THREADS
from replay import testing


def tiny(epochs: int = 1) -> None:
    X = ap.dvector(4, shape=(), name="X")

    def body(j: int) -> None:
        X[j] = X[j] + 1.0

    for _ in range(epochs):
        ap.async_for(0, 4, body, name="inc")


def test_the_engines_bounds_are_the_traces() -> None:
    assert (1, MAX_NODES) == tracer.RUN_LIMITS["ranks"]
    assert (1, MAX_THREADS) == tracer.RUN_LIMITS["threads"]


bad = st.one_of(
    st.builds(lambda n: ("nodes", n), st.integers(MAX_NODES + 1, 10**12) | st.integers(-5, 0)),
    st.builds(lambda n: ("threads", n), st.integers(MAX_THREADS + 1, 10**9) | st.integers(-5, 0)),
    st.builds(lambda n: ("seed", n), st.integers(-(2**70), -1)),
)


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(arg=bad, face=st.sampled_from(["run", "dual", "forward", "backward"]))
def test_an_impossible_shape_or_seed_is_refused_at_once(arg: tuple[str, int], face: str) -> None:
    name, value = arg
    call: Any = ap.run if face == "run" else getattr(testing, face)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=rf"\b{name} must be .*got {value}"):
        call(tiny, **{name: value})
    assert time.monotonic() - t0 < 2.0
