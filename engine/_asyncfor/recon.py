"""Reconnaissance execution (RE): per-index read and write sets as compact arrays.

RE runs every body once in virtual mode (see ``_dds``): reads are served from the
node's replica, writes are kept in a per-body overlay and never committed, and the
element ids each body touches are logged.  A kernel's bodies run as one compiled loop
that does the same (``kernel.record``).  The sets are stored as CSR arrays —
``indptr`` of length n+1 and sorted, de-duplicated ``ids`` per index — not as Python
sets, so that a 1M-body loop costs a few tens of MB.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .._data import dds as _dds
from .._data.shard import fetch_missed
from .._errors import BodyError, ClosureRuleError, ShardMissError
from .._runtime.session import _tls, current
from .kernel import BoundKernel, record

if TYPE_CHECKING:
    from .._runtime.session import Session


@dataclass(frozen=True, slots=True)
class AccessSets:
    """Read and write sets of indices ``start .. start+n-1`` (position k is index start+k)."""

    start: int
    n: int
    r_indptr: np.ndarray
    r_ids: np.ndarray
    w_indptr: np.ndarray
    w_ids: np.ndarray

    def reads_of(self, k: int) -> np.ndarray:
        """Element ids read by the body at position ``k``."""
        return self.r_ids[self.r_indptr[k] : self.r_indptr[k + 1]]

    def writes_of(self, k: int) -> np.ndarray:
        """Element ids written by the body at position ``k``."""
        return self.w_ids[self.w_indptr[k] : self.w_indptr[k + 1]]

    def whole(self) -> AccessSets:
        """Every body's sets (these: see :meth:`NodeSets.whole`)."""
        return self

    def nbytes(self) -> int:
        """Memory held by the four arrays."""
        return sum(a.nbytes for a in (self.r_indptr, self.r_ids, self.w_indptr, self.w_ids))


@dataclass(frozen=True, slots=True)
class NodeSets:
    """The reconnaissance sets a node keeps once its plan is made and the guard's plan
    built from them: those of the bodies its own tasks run (issue 35: the sets of
    every body on every node are O(n) per node; these are O(n / P)).

    ``parts[node]`` is (``pos``, ``sets``): the sorted positions (index - ``start``) of
    that node's bodies and their sets, row k of ``sets`` for position ``pos[k]``.  A
    process keeps the parts of its local nodes only (one under MPI; every node of the
    in-process cluster, each node's part its own).  Under a plan a node runs only its
    tasks' bodies, so every lookup of checked mode and of the lock-split groups finds
    its position here; what needs every body's sets (planning, the dual tests'
    serialization orders) plans again from a fresh reconnaissance."""

    start: int
    n: int
    parts: dict[int, tuple[np.ndarray, AccessSets]]

    def part(self, node: int) -> tuple[np.ndarray, AccessSets]:
        """Node ``node``'s positions and their sets."""
        return self.parts[node]

    def rows(self, node: int, pos: np.ndarray) -> np.ndarray:
        """The rows of node ``node``'s sets that hold positions ``pos``."""
        have, _ = self.parts[node]
        at = np.searchsorted(have, pos)
        if len(pos) and (at.max() >= len(have) or not np.array_equal(have[at], pos)):
            raise KeyError(f"positions not among node {node}'s bodies")
        return at

    def _find(self, k: int) -> tuple[AccessSets, int]:
        # the bound node's part first: the body that asks almost always runs there
        for p in (current().current_node, *self.parts):
            if p not in self.parts:
                continue
            have, sets = self.parts[p]
            at = int(np.searchsorted(have, k))
            if at < len(have) and int(have[at]) == k:
                return sets, at
        raise KeyError(f"position {k} is not among the bodies of this process's nodes")

    def reads_of(self, k: int) -> np.ndarray:
        """Element ids read by the body at position ``k`` (one of a local node's)."""
        sets, at = self._find(k)
        return sets.reads_of(at)

    def writes_of(self, k: int) -> np.ndarray:
        """Element ids written by the body at position ``k`` (one of a local node's)."""
        sets, at = self._find(k)
        return sets.writes_of(at)

    def expanded(self, node: int) -> AccessSets:
        """Node ``node``'s sets as an :class:`AccessSets` over every position, the other
        nodes' bodies with empty sets (for the compiled loops of checked mode, which
        index the sets by position); built on demand."""
        have, sets = self.parts[node]

        def spread(indptr: np.ndarray) -> np.ndarray:
            counts = np.zeros(self.n, dtype=np.int64)
            counts[have] = np.diff(indptr)
            out = np.zeros(self.n + 1, dtype=np.int64)
            np.cumsum(counts, out=out[1:])
            return out

        return AccessSets(
            self.start, self.n, spread(sets.r_indptr), sets.r_ids, spread(sets.w_indptr), sets.w_ids
        )

    def nbytes(self, node: int | None = None) -> int:
        """Memory held for ``node`` (every local node's when None)."""
        nodes = list(self.parts) if node is None else [node]
        return sum(self.parts[p][0].nbytes + self.parts[p][1].nbytes() for p in nodes)

    def whole(self) -> AccessSets:
        """Every body's sets again, when this process holds every node's part (the
        in-process cluster; for tests and benchmarks)."""
        pos = np.concatenate([self.parts[p][0] for p in sorted(self.parts)])
        if len(pos) != self.n:
            raise KeyError("this process does not hold every node's bodies")
        parts = [self.parts[p] for p in sorted(self.parts)]
        joined = concat_sets([AccessSets(0, len(h), *_arrays(s)) for h, s in parts])
        back = np.argsort(pos, kind="stable")
        return subset(joined, back, self.start)


