"""Routed write-back: after each round of a plan, a written row goes only to the nodes
that touch it before it is written again, not to every node.

Pure functions of a :class:`~engine._machines.planner.Plan` and its reconnaissance sets
(numpy only), so every node computes the same routes without a message.

Why this is exact.  Rounds run in order and, within a round, no two nodes touch an
element one of them writes.  So the value a body of round ``s`` on node ``p`` must see of
element ``e`` is the one written by the *latest write of e before round s*, say in round
``r`` by node ``q``; every node that touches ``e`` in rounds ``r+1 .. s`` (up to and
including the round of the next write) receives it right after round ``r``.  That is the
whole routing rule: one message per (round, source, destination) with the rows it needs,
whose sources and sizes both sides know from the plan, so arrival order cannot change a
bit and nothing needs recording.

What a node does not receive it must not read: a body that leaves its reconnaissance sets
could read a row some other node wrote and did not send.  :func:`route` therefore also
returns, per round and node, the elements that become *stale* there after the round's
write-back; the guard marks them as written by another node, so reading one is a plan
violation (re-plan or serial fallback), never a wrong value.

At the end of the invocation a final exchange (:attr:`Routes.final`) sends each written
element's last value to its *home* (the range owner, which digests and checkpoints read)
when the home does not hold it already: not to every node.  Other nodes may then hold
an old value of the element until the next reader needs it: the next ``async_for``
fetches what its nodes touch from the homes (:func:`fetch`), and any other reader makes
the replicas whole first (``engine._data.dds.make_whole``).  Without ``home``,
:func:`route` sends the final values to every node that lacks them, as before.

Coalescing (``route(coalesce=True)``, the default of runs since 2026-12-06).  A row need
not leave in the round it was written, only arrive before the first round its
destination touches it; a last value going home, before the end.  So each row has a
send window, and the rows one node sends another travel in as few messages as those
windows allow (:func:`coalesce`) without making the destination wait longer than the
uncoalesced messages would (timed with bodies as time, as the planner's critical path
is): each message leaves once every row in it is written and is due where its
destination first touches one of them (``Routes.uses``), where an MPI rank completes the
receive.  The same rows, fewer messages; ``Routes.born`` says, per row, the round that
wrote it, from whose write-back until its arrival the guard marks it on its
destination.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .._asyncfor.recon import AccessSets
from .makespan import on_demand_finish

if TYPE_CHECKING:  # the planner measures its plans by their routes (``makespan``)
    from .planner import Plan

_EMPTY = np.empty(0, dtype=np.int64)
#: Up to this many (element, round, node) cells, events are deduplicated with one flag per
#: cell (no sort); above it, with a sort (SGDMF on MovieLens-100K at P = 64: 10.8M cells).
DENSE_CELLS = 1 << 26
#: A routed message is relayed (:func:`relay`) when that adds at most this many bytes
#: sent: what an MPI message costs in latency and per-message overhead (1-2 us) buys a
#: few kB at cluster bandwidth, so one message saved is worth at least 1 KiB.
RELAY_BYTES = 1024


@dataclass(frozen=True)
class Messages:
    """Messages of one exchange: message ``k`` goes from ``src[k]`` to ``dst[k]`` and
    carries the rows of ``gids[ptr[k]:ptr[k+1]]`` (sorted element ids).  Messages are
    sorted by (src, dst)."""

    src: np.ndarray
    dst: np.ndarray
    ptr: np.ndarray
    gids: np.ndarray

    def __len__(self) -> int:
        return len(self.src)

    def rows(self, k: int) -> np.ndarray:
        """Element ids carried by message ``k``."""
        return self.gids[int(self.ptr[k]) : int(self.ptr[k + 1])]

    @classmethod
    def of(cls, src: np.ndarray, dst: np.ndarray, gids: np.ndarray) -> Messages:
        """From one (src, dst, gid) triple per row sent, in any order (duplicates merge)."""
        return cls.carrying(src, dst, gids)[0]

    @classmethod
    def carrying(
        cls, src: np.ndarray, dst: np.ndarray, gids: np.ndarray, extra: np.ndarray = _EMPTY
    ) -> tuple[Messages, np.ndarray]:
        """:meth:`of`, and ``extra`` (one value per triple, the same for duplicates, or
        empty) aligned with the messages' ``gids``."""
        if not len(gids):
            return cls(_EMPTY, _EMPTY, np.zeros(1, np.int64), _EMPTY), _EMPTY
        order = np.lexsort((gids, dst, src))
        s, d, g = src[order], dst[order], gids[order]
        keep = np.ones(len(g), dtype=bool)
        keep[1:] = (s[1:] != s[:-1]) | (d[1:] != d[:-1]) | (g[1:] != g[:-1])
        s, d, g = s[keep], d[keep], g[keep]
        x = extra[order][keep] if len(extra) else _EMPTY
        new = np.ones(len(g), dtype=bool)
        new[1:] = (s[1:] != s[:-1]) | (d[1:] != d[:-1])
        starts = np.flatnonzero(new)
        ptr = np.append(starts, len(g)).astype(np.int64)
        return cls(s[starts].astype(np.int64), d[starts].astype(np.int64), ptr, g), x


