"""Sharded dvectors: which rows each node holds, and fetching the ones it lacks.

A sharded dvector (Python-object rows; ``sharded=True`` is their default) keeps on each
node a dict of rows: its home rows, always, and the rows the node needs for a *reason*:
an ``async_for`` plan whose tasks there touch them, the minibatches a ``sync_for`` runs
there, a reconnaissance that read them.  What each node holds for each reason is kept
in ``d._cache`` on every rank alike (a function of the plans, never of timing), so a
home knows without asking which rows a node lacks: before an operator runs,
:func:`ensure_rows` has each home send them (one collective exchange, none when the
plan is reused) and each node drops the rows no reason needs any more.  Written rows
stay consistent through the routed write-back and the dirty marks of
``engine._data.dds``, as for every other DDS; an old copy of a dirty row is dropped
when the DDS is made whole (``drop_stale``).

The trust rule: a node never reads a row it does not hold.  Inside an ``async_for``
round such a read is a plan violation (re-plan, ``engine._asyncfor.guard``); in a
reconnaissance the row is fetched and the reconnaissance runs again
(:func:`fetch_missed`); anywhere else it is :class:`ShardMissError`, raised after the
operator even if the body swallowed it (:func:`check_missed`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .._errors import PeerRankFailed, ShardMissError, peer_error
from . import dds as _dds
from .dds import _DDS, SLOT_BITS, SLOT_MASK, homes

if TYPE_CHECKING:
    from .._runtime.session import Session

_EMPTY = np.empty(0, dtype=np.int64)


def sharded(sess: Session) -> list[_DDS]:
    """The session's sharded DDS."""
    return [d for d in sess.dds if d._sharded]


def _away(d: _DDS, p: int, slots: np.ndarray) -> np.ndarray:
    """Sorted unique ``slots`` without node ``p``'s home rows."""
    slots = np.unique(slots)
    return slots[homes(d, slots) != p] if len(slots) else _EMPTY


def needs_of(sess: Session, nodes: np.ndarray, gids: np.ndarray) -> dict[_DDS, list[np.ndarray]]:
    """Per sharded DDS, per node of the cluster: the rows away from home that the node
    touches, from (node, element id) pairs (a plan's touches)."""
    out: dict[_DDS, list[np.ndarray]] = {}
    P = sess.cluster.size
    ids = gids >> SLOT_BITS
    for d in sharded(sess):
        mine = ids == d._id
        if not mine.any():
            continue
        at, slots = nodes[mine], gids[mine] & SLOT_MASK
        out[d] = [_away(d, p, slots[at == p]) for p in range(P)]
    return out


def everything(sess: Session) -> dict[_DDS, list[np.ndarray]]:
    """Every row on every node (a replicated plan runs every body on every node)."""
    P = sess.cluster.size
    return {
        d: [np.setdiff1d(np.arange(len(d), dtype=np.int64), d.owned(p)) for p in range(P)]
        for d in sharded(sess)
    }


def minibatch_needs(
    d: _DDS, nodes: int, threads: int, size: int, per_clock: int
) -> dict[_DDS, list[np.ndarray]]:
    """The rows of ``sync_for`` data ``d`` each node reads (``engine._syncfor.layout``):
    the minibatches of its reconnaissance share and the ones it runs (a minibatch m
    runs on node ``(m mod nodes*threads*per_clock) // (threads*per_clock)``)."""
    n = len(d)
    M = -(-n // size) if n else 0
    ms = np.arange(M, dtype=np.int64)
    runs_on = (ms % (nodes * threads * per_clock)) // (threads * per_clock)
    out = []
    for p in range(nodes):
        mine = (ms >= M * p // nodes) & (ms < M * (p + 1) // nodes)
        picked = ms[mine | (runs_on == p)]
        lo, hi = picked * size, np.minimum((picked + 1) * size, n)
        rows = (
            np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in zip(lo, hi, strict=True)])
            if len(picked)
            else _EMPTY
        )
        out.append(_away(d, p, rows))
    return {d: out}


def kept_share(sess: Session, d: _DDS, p: int, rows: np.ndarray) -> np.ndarray:
    """What this process keeps of node ``p``'s rows ``rows`` of ``d`` in a record of
    held or needed rows: all of them for its own nodes (what they receive), and for
    every other node those whose home is one of its own (what they send it).  In one
    process, every node's rows."""
    cl = sess.cluster
    if p in cl.local_nodes or len(cl.local_nodes) == cl.size or not len(rows):
        return rows
    return rows[np.isin(homes(d, rows), cl.local_nodes)]


