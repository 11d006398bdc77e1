"""Lock-grant order of a split group, stored as its deviation from a predicted order.

Why it is built this way: the bodies of a lock-split group run on several threads; each
thread runs its own bodies in plan order and takes a *ticket* while it holds all the
locks of a body.  The ticket order is therefore a merge of the threads' plan sequences,
and every lock's grant order is the ticket order restricted to the bodies that take that
lock.  So the whole grant record of a node-round is one merge, i.e. which thread took the
next ticket — nothing about lock ids (replay recomputes those from reconnaissance).

The merge is stored, in the style of ReMPI's clock-delta compression, as its deviation
from an order replay predicts without the log: *the thread that took the last ticket
takes the next one; a thread that has run all its bodies hands over to the next thread
(cyclically) that has bodies left.*  Under the GIL a thread runs for a switch interval
before another one takes over, so the log holds one (position, thread) pair per actual
hand-over and is empty when the group ran without contention.

Everything here is pure (numpy in, numpy out); :class:`TurnSequencer` is the thin
threading driver that makes a replay take the tickets in the decoded order.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from .._errors import DivergenceError, EngineError

#: Seconds a thread may wait for its recorded turn before replay reports a divergence
#: instead of hanging.
TURN_TIMEOUT_S = 60.0

#: How many earlier tickets a hand-over searches for the element lock it took over from
#: another thread: the recording cost of one hand-over against naming a lock that a body
#: further back released (beyond it, the body's first lock is named).
HANDOVER_LOOKBACK = 64


class GrantOrderError(EngineError, ValueError):
    """A deviation log does not fit the per-thread body counts (damaged or foreign)."""


def _predicted(cur: int, left: np.ndarray) -> int:
    """The thread predicted to take the next ticket after ``cur`` (-1: none left)."""
    n = len(left)
    for k in range(1, n + 1):
        t = (cur + k) % n
        if left[t] > 0:
            return t
    return -1


def encode_grant_order(
    threads: np.ndarray, lengths: Sequence[int] | np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(positions, threads) where ticket-order ``threads`` deviates from the prediction.

    ``lengths[t]`` is how many bodies thread ``t`` runs (``threads`` holds each ``t``
    exactly that often).  Cost: one numpy pass plus a Python step per hand-over."""
    threads = np.asarray(threads, dtype=np.int64)
    if len(threads) == 0:
        none = np.empty(0, np.int64)
        return none, none
    starts = np.flatnonzero(np.concatenate(([True], threads[1:] != threads[:-1])))
    left = np.asarray(lengths, dtype=np.int64).copy()
    pos_out: list[int] = []
    thr_out: list[int] = []
    cur = -1  # before the first ticket the prediction is the lowest thread with bodies
    run_starts = starts.tolist()
    run_ends = run_starts[1:] + [len(threads)]
    for s, e in zip(run_starts, run_ends, strict=True):
        t = int(threads[s])
        want = _predicted(cur, left) if (cur < 0 or left[cur] == 0) else cur
        if t != want:
            pos_out.append(s)
            thr_out.append(t)
        left[t] -= e - s
        cur = t
    return np.asarray(pos_out, dtype=np.int64), np.asarray(thr_out, dtype=np.int64)


def decode_grant_order(
    positions: np.ndarray, threads: np.ndarray, lengths: Sequence[int] | np.ndarray
) -> np.ndarray:
    """The ticket-order thread of every body, from the prediction and its deviations.

    Raises :class:`GrantOrderError` when the log cannot belong to these thread lengths."""
    left = np.asarray(lengths, dtype=np.int64).copy()
    n = int(left.sum())
    out = np.empty(n, dtype=np.int64)
    pos = [int(p) for p in np.asarray(positions).tolist()] + [n]
    thr = [int(t) for t in np.asarray(threads).tolist()]
    if len(thr) != len(pos) - 1:
        raise GrantOrderError("positions and threads differ in length")
    at, cur, k = 0, -1, 0
    while at < n:
        if k < len(thr) and pos[k] == at:
            t = thr[k]
            k += 1
            want = cur if cur >= 0 and left[cur] > 0 else _predicted(cur, left)
            if not 0 <= t < len(left) or left[t] == 0 or t == want:
                raise GrantOrderError(f"deviation {k - 1} names thread {t}, which has no turn")
        else:
            t = cur if cur >= 0 and left[cur] > 0 else _predicted(cur, left)
        stop = min(pos[k], at + int(left[t]))
        if stop <= at:
            raise GrantOrderError(f"deviation positions not increasing at {at}")
        out[at:stop] = t
        left[t] -= stop - at
        at, cur = stop, t
    if k != len(thr):
        raise GrantOrderError(f"{len(thr) - k} deviation(s) lie past the last body")
    return out


