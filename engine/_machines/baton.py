"""Chaos grant gate: lock-split bodies interleaved at DDS-access granularity.

Why it is built this way: a :class:`~engine._machines.grants.TurnSequencer` runs whole
bodies one after the other, so a body never sees another one half-way and a body that
locks too little (it reads an element another body of its group writes) still gives some
serial order.  Real threads do overlap.  :class:`BatonGrants` lets a chaos run overlap
them on purpose, deterministically: the threads of a node-round run their bodies at the
same time, but only the holder of one *baton* runs; the baton passes at every body start,
body end and access to an element the group writes (the guard calls :meth:`step` there),
to a thread drawn from the chaos seed among those that can run.  Each body takes the
element locks ``lock_of[j]`` in a lock table the gate owns, all at once when it is drawn
(a thread whose locks are not all free cannot be drawn), and its ticket then — as in
:class:`~engine._machines.grants.FreeGrants`, ``tickets`` is the order in which bodies got
all their locks.  With correct locks (two-phase over everything a body touches that
another body writes) the outcome is bitwise the serial run in ticket order, so the run
replays; with too few, a body sees another one mid-way and the dual test sees a
non-serial outcome.

A draw happens only when every thread that still has locked bodies waits at the gate, so
it never depends on thread timing: the same chaos seed and run give the same
interleaving.  Taking all of a body's locks at once means a lock is only ever held by a
body in the middle of its run, which can always be drawn: no deadlock.  If no thread can
run all the same, that is an engine bug and the gate raises; every wait is bounded by
:data:`~engine._machines.grants.TURN_TIMEOUT_S`.
"""

from __future__ import annotations

import threading

import numpy as np

from .._errors import EngineError
from .grants import TURN_TIMEOUT_S, holder_failed

#: How many uniform draws the gate takes from its generator at once.
_BLOCK = 512


class BatonError(EngineError, RuntimeError):
    """The chaos gate found no thread that can run, or a thread waited too long."""


class BatonGrants:
    """The chaos grant gate of one lock-split node-round (same interface as
    :class:`~engine._machines.grants.FreeGrants`, plus :meth:`step`).

    ``lock_of[j]``: the sorted element ids body ``j`` locks; ``lengths[t]``: how many
    locked bodies thread ``t`` runs; ``rng``: the node-round's chaos generator."""

    def __init__(
        self,
        lock_of: dict[int, np.ndarray],
        lengths: np.ndarray,
        rng: np.random.Generator,
        where: dict[str, object],
    ) -> None:
        self._lock_of = lock_of
        self._left = {t: int(n) for t, n in enumerate(lengths.tolist()) if n > 0}
        self._rng = rng
        self._u: list[float] = []
        self._at = 0
        self._mutex = threading.Lock()
        self._cvs = {t: threading.Condition(self._mutex) for t in self._left}
        #: thread -> the locks it waits for (a body start) or None (mid-body: can run)
        self._waiting: dict[int, frozenset[int] | None] = {}
        self._owner: dict[int, int] = {}  # element id -> thread holding it
        self._holder = -1
        self._runner = -1  # the OS thread that holds the baton
        self._where = where
        self.failed = False
        self.steps = 0
        self.tickets: list[tuple[int, int]] = []

    # ------------------------------------------------------------ the gate interface
    def acquire(self, thread: int, index: int) -> None:
        """Body start: wait to be drawn with all the locks of ``index`` free, take them
        and a ticket."""
        need = frozenset(self._lock_of[index].tolist())
        with self._mutex:
            self._wait(thread, need)
            for g in need:
                self._owner[g] = thread
            self.tickets.append((index, thread))

    def step(self) -> None:
        """A DDS access of the running body: the baton may pass to another thread."""
        thread = self._holder
        if thread < 0 or self._runner != threading.get_ident():
            raise BatonError(
                f"chaos lock gate of {self._where}: an access from a thread that does not "
                "hold the baton"
            )
        with self._mutex:
            self.steps += 1
            self._wait(thread, None)

    def release(self, thread: int, index: int) -> None:
        """Body end: give back its locks and the baton."""
        with self._mutex:
            for g in self._lock_of[index].tolist():
                del self._owner[g]
            self._left[thread] -= 1
            if self._left[thread] == 0:
                del self._left[thread]
            self._holder = -1
            self._draw()

    def abort(self, thread: int, index: int) -> None:
        """The body raised: every waiter stops."""
        with self._mutex:
            self.failed = True
            for cv in self._cvs.values():
                cv.notify_all()

    # ------------------------------------------------------------ the baton
    def _wait(self, thread: int, need: frozenset[int] | None) -> None:
        """Wait at the gate (called with the mutex held) until ``thread`` is drawn."""
        self._waiting[thread] = need
        if self._holder == thread:
            self._holder = -1
        self._draw()
        if self._holder != thread:
            ok = self._cvs[thread].wait_for(
                lambda: self.failed or self._holder == thread, TURN_TIMEOUT_S
            )
            if self.failed:
                raise holder_failed(self._where)
            if not ok:
                self.failed = True
                raise BatonError(
                    f"chaos lock gate of {self._where}: thread {thread} waited "
                    f"{TURN_TIMEOUT_S:g} s for the baton"
                )
        del self._waiting[thread]
        self._runner = threading.get_ident()

    def _draw(self) -> None:
        """Pass the baton when every thread with locked bodies left waits at the gate."""
        if self._holder >= 0 or self.failed or len(self._waiting) < len(self._left):
            return
        if not self._waiting:
            return
        owner = self._owner
        can = [
            t
            for t, need in sorted(self._waiting.items())
            if need is None or not any(g in owner for g in need)
        ]
        if not can:
            self.failed = True
            for cv in self._cvs.values():
                cv.notify_all()
            raise BatonError(
                f"chaos lock gate of {self._where}: no thread can run "
                f"(waiting {sorted(self._waiting)}, locks held {len(owner)})"
            )
        if self._at == len(self._u):
            self._u, self._at = self._rng.random(_BLOCK).tolist(), 0
        u = self._u[self._at]
        self._at += 1
        t = can[int(u * len(can))]
        self._holder = t
        self._cvs[t].notify()


__all__ = ["BatonError", "BatonGrants"]
