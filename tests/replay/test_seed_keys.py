"""Runs record that their random streams key every seed exactly (run label
``exact_seed_keys``, since 2026-12-07), and a replay keys them as its run did.

Before, numpy rounded a seed of 2**53 or more to 53 bits whenever an invocation's op key
did not fit an int64 (half of them), so nearby large seeds shared streams.  A trace
recorded so (made here with ``exact_seeds=False``) must still replay bit for bit, and a
new run with such a seed must differ from its neighbour's and replay too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import tracer
from replay import _replay as rp
from replay._job import EXACT_SEEDS_LABEL, run_here

PROGRAM = """
import numpy as np
import engine as ap


def draws(n: int = 6, rounds: int = 4):
    X = ap.dvector(n, shape=(), name="X", init=lambda rng, shape, dtype: rng.random(shape))

    def body(j: int) -> None:
        X[j] = X[j] + ap.rng().random()

    for _ in range(rounds):  # op keys of both kinds: below and above 2**63
        ap.async_for(0, n, body, name="draw")
        ap.log_objective("sum", float(np.sum(X.gather())))
    return [float(v) for v in X.gather()]
"""

SEED = 2**60 + 1  # numpy rounded it to 2**60 (as it did 2**60 + 2)


def _record(tmp_path: Path, name: str, seed: int, exact: bool) -> tuple[Path, object]:
    app = tmp_path / "seeded.py"
    app.write_text(PROGRAM)
    trace = tmp_path / f"{name}.sqlite"
    res = run_here(
        {
            "app": f"{app}:draws",
            "nodes": 2,
            "seed": seed,
            "trace": str(trace),
            "exact_seeds": exact,
        }
    )
    return trace, res["result"]


@pytest.mark.parametrize("exact", [False, True], ids=["before", "exact"])
def test_a_large_seeds_run_replays_as_it_drew(tmp_path: Path, exact: bool) -> None:
    trace, _ = _record(tmp_path, "t", SEED, exact)
    with tracer.open(trace) as store:
        assert bool((store.run().info.labels or {}).get(EXACT_SEEDS_LABEL)) is exact
    spec = {"kind": "replay", "mode": "single", "trace": str(trace)}
    assert rp.replay_here(spec)["identical"] is True


def test_neighbouring_large_seeds_draw_apart_only_with_exact_keys(tmp_path: Path) -> None:
    _, old_a = _record(tmp_path, "oa", SEED, False)
    _, old_b = _record(tmp_path, "ob", SEED + 1, False)
    _, new_a = _record(tmp_path, "na", SEED, True)
    _, new_b = _record(tmp_path, "nb", SEED + 1, True)
    assert new_a != new_b
    assert old_a != new_a  # so a replay that ignored the label would diverge
    # the old keys kept the seed only where the op key fits an int64, so these differ too
    assert old_a != old_b
