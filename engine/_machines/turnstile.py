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
from functools import partial
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
class LockFreed:
    """Free mode: ``lock`` has no holder and threads wait for it; each may ask again,
    and the first to ask gets it (a plain mutex, not a queue)."""

    lock: int


@dataclass(frozen=True, slots=True)
class ReportDivergence:
    """The request cannot be served in the recorded order."""

    lock: int
    thread: int
    index: int
    expected: tuple[int, int] | None
    grant_no: int


#: What :meth:`Turnstile.handle` tells its driver to do.
Instruction = GrantLock | LockFreed | ReportDivergence


class Turnstile:
    """Grants each lock to (thread, index) requests in a recorded order, or, in free mode
    (``orders=None``, a normal run), like a plain mutex: a request for a free lock is
    granted, a release wakes the waiters (:class:`LockFreed`) and whichever asks again
    first wins, so the order is the threads' race, as with ``threading.Lock`` (a queue
    would make it a fixed rotation).  ``granted(lock)`` is the grant order either way
    (what a normal run records)."""

    def __init__(self, orders: dict[int, list[tuple[int, int]]] | None) -> None:
        self.free = orders is None
        orders = orders or {}
        self._queue = {lock: deque(seq) for lock, seq in orders.items()}
        self._remaining = {lock: set(seq) for lock, seq in orders.items()}
        self._held: dict[int, tuple[int, int] | None] = dict.fromkeys(orders)
        self._waiting: dict[int, set[tuple[int, int]]] = {lock: set() for lock in orders}
        self._granted = dict.fromkeys(orders, 0)
        self._waiters: dict[int, set[tuple[int, int]]] = {}
        self._order: dict[int, list[tuple[int, int]]] = {}

    def granted(self, lock: int) -> list[tuple[int, int]]:
        """The (thread, index) grants of ``lock`` so far, in grant order."""
        return self._order.get(lock, [])

    def handle(self, event: LockRequested | LockReleased) -> list[Instruction]:
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

    def _handle_free(self, event: LockRequested | LockReleased) -> list[Instruction]:
        lock, who = event.lock, (event.thread, event.index)
        waiters = self._waiters.setdefault(lock, set())
        if isinstance(event, LockReleased):
            if self._held.get(lock) != who:
                held = self._held.get(lock)
                return [ReportDivergence(lock, event.thread, event.index, held, -1)]
            self._held[lock] = None
            return [LockFreed(lock)] if waiters else []
        if self._held.get(lock) is not None:
            waiters.add(who)
            return []
        waiters.discard(who)
        self._held[lock] = who
        self._order.setdefault(lock, []).append(who)
        return [GrantLock(lock, *who)]

    def _try_grant(self, lock: int) -> list[Instruction]:
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
        self._freed = 0  # free mode: how many times a lock was left free to waiters

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

    def _perform(self, out: list[Instruction]) -> None:
        for ins in out:
            if isinstance(ins, ReportDivergence):
                self._failure = self._diverged(ins)
            elif isinstance(ins, LockFreed):
                self._freed += 1
            else:
                self._granted.add((ins.lock, ins.thread, ins.index))
        self._cv.notify_all()

    def acquire(self, lock: int, thread: int, index: int) -> None:
        """Block until the recorded order (free mode: the race for it) lets (thread,
        index) take ``lock``."""
        key = (lock, thread, index)
        with self._cv:
            self._perform(self._ts.handle(LockRequested(lock, thread, index)))
            if self._ts.free:
                while key not in self._granted and self._failure is None:
                    freed = self._freed
                    self._cv.wait_for(partial(self._moved, key, freed))
                    if key not in self._granted and self._failure is None:
                        self._perform(self._ts.handle(LockRequested(lock, thread, index)))
                ok = True
            else:
                ok = self._cv.wait_for(
                    lambda: key in self._granted or self._failure is not None, TURN_TIMEOUT_S
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

    def _moved(self, key: tuple[int, int, int], freed: int) -> bool:
        """Free mode: ``key`` was granted, a body failed, or a lock was freed since."""
        return key in self._granted or self._failure is not None or self._freed != freed

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
    "LockFreed",
    "LockReleased",
    "LockRequested",
    "ReportDivergence",
    "Turnstile",
    "TurnstileDriver",
]