def _arrays(s: AccessSets) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return s.r_indptr, s.r_ids, s.w_indptr, s.w_ids


def subset(sets: AccessSets, rows: np.ndarray, start: int = 0) -> AccessSets:
    """The sets of ``sets``' rows ``rows``, in that order (row k of the result is row
    ``rows[k]``), numbered from ``start``."""

    def take(indptr: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = indptr[rows], indptr[rows + 1]
        counts = hi - lo
        out = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(counts, out=out[1:])
        if not len(rows) or not out[-1]:
            return out, np.empty(0, dtype=ids.dtype)
        # each taken row's ids are ids[lo:hi]: one gather over the concatenated ranges
        offs = np.repeat(lo - out[:-1], counts) + np.arange(out[-1], dtype=np.int64)
        return out, ids[offs]

    rows = np.asarray(rows, dtype=np.int64)
    rp, ri = take(sets.r_indptr, sets.r_ids)
    wp, wi = take(sets.w_indptr, sets.w_ids)
    return AccessSets(start, len(rows), rp, ri, wp, wi)


def node_sets(sets: AccessSets, plan: Any, nodes: list[int]) -> NodeSets:
    """What ``nodes`` keep of ``sets`` under ``plan``: each node's tasks' bodies."""
    parts = {}
    for p in nodes:
        mine = [t.indices for rnd in plan.rounds if p < len(rnd) for t in rnd[p]]
        pos = np.unique(np.concatenate(mine)) - sets.start if mine else np.empty(0, np.int64)
        parts[p] = (pos.astype(np.int64), subset(sets, pos))
    return NodeSets(sets.start, sets.n, parts)


def csr_from_ends(ends: list[int], ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Build (indptr, ids) from cumulative row ends; rows sorted and de-duplicated."""
    ends_a = np.asarray(ends, dtype=np.int64)
    flat = np.asarray(ids, dtype=np.int64)
    n = len(ends_a)
    counts = np.diff(ends_a, prepend=0)
    rows = np.repeat(np.arange(n, dtype=np.int64), counts)
    return csr_from_pairs(rows, flat, n)


def csr_from_pairs(rows: np.ndarray, flat: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Build (indptr, ids) of ``n`` rows from (row, id) pairs in any order; rows sorted
    and de-duplicated.

    Bodies usually touch few elements, so rows are sorted with one global sort of
    ``row * span + (id - min)`` when that fits in 63 bits, and a lexsort otherwise.
    """
    if len(flat):
        lo = int(flat.min())
        span = int(flat.max()) - lo + 1
        if span * max(n, 1) < 2**62:
            key = rows * span + (flat - lo)
            key.sort()
            if len(key) > 1:
                key = key[np.concatenate(([True], key[1:] != key[:-1]))]
            rows, flat = key // span, key % span + lo
        else:
            order = np.lexsort((flat, rows))
            rows, flat = rows[order], flat[order]
            keep = np.ones(len(flat), dtype=bool)
            keep[1:] = (rows[1:] != rows[:-1]) | (flat[1:] != flat[:-1])
            rows, flat = rows[keep], flat[keep]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
    return indptr, flat


def union_sorted(parts: list[np.ndarray]) -> np.ndarray:
    """The sorted union of sorted, duplicate-free int64 arrays (what
    ``np.unique(np.concatenate(parts))`` gives, without its hashing: numpy 2's unique
    hashes every id, about 0.5 ms for a minibatch's rows, where one sort and a
    comparison of neighbours suffice).  One part is returned as it is."""
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return np.empty(0, dtype=np.int64)
    out = np.concatenate(parts)
    out.sort()
    if len(out) > 1:
        out = out[np.concatenate(([True], out[1:] != out[:-1]))]
    return out


def csr_from_lists(counts: list[int], ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Build (indptr, ids) from per-row counts; rows sorted and de-duplicated."""
    return csr_from_ends(np.cumsum(np.asarray(counts, dtype=np.int64)).tolist(), ids)


def concat_sets(parts: list[AccessSets]) -> AccessSets:
    """Join the sets of consecutive index ranges (one part per node)."""
    parts = [p for p in parts if p.n > 0] or parts[:1]

    def cat(ptr_name: str, ids_name: str) -> tuple[np.ndarray, np.ndarray]:
        ptrs, ids, off = [np.zeros(1, dtype=np.int64)], [], 0
        for p in parts:
            ptr = getattr(p, ptr_name)
            ptrs.append(ptr[1:] + off)
            ids.append(getattr(p, ids_name))
            off += int(ptr[-1])
        return np.concatenate(ptrs), np.concatenate(ids) if ids else np.empty(0, np.int64)

    rp, ri = cat("r_indptr", "r_ids")
    wp, wi = cat("w_indptr", "w_ids")
    return AccessSets(parts[0].start, sum(p.n for p in parts), rp, ri, wp, wi)


@dataclass
class Done:
    """What one reconnaissance pass of a range found for the bodies that read no sharded
    row their node lacked: their reads and writes, one list each per body (indices of
    the range without an entry missed a row and run again)."""

    reads: dict[int, list[int]]
    writes: dict[int, list[int]]


def recon_range(
    sess: Session,
    op: str,
    invocation: int,
    body: Callable[[int], Any],
    lo: int,
    hi: int,
    done: Done | None = None,
) -> AccessSets:
    """Run RE for indices ``lo .. hi-1`` on the currently bound node.  ``done``: a pass
    before this one, whose bodies that missed no row are not run again (the DDS state is
    the same, only rows the others missed were fetched, so they would find the same)."""
    if type(body) is BoundKernel and done is None:  # one compiled loop, unless it leaves
        got = record(body, lo, hi, sess.op_key(op, invocation))  # the range to Python
        if got is not None:
            (rk, rid), (wk, wid) = got[0].T, got[1].T
            rp, ri = csr_from_pairs(rk, rid, hi - lo)
            wp, wi = csr_from_pairs(wk, wid, hi - lo)
            return AccessSets(lo, hi - lo, rp, ri, wp, wi)
    rec = _dds._Recon()
    _dds.RECON = rec
    reads, writes = rec.reads, rec.writes
    r_ends: list[int] = []
    w_ends: list[int] = []
    #: per body run without a miss in this pass: where its reads and writes start
    clean: list[tuple[int, int, int]] = []
    _tls.op_key = sess.op_key(op, invocation)
    j = lo
    try:
        for j in range(lo, hi):
            if done is not None and j in done.reads:
                reads.extend(done.reads[j])
                writes.extend(done.writes[j])
                r_ends.append(len(reads))
                w_ends.append(len(writes))
                continue
            _tls.index = j
            r0, w0, m0 = len(reads), len(writes), len(rec.misses)
            try:
                body(j)
            except ShardMissError:
                pass  # in ``rec.misses``: the caller fetches the row and runs this again
            if len(rec.misses) == m0:
                clean.append((j, r0, w0))
            r_ends.append(len(reads))
            w_ends.append(len(writes))
            if rec.overlay or rec.later:
                rec.clear()
    except ClosureRuleError:
        raise
    except Exception as exc:
        raise BodyError(op, invocation, j, sess.current_node, exc) from exc
    finally:
        _dds.RECON = None
        _tls.op_key = None
        if rec.asked:
            sess.recon_asked.add(op)
    if rec.misses:
        kept = done if done is not None else Done({}, {})
        for j, r0, w0 in clean:
            kept.reads[j] = reads[r0 : r_ends[j - lo]]
            kept.writes[j] = writes[w0 : w_ends[j - lo]]
        raise ReconMissed(rec.misses, kept)
    rp, ri = csr_from_ends(r_ends, reads)
    wp, wi = csr_from_ends(w_ends, writes)
    return AccessSets(lo, hi - lo, rp, ri, wp, wi)


def reconnaissance() -> bool:
    """True while a loop body runs in reconnaissance, the pass that only learns which
    rows each body reads and writes (``async_for``: once per plan; ``sync_for``: per
    its ``replan``).  A body may skip there the work that decides no row, e.g. a
    kernel's arithmetic, as long as it still reads and writes every row that
    execution will: it writes the rows' current values back, say.  A body that
    touches other rows in execution than it declared here is caught by the plan's
    guard like any body whose rows depend on values (undone and re-planned, never a
    wrong result), at the cost of that re-run."""
    rec = _dds.RECON
    if rec is None:
        return False
    rec.asked = True
    return True


def declared_hint(sess: Session, op: str) -> str:
    """What a guard's note adds for an operator whose body asked ``ap.reconnaissance()``:
    its declared rows, not changed values, may be why an access left them."""
    if op not in sess.recon_asked:
        return ""
    return (
        " (or, since the body asks ap.reconnaissance(), it declared other rows there "
        "than it touched)"
    )


class ReconMissed(Exception):  # noqa: N818 - a signal to the caller, never shown
    """A reconnaissance read sharded rows its node does not hold: ``misses``, (node,
    element id) pairs; the caller fetches them (``engine._data.shard.fetch_missed``) and
    runs the reconnaissance again, passing ``done`` (the bodies that missed nothing) on."""

    def __init__(self, misses: list[tuple[int, int]], done: Done | None = None) -> None:
        super().__init__(misses)
        self.misses = misses
        self.done = done


def recon_shares(
    cl: Any, sess: Any, why: str, share: Callable[[int, Done | None], AccessSets]
) -> list[AccessSets]:
    """Each node's sets, ``share(node, done)`` run on every node (``cl.run_on_nodes``)
    until no node's reconnaissance reads a sharded row it does not hold.  A share that
    raises :class:`ReconMissed` is run again after every rank has fetched the rows missed
    (collectively), given what it finished (``done``: only the bodies that missed run
    again); a node whose share finished keeps its sets and does not run again."""
    done: dict[int, Done | AccessSets | None] = {}

    def one(node: int) -> AccessSets | list[tuple[int, int]]:
        prev = done.get(node)
        if isinstance(prev, AccessSets):  # finished in an earlier pass
            return prev
        try:
            sets = share(node, prev)
        except ReconMissed as missed:  # rows this node lacks: fetched before the next pass
            done[node] = missed.done
            return missed.misses
        done[node] = sets
        return sets

    while True:
        parts = cl.run_on_nodes(one)
        missed = [m for part in parts if isinstance(part, list) for m in part]
        if not missed:
            return parts
        fetch_missed(sess, why, missed)


__all__ = [
    "AccessSets",
    "NodeSets",
    "node_sets",
    "subset",
    "concat_sets",
    "csr_from_ends",
    "csr_from_lists",
    "csr_from_pairs",
    "Done",
    "ReconMissed",
    "declared_hint",
    "reconnaissance",
    "recon_range",
    "recon_shares",
    "union_sorted",
]
