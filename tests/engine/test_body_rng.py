"""``ap.rng()`` in a loop body is the Philox stream keyed by (seed, operator and
invocation) at counter (index, 0, 0, 0): the same numbers on any node, thread, replay or
serial run, and in traces recorded before the generator was made without numpy's OS
entropy draw.  The failure class: a faster construction that starts another stream
(another key, counter or buffer position) would change every run's bits, so it is
compared with numpy's own constructor over generated seeds, keys and indices (negative
indices wrap, as numpy wraps them) and several distributions."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import engine as ap
from engine._runtime.session import Session

U64 = 2**64 - 1


def numpy_own(seed: int, op_key: int, index: int) -> np.random.Generator:
    return np.random.Generator(np.random.Philox(key=[seed & U64, op_key], counter=[index, 0, 0, 0]))


@given(
    seed=st.integers(0, 2**70),
    op_key=st.integers(0, U64),
    index=st.integers(-(2**40), 2**62),
    n=st.integers(1, 9),
)
def test_a_bodys_generator_is_numpys_philox_stream(seed: int, op_key: int, index: int, n: int):
    sess = Session.__new__(Session)  # only what body_rng reads
    sess.seed, sess._rng_key = seed, None
    ours, theirs = sess.body_rng(op_key, index), numpy_own(seed, op_key, index)
    for _ in range(2):  # a second round starts from a partly used buffer
        assert ours.random(n).tobytes() == theirs.random(n).tobytes()
        assert ours.integers(0, 2**40, n).tobytes() == theirs.integers(0, 2**40, n).tobytes()
        assert ours.normal(size=n).tobytes() == theirs.normal(size=n).tobytes()
        assert ours.integers(0, 7, dtype=np.int32) == theirs.integers(0, 7, dtype=np.int32)
    assert ours.bit_generator.state["state"]["counter"].tolist() == (
        theirs.bit_generator.state["state"]["counter"].tolist()
    )


def test_bodies_draw_the_numbers_they_drew_before():
    """Pinned: the first draws of a seed-7 run's bodies -2..5, as the engine drew them
    before the faster construction (numpy's key for ``draw#0`` has lost its low bits:
    the op key is above 2**63)."""

    def prog() -> list[float]:
        X = ap.dvector(8, shape=(), name="X")

        def body(j: int) -> None:
            X[j + 2] = ap.rng().random()

        ap.async_for(-2, 6, body, name="draw")
        return X.gather().tolist()

    assert ap.run(prog, seed=7).value == [
        0.4046152430361222,
        0.48585093861013506,
        0.091685871461343,
        0.4831589171121973,
        0.3294802046003562,
        0.6505933592669318,
        0.7630297134287668,
        0.5435508075195061,
    ]
