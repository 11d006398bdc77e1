"""sync_for's per-clock fast paths keep every message the size the layout says: an owner's
update carries its rows in the parameter's dtype even when a registered aggregation returns
a wider one."""

from __future__ import annotations

import numpy as np
import pytest

import engine as ap

ROWS, N, MB, INVOCATIONS = 6, 40, 4, 2
DATA = np.arange(2.0 * N).reshape(N, 2)


def _program() -> dict[str, np.ndarray]:
    D = ap.dvector(N, shape=(2,), data=DATA, name="D")
    W = ap.dvector(ROWS, shape=(3,), dtype=np.float32, init=ap.init.zeros(), name="W")
    ap.register_aggregation(W, lambda deltas: deltas.astype(np.float64).sum(axis=0))

    def body(batch: ap.Batch) -> None:
        k = batch.number % ROWS
        W[k] = W[k] + np.float32(batch.values.sum() / 7)

    for _ in range(INVOCATIONS):
        ap.sync_for(D, MB, body, name="wide_aggregate")
    return {"W": W.gather(), "replicas": np.stack([W._bufs[p] for p in range(len(W._bufs))])}


def _reference(nodes: int) -> np.ndarray:
    """BSP by hand: clock c runs minibatch c*nodes + p on node p; the float64 sum of the
    float32 deltas is added to the float32 rows (and stored back as float32)."""
    W = np.zeros((ROWS, 3), np.float32)
    values = DATA.reshape(N // MB, MB, 2)
    clocks = -(-(N // MB) // nodes)
    for _ in range(INVOCATIONS):
        for c in range(clocks):
            ms = [m for m in range(c * nodes, (c + 1) * nodes) if m < N // MB]
            deltas = np.zeros((len(ms), ROWS, 3), np.float32)
            for w, m in enumerate(ms):
                k = m % ROWS
                deltas[w, k] = (W[k] + np.float32(values[m].sum() / 7)) - W[k]
            rows = sorted({m % ROWS for m in ms})
            W[rows] = W[rows] + deltas.astype(np.float64).sum(axis=0)[rows]
    return W


@pytest.mark.parametrize("nodes", [1, 2, 3])
def test_an_aggregate_of_a_wider_dtype_keeps_the_update_in_the_rows_dtype(nodes: int) -> None:
    out = ap.run(_program, nodes=nodes).value
    assert out["W"].dtype == np.float32
    assert all(np.array_equal(r, out["replicas"][0]) for r in out["replicas"])  # coherent
    assert np.array_equal(out["W"], _reference(nodes))
    assert out["W"].any()
