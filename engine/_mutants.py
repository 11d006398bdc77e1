"""Deliberately broken engine variants (mutants), for the test suite only.

The dual tests claim to catch real engine bugs; the suite proves it by switching one
of these on and asserting that property-based dual tests fail::

    from engine import _mutants

    with _mutants.active("skip_writeback"):
        ...  # every in-process run in this block drops rows of its write-backs

Only tests may touch :data:`ACTIVE`.  In every other run it is empty, and each hook in
the engine is a single set-membership test outside the per-body hot path (once per
round, node-round or clock) that changes nothing.  ``skip_writeback`` and
``stale_prefetch`` act on in-process clusters only (the tests' clusters); the others
also act under MPI.

* ``skip_writeback`` (``_runtime.InProcessCluster.exchange_rows``): the first row of
  every DDS block of a write-back never reaches the other replicas.
* ``drop_barrier`` (``_asyncfor._execute``): no write-back between rounds; every
  round's writes are exchanged after the last round only.
* ``stale_prefetch`` (``_asyncfor._execute``): the last write-back of an invocation
  reaches the owners only, so the next invocation prefetches stale non-owned rows.
* ``wrong_lock_order`` (``_asyncfor._run_threads``): split groups lock only the
  elements a body writes, not the elements it reads that others in the group write.
* ``aggregate_twice`` (``_syncnode.NodeRun.aggregate``): an owner adds its own delta
  twice.
* ``reorder_aggregation`` (``_syncnode.NodeRun.aggregate``): an owner sums the nodes'
  deltas in reverse node order, not the fixed order reported and recorded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ._recon import AccessSets
    from ._runtime import Cluster, RoundWrites

#: Every mutant the engine knows.
NAMES = (
    "skip_writeback",
    "stale_prefetch",
    "wrong_lock_order",
    "aggregate_twice",
    "drop_barrier",
    "reorder_aggregation",
)

#: The mutants switched on (tests only; empty in every real run).
ACTIVE: set[str] = set()


@contextlib.contextmanager
def active(name: str) -> Iterator[None]:
    """Switch mutant ``name`` on inside the ``with`` block (tests only)."""
    if name not in NAMES:
        raise ValueError(f"unknown mutant {name!r}; the engine knows {', '.join(NAMES)}")
    if name in ACTIVE:
        raise RuntimeError(f"mutant {name!r} is already active; blocks do not nest")
    ACTIVE.add(name)
    try:
        yield
    finally:
        ACTIVE.discard(name)


# ================================================================ hook bodies
def skipped(slots: np.ndarray) -> np.ndarray:
    """skip_writeback: the slots of a write-back block that still travel."""
    return slots[1:]


def round_exchange(cl: Cluster, round_writes: list[list[RoundWrites]], r: int) -> None:
    """drop_barrier / stale_prefetch: the write-back after round ``r`` of ``async_for``."""
    last = r == len(round_writes) - 1
    if "drop_barrier" in ACTIVE:
        if not last:
            return
        for rw in round_writes:  # every round's writes, at the very end
            cl.exchange_rows({p: rw[p] for p in cl.local_nodes}, rw)
        return
    if last and not cl.is_mpi:  # stale_prefetch
        _owners_only(cl, round_writes[r])
        return
    cl.exchange_rows({p: round_writes[r][p] for p in cl.local_nodes}, round_writes[r])


def _owners_only(cl: Cluster, writes: list[RoundWrites]) -> None:
    """Copy each node's written rows to their owners only; other replicas stay stale."""
    from ._synclayout import owner_array

    for src in cl.local_nodes:
        for dds, slots in writes[src].per_dds:
            if not len(slots):
                continue
            owners = owner_array(dds, cl.size)[slots]
            for dst in cl.local_nodes:
                sel = owners == dst
                if dst != src and sel.any():
                    vals = dds.rows(src, slots[sel])
                    dds.set_rows(dst, slots[sel], vals)


def write_locks_only(
    sets: AccessSets, start: int, lock_of: dict[int, np.ndarray]
) -> dict[int, np.ndarray]:
    """wrong_lock_order: per body, only the element ids it writes (still sorted)."""
    return {
        j: np.intersect1d(ids, sets.writes_of(j - start), assume_unique=True)
        for j, ids in lock_of.items()
    }


def aggregation_sources(nodes: int, me: int) -> Sequence[int]:
    """aggregate_twice / reorder_aggregation: the nodes whose deltas are summed, in order."""
    if "reorder_aggregation" in ACTIVE:
        srcs: list[Any] = list(range(nodes - 1, -1, -1))
    else:
        srcs = list(range(nodes))
    if "aggregate_twice" in ACTIVE:
        srcs.append(me)
    return srcs


__all__ = [
    "ACTIVE",
    "NAMES",
    "active",
    "aggregation_sources",
    "round_exchange",
    "skipped",
    "write_locks_only",
]
