"""The plan guard: catch, as it happens, every access that could break serializability.

A plan is built from the reconnaissance (RE) sets of one invocation and reused by the
next ones.  A body whose accesses depend on values (coordinate descent that skips zero
coefficients, a flag that flips after the first epoch) can leave those sets later, and
then the plan no longer proves that the result equals a serial order.  So every
execution checks, per access, the two things that could break it:

* a write to a slot the running task does not own in this round (its node's, or with
  several threads its thread's, planned writes) — the write would race with another
  task or never reach the other replicas;
* a read of a slot that another node (or another thread's task) writes in the same
  round — the value read would depend on timing;
* a read of a slot that another node wrote in an earlier round and did not send here
  (the write-back is routed: a row goes only to the nodes whose sets touch it next,
  ``engine._machines.routing``) — the value read would be stale;
* a read of a slot sent here for a later round, before that round (an MPI rank takes
  such rows in just before the round that first touches them, ``Cluster.settle``) —
  the value would not be there yet;
* a read of a slot an earlier invocation wrote (*dirty*: its last value went home only,
  ``engine._data.dds.make_whole``) that this node's sets do not touch, so the fetch
  exchange before the first round did not bring it — the value read would be old.

The check itself lives in the DDS guard modes (``engine._data.dds``): one byte per slot and
node says who may touch the slot in the running round, so the common case is one
bytearray lookup.  This module arms those bytes round by round, snapshots what an
invocation may change so that it can be undone, and decides what a violation means:

* ``replan="auto"`` (default): the node stops, the invocation is undone on every node,
  reconnaissance re-runs and the invocation re-executes under the new plan; if that
  plan is violated too, the invocation runs serially on every replica;
* ``replan="always"``: reconnaissance on every invocation (for bodies known to depend
  on values);
* ``replan="never"``: a violation is an error naming operator, invocation, index and
  element.

Nodes learn that another node stopped from a flag in the header of its write-back
messages, not from a collective per round: a stopped node runs no more bodies but keeps
sending and receiving every message of the attempt, flagged, so nobody waits for it;
the outcome is agreed once, at the final exchange, and the violation reported is the one
with the smallest (round, node) (:meth:`Violation.key`), which timing cannot change.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .._data import dds as _dds
from .._data.dds import ANY_OWN, FREE, LOCKED, LOCKED_BODY, OTHER, SLOT_BITS, SLOT_MASK, _tls
from .._data.shard import kept_needs, needs_of
from .._errors import BodyError
from .._machines.routing import (
    Messages,
    fetch,
    fetch_any,
    fetch_summary,
    held_touches,
    route,
    touches,
)
from .._runtime.session import not_seen

if TYPE_CHECKING:
    from .._machines.planner import Plan
    from .._runtime.session import Session
    from .._runtime.transport import Message
    from .recon import AccessSets

#: The values ``replan=`` accepts.
POLICIES = ("auto", "always", "never")


class PlanViolation(BaseException):
    """Internal: a body left its plan; unwinds the node's round.

    A ``BaseException`` so that a user's ``except Exception`` around a DDS access cannot
    swallow it (the guard also keeps the first violation, so a bare ``except:`` does not
    hide it either)."""


@dataclass(frozen=True, slots=True)
class Violation:
    """The first access of an invocation that left the plan."""

    op: str
    invocation: int
    index: int
    node: int
    element: str
    write: bool
    reason: str
    #: the plan round the access was in (-1: not known)
    round: int = -1

    def key(self) -> tuple[int, int]:
        """Which of several violations an attempt reports: the smallest (round, node)."""
        return (self.round, self.node)

    def message(self) -> str:
        what = "wrote" if self.write else "read"
        if self.node < 0:  # a stop heard from another rank: its access is not known here
            return (
                f"async_for {self.op!r} invocation {self.invocation}: {self.reason}, so "
                "this node stopped too"
            )
        return (
            f"async_for {self.op!r} invocation {self.invocation} index {self.index} on node "
            f"{self.node} {what} {self.element}, which {self.reason}: the body's accesses "
            "depend on values that changed since reconnaissance"
        )


def _slot_groups(dds_list: list[Any], gids: np.ndarray) -> list[tuple[Any, np.ndarray]]:
    """Split sorted element ids into (dds, slots) pairs."""
    ids = gids >> SLOT_BITS
    return [(dds_list[d], gids[ids == d] & SLOT_MASK) for d in np.unique(ids).tolist()]


def _task_writes(sets: AccessSets, indices: np.ndarray) -> np.ndarray:
    """Unique element ids written by the bodies ``indices``."""
    pos = np.asarray(indices, dtype=np.int64) - sets.start
    if not len(pos):
        return np.empty(0, dtype=np.int64)
    counts = np.diff(sets.w_indptr)[pos]
    starts = sets.w_indptr[pos]
    idx = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
    return np.unique(sets.w_ids[idx])


def _messages(
    dds: list[Any], msgs: Messages, local: list[int], every: bool
) -> tuple[list[Message], list[int]]:
    """The transport's messages of one exchange: all of them (``every``: the in-process
    cluster moves rows between its nodes itself), else those a local node sends or gets;
    and the index in ``msgs`` of each."""
    here = set(local)
    out: list[Message] = []
    kept: list[int] = []
    for k in range(len(msgs)):
        src, dst = int(msgs.src[k]), int(msgs.dst[k])
        if every or src in here or dst in here:
            out.append((src, dst, _slot_groups(dds, msgs.rows(k))))
            kept.append(k)
    return out, kept


class Exchange(list[Any]):
    """The messages (``Message``) of one write-back, and ``defer``: per message, the round before which
    its destination must have its rows when that is later than the next (None: at once).
    A list, so that a substituted write-back step (``tests/mutants.py``) sees messages."""

    defer: list[int | None]


def _per_dds(dds_list: list[Any], value: Callable[[Any, np.ndarray], Any]) -> Any:
    """Element ids -> ``value(dds, slots)`` of each id's DDS, vectorised (one call per DDS)."""

    def of(gids: np.ndarray) -> np.ndarray:
        out = np.empty(len(gids), dtype=np.int64)
        ids = gids >> SLOT_BITS
        for d in np.unique(ids).tolist():
            at = ids == d
            out[at] = value(dds_list[d], gids[at] & SLOT_MASK)
        return out

    return of