def merge_grant_order(ticket_threads: np.ndarray, per_thread: dict[int, np.ndarray]) -> np.ndarray:
    """The loop indices in ticket order, given each ticket's thread and each thread's
    locked bodies in plan order."""
    out = np.empty(len(ticket_threads), dtype=np.int64)
    for t, idx in per_thread.items():
        out[ticket_threads == t] = idx
    return out


def handover_elements(
    indices: np.ndarray,
    threads: np.ndarray,
    positions: np.ndarray,
    locks_of: dict[int, np.ndarray],
) -> np.ndarray:
    """The element lock each hand-over took over: one global element id per position.

    At ticket ``p`` thread ``threads[p]`` took over, running body ``indices[p]``, which
    held the sorted element ids ``locks_of[indices[p]]``.  Its element is the lowest one
    it shares with the nearest earlier ticket of another thread (within
    :data:`HANDOVER_LOOKBACK` tickets): the lock whose grant passed between threads
    there.  A hand-over that shares none names its body's first lock; -1: it locked none.
    Cost: a few set intersections per hand-over, never per body."""
    idx = np.asarray(indices).tolist()
    thr = np.asarray(threads).tolist()
    out = np.full(len(positions), -1, dtype=np.int64)
    for k, p in enumerate(np.asarray(positions).tolist()):
        mine = locks_of[idx[p]]
        if not len(mine):
            continue
        out[k] = int(mine[0])
        held = set(mine.tolist())
        for q in range(p - 1, max(p - HANDOVER_LOOKBACK, 0) - 1, -1):
            if thr[q] == thr[p]:
                continue
            shared = held.intersection(locks_of[idx[q]].tolist())
            if shared:
                out[k] = min(shared)
                break
    return out


def holder_failed(where: dict[str, object]) -> DivergenceError:
    """What a thread waiting at a node-round's grant gate raises when the body holding the
    turn failed (the round's real error is that body's; ``_run_threads`` reports it)."""
    return DivergenceError(
        node=int(where["node"]),  # type: ignore[call-overload]
        op=str(where["op"]),
        invocation=int(where["invocation"]),  # type: ignore[call-overload]
        event="lock turn",
        what="lock",
        expected="the thread holding the turn to finish its body",
        actual="it failed",
    )


def thread_lengths(per_thread: dict[int, np.ndarray]) -> np.ndarray:
    """How many locked bodies each thread runs (index: thread), from its plan sequence."""
    lengths = np.zeros(max(per_thread, default=-1) + 1, dtype=np.int64)
    for th, idx in per_thread.items():
        lengths[th] = len(idx)
    return lengths


