"""A rotation plan that two bodies leave, in different rounds on different nodes.

``trapped`` is SGD matrix factorisation planned by rotation (the planner's choice for these sizes: one round per node, so a
fast node can run rounds ahead of a slow one).  After the first invocation, two bodies
start writing an element outside their reconnaissance sets: the last body of the last
node in round 0, and in round 1 the first body of a lower node that gets none of the
rows written there.  Without a barrier per round, that node runs round 1 (and hits its
own violation) before it hears that the last node stopped in round 0; the violation
reported must still be the earliest one, (round 0, last node), on every rank and in
every run, and the re-planned result the same bits.

An app for the CLI too (``tests/engine/trapped.py:trapped``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

import engine as ap


def trapped_indices(plan: Any, items: np.ndarray) -> list[int]:
    """The bodies that leave the plan: the last of the last node in round 0, and the
    first in round 1 of the lowest node that gets none of the rows written there (so it
    hears of that stop one exchange late, if at all, and runs round 1)."""
    last = plan.nodes - 1
    out = [int(plan.rounds[0][last][-1].indices[-1])]
    if len(plan.rounds) < 2:
        return out
    seen = np.concatenate([t.indices for t in plan.rounds[0][last]])
    for q in range(last):
        mine = np.concatenate([t.indices for t in plan.rounds[1][q]])
        if not np.isin(items[mine], items[seen]).any():
            return [*out, int(mine[0])]
    return out


def trapped(
    epochs: int = 3,
    n: int = 2000,
    rows: int = 40,
    relaxed: bool = False,
    first: bool = True,
    fail: bool = False,
) -> dict[str, Any]:
    """Run ``epochs`` SGD invocations; the trap is set after the first.  Returns the
    final tables' bytes (hex), the trapped indices and the rotation's rounds.  With
    ``relaxed``, every body also adds to a relaxed DDS (reconciled by a collective after
    every round, which a stopped node must keep joining).  Without ``first`` the round-0
    body is not trapped; with ``fail`` the round-1 body raises instead of leaving the
    plan."""
    rng = np.random.default_rng(7)
    users, items = rng.integers(0, rows, n), rng.integers(0, rows, n)
    W = ap.dvector(rows, shape=(3,), init=ap.init.normal(0.3, 0.1), name="W")
    H = ap.dvector(rows, shape=(3,), init=ap.init.normal(0.3, 0.1), name="H")
    trap = ap.dvector(n, shape=(), init=ap.init.zeros(), name="trap")
    Z = ap.dvector(1, shape=(), init=ap.init.zeros(), name="Z")
    tables = [W, H, Z]

    def body(j: int) -> None:
        w, h = W[users[j]], H[items[j]]
        err = 3.0 - w @ h
        W[users[j]] = w + 0.01 * (err * h - 0.05 * w)
        H[items[j]] = h + 0.01 * (err * w - 0.05 * h)
        t = trap[j]
        if t > 1:
            raise ValueError(f"body {j} was told to fail")
        if t > 0:
            Z[0] = Z[0] * 0.5 + w[0]

    if relaxed:
        S = ap.dvector(2, shape=(), init=ap.init.constant(0.5), relaxed=True, name="S")
        tables.append(S)
        sgd = body

        def body(j: int) -> None:
            sgd(j)
            S[j % 2] += 0.001 * (3.0 - W[users[j]] @ H[items[j]])

    trapped: list[int] = []
    rounds = 0
    for e in range(epochs):
        ap.async_for(0, n, body, name="sgd")
        if e == 0:
            plan = ap.plan_of("sgd")
            rounds = len(plan.rounds)
            trapped = trapped_indices(plan, items)
            for k, j in enumerate(trapped):
                if k or first:
                    trap[j] = 2.0 if k and fail else 1.0
        ap.log_objective("z", float(Z.gather()[0]))
    return {
        "tables": [t.gather().tobytes().hex() for t in tables],
        "trapped": trapped,
        "rounds": rounds,
    }