def _home_of(dds_list: list[Any]) -> Any:
    """Element ids -> their home nodes (``engine._data.dds.homes``), vectorised."""
    return _per_dds(dds_list, _dds.homes)


def _row_bytes_of(dds_list: list[Any]) -> Any:
    """Element ids -> the bytes of their rows where a message may relay them
    (``routing.relay``: numeric DDS that are not sharded), else 0."""
    return _per_dds(dds_list, lambda d, _: d.row_nbytes() if d._numeric and not d._sharded else 0)


def dirty_ids(sess: Session) -> tuple[np.ndarray, np.ndarray]:
    """Sorted element ids of every dirty slot (see ``engine._data.dds``), and per id the
    node that wrote its last value."""
    parts = [(d._gbase | d._dirty, d._holder) for d in sess.dds if d._dirty is not None]
    if not parts:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    return np.concatenate([g for g, _ in parts]), np.concatenate([h for _, h in parts])


class Fetch:
    """The fetch exchange of one invocation (``GuardPlan.fetch``): the messages (an
    :class:`Exchange`, each deferred to the first round its destination touches its
    rows when that is not round 0); per local node the (dds, slots) it must not read
    for the whole attempt (dirty, not homed there, not fetched: ``stale``) and the ones
    that arrive only before round ``u`` (``arrive[u]``)."""

    def __init__(self) -> None:
        self.exchange = Exchange()
        self.exchange.defer = []
        #: whether any node fetches (the same on every rank: then every rank exchanges)
        self.any = False
        self.stale: dict[int, list[tuple[Any, np.ndarray]]] = {}
        self.arrive: dict[int, dict[int, list[tuple[Any, np.ndarray]]]] = {}

    def marked(self) -> list[Any]:
        """The DDS with a mark on some local node (they need guard maps)."""
        seen: dict[int, Any] = {}
        for groups in self.stale.values():
            seen.update((id(d), d) for d, _ in groups)
        for per in self.arrive.values():
            for groups in per.values():
                seen.update((id(d), d) for d, _ in groups)
        return list(seen.values())


