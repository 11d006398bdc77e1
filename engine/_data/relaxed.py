"""Relaxed DDS: round-start values, per-thread deltas and their reconciliation.

A dvector declared ``relaxed=True`` is left out of ``async_for``'s conflict analysis
(reconnaissance logs none of its accesses), so bodies on different nodes and threads
update it in the same round.  What a body sees and what the round produces:

* at the start of every round each local node keeps ``V``, its replica's values (equal
  on every node: replicas are coherent between rounds);
* with one thread per node, bodies read and write the node's replica directly; with T
  threads, planned thread ``t`` reads and writes its own copy of ``V`` (made at the start
  of the round), so threads never race.  A read therefore returns ``V`` plus the changes
  of the bodies that ran earlier in the round *on the same node and planned thread*;
* at the end of the round a node's delta is ``sum over t of (copy_t - V)``, summed in
  thread order, and every node sets its replica to ``V + (delta_0 + delta_1 + ...)``,
  summed in node order.

The summation order is fixed by construction (node order, then thread order; under MPI
the deltas travel in one ``Allgather``, which delivers them in rank order), and each
thread runs its planned bodies in plan order, so the result never depends on timing:
there is nothing to record, and cluster and single-node replay reproduce it bit for bit.
Single-node replay runs a node's bodies on one thread; :func:`per_planned_thread` points
each body at the copy of the thread that ran it in the recorded run.

Test and checked mode turn relaxation off (``engine._data.dds.relaxing``): the dvector
is then ordinary, in conflict analysis, and this module is not used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .._runtime.session import _tls
from . import dds as _dds

if TYPE_CHECKING:
    from .._machines.planner import Task
    from .._runtime.session import Session


def active(sess: Session) -> list[_dds._DDS]:
    """The DDS of ``sess`` that are relaxed in this session."""
    return [d for d in sess.dds if _dds.relaxing(d)]


def enter_recon(sess: Session) -> None:
    """Switch the relaxed DDS to ``async_for`` reconnaissance: unlogged when relaxation is
    on, ordinary (logged) when test mode turned it off."""
    for d in sess.dds:
        if d._relaxed:
            d.__class__ = type(d)._modes["relaxed_recon" if _dds.relaxing(d) else "recon_plain"]


def rows_seen(d: _dds._DDS, node: int, slots: np.ndarray) -> Any:
    """The values at ``slots`` as a body running now on ``node`` sees them: in a round
    with several threads, a relaxed DDS's copy of the body's planned thread (the node's
    replica holds the round-start values until the round ends); else the replica."""
    copies = d._rxs.get(node) if d._relaxed else None
    if copies:
        return copies[getattr(_tls, "rthread", 0)][slots]
    return d.rows(node, slots)


def per_planned_thread(body: Callable[[int], Any], tasks: list[Task]) -> Callable[[int], Any]:
    """``body`` run on one thread in a forced order (single-node replay): each index
    works on the relaxed copy of the thread the plan gave it."""
    thread_of = {j: t.thread for t in tasks for j in t.indices.tolist()}

    def run(j: int) -> Any:
        _tls.rthread = thread_of[j]
        return body(j)

    return run


class Relaxation:
    """The relaxed DDS of one attempt at one ``async_for`` invocation."""

    def __init__(self, sess: Session, dds: list[_dds._DDS]) -> None:
        self.cl = sess.cluster
        self.dds = dds
        self.threads = self.cl.threads
        nodes = self.cl.local_nodes
        #: the replicas before the attempt, to restore when it is undone
        self.before = [(d, p, d._bufs[p].copy()) for d in dds for p in nodes]
        #: per DDS, per local node: the values at the start of the running round
        self.base: list[dict[int, np.ndarray]] = []

    @classmethod
    def of(cls, sess: Session) -> Relaxation | None:
        """The relaxation of the next attempt, or None when no DDS is relaxed."""
        dds = active(sess)
        return cls(sess, dds) if dds else None

    def begin_round(self) -> None:
        """Keep every local replica's round-start values; give each thread its copy."""
        nodes = self.cl.local_nodes
        self.base = [{p: d._bufs[p].copy() for p in nodes} for d in self.dds]
        if self.threads > 1:
            for d, base in zip(self.dds, self.base, strict=True):
                d._rxs = {p: [base[p].copy() for _ in range(self.threads)] for p in nodes}
                d._rxc = d._rxs[nodes[0]]

    def _node_delta(self, d: _dds._DDS, base: np.ndarray, node: int) -> np.ndarray:
        if self.threads == 1:
            return np.subtract(d._bufs[node], base)
        copies = d._rxs[node]
        delta = np.subtract(copies[0], base)
        for c in copies[1:]:
            delta += c - base
        return delta

    def end_round(self) -> None:
        """Reconcile: every local replica becomes start + the sum of all nodes' deltas
        (collective: every node calls it after every round)."""
        nodes = self.cl.local_nodes
        mine = [
            [self._node_delta(d, base[p], p) for p in nodes]
            for d, base in zip(self.dds, self.base, strict=True)
        ]
        every = self._all_deltas(mine)
        for d, base, deltas in zip(self.dds, self.base, every, strict=True):
            total = deltas[0].copy()
            for delta in deltas[1:]:
                total += delta
            for p in nodes:
                np.add(base[p], total, out=d._bufs[p])
            d._rxs = {}
            d._touch()
        self.base = []

    def _all_deltas(self, mine: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
        """Per DDS, every node's delta in node order."""
        if not self.cl.is_mpi:
            return mine
        from mpi4py import MPI

        P = self.cl.size
        flat = [np.ascontiguousarray(per[0]).view(np.uint8).ravel() for per in mine]
        send = np.concatenate(flat) if flat else np.empty(0, dtype=np.uint8)
        recv = np.empty((P, len(send)), dtype=np.uint8)
        self.cl.comm.Allgather([send, MPI.BYTE], [recv, MPI.BYTE])  # type: ignore[attr-defined]
        out: list[list[np.ndarray]] = []
        off = 0
        for per in mine:
            a = per[0]
            nb = a.nbytes
            out.append(
                [recv[q, off : off + nb].copy().view(a.dtype).reshape(a.shape) for q in range(P)]
            )
            off += nb
        return out

    def restore(self) -> None:
        """Undo the attempt: every replica back to its values before the attempt."""
        for d, p, values in self.before:
            np.copyto(d._bufs[p], values)
            d._rxs = {}
            d._touch()


__all__ = ["Relaxation", "active", "enter_recon", "per_planned_thread", "rows_seen"]
