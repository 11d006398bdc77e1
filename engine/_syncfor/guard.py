"""The ``sync_for`` access guard: no access outside a minibatch's reconnaissance rows
goes unnoticed.

With ``re=True`` a worker's cache is refreshed, and its delta taken, only on the rows
reconnaissance saw its minibatches read and write.  A body whose row choice depends
on random draws or parameter values (negative sampling, a flag that flips) may touch
other rows in a later invocation: such a read would be served a stale cached value
and such a write would never reach the owner.  The guard makes every such access a
*violation*, detected at the access itself, in every run:

* each worker lane keeps two boolean masks per parameter DDS (may read, may write),
  holding exactly the rows of the minibatch it is running; switching minibatches
  flips only the rows that differ (minibatches with identical rows share one interned
  array, so a dense body like MLR pays for its masks once per clock);
* the check in the DDS hot path is one dictionary lookup and one mask lookup;
* the first violation of a lane is recorded *before* the access raises, so a body
  that swallows the exception cannot hide it; the rest of the lane's bodies are
  skipped (the clock protocol still runs, so no node waits on another), and the
  invocation is undone or reported by ``_syncfor`` once every node agrees.

A write to a numeric DDS that reconnaissance never saw written (so it is not a
parameter of this layout) is a violation too; writes to the data DDS or to a DDS of
Python objects stay plain errors.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .._errors import AccessOutsideReconError
from .._runtime.session import not_seen

if TYPE_CHECKING:
    from .._data.dds import _DDS
    from .layout import SyncLayout


@dataclass(frozen=True, slots=True)
class Violation:
    """The first access of an invocation outside its reconnaissance rows."""

    minibatch: int
    node: int
    element: str  # e.g. ``E[17]``
    write: bool

    def key(self) -> tuple[int, int]:
        """Order among violations: the lowest minibatch, then the lowest node."""
        return (self.minibatch, self.node)


def violation_error(
    op: str, invocation: int, v: Violation, hint: str = ""
) -> AccessOutsideReconError:
    """The error ``replan="never"`` raises (attributes name every coordinate); ``hint``
    follows the cause (``engine._asyncfor.recon.declared_hint``)."""
    did, what = ("wrote", "write") if v.write else ("read", "read")
    err = AccessOutsideReconError(
        f"sync_for {op!r} invocation {invocation}, minibatch {v.minibatch} (node {v.node}) "
        f"{did} {v.element}, which reconnaissance did not see that minibatch {what}: the "
        "body's rows depend on random draws or parameter values that changed since "
        f"reconnaissance{hint}; use replan='auto' (undo and re-plan), replan='always' "
        "(reconnaissance every invocation) or re=False (move parameters whole)"
    )
    err.op = op  # type: ignore[attr-defined]
    err.invocation = invocation  # type: ignore[attr-defined]
    err.minibatch = v.minibatch  # type: ignore[attr-defined]
    err.node = v.node  # type: ignore[attr-defined]
    err.element = v.element  # type: ignore[attr-defined]
    err.write = v.write  # type: ignore[attr-defined]
    return err


class NodeViolations:
    """The violations of one node in one attempt (shared by its lanes)."""

    def __init__(self, node: int) -> None:
        self.node = node
        self.first: Violation | None = None
        self._lock = threading.Lock()

    def add(self, v: Violation) -> None:
        with self._lock:
            if self.first is None or v.key() < self.first.key():
                self.first = v


class LaneGuard:
    """The masks of one worker lane (a thread's cache; Hybrid: the node's cache)."""

    def __init__(
        self, layout: SyncLayout, data: _DDS, sink: NodeViolations, op: str, inv: int
    ) -> None:
        self.layout = layout
        self.data_id = data._id
        self.sink = sink
        self.op = op
        self.inv = inv
        params = layout.params
        self.ids = [d._id for d in params]
        self.rmask = {d._id: np.zeros(len(d), dtype=bool) for d in params}
        self.wmask = {d._id: np.zeros(len(d), dtype=bool) for d in params}
        self._r: list[np.ndarray | None] = [None] * len(params)
        self._w: list[np.ndarray | None] = [None] * len(params)
        self._masks = [(k, self.rmask[i], self.wmask[i]) for k, i in enumerate(self.ids)]
        self.minibatch = -1
        #: set at this lane's first violation (or when its node stopped): skip bodies
        self.hit = False

    def enter(self, m: int) -> None:
        """Allow exactly minibatch ``m``'s reconnaissance rows."""
        self.minibatch = m
        reads, writes = self.layout.allowed(m)
        for k, rmask, wmask in self._masks:
            _swap(rmask, self._r, k, reads[k])
            _swap(wmask, self._w, k, writes[k])

    def outside(self, dds: _DDS, key: Any, write: bool) -> Exception | None:
        """Record an access outside the rows; return the error to raise in the body, or
        None when the access is not the guard's business (the caller raises its own)."""
        if dds._id == self.data_id or not dds._numeric:
            return None
        refused = not_seen(
            lambda: dds._desc(key), write, "not in its minibatch's reconnaissance rows"
        )
        if refused is not None:  # a debugger's access, not the body's: count nothing
            return refused
        v = Violation(self.minibatch, self.sink.node, dds._desc(key), write)
        self.hit = True
        self.sink.add(v)
        return violation_error(self.op, self.inv, v)


def _swap(mask: np.ndarray, cur: list[np.ndarray | None], k: int, new: np.ndarray) -> None:
    old = cur[k]
    if old is new:
        return
    if old is not None:
        mask[old] = False
    mask[new] = True
    cur[k] = new


__all__ = ["LaneGuard", "NodeViolations", "Violation", "violation_error"]
