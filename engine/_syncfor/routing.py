"""Which rows of an owner's update of a clock each node receives (issue 35 item 5).

An owner used to send every node the new values of every row it aggregated, every clock,
and every node an 8-byte message when there were none.  Now node ``q`` receives a row of
the update of clock ``c`` only when it may read that value:

* ``q`` reads row ``r`` (its prefetch set: reads and writes, from reconnaissance) in some
  clock ``c2 > c`` at which the update of ``c`` may still be the newest it can see.
  Clock ``c2`` sees every update up to ``c2 - staleness - 1`` and perhaps newer ones, so
  the value of ``c`` may be what it reads while the next write of ``r`` after ``c``
  (clock ``nw``) is not guaranteed visible: ``c < c2 <= nw + staleness`` (no next write:
  any later clock).  Every value ``q`` can read is then the one the broadcast gave it:
  the newest write guaranteed visible and every newer one were all routed to ``q``.
* The update of the last clock makes every replica whole again: it carries the rows
  written in that clock and every row the invocation wrote whose final value ``q`` was
  not sent, so the replicas agree when the operator returns, as before (what the driver
  reads next, and the next invocation's caches, need no routing of their own).

A message that would carry no rows is not sent.  Sender and receiver compute the same
routes from the same layout, so each knows which messages exist and their sizes.
Arithmetic is untouched: an owner aggregates exactly as before and each row a node holds
when it reads it has the bits the broadcast gave it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .layout import SyncLayout


class Routing:
    """The routes of one layout under one staleness (built lazily, cached per clock)."""

    def __init__(self, layout: SyncLayout, staleness: int) -> None:
        self.layout = layout
        self.staleness = staleness
        C = layout.clocks
        D = len(layout.params)
        #: per parameter: sorted keys ``row * C + clock`` of every write of the invocation
        self._writes: list[np.ndarray] = []
        #: per parameter, per node: sorted keys ``row * C + clock`` of its reads
        self._reads: list[list[np.ndarray]] = []
        for d in range(D):
            w: list[np.ndarray] = []
            r: list[list[np.ndarray]] = [[] for _ in range(layout.nodes)]
            for c in range(C):
                for o in range(layout.nodes):
                    w.append(layout.owner(c, o).rows[d] * C + c)
                for q in range(layout.nodes):
                    r[q].append(layout.node(c, q).npref[d] * C + c)
            self._writes.append(np.sort(np.concatenate(w)) if w else np.empty(0, np.int64))
            self._reads.append([np.sort(np.concatenate(x)) if x else _EMPTY for x in r])
        self._routes: dict[tuple[int, int], list[list[np.ndarray]]] = {}

    def written(self, d: int) -> np.ndarray:
        """Rows of parameter ``d`` the invocation writes (sorted)."""
        C = self.layout.clocks
        return np.unique(self._writes[d] // C) if C else _EMPTY

    def rows(self, clock: int, owner: int) -> list[list[np.ndarray]]:
        """Per destination node, per parameter: the slots (sorted) of ``owner``'s update of
        ``clock`` that node receives (empty for ``owner`` itself)."""
        key = (clock, owner)
        got = self._routes.get(key)
        if got is None:
            got = self._routes[key] = self._route(clock, owner)
        return got

    def _reads_in(
        self, d: int, q: int, rows: np.ndarray, after: np.ndarray, upto: np.ndarray
    ) -> np.ndarray:
        """Which of ``rows`` node ``q`` reads in some clock in ``(after, upto]`` (per row)."""
        C = self.layout.clocks
        keys = self._reads[d][q]
        j = np.searchsorted(keys, rows * C + after + 1)
        hit = j < len(keys)
        hit[hit] = keys[j[hit]] <= rows[hit] * C + upto[hit]
        return hit

    def _route(self, clock: int, owner: int) -> list[list[np.ndarray]]:
        lay = self.layout
        C, P = lay.clocks, lay.nodes
        out: list[list[np.ndarray]] = [[] for _ in range(P)]
        for d in range(len(lay.params)):
            rows = lay.owner(clock, owner).rows[d]
            keys = self._writes[d]
            if clock < C - 1:
                # the next write of each row after ``clock`` (none: C - 1 closes the window)
                i = np.searchsorted(keys, rows * C + clock + 1)
                nxt = np.full(len(rows), C - 1, dtype=np.int64)
                ok = i < len(keys)
                ok[ok] = keys[i[ok]] < (rows[ok] + 1) * C
                nxt[ok] = keys[i[ok]] - rows[ok] * C + self.staleness
                upto = np.minimum(nxt, C - 1)
                after = np.full(len(rows), clock, dtype=np.int64)
                for q in range(P):
                    out[q].append(
                        _EMPTY if q == owner else rows[self._reads_in(d, q, rows, after, upto)]
                    )
                continue
            # the last clock: its rows, and every final value a node was not sent
            mine = self.written(d)
            mine = mine[lay.owners[d][mine] == owner]
            last = keys[np.searchsorted(keys, (mine + 1) * C) - 1] - mine * C
            older = mine[last < clock]
            last = last[last < clock]
            end = np.full(len(older), C - 1, dtype=np.int64)
            for q in range(P):
                if q == owner:
                    out[q].append(_EMPTY)
                    continue
                missed = older[~self._reads_in(d, q, older, last, end)]
                out[q].append(np.union1d(rows, missed) if len(missed) else rows)
        return out


_EMPTY = np.empty(0, dtype=np.int64)

__all__ = ["Routing"]