@dataclass(frozen=True)
class Routes:
    """The write-back of one plan: ``rounds[r]`` after round ``r``, ``final`` after the
    last round; ``stale[r][p]``: element ids node ``p`` must not read after round ``r``'s
    write-back (for the rest of the invocation; after it, a final exchange to every node
    makes them whole, one to the homes leaves them *dirty*), for the nodes it was asked
    for."""

    rounds: list[Messages]
    final: Messages
    stale: list[dict[int, np.ndarray]]
    #: per round, per message of ``rounds[r]``: the first round in which its destination
    #: touches a row it carries (> r): the message may be received as late as just
    #: before that round (``engine._asyncfor.guard``, ``Cluster.settle``)
    uses: list[np.ndarray] = field(default_factory=list)
    #: each written element (sorted ids) and the node that wrote its last value
    holders: tuple[np.ndarray, np.ndarray] = (_EMPTY, _EMPTY)
    #: per exchange ``r``, aligned with ``rounds[r].gids``: the exchange after whose
    #: round the row's value was written and due to leave (``r`` itself unless the
    #: routes were coalesced, :func:`coalesce`), or -1 for a last value on its way home
    #: early (its destination does not touch it again in the invocation); empty lists:
    #: every row left in its own round
    born: list[np.ndarray] = field(default_factory=list)
    #: per exchange ``r``, aligned with ``rounds[r].gids``: True where the destination
    #: only passes the row on (:func:`relay`): it neither reads it nor is marked for it;
    #: empty lists: no row is relayed
    via: list[np.ndarray] = field(default_factory=list)

    def sent_rows(self) -> int:
        """Rows sent in total (every exchange, the final one included)."""
        return sum(len(m.gids) for m in self.rounds) + len(self.final.gids)