def recorded_ticket_order(
    positions: np.ndarray,
    threads: np.ndarray,
    per_thread: dict[int, np.ndarray],
    *,
    node: int,
    op: str,
    invocation: int,
    round: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(thread of every ticket, loop index of every ticket) of a node-round, from its
    recorded deviations and each thread's locked bodies in plan order.

    A log that cannot belong to these bodies is a replay divergence (:class:`DivergenceError`).
    """
    lengths = thread_lengths(per_thread)
    try:
        turns = decode_grant_order(positions, threads, lengths)
    except GrantOrderError as exc:
        raise DivergenceError(
            node=node,
            op=op,
            invocation=invocation,
            event=f"round {round}",
            what="lock",
            expected=f"a grant order of {int(lengths.sum())} locked bodies",
            actual=f"a recorded order that does not fit them ({exc})",
        ) from None
    return turns, merge_grant_order(turns, per_thread)


class TurnSequencer:
    """Follow mode of a node-round's grant gate: the threads take tickets in a decoded
    order (a replay's recorded order, a dual side's or a chaos draw).

    Only the thread whose turn it is advances the turn, so a thread that finds its own
    turn proceeds without taking any lock; hand-overs go through one condition per
    thread.  A body's failure wakes every waiter, which then stops too.  As in free mode
    (:class:`FreeGrants`), ``tickets`` holds (index, thread) in the order taken."""

    def __init__(self, threads: np.ndarray, indices: np.ndarray, where: dict[str, object]) -> None:
        self._threads = threads.tolist()
        self._indices = indices.tolist()
        self._n = len(self._threads)
        self._pos = 0
        self._lock = threading.Lock()
        self._cvs: dict[int, threading.Condition] = {}
        for t in set(self._threads):
            self._cvs[t] = threading.Condition(self._lock)
        self._where = where
        self.failed = False
        self.tickets: list[tuple[int, int]] = []

    def acquire(self, thread: int, index: int) -> None:
        """Block until (thread, index) holds the turn; then its ticket is taken."""
        self.wait(thread, index)
        self.tickets.append((index, thread))

    def release(self, thread: int, index: int) -> None:
        """The body of (thread, index) finished: pass the turn on."""
        self.done(thread)

    def abort(self, thread: int, index: int) -> None:
        """The body of (thread, index) raised: every waiter stops."""
        self.fail()

    def _divergence(self, thread: int, index: int, what: str) -> DivergenceError:
        at = self._pos
        exp = (
            f"thread {self._threads[at]} running index {self._indices[at]}"
            if at < self._n
            else "no further grant"
        )
        return DivergenceError(
            node=int(self._where["node"]),  # type: ignore[call-overload]
            op=str(self._where["op"]),
            invocation=int(self._where["invocation"]),  # type: ignore[call-overload]
            event=f"grant {at} of the locked bodies",
            what="lock",
            expected=exp,
            actual=f"thread {thread} {what} index {index}",
        )

    def wait(self, thread: int, index: int) -> None:
        """Block until (thread, index) holds the turn."""
        at = self._pos
        if at < self._n and self._threads[at] == thread:
            if self._indices[at] != index:
                raise self._divergence(thread, index, "asked for its turn to run")
            return
        cv = self._cvs.get(thread)
        if cv is None:
            raise self._divergence(thread, index, "has no recorded turn; it asked to run")
        with cv:
            ok = cv.wait_for(
                lambda: self.failed or self._pos >= self._n or self._threads[self._pos] == thread,
                TURN_TIMEOUT_S,
            )
            if self.failed:
                raise holder_failed(self._where)
            if not ok or self._pos >= self._n or self._indices[self._pos] != index:
                raise self._divergence(
                    thread, index, "asked to run" if ok else f"waited {TURN_TIMEOUT_S:g} s to run"
                )

    def done(self, thread: int) -> None:
        """The turn holder finished its body: pass the turn on."""
        nxt = self._pos + 1
        if nxt < self._n and self._threads[nxt] == thread:
            self._pos = nxt
            return
        with self._lock:
            self._pos = nxt
            if nxt < self._n:
                self._cvs[self._threads[nxt]].notify()

    def fail(self) -> None:
        """A body raised: wake every waiter so the round ends at once."""
        with self._lock:
            self.failed = True
            for cv in self._cvs.values():
                cv.notify_all()


class FreeGrants:
    """Free mode of a node-round's grant gate (a normal run): each body takes its element
    locks in the global order of their ids, first come first served, and ``tickets``
    records (index, thread) in the order the bodies got them (taken while all of a body's
    locks are held, so every lock's grant order is the ticket order restricted to it).

    Same interface as :class:`TurnSequencer`, so a node-round runs one code path in
    every mode.  Element locks, not a condition per grant: a lock-heavy round takes
    millions of grants and a plain lock costs a fraction of a microsecond."""

    def __init__(self, locks: dict[int, threading.Lock], lock_of: dict[int, np.ndarray]) -> None:
        self._locks = locks
        self._lock_of = lock_of
        self._held: dict[int, list[threading.Lock]] = {}
        self.tickets: list[tuple[int, int]] = []

    def acquire(self, thread: int, index: int) -> None:
        """Take every element lock of ``index`` (ids are sorted: no deadlock), then a ticket."""
        held = [self._locks[g] for g in self._lock_of[index].tolist()]
        for lk in held:
            lk.acquire()
        self._held[thread] = held
        self.tickets.append((index, thread))  # one append: atomic, in lock order

    def release(self, thread: int, index: int) -> None:
        """Give back the locks of the body that ``thread`` ran."""
        for lk in reversed(self._held.pop(thread)):
            lk.release()

    def abort(self, thread: int, index: int) -> None:
        """The body raised: its locks are given back all the same."""
        self.release(thread, index)


__all__ = [
    "FreeGrants",
    "GrantOrderError",
    "TurnSequencer",
    "decode_grant_order",
    "encode_grant_order",
    "handover_elements",
    "holder_failed",
    "merge_grant_order",
    "recorded_ticket_order",
    "thread_lengths",
]