def kept_needs(sess: Session, needs: dict[_DDS, list[np.ndarray]]) -> dict[_DDS, list[np.ndarray]]:
    """``needs`` with each node's rows cut to :func:`kept_share`."""
    return {
        d: [kept_share(sess, d, p, rows) for p, rows in enumerate(need)]
        for d, need in needs.items()
    }


def ensure_rows(sess: Session, why: str, needs: dict[_DDS, list[np.ndarray]]) -> int:
    """Collective: from now on node p holds, for reason ``why``, the rows
    ``needs[d][p]`` of each sharded ``d`` (sorted, away from home): each home sends the
    ones p holds for no reason yet, and p drops the ones it held for ``why`` alone that
    it no longer needs.  Every rank calls it alike; returns the number of messages this
    process sends or receives.

    Under MPI a rank keeps of another node's record only the rows homed at it
    (:func:`kept_share`: issue 35, every node's record on every rank is O(n)), so it sees
    only the messages it sends or receives; whether the exchange runs at all (every rank
    takes part, or none) is agreed in one small allgather."""
    cl = sess.cluster
    share = len(cl.local_nodes) < cl.size
    if share:
        needs = kept_needs(sess, needs)
    by_pair: dict[tuple[int, int], list[tuple[_DDS, np.ndarray]]] = {}
    for d, need in needs.items():
        old = d._cache.get(why)
        others = [c for k, c in d._cache.items() if k != why]
        for p, mine in enumerate(need):
            if old is not None and np.array_equal(old[p], mine):
                continue  # the plan is reused: it holds them all, and drops nothing
            other = [c[p] for c in others if len(c[p])]
            held = np.concatenate([old[p], *other]) if old is not None else _cat(other)
            absent = np.setdiff1d(mine, held)
            if len(absent):
                h = homes(d, absent)
                for src in np.unique(h).tolist():
                    by_pair.setdefault((src, p), []).append((d, absent[h == src]))
            buf = d._bufs.get(p)
            if buf is not None and old is not None and len(old[p]):
                gone = np.setdiff1d(np.setdiff1d(old[p], mine), _cat(other))
                for s in gone.tolist():
                    buf.pop(s, None)
        d._cache[why] = list(need)
    messages = [(src, dst, parts) for (src, dst), parts in sorted(by_pair.items())]
    anyone = bool(messages)
    if share and needs:
        anyone = any(cl.allgather(anyone))
    if anyone:
        cl.exchange(messages)
        for d in needs:
            d._touch()
    return len(messages)


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else _EMPTY


def fetch_missed(sess: Session, why: str, missed: list[tuple[int, int]]) -> None:
    """Collective: a reconnaissance read the rows ``missed`` ((node, element id) pairs,
    every node's) where their nodes do not hold them: hold them from now on, for
    ``why`` (with whatever that reason held before)."""
    got = needs_of(
        sess,
        np.array([n for n, _ in missed], dtype=np.int64),
        np.array([g for _, g in missed], dtype=np.int64),
    )
    for d, need in got.items():
        old = d._cache.get(why)
        if old is not None:
            got[d] = [np.union1d(a, b) for a, b in zip(old, need, strict=True)]
    ensure_rows(sess, why, got)


def check_missed(sess: Session) -> None:
    """After an operator: raise the first read of a row its node did not hold (see the
    module docstring), also when the body caught it; under MPI every rank raises (the
    ranks agree first, as they do on a body's error)."""
    if not sharded(sess):
        return
    err = _dds.MISSED[0] if _dds.MISSED else None
    _dds.MISSED.clear()
    if sess.cluster.is_mpi:
        got = sess.cluster.allgather(None if err is None else peer_error(err))
        first = next((r for r, e in enumerate(got) if e is not None), None)
        if first is not None and first != sess.cluster.local_nodes[0]:
            raise PeerRankFailed(first, got[first])
    if err is not None:
        raise err


def take_missed(sess: Session) -> list[tuple[int, int]]:
    """Collective when the session has sharded DDS: every rank's misses since
    :func:`clear_missed`, as (node, element id) pairs (the same list on every rank)."""
    if not sharded(sess):
        return []
    mine = [(e.node, e.gid) for e in _dds.MISSED if isinstance(e, ShardMissError)]
    _dds.MISSED.clear()
    if not sess.cluster.is_mpi:
        return mine
    return [m for part in sess.cluster.allgather(mine) for m in part]


def clear_missed() -> None:
    """Before an operator: forget misses of an earlier one that already failed."""
    _dds.MISSED.clear()


__all__ = [
    "check_missed",
    "clear_missed",
    "ensure_rows",
    "everything",
    "fetch_missed",
    "kept_needs",
    "kept_share",
    "minibatch_needs",
    "needs_of",
    "sharded",
    "take_missed",
]