def _placement(plan: Plan, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Round and node of every body position (-1: not in the plan)."""
    rnd = np.full(n, -1, dtype=np.int64)
    node = np.full(n, -1, dtype=np.int64)
    for r, per_node in enumerate(plan.rounds):
        for p, tasks in enumerate(per_node):
            for t in tasks:
                pos = np.asarray(t.indices, dtype=np.int64) - plan.start
                rnd[pos] = r
                node[pos] = p
    return rnd, node


def _events(plan: Plan, sets: AccessSets) -> tuple[np.ndarray, ...]:
    """Accesses of written elements as events (gid, round, node, writes), one per
    (gid, round, node), sorted by gid, then round, then reads before the write, then node."""
    n = sets.n
    written = (
        np.unique(np.concatenate([w for per in plan.writes for w in per]))
        if plan.writes
        else _EMPTY
    )
    if not len(written):
        return _EMPTY, _EMPTY, _EMPTY, np.empty(0, dtype=bool)
    w_rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(sets.w_indptr))
    r_rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(sets.r_indptr))
    # dense element numbers (positions in ``written``), so that one int64 key orders
    # (element, round, node); a read of an element nobody writes is dropped
    r_u = np.minimum(np.searchsorted(written, sets.r_ids), len(written) - 1)
    keep = written[r_u] == sets.r_ids
    rows = np.concatenate([w_rows, r_rows[keep]])
    u = np.concatenate([np.searchsorted(written, sets.w_ids), r_u[keep]]).astype(np.int64)
    isw = np.concatenate([np.ones(len(w_rows), bool), np.zeros(int(keep.sum()), bool)])
    rnd_of, node_of = _placement(plan, n)
    rnd, node = rnd_of[rows], node_of[rows]
    planned = rnd >= 0
    u, rnd, node, isw = u[planned], rnd[planned], node[planned], isw[planned]
    R, P = max(1, len(plan.rounds)), max(1, plan.nodes)
    # one event per (element, round, node): a write if any access there writes
    cell = (u * R + rnd) * P + node
    space = len(written) * R * P
    if space <= DENSE_CELLS:  # flags over every cell: no sort of the accesses
        touched = np.zeros(space, dtype=bool)
        touched[cell] = True
        wrote = np.zeros(space, dtype=bool)
        wrote[cell[isw]] = True
        cells = np.flatnonzero(touched)
        isw = wrote[cells]
    else:
        cells, where = np.unique(cell, return_inverse=True)
        isw = np.bincount(where, weights=isw, minlength=len(cells)) > 0
    node, rest = cells % P, cells // P
    rnd, u = rest % R, rest // R
    order = np.argsort(((u * R + rnd) * 2 + isw) * P + node, kind="stable")
    return written[u[order]], rnd[order], node[order], isw[order]


def _sends(plan: Plan, sets: AccessSets) -> tuple[np.ndarray, ...]:
    """The events of :func:`_events` and the rows sent: ``(gid, rnd, node, isw, w, dst,
    at)``, where row ``k`` sent is the value written at event ``w[k]`` (after round
    ``rnd[w[k]]``, from ``node[w[k]]``) going to node ``dst[k]`` for its event ``at[k]``."""
    gid, rnd, node, isw = _events(plan, sets)
    m = len(gid)
    idx = np.arange(m, dtype=np.int64)
    # the latest write of the same element strictly before each event
    wlast = np.maximum.accumulate(np.where(isw, idx, -1)) if m else _EMPTY
    prev = np.concatenate(([-1], wlast[:-1])) if m else _EMPTY
    first = np.ones(m, dtype=bool)
    first[1:] = gid[1:] != gid[:-1]
    gstart = np.maximum.accumulate(np.where(first, idx, 0)) if m else _EMPTY
    ok = (prev >= gstart) & (prev >= 0)
    w = prev[ok]
    dst = node[ok]
    send = node[w] != dst
    return gid, rnd, node, isw, w[send], dst[send], idx[ok][send]


def message_edges(
    plan: Plan, sets: AccessSets, *, first_use: bool = False
) -> tuple[np.ndarray, ...]:
    """The messages of every round's exchange (not the final one) as sorted unique
    ``(round, src, dst)`` triples: who waits for whom between rounds (``makespan``).
    ``first_use``: one more array, per triple the first round in which ``dst`` touches a
    row the message carries (the latest round it could be received before)."""
    _, rnd, node, _, w, dst, at = _sends(plan, sets)
    if not len(w):
        return (_EMPTY,) * (4 if first_use else 3)
    P = max(1, plan.nodes)
    uniq, inv = np.unique((rnd[w] * P + node[w]) * P + dst, return_inverse=True)
    out = (uniq // (P * P), (uniq // P) % P, uniq % P)
    if not first_use:
        return out
    use = np.full(len(uniq), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(use, inv, rnd[at])
    return (*out, use)


def route(
    plan: Plan,
    sets: AccessSets,
    nodes: list[int] | None = None,
    *,
    home: Callable[[np.ndarray], np.ndarray] | None = None,
    coalesce: bool = False,
    row_bytes: Callable[[np.ndarray], np.ndarray] | None = None,
) -> Routes:
    """The routes of ``plan`` (see the module docstring); ``stale`` is computed for
    ``nodes`` only (default: every node).  ``home`` maps element ids to their home
    nodes: the final exchange then sends each last value to its home only (if the home
    lacks it); without it, to every node that lacks it.  ``coalesce``: each row leaves
    at the latest exchange that still reaches its destination in time, merged with the
    other rows of the same pair of nodes (:func:`coalesce`).  ``row_bytes`` (with
    ``coalesce``) maps element ids to the bytes of their rows (0: never relayed): a
    message that a chain of other messages can carry instead is relayed (:func:`relay`)."""
    P, R = plan.nodes, len(plan.rounds)
    gid, rnd, node, isw, w, dst, at = _sends(plan, sets)
    m = len(gid)
    idx = np.arange(m, dtype=np.int64)
    wlast = np.maximum.accumulate(np.where(isw, idx, -1)) if m else _EMPTY
    first = np.ones(m, dtype=bool)
    first[1:] = gid[1:] != gid[:-1]
    gstart = np.maximum.accumulate(np.where(first, idx, 0)) if m else _EMPTY
    # final exchange: every element's last value to its home (or to each node) lacking it
    if m:
        ends = np.flatnonzero(np.concatenate((gid[1:] != gid[:-1], [True])))
        finals = wlast[ends][wlast[ends] >= gstart[ends]]
    else:
        finals = _EMPTY
    last_w = np.zeros(m, dtype=bool)
    last_w[finals] = True
    slot_of = np.full(m, -1, dtype=np.int64)
    slot_of[finals] = np.arange(len(finals))
    have = np.zeros((len(finals), P), dtype=bool)
    have[np.arange(len(finals)), node[finals]] = True
    got = last_w[w]
    have[slot_of[w[got]], dst[got]] = True
    if home is None:
        f_row, f_dst = np.nonzero(~have)
    else:
        dest = np.asarray(home(gid[finals]), dtype=np.int64)
        f_row = np.flatnonzero(~have[np.arange(len(finals)), dest])
        f_dst = dest[f_row]
    f_src, f_gid = node[finals][f_row], gid[finals][f_row]
    f_dst = f_dst.astype(np.int64)
    if coalesce:
        rounds, uses, born, row_uses, final = _coalesced(
            (node[w], dst, gid[w], rnd[w], rnd[at]),
            (f_src, f_dst, f_gid, rnd[finals][f_row]),
            R,
            P,
            _loads(plan),
        )
        vias = _no_vias(rounds)
        if row_bytes is not None:
            rounds, uses, born, vias = relay(rounds, uses, born, row_uses, P, row_bytes)
    else:
        rounds, uses, born = [], [], []
        for r in range(R):
            sel = rnd[w] == r
            msgs = Messages.of(node[w[sel]], dst[sel], gid[w[sel]])
            rounds.append(msgs)
            uses.append(_first_uses(msgs, node[w[sel]], dst[sel], rnd[at[sel]], P))
            born.append(np.full(len(msgs.gids), r, dtype=np.int64))
        final = Messages.of(f_src, f_dst, f_gid)
        vias = []
    # stale: after round r, node p lacks what another node wrote in r and did not send it
    want = range(P) if nodes is None else nodes
    stale: list[dict[int, np.ndarray]] = [{} for _ in range(R)]
    writes = np.flatnonzero(isw)
    for p in want:
        routed = np.zeros(m, dtype=bool)
        routed[w[dst == p]] = True
        mine = writes[(node[writes] != p) & ~routed[writes]]
        by_round = rnd[mine]
        for r in range(R):
            stale[r][p] = np.sort(gid[mine[by_round == r]])
    return Routes(rounds, final, stale, uses, (gid[finals], node[finals]), born, vias)


def coalesce(
    start: np.ndarray,
    end: np.ndarray,
    pair: np.ndarray,
    due: np.ndarray | None = None,
    may: Callable[[int, int, int], bool] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fewest messages for a set of *sends*: send ``k`` goes between the pair of nodes
    ``pair[k]`` and may leave at any exchange from ``start[k]`` to ``end[k]`` (its send
    window, ``start <= end``).  Sends of one pair whose windows share an exchange can
    travel as one message.  Returns per send its group (one message) and the group's
    window: from the latest start to the earliest end of its sends (never empty).

    The greedy rule (per pair, by start: a send joins the open group while its start is
    no later than the group's earliest end) meets every window with as few exchanges as
    any rule can (each group closes at the earliest deadline among its sends, and the
    next send starts after it).

    ``may(pair, written, needed)``, with ``due`` (per send, the round its destination
    first needs it), restricts that: a send joins only if a group whose rows are all
    written by round ``written`` and first needed in round ``needed`` may travel as one
    message (:func:`route` asks whether the destination would wait longer)."""
    n = len(start)
    if not n:
        return _EMPTY, _EMPTY, _EMPTY
    order = np.lexsort((start, pair))
    grp = np.empty(n, dtype=np.int64)
    g, cur_pair, cur_end, cur_lo, cur_due = -1, None, 0, 0, 0
    starts, ends, pairs = start[order].tolist(), end[order].tolist(), pair[order].tolist()
    dues = due[order].tolist() if due is not None else ends
    out: list[int] = []
    for s, e, pr, d in zip(starts, ends, pairs, dues, strict=True):
        if (
            pr != cur_pair
            or s > cur_end
            or (may is not None and not may(pr, max(cur_lo, s), min(cur_due, d)))
        ):
            g += 1
            cur_pair, cur_end, cur_lo, cur_due = pr, e, s, d
        else:
            cur_end, cur_lo, cur_due = min(cur_end, e), max(cur_lo, s), min(cur_due, d)
        out.append(g)
    grp[order] = out
    lo = np.full(g + 1, -1, dtype=np.int64)
    np.maximum.at(lo, grp, start)
    hi = np.full(g + 1, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(hi, grp, end)
    return grp, lo[grp], hi[grp]


def _loads(plan: Plan) -> np.ndarray:
    """Bodies per (round, node) of ``plan``: the time unit of the critical path."""
    out = np.zeros((len(plan.rounds), max(1, plan.nodes)))
    for r, per_node in enumerate(plan.rounds):
        for p, tasks in enumerate(per_node):
            out[r, p] = sum(len(t.indices) for t in tasks)
    return out


def _coalesced(
    routed: tuple[np.ndarray, ...],
    finals: tuple[np.ndarray, ...],
    R: int,
    P: int,
    loads: np.ndarray,
) -> tuple[list[Messages], list[np.ndarray], list[np.ndarray], list[np.ndarray], Messages]:
    """The exchanges of coalesced routes (:func:`route` with ``coalesce``): the messages,
    per message the round it is due by, per row the round that wrote it (-1: a last
    value going home) and the first round its destination touches it, and the final
    exchange.

    ``routed``: per row sent, (src, dst, gid, round written, first round ``dst`` touches
    it after that): it may leave at any exchange from the round written to the one
    before that use.  ``finals``: per last value that goes home, (src, dst, gid, round
    written): it may leave at any exchange from that round to the final one (``R``).
    Rows written in the same round and sent between the same pair form one send (its
    window, the intersection of theirs, holds the round written); :func:`coalesce`
    groups the sends.

    Why the value sent is the one routed (the property test checks it on generated
    plans): between the round a row was written and its send, nobody writes it (the
    next write of a routed row is at or after its use; nobody writes a last value
    again), so the sender's replica keeps it; and nothing arrives there to overwrite it
    (a message to the sender carrying the row holds an older write, and was due by the
    sender's own write, which follows the first round it touches the row)."""
    src = np.concatenate([routed[0], finals[0]]).astype(np.int64)
    dst = np.concatenate([routed[1], finals[1]]).astype(np.int64)
    gid = np.concatenate([routed[2], finals[2]]).astype(np.int64)
    born = np.concatenate([routed[3], finals[3]]).astype(np.int64)
    never = np.iinfo(np.int64).max
    use = np.concatenate([routed[4], np.full(len(finals[0]), never, np.int64)]).astype(np.int64)
    last = np.arange(len(src)) >= len(routed[0])
    row_end = np.where(last, R, use - 1)
    # one send per (pair, round written): its window ends at its rows' earliest deadline
    key = (src * P + dst) * (R + 1) + born
    subs, inv = np.unique(key, return_inverse=True)
    sub_end = np.full(len(subs), never, dtype=np.int64)
    np.minimum.at(sub_end, inv, row_end)
    sub_due = np.full(len(subs), never, dtype=np.int64)
    np.minimum.at(sub_due, inv, use)
    # uncoalesced, each send is one message: node ``dst`` starts round ``due`` once the
    # sender finished round ``born`` (``makespan.on_demand_path``, bodies as time).  A
    # group may wait only where that timing has slack: the sender finishes the group's
    # last round written no later than the destination, as timed so, starts the first
    # round that needs a row, so the plan's critical path stays what it was
    s_pair, s_born = subs // (R + 1), subs % (R + 1)
    routed_sub = sub_due < never
    finish = on_demand_finish(
        loads,
        s_born[routed_sub],
        s_pair[routed_sub] // P,
        s_pair[routed_sub] % P,
        sub_due[routed_sub],
    )
    ready = finish - loads

    def may(pair: int, written: int, needed: int) -> bool:
        if needed >= R:  # last values only: due at the end
            return True
        return bool(finish[written, pair // P] <= ready[needed, pair % P])

    # a group leaves as soon as every row in it is written (the start of its window),
    # and is due where its destination first touches one (the receive is deferred to
    # there: ``Cluster.settle``), so a receiver waits for the sender's round that wrote
    # the rows, not for a later one; a group of last values only (its window ends at
    # the final exchange) waits for the final exchange, where nobody waits mid-way
    _, lo, hi = coalesce(s_born, sub_end, s_pair, sub_due, may)
    leave = np.where(hi == R, R, lo)
    at = leave[inv] if len(inv) else _EMPTY
    tag = np.where(last, -1, born)  # a last value on its way home: read by nobody there
    rounds: list[Messages] = []
    uses: list[np.ndarray] = []
    borns: list[np.ndarray] = []
    row_uses: list[np.ndarray] = []
    for r in range(R):
        sel = at == r
        # each row's index: its tag and use (one per triple, duplicates alike) with one sort
        msgs, k = Messages.carrying(src[sel], dst[sel], gid[sel], np.flatnonzero(sel))
        rounds.append(msgs)
        uses.append(_first_uses(msgs, src[sel], dst[sel], use[sel], P))
        borns.append(tag[k] if len(k) else _EMPTY)
        row_uses.append(use[k] if len(k) else _EMPTY)
    sel = at == R
    final = Messages.of(src[sel], dst[sel], gid[sel])
    return rounds, uses, borns, row_uses, final


def _successors(rounds: list[Messages], P: int) -> np.ndarray:
    """Per node, the node it sends the most messages to over ``rounds`` (ties: the
    nearest after it, counting up modulo ``P``), or -1 if it sends none."""
    src = np.concatenate([m.src for m in rounds]) if rounds else _EMPTY
    dst = np.concatenate([m.dst for m in rounds]) if rounds else _EMPTY
    succ = np.full(P, -1, dtype=np.int64)
    if not len(src):
        return succ
    n = np.bincount(src * P + dst, minlength=P * P).reshape(P, P)
    ahead = (np.arange(P)[None, :] - np.arange(P)[:, None]) % P  # dst's distance after src
    best = np.argmax(n * P + (P - 1 - ahead), axis=1)  # most messages, then nearest after
    sends = n.sum(axis=1) > 0
    succ[sends] = best[sends]
    return succ


def _no_vias(rounds: list[Messages]) -> list[np.ndarray]:
    """``Routes.via`` of exchanges that relay nothing: no row only passes through."""
    return [np.zeros(len(m.gids), dtype=bool) for m in rounds]


def relay(
    rounds: list[Messages],
    uses: list[np.ndarray],
    borns: list[np.ndarray],
    row_uses: list[np.ndarray],
    P: int,
    row_bytes: Callable[[np.ndarray], np.ndarray],
) -> tuple[list[Messages], list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Relayed routes: a message whose rows the chain of *successors* (each node's most
    used destination, :func:`_successors`; in a rotation, the ring) can carry to its
    destination in time, for at most ``RELAY_BYTES`` more bytes sent, is not sent: its
    rows ride those messages, each node on the way passing them on.

    The rows written in one round travel together: a hop leaves node ``x`` at the first
    exchange at or after they are in ``x``'s replica (the round that wrote them; then
    the previous carrier's due round, ``uses``) that has a message from ``x`` to its
    successor, no later than the round before their first use at the destination
    (``row_uses``), and the last hop must be due by that use.  So no carrier is due
    earlier than it was (its deferral, and with it the plan's critical path, are
    unchanged), and every row is in its destination when the routes meant.  The value
    stays the one routed: nobody writes a routed row before its destination's use, and
    nothing sends an intermediate another version (it does not touch the row).  Only
    messages whose rows were all written in the invocation (no last value on its way
    home) and all have bytes are relayed; successors' messages never are (they carry).

    Returns the exchanges, per message the round it is due by, per row the round that
    wrote it, and per row whether its destination only passes it on (``Routes.via``)."""
    R = len(rounds)
    succ = _successors(rounds, P)
    nbytes = [np.asarray(row_bytes(m.gids), dtype=np.int64) for m in rounds]
    positive = [nb[nb > 0] for nb in nbytes]
    smallest = min((int(x.min()) for x in positive if len(x)), default=0)
    if not smallest:
        return rounds, uses, borns, _no_vias(rounds)
    hop = _hops(succ, min(P, 1 + RELAY_BYTES // smallest))
    # the carriers: per node, the exchanges with a message to its successor, and its due
    c_ex: list[list[int]] = [[] for _ in range(P)]
    c_use: list[list[int]] = [[] for _ in range(P)]
    for r, m in enumerate(rounds):
        for k in np.flatnonzero(m.dst == succ[m.src]).tolist():
            c_ex[int(m.src[k])].append(r)
            c_use[int(m.src[k])].append(int(uses[r][k]))
    parts: list[tuple[np.ndarray, ...]] = []  # (exchange, src, dst, gid, born, via, use)
    for r, m in enumerate(rounds):
        n_rows = np.diff(m.ptr)
        drop = np.zeros(len(m), dtype=bool)
        if len(m):
            starts = m.ptr[:-1]
            size = np.add.reduceat(nbytes[r], starts)
            h = hop[m.src, m.dst]
            may = (
                (h >= 2)
                & (size * (h - 1) <= RELAY_BYTES)
                & (np.minimum.reduceat(nbytes[r], starts) > 0)
                & (np.minimum.reduceat(borns[r], starts) >= 0)  # no last value going home
            )
            for k in np.flatnonzero(may).tolist():
                lo, hi = int(m.ptr[k]), int(m.ptr[k + 1])
                hops = _relayed(
                    m.gids[lo:hi],
                    borns[r][lo:hi],
                    row_uses[r][lo:hi],
                    int(m.src[k]),
                    int(m.dst[k]),
                    succ,
                    c_ex,
                    c_use,
                )
                if hops is not None:
                    drop[k] = True
                    parts += hops
        keep = np.repeat(~drop, n_rows)
        parts.append(
            (
                np.full(int(keep.sum()), r),
                np.repeat(m.src, n_rows)[keep],
                np.repeat(m.dst, n_rows)[keep],
                m.gids[keep],
                borns[r][keep],
                np.zeros(int(keep.sum()), dtype=bool),
                row_uses[r][keep],
            )
        )
    if len(parts) == R:  # nothing relayed
        return rounds, uses, borns, _no_vias(rounds)
    # a relayed row that a carrier also carries to its next node (who touches it too)
    # merges into that row, which comes first (``Messages.carrying`` keeps the first)
    parts.sort(key=lambda c: bool(len(c[5]) and c[5][0]))
    ex, src, dst, gid, born, via, use = (np.concatenate(c) for c in zip(*parts, strict=True))
    out_m, out_u, out_b, out_v = [], [], [], []
    for r in range(R):
        sel = ex == r
        tag = (born[sel] + 1) * 2 + via[sel]
        msgs, t = Messages.carrying(src[sel], dst[sel], gid[sel], tag.astype(np.int64))
        out_m.append(msgs)
        out_u.append(_first_uses(msgs, src[sel], dst[sel], use[sel], P))
        out_b.append(t // 2 - 1)
        out_v.append((t % 2).astype(bool))
    return out_m, out_u, out_b, out_v


def _hops(succ: np.ndarray, most: int) -> np.ndarray:
    """``hop[s, d]``: how many steps along successors lead from ``s`` to ``d`` (at most
    ``most``), 0 where they do not."""
    P = len(succ)
    hop = np.zeros((P, P), dtype=np.int64)
    for s in range(P):
        x = s
        for k in range(1, most + 1):
            x = int(succ[x])
            if x < 0 or x == s or hop[s, x]:
                break
            hop[s, x] = k
    return hop


def _relayed(
    gids: np.ndarray,
    born: np.ndarray,
    use: np.ndarray,
    src: int,
    dst: int,
    succ: np.ndarray,
    c_ex: list[list[int]],
    c_use: list[list[int]],
) -> list[tuple[np.ndarray, ...]] | None:
    """The hops of one message's rows along successors (:func:`relay`), the rows
    written in one round together, or None when some cannot arrive in time."""
    out: list[tuple[np.ndarray, ...]] = []
    lo, hi = int(born.min()), int(born.max())
    for b in [lo] if lo == hi else np.unique(born).tolist():
        at = born == b
        path = _chain(src, dst, b, int(use[at].min()), succ, c_ex, c_use)
        if path is None:
            return None
        g, n = gids[at], int(at.sum())
        for j, (e, x, y, u) in enumerate(path):
            last = j == len(path) - 1
            out.append(
                (
                    np.full(n, e),
                    np.full(n, x),
                    np.full(n, y),
                    g,
                    born[at],
                    np.full(n, not last),
                    use[at] if last else np.full(n, u),
                )
            )
    return out


def _chain(
    src: int,
    dst: int,
    r: int,
    due: int,
    succ: np.ndarray,
    c_ex: list[list[int]],
    c_use: list[list[int]],
) -> list[tuple[int, int, int, int]] | None:
    """The hops (exchange, from, to, due) that carry rows leaving ``src`` at exchange
    ``r`` or later along successors to ``dst`` (which they reach: :func:`_hops`) by
    round ``due``; None if some hop has no message in time (see :func:`relay`)."""
    path: list[tuple[int, int, int, int]] = []
    x, t = src, r
    while True:
        j = bisect.bisect_left(c_ex[x], t)
        if j == len(c_ex[x]) or c_ex[x][j] > due - 1:
            return None
        e, u, y = c_ex[x][j], c_use[x][j], int(succ[x])
        path.append((e, x, y, u))
        if y == dst:
            return path if u <= due else None
        x, t = y, u


def _first_uses(
    msgs: Messages, src: np.ndarray, dst: np.ndarray, use: np.ndarray, P: int
) -> np.ndarray:
    """Per message of ``msgs``: the smallest ``use`` among the rows it carries (one
    (src, dst, use) per row sent, in any order)."""
    out = np.full(len(msgs), np.iinfo(np.int64).max, dtype=np.int64)
    if len(msgs):
        keys = msgs.src * P + msgs.dst  # sorted: messages are sorted by (src, dst)
        np.minimum.at(out, np.searchsorted(keys, src * P + dst), use)
    return out


@dataclass(frozen=True)
class Touches:
    """What each node of a plan touches: per (node, element) pair, sorted by node then
    element, the first round in which it does; per written element (sorted), the round
    of its first write.  Built once per plan; :func:`fetch` reads it per invocation."""

    node: np.ndarray
    gid: np.ndarray
    first: np.ndarray
    written: np.ndarray
    first_write: np.ndarray
    nodes: int


def touches(plan: Plan, sets: AccessSets) -> Touches:
    """The :class:`Touches` of ``plan``."""
    n = sets.n
    rnd_of, node_of = _placement(plan, n)
    w_rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(sets.w_indptr))
    r_rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(sets.r_indptr))
    rows = np.concatenate([w_rows, r_rows])
    gids = np.concatenate([sets.w_ids, sets.r_ids]).astype(np.int64)
    rnd, node = rnd_of[rows], node_of[rows]
    keep = rnd >= 0
    rnd, node, gids = rnd[keep], node[keep], gids[keep]
    order = np.lexsort((rnd, gids, node))
    rnd, node, gids = rnd[order], node[order], gids[order]
    new = np.ones(len(gids), dtype=bool)
    new[1:] = (node[1:] != node[:-1]) | (gids[1:] != gids[:-1])
    wr = rnd_of[w_rows]
    wk = wr >= 0
    wg, wr = sets.w_ids[wk].astype(np.int64), wr[wk]
    worder = np.lexsort((wr, wg))
    wg, wr = wg[worder], wr[worder]
    wnew = np.ones(len(wg), dtype=bool)
    wnew[1:] = wg[1:] != wg[:-1]
    return Touches(node[new], gids[new], rnd[new], wg[wnew], wr[wnew], max(1, plan.nodes))


def held_touches(t: Touches, nodes: list[int], home: Callable[[np.ndarray], np.ndarray]) -> Touches:
    """What ``nodes`` (an MPI rank's) need of ``t`` for :func:`fetch`: the pairs of their
    own touches (what they receive) and of every node's touches of the rows whose home
    is one of them (what they send), with every written element's first write (one
    entry per model row, not per body).  The messages :func:`fetch` makes from it between
    a pair with a node of ``nodes`` at one end are those it makes from the whole of
    ``t``: a message's rows, source and due round depend only on its destination's
    touches of its source's home rows."""
    mine = np.asarray(nodes, dtype=np.int64)
    if not len(t.gid):
        return t
    keep = np.isin(t.node, mine) | np.isin(np.asarray(home(t.gid), dtype=np.int64), mine)
    return Touches(t.node[keep], t.gid[keep], t.first[keep], t.written, t.first_write, t.nodes)


def _first_write(t: Touches, gids: np.ndarray) -> np.ndarray:
    """Per element of ``gids``, the round of its first write in the plan (never: the
    largest int64), from ``t``'s written elements."""
    never = np.iinfo(np.int64).max
    if not len(t.written):
        return np.full(len(gids), never, dtype=np.int64)
    w = np.minimum(np.searchsorted(t.written, gids), len(t.written) - 1)
    return np.where(t.written[w] == gids, t.first_write[w], never)


@dataclass
class FetchSummary:
    """Enough of every node's touches to tell, on every rank alike, whether a fetch
    exchange has any message (:func:`fetch_any`) once a rank keeps only its share of
    them (:func:`held_touches`): per element some node touches before anyone writes it
    and that is not its home (sorted ``gids``), how many such nodes (``count``, at most
    2) and, where there is one, which (``only``).  One entry per element, not per body."""

    gids: np.ndarray
    count: np.ndarray
    only: np.ndarray


def fetch_summary(t: Touches, home: Callable[[np.ndarray], np.ndarray]) -> FetchSummary:
    """The :class:`FetchSummary` of every node's touches ``t``."""
    if not len(t.gid):
        return FetchSummary(_EMPTY, _EMPTY, _EMPTY)
    early = (t.first <= _first_write(t, t.gid)) & (
        np.asarray(home(t.gid), dtype=np.int64) != t.node
    )
    gid, node = t.gid[early], t.node[early]
    if not len(gid):
        return FetchSummary(_EMPTY, _EMPTY, _EMPTY)
    order = np.lexsort((node, gid))
    gid, node = gid[order], node[order]
    first = np.ones(len(gid), dtype=bool)
    first[1:] = gid[1:] != gid[:-1]
    starts = np.flatnonzero(first)
    count = np.minimum(np.diff(np.append(starts, len(gid))), 2)  # (node, gid) pairs unique
    return FetchSummary(gid[starts], count.astype(np.int64), node[starts].astype(np.int64))


def fetch_any(s: FetchSummary, dirty: np.ndarray, holder: np.ndarray | None) -> bool:
    """Whether :func:`fetch` of every node's touches, for these ``dirty`` elements and
    ``holder`` s, has a message: some dirty element is touched early by a node other
    than its home and its holder."""
    if not len(dirty) or not len(s.gids):
        return False
    k = np.minimum(np.searchsorted(s.gids, dirty), len(s.gids) - 1)
    hit = s.gids[k] == dirty
    if holder is None:
        return bool(hit.any())
    kh = k[hit]
    return bool(((s.count[kh] >= 2) | (s.only[kh] != holder[hit])).any())


def fetch(
    t: Touches,
    dirty: np.ndarray,
    home: Callable[[np.ndarray], np.ndarray],
    holder: np.ndarray | None = None,
) -> tuple[Messages, np.ndarray]:
    """The fetch exchange before a plan's first round: the home of each element in
    ``dirty`` (sorted ids whose replicas may be old away from home, see the module
    docstring) sends it to each node that touches it before anyone writes it in this
    invocation (a node that touches it only later gets it from the routed write-back),
    unless that node is its ``holder`` (per element, the node that wrote its last value,
    which holds it: SGD's user rows stay where a rotation writes them); and per message,
    the first round in which its destination touches one of its rows (it may be
    received as late as just before that round)."""
    if not len(dirty) or not len(t.gid):
        return Messages.of(_EMPTY, _EMPTY, _EMPTY), _EMPTY
    k = np.minimum(np.searchsorted(dirty, t.gid), len(dirty) - 1)
    hit = dirty[k] == t.gid
    node, gid, first = t.node[hit], t.gid[hit], t.first[hit]
    h = np.asarray(home(gid), dtype=np.int64)
    need = (first <= _first_write(t, gid)) & (h != node)
    if holder is not None:
        need &= holder[k[hit]] != node
    src, dst, use = h[need], node[need], first[need]
    msgs = Messages.of(src, dst, gid[need])
    return msgs, _first_uses(msgs, src, dst, use, t.nodes)


__all__ = [
    "Messages",
    "Routes",
    "Touches",
    "coalesce",
    "FetchSummary",
    "fetch",
    "fetch_any",
    "fetch_summary",
    "held_touches",
    "message_edges",
    "relay",
    "route",
    "touches",
]
