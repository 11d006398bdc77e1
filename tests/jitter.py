"""Seeded message-timing perturbation for MPI runs (tests only).

:class:`Jitter` wraps a communicator so that buffer sends are delivered late by a
background thread and other point-to-point calls pause first, all drawn from a seed.
:func:`install` makes every ``MpiCluster`` of this process use one; ``tests/jitter_site``
calls it at interpreter start when ``STRADS_TEST_JITTER`` holds a seed, so that whole
``replay`` commands (and their mpiexec ranks) run perturbed without any hook in the
production runtime.  :func:`plain_then_jittered` is the loop of the MPI case scripts that
run one program plainly and once per seed.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from mpi4py import MPI

#: the calls that get a delay first (everything else passes straight through)
DELAYED = ("isend", "Probe", "Recv", "recv", "Irecv", "send")
#: the delays drawn from (seconds): mostly none, sometimes long enough for the other
#: ranks to finish a round
PAUSES = np.array([0.0] * 6 + [0.001, 0.003, 0.03])


class Jitter:
    """``comm`` with seeded delays: each point-to-point call first sleeps a ``PAUSES``
    draw, and each buffer send (``Isend``) is delivered late, by a background thread, a
    ``PAUSES`` draw after it was made.  Late delivery keeps the order of the messages to
    each destination (MPI's only ordering promise), so every run is a legal one."""

    def __init__(self, comm: Any, rng: np.random.Generator) -> None:
        self._comm, self._rng = comm, rng
        self._lock = threading.Condition()
        self._queue: list[tuple[float, int, np.ndarray, int, int]] = []  # (due, k, ...)
        self._last_due: dict[int, float] = {}
        self._count = 0
        self._closed = False
        self._thread = threading.Thread(target=self._deliver, daemon=True)
        self._thread.start()

    def Dup(self) -> Jitter:  # noqa: N802 - MPI's name
        return Jitter(self._comm.Dup(), self._rng)

    def Isend(self, buf: Any, dest: int, tag: int) -> Any:  # noqa: N802 - MPI's name
        data = np.array(buf[0], copy=True)
        with self._lock:
            due = max(
                time.monotonic() + float(self._rng.choice(PAUSES)), self._last_due.get(dest, 0)
            )
            self._last_due[dest] = due
            self._count += 1
            heapq.heappush(self._queue, (due, self._count, data, dest, tag))
            self._lock.notify()
        return MPI.REQUEST_NULL

    def _deliver(self) -> None:
        # Late sends are started nonblocking, in due order, from this one thread (so the
        # order per destination is kept) and completed later: a blocking send here would
        # tie every destination to the slowest receiver, a dependency real MPI never has
        # (it deadlocks a replay that waits for one source while another's rows queue
        # behind an unreceived large message).
        pending: list[tuple[Any, np.ndarray]] = []
        while True:
            pending = [(r, d) for r, d in pending if not r.Test()]
            with self._lock:
                while not self._queue and not self._closed:
                    self._lock.wait(0.01 if pending else None)
                    if pending:
                        break
                if not self._queue:
                    if self._closed:
                        break
                    continue
                due = self._queue[0][0]
                wait = due - time.monotonic()
                if wait > 0:
                    self._lock.wait(min(wait, 0.01))
                    continue
                _, _, data, dest, tag = heapq.heappop(self._queue)
            pending.append((self._comm.Isend([data, MPI.BYTE], dest, tag), data))
        MPI.Request.Waitall([r for r, _ in pending])

    def Free(self) -> None:  # noqa: N802 - MPI's name
        """Deliver everything still queued, then free the communicator."""
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._thread.join()
        self._comm.Free()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._comm, name)
        if name not in DELAYED:
            return attr

        def delayed(*args: Any, **kw: Any) -> Any:
            time.sleep(float(self._rng.choice(PAUSES)))
            return attr(*args, **kw)

        return delayed


def install(seed: int) -> None:
    """Every ``MpiCluster`` made from now on in this process talks through a
    :class:`Jitter` seeded by (``seed``, this rank)."""
    from engine._runtime import transport

    made = transport.MpiCluster.__init__

    def jittered(self: Any, comm: Any, threads: int = 1) -> None:
        made(self, comm, threads)
        rng = np.random.default_rng([seed, MPI.COMM_WORLD.Get_rank()])
        self.comm = Jitter(self.comm, rng)

    transport.MpiCluster.__init__ = jittered  # type: ignore[method-assign]


def plain_then_jittered(
    program: Callable[[], dict[str, Any]], world: Any, seeds: Iterable[int]
) -> list[dict[str, Any]]:
    """``program`` run with ``engine.run`` on ``world``, then once per seed through a
    :class:`Jitter` seeded by (seed, this rank): per run, the program's value with its
    ``digests`` added."""
    import engine as ap  # as in install: this module loads at interpreter start

    me = world.Get_rank()
    runs: list[dict[str, Any]] = []
    for comm in [world] + [Jitter(world, np.random.default_rng([s, me])) for s in seeds]:
        res = ap.run(program, comm=comm)
        runs.append({**res.value, "digests": res.digests})
    return runs


__all__ = ["PAUSES", "Jitter", "install", "plain_then_jittered"]
