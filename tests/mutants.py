"""Deliberately broken engine variants (mutants), injected by the test suite.

The dual tests claim to catch real engine bugs; the suite proves it by switching one of
these on and asserting that property-based dual tests fail::

    from tests import mutants

    with mutants.active("skip_writeback"):
        ...  # every in-process run in this block drops rows of its write-backs

A mutant substitutes one driver step that the engine calls through a module or class
attribute; the production code carries no switch for it.  Leaving the block restores the
real step.  Substitution is per process: a test that wanted a mutant on MPI ranks would run
a rank program that enters :func:`active` before calling ``engine.run``.

* ``skip_writeback`` (``InProcessCluster.copy_rows``): the first row of every DDS block of
  a write-back message never reaches its destination (in-process clusters).
* ``drop_barrier`` (``_asyncfor.write_back``): no write-back between rounds; every round's
  writes are exchanged after the last round only.
* ``stale_prefetch`` (``_asyncfor.fetch_rows``): the fetch exchange before an
  invocation's first round is lost (the final write-back of the one before reached the
  rows' homes only), so nodes run on the stale rows they held (in-process clusters).
* ``wrong_lock_order`` (``_asyncfor.locks_to_take``): split groups lock only the elements
  a body writes, not the elements it reads that others in the group write.
* ``aggregate_twice`` (``_syncnode.summation_order``): an owner adds its own delta twice.
* ``reorder_aggregation`` (``_syncnode.summation_order``): an owner sums the nodes' deltas
  in reverse node order, not the fixed order reported and recorded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from engine._asyncfor import loop as _asyncfor
from engine._runtime import transport as _runtime
from engine._syncfor import node as _syncnode

#: The mutants switched on (at most one at a time).
ACTIVE: set[str] = set()

_real_copy_rows = _runtime.InProcessCluster.copy_rows
_real_write_back = _asyncfor.write_back
_real_fetch_rows = _asyncfor.fetch_rows


# ==================================================================== broken steps
def _skip_writeback(cl: Any, dds: Any, src: int, dst: int, slots: np.ndarray) -> None:
    _real_copy_rows(cl, dds, src, dst, slots[1:])


def _drop_barrier(cl: Any, exchanges: list, r: int, *, stopped: bool) -> bool:
    if r == len(exchanges) - 1:
        for messages in exchanges:  # every round's write-back, at the very end
            cl.exchange(messages)
    return stopped


def _stale_prefetch(cl: Any, messages: list) -> None:
    if cl.is_mpi:
        return _real_fetch_rows(cl, messages)
    cl.exchange([])  # the exchange happens, its rows are lost


def _write_locks_only(
    sets: Any, start: int, planned: dict[int, np.ndarray]
) -> dict[int, np.ndarray]:
    return {
        j: np.intersect1d(ids, sets.writes_of(j - start), assume_unique=True)
        for j, ids in planned.items()
    }


def _aggregate_twice(nodes: int, me: int) -> list[int]:
    return [*range(nodes), me]


def _reorder_aggregation(nodes: int, me: int) -> list[int]:
    return list(range(nodes - 1, -1, -1))


#: Per mutant: (owner of the step, attribute name, broken step).
MUTANTS: dict[str, tuple[Any, str, Callable[..., Any]]] = {
    "skip_writeback": (_runtime.InProcessCluster, "copy_rows", _skip_writeback),
    "stale_prefetch": (_asyncfor, "fetch_rows", _stale_prefetch),
    "wrong_lock_order": (_asyncfor, "locks_to_take", _write_locks_only),
    "aggregate_twice": (_syncnode, "summation_order", _aggregate_twice),
    "drop_barrier": (_asyncfor, "write_back", _drop_barrier),
    "reorder_aggregation": (_syncnode, "summation_order", _reorder_aggregation),
}
#: Every mutant the suite knows.
NAMES = tuple(MUTANTS)


@contextlib.contextmanager
def active(name: str) -> Iterator[None]:
    """Substitute mutant ``name``'s broken step inside the ``with`` block."""
    if name not in MUTANTS:
        raise ValueError(f"unknown mutant {name!r}; the suite knows {', '.join(NAMES)}")
    if ACTIVE:
        raise RuntimeError(f"mutant {sorted(ACTIVE)[0]!r} is already active; blocks do not nest")
    owner, attr, broken = MUTANTS[name]
    real = owner.__dict__[attr]
    setattr(owner, attr, broken)
    ACTIVE.add(name)
    try:
        yield
    finally:
        setattr(owner, attr, real)
        ACTIVE.discard(name)


__all__ = ["ACTIVE", "MUTANTS", "NAMES", "active"]
