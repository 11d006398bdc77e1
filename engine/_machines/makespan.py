"""How long a plan takes without global barriers: the critical path through its rounds.

With routed write-back (``routing``) a node need not wait for every node at the end of a
round: it starts round ``s`` as soon as it has finished its own round ``s-1`` and has
received the messages of exchange ``s-1`` addressed to it.  So, with bodies as the unit
of time, node ``p`` finishes round ``s`` at

    finish[s, p] = max(finish[s-1, p], max over messages q -> p of exchange s-1 of
                       finish[s-1, q] + latency) + load[s, p]

and the plan's *makespan* is the latest finish.  ``imbalance`` = makespan / (n / P): 1.0
when every node works all the time.  The figure the planner reported before routing,
sum over rounds of the busiest node's load / (n / P), is what the same plan takes when
every round ends with a barrier (``barrier_imbalance``); it is never smaller.

Pure numpy over a (rounds x nodes) load table and (round, src, dst) message triples.
"""

from __future__ import annotations

import numpy as np


def critical_path(
    loads: np.ndarray,
    rnd: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    *,
    latency: float = 0.0,
) -> float:
    """The makespan of ``loads[s, p]`` (bodies of node ``p`` in round ``s``) when message
    ``k`` leaves node ``src[k]`` after its round ``rnd[k]`` and node ``dst[k]`` may start
    round ``rnd[k] + 1`` only once it arrived, ``latency`` after it left."""
    loads = np.asarray(loads, dtype=np.float64)
    if loads.size == 0:
        return 0.0
    n_rounds = loads.shape[0]
    order = np.argsort(rnd, kind="stable")
    rnd, src, dst = rnd[order], src[order], dst[order]
    bounds = np.searchsorted(rnd, np.arange(n_rounds + 1))
    finish = loads[0].copy()
    for s in range(1, n_rounds):
        ready = finish.copy()
        a, b = bounds[s - 1], bounds[s]
        if b > a:
            np.maximum.at(ready, dst[a:b], finish[src[a:b]] + latency)
        finish = ready + loads[s]
    return float(finish.max())


def on_demand_path(
    loads: np.ndarray,
    rnd: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    use: np.ndarray,
) -> float:
    """The makespan if node ``dst[k]`` waited for message ``k`` only before round
    ``use[k]``, the first round that touches a row it carries (a receive posted where
    it is needed), instead of before round ``rnd[k] + 1``."""
    finish = on_demand_finish(loads, rnd, src, dst, use)
    return float(finish[-1].max()) if finish.size else 0.0


def on_demand_finish(
    loads: np.ndarray,
    rnd: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    use: np.ndarray,
) -> np.ndarray:
    """Per (round, node): when it finishes, as :func:`on_demand_path` times the plan
    (a node starts round ``s`` at ``finish[s] - loads[s]``)."""
    loads = np.asarray(loads, dtype=np.float64)
    if loads.size == 0:
        return np.zeros(loads.shape)
    n_rounds, nodes = loads.shape
    order = np.argsort(use, kind="stable")
    rnd, src, dst, use = rnd[order], src[order], dst[order], use[order]
    bounds = np.searchsorted(use, np.arange(n_rounds + 1))
    finish = np.zeros((n_rounds, nodes))
    finish[0] = loads[0]
    for s in range(1, n_rounds):
        ready = finish[s - 1].copy()
        a, b = bounds[s], bounds[s + 1]
        if b > a:
            np.maximum.at(ready, dst[a:b], finish[rnd[a:b], src[a:b]])
        finish[s] = ready + loads[s]
    return finish


def barrier_makespan(loads: np.ndarray, *, overhead: float = 0.0) -> float:
    """The time of ``loads`` when every round ends with a global barrier costing
    ``overhead``: sum over rounds of the busiest node's load (plus the overheads)."""
    loads = np.asarray(loads, dtype=np.float64)
    if loads.size == 0:
        return 0.0
    return float(loads.max(axis=1).sum() + overhead * loads.shape[0])


__all__ = ["barrier_makespan", "critical_path", "on_demand_finish", "on_demand_path"]
