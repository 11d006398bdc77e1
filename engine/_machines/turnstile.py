"""The lock-grant turnstile.

:class:`Turnstile` is the lock-grant state machine: a plain object whose only mutator is
``handle(event) -> list[instruction]``; :class:`TurnstileDriver` is the thin threading
layer that performs its instructions.  Because the machine is pure, tests feed it
hand-made events.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from .._errors import DivergenceError
from .grants import TURN_TIMEOUT_S


@dataclass(frozen=True, slots=True)
class LockRequested:
    """A thread asks for a lock to run loop index ``index``."""

    lock: int
    thread: int
    index: int


@dataclass(frozen=True, slots=True)
class LockReleased:
    """A thread released a lock."""

    lock: int
    thread: int
    index: int


@dataclass(frozen=True, slots=True)
class GrantLock:
    """Wake the waiter (thread, index) on ``lock``."""

    lock: int
    thread: int
    index: int


@dataclass(frozen=True, slots=True)
class ReportDivergence:
    """The request cannot be served in the recorded order."""

    lock: int
    thread: int
    index: int
    expected: tuple[int, int] | None
    grant_no: int


class Turnstile:
    """Grants each lock to (thread, index) requests in a recorded order, or, in free mode
    (``orders=None``, a normal run), first come first served; ``granted(lock)`` is the
    grant order either way (what a normal run records)."""

    def __init__(self, orders: dict[int, list[tuple[int, int]]] | None) -> None:
        self.free = orders is None
        orders = orders or {}
        self._queue = {lock: deque(seq) for lock, seq in orders.items()}
        self._remaining = {lock: set(seq) for lock, seq in orders.items()}
        self._held: dict[int, tuple[int, int] | None] = dict.fromkeys(orders)
        self._waiting: dict[int, set[tuple[int, int]]] = {lock: set() for lock in orders}
        self._granted = dict.fromkeys(orders, 0)
        self._fifo: dict[int, deque[tuple[int, int]]] = {}
        self._order: dict[int, list[tuple[int, int]]] = {}

    def granted(self, lock: int) -> list[tuple[int, int]]:
        """The (thread, index) grants of ``lock`` so far, in grant order."""
        return self._order.get(lock, [])

    def handle(self, event: LockRequested | LockReleased) -> list[GrantLock | ReportDivergence]:
        """Feed one event; return what the driver must do."""
        if self.free:
            return self._handle_free(event)
        lock, who = event.lock, (event.thread, event.index)
        if isinstance(event, LockRequested):
            if lock not in self._queue or who not in self._remaining[lock]:
                q = self._queue.get(lock)
                nxt = q[0] if q else None
                return [
                    ReportDivergence(
                        lock, event.thread, event.index, nxt, self._granted.get(lock, 0)
                    )
                ]
            self._waiting[lock].add(who)
            return self._try_grant(lock)
        if self._held.get(lock) != who:
            return [ReportDivergence(lock, event.thread, event.index, self._held.get(lock), -1)]
        self._held[lock] = None
        return self._try_grant(lock)

    def _handle_free(
        self, event: LockRequested | LockReleased
    ) -> list[GrantLock | ReportDivergence]:
        lock, who = event.lock, (event.thread, event.index)
        fifo = self._fifo.setdefault(lock, deque())
        if isinstance(event, LockRequested):
            fifo.append(who)
        elif self._held.get(lock) != who:
            return [ReportDivergence(lock, event.thread, event.index, self._held.get(lock), -1)]
        else:
            self._held[lock] = None
        if self._held.get(lock) is not None or not fifo:
            return []
        who = fifo.popleft()
        self._held[lock] = who
        self._order.setdefault(lock, []).append(who)
        return [GrantLock(lock, *who)]

    def _try_grant(self, lock: int) -> list[GrantLock | ReportDivergence]:
        q = self._queue[lock]
        if self._held[lock] is not None or not q or q[0] not in self._waiting[lock]:
            return []
        who = q.popleft()
        self._waiting[lock].discard(who)
        self._remaining[lock].discard(who)
        self._held[lock] = who
        self._granted[lock] += 1
        self._order.setdefault(lock, []).append(who)
        return [GrantLock(lock, *who)]

    def next_for(self, lock: int) -> tuple[int, int] | None:
        """The (thread, index) the lock goes to next."""
        q = self._queue.get(lock)
        return q[0] if q else None


class TurnstileDriver:
    """Performs a :class:`Turnstile`'s instructions with threads and a condition (free
    mode with ``orders=None``: a waiter then waits as long as the holder runs)."""

    def __init__(
        self, orders: dict[int, list[tuple[int, int]]] | None, where: dict[str, Any]
    ) -> None:
        self._ts = Turnstile(orders)
        self._cv = threading.Condition()
        self._granted: set[tuple[int, int, int]] = set()
        self._where = where
        self._failure: DivergenceError | None = None

    def _diverged(self, ins: ReportDivergence) -> DivergenceError:
        exp = (
            "no further grant"
            if ins.expected is None
            else (f"thread {ins.expected[0]} running index {ins.expected[1]}")
        )
        return DivergenceError(
            node=self._where["node"],
            op=self._where["op"],
            invocation=self._where["invocation"],
            event=f"grant {ins.grant_no} of lock {ins.lock}",
            what="lock",
            expected=exp,
            actual=f"thread {ins.thread} asked for it to run index {ins.index}",
        )

    def _perform(self, out: list[GrantLock | ReportDivergence]) -> None:
        for ins in out:
            if isinstance(ins, ReportDivergence):
                self._failure = self._diverged(ins)
            else:
                self._granted.add((ins.lock, ins.thread, ins.index))
        self._cv.notify_all()

    def acquire(self, lock: int, thread: int, index: int) -> None:
        """Block until the recorded order lets (thread, index) take ``lock``."""
        key = (lock, thread, index)
        with self._cv:
            self._perform(self._ts.handle(LockRequested(lock, thread, index)))
            ok = self._cv.wait_for(
                lambda: key in self._granted or self._failure is not None,
                None if self._ts.free else TURN_TIMEOUT_S,
            )
            if self._failure is not None:
                raise self._failure
            if not ok:
                nxt = self._ts.next_for(lock)
                raise DivergenceError(
                    node=self._where["node"],
                    op=self._where["op"],
                    invocation=self._where["invocation"],
                    event=f"lock {lock}",
                    what="lock",
                    expected=f"thread {nxt[0]} running index {nxt[1]} first" if nxt else "-",
                    actual=f"no such request within {TURN_TIMEOUT_S:g} s",
                )
            self._granted.discard(key)

    def release(self, lock: int, thread: int, index: int) -> None:
        """Give ``lock`` back; the next recorded holder is woken."""
        with self._cv:
            self._perform(self._ts.handle(LockReleased(lock, thread, index)))

    def granted(self, lock: int) -> list[tuple[int, int]]:
        """The (thread, index) grants of ``lock`` so far, in grant order."""
        with self._cv:
            return list(self._ts.granted(lock))


__all__ = [
    "GrantLock",
    "LockReleased",
    "LockRequested",
    "ReportDivergence",
    "Turnstile",
    "TurnstileDriver",
]
