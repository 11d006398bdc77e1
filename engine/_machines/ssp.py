"""The clock logic of ``sync_for`` (BSP, SSP and Hybrid) as a pure state machine.

Why a state machine: the same logic must run on an MPI rank (driven by nonblocking
receives), inside the in-process cluster (driven by a simulation in virtual time with
seeded delays), in tests (driven by hand-made events) and, later, in replay (driven
by recorded events).  So :class:`SspClock` is a plain object with no MPI, threads or
wall clock inside; its only mutator is :meth:`SspClock.handle`, which takes an event
(past tense: :class:`ClockTicked`, :class:`DeltaArrived`, :class:`UpdateArrived`) and
returns the instructions a thin driver must carry out (imperative:
:class:`SendDelta`, :class:`Aggregate`, :class:`ApplyUpdate`, :class:`Proceed`,
:class:`Wait`, :class:`Finished`).

The protocol, for one node among ``nodes`` over clocks ``0 .. clocks-1``:

* a node computes a clock on its caches, then *ticks*: it sends its delta of that
  clock to every owner (the owner of a row aggregates that row);
* an owner that holds the deltas of clock ``k`` from every node aggregates them (in
  node order, whatever the arrival order) and pushes the new values of its rows to
  every node as the *update* of clock ``k`` (the rows a node may not read before their
  next write stay out of its message, ``engine._syncfor.routing``; an update with no
  rows for a node arrives without a message); its own replica has it at once;
* updates from one owner are applied in clock order, and only between clocks (never
  while the node computes), so what a clock reads is fixed when it starts;
* a node may start clock ``c`` once it has applied, from every owner, the updates of
  every clock up to ``c - staleness - 1``.  Whatever else has arrived is applied too,
  so reads may include more recent updates, never fewer.  ``staleness=0`` is BSP.

Because an owner's update of clock ``k`` needs every node's delta of clock ``k``, a
node that starts clock ``c`` knows that the slowest node has finished clock
``c - staleness - 1``: no node runs more than ``staleness`` clocks ahead of the
slowest.  A node that has finished its last clock waits until it has applied every
update, so all replicas agree when the operator returns.

Replay gives the machine a *visibility script*: per clock, the exact vector of applied
clocks the recorded run had when it started that clock.  Then the machine applies
(and aggregates) up to that vector only — later arrivals stay buffered — waits for
whatever of it is missing, and answers :class:`ReportMismatch` when the vector can no
longer be reached.  What each clock reads is then the recorded one, whatever the
arrival timing; since the arithmetic never depends on arrival order, so is the result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .._errors import SyncProtocolError


# ====================================================================== events
@dataclass(frozen=True, slots=True)
class LoopStarted:
    """The operator invocation started on ``node``."""

    node: int
    seq: int


@dataclass(frozen=True, slots=True)
class ClockTicked:
    """``node`` finished computing ``clock``; its delta of that clock is ready."""

    node: int
    seq: int
    clock: int


@dataclass(frozen=True, slots=True)
class DeltaArrived:
    """The delta of ``clock`` from ``source`` arrived at owner ``node``."""

    node: int
    seq: int
    source: int
    clock: int


@dataclass(frozen=True, slots=True)
class UpdateArrived:
    """The update (new values) of ``clock`` from owner ``source`` arrived at ``node``."""

    node: int
    seq: int
    source: int
    clock: int


Event = LoopStarted | ClockTicked | DeltaArrived | UpdateArrived


# ====================================================================== instructions
@dataclass(frozen=True, slots=True)
class Proceed:
    """Start computing ``clock``; ``applied[q]`` is the last clock of owner q's updates
    applied so far (-1: none), i.e. what this clock's reads can see."""

    clock: int
    applied: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Wait:
    """Block until something arrives: ``clock`` cannot start (``clocks``: cannot finish)
    before the updates of the owners in ``missing`` catch up."""

    clock: int
    missing: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SendDelta:
    """Send this node's delta of ``clock`` to every other owner."""

    clock: int