class GuardPlan:
    """What the guard needs of one plan: per round and node, the codes to arm; per DDS,
    the slots the plan may change (to snapshot for undo); the routed write-back of every
    round and the slots it leaves stale on each local node.  Built once per plan."""

    def __init__(self, sess: Session, plan: Plan, sets: AccessSets) -> None:
        dds = sess.dds
        nodes = sess.cluster.local_nodes
        self._home = _home_of(dds)
        relay = _row_bytes_of(dds) if sess.ring and sess.coalesce else None
        routes = route(plan, sets, nodes, home=self._home, coalesce=sess.coalesce, row_bytes=relay)
        every = not sess.cluster.is_mpi
        here = set(nodes)
        self._dds = dds
        self._every = every
        self._nodes = nodes
        every_touch = touches(plan, sets)
        #: per sharded DDS, per node: the rows away from home its tasks touch (what an
        #: MPI rank keeps of them: ``shard.kept_needs``)
        self.shard_needs = needs_of(sess, every_touch.node, every_touch.gid)
        if not every:
            self.shard_needs = kept_needs(sess, self.shard_needs)
        #: what :meth:`fetch` reads each invocation: an MPI rank keeps its nodes' touches
        #: and those of its home rows (issue 35: every node's are O(n) on every rank)
        self._touches = every_touch if every else held_touches(every_touch, nodes, self._home)
        #: whether a fetch has any message at all, alike on every rank (a rank that
        #: keeps a share of the touches sees only its own messages)
        self._fetches = fetch_summary(every_touch, self._home)
        R = self._rounds = len(plan.rounds)
        #: per round, then once more after the last round: the messages of its write-back
        #: and, per message, the round it is due by when later than the next (``defer``:
        #: decided by the plan alone, so in-process nodes and MPI ranks mark alike)
        self.exchanges: list[list[Message]] = []
        #: per round b: per local node, (dds, slots) written in round b whose rows arrive
        #: for a later round than b + 1 (deferred, or sent at a later exchange: coalesced
        #: routes): marked as written by another node from b's write-back until ``arrive``
        self.pending: list[dict[int, list[tuple[Any, np.ndarray]]]] = [{} for _ in range(R)]
        #: per round u: per local node, (dds, slots) that arrive just before round u
        self.arrive: list[dict[int, list[tuple[Any, np.ndarray]]]] = [{} for _ in range(R + 1)]
        for r, msgs in enumerate(routes.rounds):
            out, kept = _messages(dds, msgs, nodes, every)
            uses = routes.uses[r] if r < len(routes.uses) else None
            born = routes.born[r] if r < len(routes.born) else None
            via = routes.via[r] if r < len(routes.via) else None
            later: list[int | None] = []
            for (_, dst, carried), k in zip(out, kept, strict=True):
                u = int(uses[k]) if uses is not None else r + 1
                deferred = r + 1 < u < R and all(d._numeric for d, _ in carried)
                later.append(u if deferred else None)
                if dst in here:
                    lo, hi = int(msgs.ptr[k]), int(msgs.ptr[k + 1])
                    b = None if born is None else born[lo:hi]
                    rows = msgs.rows(k)
                    if via is not None and via[lo:hi].any():  # passed on: stays stale here
                        mine = ~via[lo:hi]
                        rows, b = rows[mine], None if b is None else b[mine]
                        carried = _slot_groups(dds, rows)
                    self._mark_late(dst, u if deferred else r + 1, r, carried, rows, b)
            ex = Exchange(out)
            ex.defer = later
            self.exchanges.append(ex)
        final = Exchange(_messages(dds, routes.final, nodes, every)[0])
        final.defer = [None] * len(final)
        self.exchanges.append(final)
        #: per round: per local node: (dds, slots) it must not read after the write-back
        self.stale = [
            {p: _slot_groups(dds, g) for p, g in per.items() if len(g)} for per in routes.stale
        ]
        self.routed_rows = routes.sent_rows()
        #: per DDS written: (dds, slots, node that wrote each slot's last value)
        hg, hn = routes.holders
        self.holders = [(d, s, hn[(hg >> SLOT_BITS) == d._id]) for d, s in _slot_groups(dds, hg)]
        self.single = sess.cluster.threads == 1
        self.written: list[Any] = []
        union = (
            np.unique(np.concatenate([w for per in plan.writes for w in per]))
            if plan.writes and any(len(w) for per in plan.writes for w in per)
            else np.empty(0, dtype=np.int64)
        )
        self.undo_slots = _slot_groups(dds, union)
        self.written = [d for d, _ in self.undo_slots]
        #: per round: per local node: list of (dds, slots, code)
        self.arms: list[dict[int, list[tuple[Any, np.ndarray, int]]]] = []
        for r, rnd in enumerate(plan.rounds):
            per_node: dict[int, list[tuple[Any, np.ndarray, int]]] = {}
            for p in nodes:
                entries: list[tuple[Any, np.ndarray, int]] = []
                for q, gids in enumerate(plan.writes[r]):
                    if q != p and len(gids):
                        entries += [(d, s, OTHER) for d, s in _slot_groups(dds, gids)]
                if self.single:
                    entries += [(d, s, 1) for d, s in _slot_groups(dds, plan.writes[r][p])]
                else:
                    by_code: dict[int, list[np.ndarray]] = {}
                    for t in rnd[p]:
                        code = LOCKED if t.locked else t.thread + 1
                        by_code.setdefault(code, []).append(t.indices)
                    for code, parts in by_code.items():
                        gids = _task_writes(sets, np.concatenate(parts))
                        entries += [(d, s, code) for d, s in _slot_groups(dds, gids)]
                per_node[p] = entries
            self.arms.append(per_node)

    def _mark_late(
        self,
        dst: int,
        due: int,
        r: int,
        carried: list[tuple[Any, np.ndarray]],
        rows: np.ndarray,
        born: np.ndarray | None,
    ) -> None:
        """A message of exchange ``r`` whose rows are in ``dst``'s replica before round
        ``due``: each row written in a round ``b`` with ``due > b + 1`` is marked on
        ``dst`` from ``b``'s write-back until then (``pending``, ``arrive``).  A row born
        -1 (a last value going home early) stays as the routes left it (stale)."""
        if born is None or (born == r).all():
            if due > r + 1:
                self.pending[r].setdefault(dst, []).extend(carried)
                self.arrive[due].setdefault(dst, []).extend(carried)
            return
        for b in np.unique(born[born >= 0]).tolist():
            if due > b + 1:
                groups = _slot_groups(self._dds, rows[born == b])
                self.pending[b].setdefault(dst, []).extend(groups)
                self.arrive[due].setdefault(dst, []).extend(groups)

    def fetch(self, sess: Session) -> Fetch:
        """The fetch exchange for the DDS state now (``routing.fetch``), and what each
        local node must not read, or not yet, because of it."""
        fx = Fetch()
        dirty, holder = dirty_ids(sess)
        if not len(dirty):
            return fx
        msgs, uses = fetch(self._touches, dirty, self._home, holder)
        fx.any = fetch_any(self._fetches, dirty, holder)  # every rank takes part, or none
        out, kept = _messages(self._dds, msgs, self._nodes, self._every)
        here = set(self._nodes)
        got: dict[int, list[np.ndarray]] = {p: [] for p in self._nodes}
        for (_, dst, carried), k in zip(out, kept, strict=True):
            u = int(uses[k])
            numeric = all(d._numeric for d, _ in carried)
            due = u if 0 < u < self._rounds and numeric else None
            fx.exchange.append((int(msgs.src[k]), dst, carried))
            fx.exchange.defer.append(due)
            if dst in here:
                got[dst].append(msgs.rows(k))
                if due is not None:
                    fx.arrive.setdefault(due, {}).setdefault(dst, []).extend(carried)
        at = self._home(dirty)
        for p in self._nodes:
            mine = dirty[(at != p) & (holder != p)]
            if got[p]:
                mine = np.setdiff1d(mine, np.concatenate(got[p]), assume_unique=True)
            if len(mine):
                fx.stale[p] = _slot_groups(self._dds, mine)
        return fx


