"""Greedy colouring of the conflict graph (chromatic scheduling, as in GraphLab).

A Gauss–Seidel sweep over a power-law graph has one giant conflict component, so the
components strategy can only put every body on one node.  Yet most pairs of bodies in
that component are independent: a colouring of the conflict graph splits the bodies
into classes with no conflict inside a class, and each class is a round whose bodies
may run on any node and thread in any order.

The conflict graph is never built.  Two bodies conflict iff one writes an element the
other reads or writes (DESIGN §5), so a body may not take colour c when some body of
colour c already *writes* one of the elements it touches, or already *reads* one of the
elements it writes.  Two bit sets per written element (the colours of its writers and of
its readers) answer that in time linear in the accesses, where the explicit graph of,
say, SGDMF would have tens of millions of edges.

The order is Welsh–Powell's largest-degree-first, with each body's degree bounded from
above by counting, per element, the bodies on the other side of a possible conflict;
ties go to the lower index, so the colouring depends on the sets alone (no hash order).
"""

from __future__ import annotations

import numpy as np

from .._asyncfor.recon import AccessSets


def _written_incidence(sets: AccessSets) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(write rows, write elems, read rows, read elems): accesses of written elements only,
    elements renumbered 0..m-1.  An element that no body writes never causes a conflict."""
    n = sets.n
    w_rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(sets.w_indptr))
    r_rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(sets.r_indptr))
    written = np.unique(sets.w_ids)
    keep = np.isin(sets.r_ids, written)
    w_el = np.searchsorted(written, sets.w_ids)
    r_el = np.searchsorted(written, sets.r_ids[keep])
    return w_rows, w_el, r_rows[keep], r_el


def colour_lower_bound(sets: AccessSets) -> int:
    """A lower bound on the colours any colouring needs: the writers of one element
    conflict pairwise, so the most-written element alone needs that many colours."""
    if len(sets.w_ids) == 0:
        return 1 if sets.n else 0
    _, counts = np.unique(sets.w_ids, return_counts=True)
    return int(counts.max())


def colour_bodies(sets: AccessSets) -> np.ndarray:
    """Colour (0, 1, ...) of every body position: no two bodies of one colour conflict.

    Colour classes come out largest first (greedy first-fit fills low colours first).
    """
    n = sets.n
    colour = np.zeros(n, dtype=np.int64)
    if n == 0 or len(sets.w_ids) == 0:
        return colour
    w_rows, w_el, r_rows, r_el = _written_incidence(sets)
    m = int(max(w_el.max(initial=-1), r_el.max(initial=-1))) + 1
    writers = np.bincount(w_el, minlength=m)
    readers = np.bincount(r_el, minlength=m)
    # an upper bound on each body's conflict degree: for a write, everyone else touching
    # the element; for a read, the element's writers
    degree = np.bincount(w_rows, weights=writers[w_el] + readers[w_el] - 1, minlength=n)
    degree += np.bincount(r_rows, weights=writers[r_el], minlength=n)
    order = np.lexsort((np.arange(n), -degree))
    w_ptr = np.searchsorted(w_rows, np.arange(n + 1))
    r_ptr = np.searchsorted(r_rows, np.arange(n + 1))
    w_list, r_list = w_el.tolist(), r_el.tolist()
    wp, rp = w_ptr.tolist(), r_ptr.tolist()
    # colour sets as Python ints: bit c set = some writer (reader) of the element has colour c
    wmask = [0] * m
    rmask = [0] * m
    out = [0] * n
    for j in order.tolist():
        ws = w_list[wp[j] : wp[j + 1]]
        rs = r_list[rp[j] : rp[j + 1]]
        forbidden = 0
        for e in ws:
            forbidden |= wmask[e] | rmask[e]
        for e in rs:
            forbidden |= wmask[e]
        free = ~forbidden & (forbidden + 1)  # lowest colour not forbidden
        out[j] = free.bit_length() - 1
        for e in ws:
            wmask[e] |= free
        for e in rs:
            rmask[e] |= free
    colour[:] = out
    return colour


#: Estimated fixed cost of one body (call, arithmetic, write-back of its row) in units of
#: one element access; weighs how much a hub's many reads count against a leaf's call.
BODY_BASE_WEIGHT = 4


def body_weights(sets: AccessSets) -> np.ndarray:
    """Work of each body: a fixed cost plus the elements it touches, so a vertex update
    that reads 500 neighbours counts for more than one that reads 2."""
    return BODY_BASE_WEIGHT + np.diff(sets.r_indptr) + np.diff(sets.w_indptr)


__all__ = ["BODY_BASE_WEIGHT", "body_weights", "colour_bodies", "colour_lower_bound"]