@dataclass(frozen=True, slots=True)
class Aggregate:
    """Aggregate the deltas of ``clock`` in node order, apply them to the owned rows and
    send the update to every other node; ``arrival`` is the order the deltas came in."""

    clock: int
    arrival: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ApplyUpdate:
    """Write the update of ``clock`` from owner ``source`` into this node's replica."""

    source: int
    clock: int


@dataclass(frozen=True, slots=True)
class Finished:
    """Every clock is done and every update is applied: the invocation is over here."""


@dataclass(frozen=True, slots=True)
class ReportMismatch:
    """Replay: ``clock`` cannot start with the scripted ``recorded`` vector of applied
    clocks (``applied`` is what this node has, ``why`` says what is impossible)."""

    clock: int
    recorded: tuple[int, ...]
    applied: tuple[int, ...]
    why: str


Instruction = Proceed | Wait | SendDelta | Aggregate | ApplyUpdate | Finished | ReportMismatch

#: A visibility script: clock -> the applied vector that clock must start with (None: free).
Script = Callable[[int], tuple[int, ...] | None]


# ====================================================================== the machine
class SspClock:
    """One node's view of the clocks of one ``sync_for`` invocation."""

    def __init__(
        self, node: int, nodes: int, clocks: int, staleness: int, script: Script | None = None
    ) -> None:
        if not 0 <= node < nodes:
            raise ValueError(f"node {node} is not in 0..{nodes - 1}")
        if clocks < 0 or staleness < 0:
            raise ValueError(f"need clocks >= 0 and staleness >= 0, got {clocks}, {staleness}")
        self.node = node
        self.nodes = nodes
        self.clocks = clocks
        self.staleness = staleness
        self._started = False
        self._finished = False
        self._running: int | None = None
        self._next = 0
        self._arrivals: dict[int, list[int]] = {}  # clock -> delta sources in arrival order
        self._pending: list[set[int]] = [set() for _ in range(nodes)]  # arrived, not applied
        self._applied = [-1] * nodes  # per owner: last clock applied (own: aggregated)
        self._script = script
        self._caps: dict[int, tuple[int, ...] | None] = {}

    # ---------------------------------------------------------------- read-only state
    @property
    def running(self) -> int | None:
        """The clock being computed, or None between clocks."""
        return self._running

    @property
    def completed(self) -> int:
        """How many clocks this node has finished computing."""
        return self._next

    @property
    def applied(self) -> tuple[int, ...]:
        """Per owner, the last clock whose update this node has applied (-1: none)."""
        return tuple(self._applied)

    @property
    def finished(self) -> bool:
        """True once :class:`Finished` was emitted."""
        return self._finished

    # ---------------------------------------------------------------- the mutator
    def handle(self, event: Event) -> list[Instruction]:
        """Feed one event; return the instructions the driver must perform, in order."""
        if event.node != self.node:
            self._bad(event, f"it is addressed to node {event.node}")
        if isinstance(event, LoopStarted):
            if self._started:
                self._bad(event, "the loop already started")
            self._started = True
            return self._progress()
        if isinstance(event, ClockTicked):
            if self._running != event.clock:
                self._bad(event, f"the running clock is {self._running}")
            self._running = None
            self._next = event.clock + 1
            self._arrivals.setdefault(event.clock, []).append(self.node)
            return [SendDelta(event.clock), *self._progress()]
        if isinstance(event, DeltaArrived):
            self._check_peer(event, event.source, event.clock)
            got = self._arrivals.setdefault(event.clock, [])
            if event.source in got or event.clock <= self._applied[self.node]:
                self._bad(event, "this delta already arrived")
            got.append(event.source)
        elif isinstance(event, UpdateArrived):
            self._check_peer(event, event.source, event.clock)
            if (
                event.clock <= self._applied[event.source]
                or event.clock in self._pending[event.source]
            ):
                self._bad(event, "this update already arrived")
            self._pending[event.source].add(event.clock)
        else:
            raise SyncProtocolError(f"SspClock: unknown event {event!r}")
        if self._running is not None or not self._started:
            return []  # applied at the next clock boundary
        return self._progress()

    # ---------------------------------------------------------------- internals
    def _cap(self) -> tuple[int, ...] | None:
        """The scripted vector the next clock must start with (None: no script)."""
        if self._script is None or self._next >= self.clocks:
            return None
        c = self._next
        if c not in self._caps:
            got = self._script(c)
            self._caps[c] = None if got is None else tuple(int(v) for v in got)
        return self._caps[c]

    def _unreachable(self, cap: tuple[int, ...]) -> str | None:
        """Why the scripted vector ``cap`` cannot be the next clock's (None: it can)."""
        if len(cap) != self.nodes:
            return f"it has {len(cap)} entries for {self.nodes} nodes"
        need = self._next - self.staleness - 1
        for q, v in enumerate(cap):
            if v < self._applied[q]:
                return f"owner {q}'s update of clock {self._applied[q]} is already applied"
            if v < need:
                return f"it misses owner {q}'s update of clock {need} (staleness bound)"
            if v >= self._next:
                return f"owner {q}'s update of clock {v} needs this node's delta of that clock"
        return None

    def _progress(self) -> list[Instruction]:
        out: list[Instruction] = []
        me, P = self.node, self.nodes
        cap = self._cap()
        if cap is not None and (why := self._unreachable(cap)) is not None:
            return [ReportMismatch(self._next, cap, tuple(self._applied), why)]
        while True:
            k = self._applied[me] + 1
            got = self._arrivals.get(k)
            if k >= self.clocks or got is None or len(got) < P:
                break
            if cap is not None and k > cap[me]:
                break  # replay: the recorded clock started before this aggregation
            del self._arrivals[k]
            out.append(Aggregate(k, tuple(got)))
            self._applied[me] = k
        for q in range(P):
            pend = self._pending[q]
            while self._applied[q] + 1 in pend:
                k = self._applied[q] + 1
                if cap is not None and k > cap[q]:
                    break  # replay: buffered until after the recorded clock starts
                pend.discard(k)
                self._applied[q] = k
                out.append(ApplyUpdate(q, k))
        if self._next < self.clocks:
            need = self._next - self.staleness - 1
            if cap is None:
                missing = tuple(q for q in range(P) if self._applied[q] < need)
            else:
                missing = tuple(q for q in range(P) if self._applied[q] < cap[q])
            if missing:
                out.append(Wait(self._next, missing))
            else:
                out.append(Proceed(self._next, tuple(self._applied)))
                self._running = self._next
        elif not self._finished:
            missing = tuple(q for q in range(P) if self._applied[q] < self.clocks - 1)
            if missing:
                out.append(Wait(self.clocks, missing))
            else:
                self._finished = True
                out.append(Finished())
        return out

    def _check_peer(self, event: Event, source: int, clock: int) -> None:
        if not 0 <= source < self.nodes or source == self.node:
            self._bad(event, f"source {source} is not another node of {self.nodes}")
        if not 0 <= clock < self.clocks:
            self._bad(event, f"clock {clock} is outside 0..{self.clocks - 1}")

    def _bad(self, event: Event, why: str) -> None:
        raise SyncProtocolError(
            f"SspClock of node {self.node} (running={self._running}, completed={self._next}, "
            f"applied={self._applied}) cannot take {event!r}: {why}"
        )


__all__ = [
    "Aggregate",
    "ApplyUpdate",
    "ClockTicked",
    "DeltaArrived",
    "Event",
    "Finished",
    "Instruction",
    "LoopStarted",
    "Proceed",
    "ReportMismatch",
    "Script",
    "SendDelta",
    "SspClock",
    "UpdateArrived",
    "Wait",
]