class Guard:
    """The guard of one attempt at one invocation (``_dds.GUARD`` while it runs)."""

    def __init__(self, op: str, invocation: int, policy: str, gp: GuardPlan) -> None:
        self.op = op
        self.invocation = invocation
        self.policy = policy
        self.single = gp.single
        self.node = 0
        self.round = -1
        self.first: Violation | None = None
        #: on an MPI rank: (round, node, error) of a body that raised, held until the
        #: ranks agree on the attempt's outcome (``engine._asyncfor.loop._attempt``)
        self.failure: tuple[int, int, BodyError] | None = None
        self._gp = gp
        self._lock = threading.Lock()
        self._stale: list[tuple[int, Any, np.ndarray]] = []
        self._pending: list[tuple[int, Any, np.ndarray]] = []
        #: (node, dds, slots) an earlier invocation wrote that were not fetched here
        self._old: list[tuple[int, Any, np.ndarray]] = []
        self._fetched: dict[int, dict[int, list[tuple[Any, np.ndarray]]]] = {}
        #: DDS with a mark of ``mark_fetch`` on a local node
        self.marked: list[Any] = []

    # ------------------------------------------------------------ masks
    def prepare(self, sess: Session, extra: list[Any] | None = None) -> None:
        """Give every written DDS (and ``extra``) a zeroed byte per slot on each local
        node."""
        for d in [*self._gp.written, *(extra or [])]:
            n = len(d)
            for node in sess.cluster.local_nodes:
                m = d._gms.get(node)
                if m is None or len(m) < n:
                    d._gms[node] = bytearray(n)
            d._gm = d._gms[sess.current_node]

    def arm(self, r: int, code: bool = True) -> None:
        """Write (or, with ``code=False``, clear) the codes of round ``r``."""
        if code:
            self.round = r
        for node, entries in self._gp.arms[r].items():
            for d, slots, c in entries:
                np.frombuffer(d._gms[node], dtype=np.uint8)[slots] = c if code else FREE

    @property
    def exchanges(self) -> list[list[Message]]:
        """The plan's routed write-backs (see :class:`GuardPlan`)."""
        return self._gp.exchanges

    def mark_stale(self, r: int) -> None:
        """After round ``r``'s write-back: what other nodes wrote and did not send to a
        local node reads as written by another node there (a violation, not a stale value)."""
        for node, groups in self._gp.stale[r].items():
            for d, slots in groups:
                np.frombuffer(d._gms[node], dtype=np.uint8)[slots] = OTHER
                self._stale.append((node, d, slots))

    def mark_pending(self, r: int) -> None:
        """After round ``r``'s write-back: rows routed to a local node for a later round
        than the next (``GuardPlan.defer``) read as written by another node until they
        arrive: reading one earlier leaves the plan (on MPI its value is not there yet)."""
        for node, groups in self._gp.pending[r].items():
            for d, slots in groups:
                np.frombuffer(d._gms[node], dtype=np.uint8)[slots] = OTHER
                self._pending.append((node, d, slots))

    def mark_fetch(self, fx: Fetch) -> None:
        """Before the first round: what the fetch exchange ``fx`` did not bring a local
        node reads as written by another node there, for the whole attempt (until a
        routed write-back brings a newer value), and what it brings for a later round
        until then."""
        for node, groups in fx.stale.items():
            for d, slots in groups:
                np.frombuffer(d._gms[node], dtype=np.uint8)[slots] = OTHER
                self._old.append((node, d, slots))
        for per in fx.arrive.values():
            for node, groups in per.items():
                for d, slots in groups:
                    np.frombuffer(d._gms[node], dtype=np.uint8)[slots] = OTHER
                    self._pending.append((node, d, slots))
        self._fetched = fx.arrive
        self.marked = fx.marked()

    def unmark_pending(self, u: int) -> None:
        """Before round ``u``: the rows routed for it have arrived (``Cluster.settle``)."""
        arrived = set()
        for node, groups in self._fetched.get(u, {}).items():
            for d, slots in groups:
                np.frombuffer(d._gms[node], dtype=np.uint8)[slots] = FREE
                arrived.add((node, id(slots)))
        for node, groups in self._gp.arrive[u].items():
            for d, slots in groups:
                np.frombuffer(d._gms[node], dtype=np.uint8)[slots] = FREE
                arrived.add((node, id(slots)))
        if arrived:
            self._pending = [e for e in self._pending if (e[0], id(e[2])) not in arrived]

    def clear_stale(self) -> None:
        """Forget the stale marks (the final write-back, or the undo, made replicas whole)."""
        for node, d, slots in self._stale + self._pending + self._old:
            np.frombuffer(d._gms[node], dtype=np.uint8)[slots] = FREE
        self._stale.clear()
        self._pending.clear()
        self._old.clear()

    def _other_reason(self, dds: Any, slot: int) -> str:
        for node, d, slots in self._pending:
            if node == self.node and d is dds and slot in slots:
                return (
                    "another node wrote in an earlier round and sent here for a later round "
                    "(it is outside this node's reconnaissance sets for this round)"
                )
        for node, d, slots in self._stale:
            if node == self.node and d is dds and slot in slots:
                return (
                    "another node wrote in an earlier round and did not send here (it is "
                    "outside this node's reconnaissance sets)"
                )
        for node, d, slots in self._old:
            if node == self.node and d is dds and slot in slots:
                return (
                    "an earlier invocation wrote and only its home holds now (it is outside "
                    "this node's reconnaissance sets, so it was not fetched here)"
                )
        return "another node writes in the same round"

    # ------------------------------------------------------------ the slow path
    def outside(self, dds: Any, slot: int, write: bool, strict: str | None = None) -> None:
        """An access the fast path could not clear: allow it, or report a violation.

        ``strict`` (checked mode) names the sets the access left, or is ``"held"`` (a
        sharded dvector's row the node does not hold); it is a violation
        whatever the codes say."""
        m = dds._gm
        c = m[slot] if slot < len(m) else FREE
        if strict is None:
            code = 1 if self.single else getattr(_tls, "gcode", 1)
            if c == code or (code == ANY_OWN and c != OTHER and (c != FREE or not write)):
                return
            if code == LOCKED_BODY and c == LOCKED:
                if _tls.baton is not None:  # a chaos run: the baton may pass here
                    _tls.baton.step()
                if (dds._gbase | slot) in _tls.held:
                    return
                reason = "a concurrent body writes, and the body does not hold its lock"
            elif write or c not in (FREE, code):
                reason = {
                    FREE: "is outside the plan's write sets",
                    OTHER: self._other_reason(dds, slot),
                    LOCKED: "the lock-split bodies write under locks it does not hold",
                }.get(c, "another thread's task writes in the same round")
            else:
                return
        else:
            reason = (
                "is not held on this node (a sharded dvector: the node holds its home rows "
                "and the rows of its tasks' reconnaissance sets)"
                if strict == "held"
                else f"is not in {strict} {'write' if write else 'read'} set"
            )
        desc = dds._desc(dds.key_of(slot))
        refused = not_seen(lambda: desc, write, reason)
        if refused is not None:  # a debugger's access, not the body's: count nothing
            raise refused
        v = Violation(
            self.op,
            self.invocation,
            int(getattr(_tls, "index", -1)),
            self.node,
            desc,
            write,
            reason,
            self.round,
        )
        with self._lock:
            if self.first is None:
                self.first = v
        # replan="never" too: the attempt stops and is undone like any other, and
        # ``async_for`` raises the violation the ranks agree came first, on every rank
        raise PlanViolation(v)


def install(guard: Guard | None) -> None:
    """Make ``guard`` the one the DDS guard modes report to."""
    _dds.GUARD = guard


__all__ = [
    "POLICIES",
    "Fetch",
    "Guard",
    "GuardPlan",
    "PlanViolation",
    "Violation",
    "dirty_ids",
    "install",
]
