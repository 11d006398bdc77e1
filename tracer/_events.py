"""The events of a trace: what the read API hands out, one per recorded fact.

Every event names the node it happened on and its position ``seq`` in that node's
sequence (a per-node counter, with no cross-node coordination).  Events are plain
frozen values, so replay, the TUI and tests can compare, hash and build them by hand.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PlanMade:
    """A plan was built for ``op`` (stored once; see ``RunTrace.plan``)."""

    node: int
    seq: int
    op: str
    plan_no: int
    strategy: str
    rounds: int
    bodies: int


@dataclass(frozen=True, slots=True)
class LockGranted:
    """In ``round``, ``bodies`` locked bodies took ``grants`` element locks in a ticket
    order that left its prediction (the last thread keeps going) at the flattened
    (position, thread) pairs ``deviations``: from that position on, that thread went,
    taking over the element lock named in ``elements`` (``W[943]``; one per pair)."""

    node: int
    seq: int
    op: str
    invocation: int
    round: int
    bodies: int
    grants: int
    deviations: tuple[int, ...]
    elements: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class MessageReceived:
    """The ``source_seq``-th message of ``source`` on ``channel`` arrived at ``node``."""

    node: int
    seq: int
    channel: str
    source: int
    source_seq: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class IndexOrderDeviated:
    """A thread ran ``indices`` in an order other than the plan's."""

    node: int
    seq: int
    op: str
    invocation: int
    round: int
    thread: int
    indices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DeltasAggregated:
    """Owner ``node`` aggregated the deltas of ``clock``, taken from ``sources`` in this order."""

    node: int
    seq: int
    op: str
    invocation: int
    clock: int
    sources: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class UpdatesApplied:
    """Before ``clock`` of an SSP ``sync_for``, ``node`` had applied owner q's updates
    of every clock up to ``applied[q]`` (-1: none)."""

    node: int
    seq: int
    op: str
    invocation: int
    clock: int
    applied: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class MutexGranted:
    """In a hybrid ``sync_for``, ``thread`` took the node mutex to run ``minibatch``."""

    node: int
    seq: int
    op: str
    invocation: int
    clock: int
    thread: int
    minibatch: int


@dataclass(frozen=True, slots=True)
class InvocationCompleted:
    """A node finished one invocation of ``op`` (the commit point of the recorder)."""

    node: int
    seq: int
    op: str
    invocation: int
    bodies: int
    rounds: int
    seconds: float


@dataclass(frozen=True, slots=True)
class DigestRecorded:
    """The digest of DDS ``dds`` after one invocation of ``op`` (xxh3-chunks ``xc:...``;
    in older traces xxh3-128 ``x3:...`` or blake2b-128; see ``engine._data.digest``)."""

    node: int
    seq: int
    op: str
    invocation: int
    dds: str
    digest: str


@dataclass(frozen=True, slots=True)
class ObjectiveLogged:
    """The driver logged objective ``name`` for ``iteration``."""

    node: int
    seq: int
    name: str
    iteration: int
    value: float


@dataclass(frozen=True, slots=True)
class RunEnded:
    """The run ended with ``status`` (finished, failed, crashed or interrupted) and maybe a traceback."""

    node: int
    seq: int
    status: str
    error: str | None


Event = (
    PlanMade
    | LockGranted
    | MessageReceived
    | IndexOrderDeviated
    | DeltasAggregated
    | UpdatesApplied
    | MutexGranted
    | InvocationCompleted
    | DigestRecorded
    | ObjectiveLogged
    | RunEnded
)

#: Every event class, in the order the docs list them.
EVENT_TYPES: tuple[type, ...] = (
    PlanMade,
    LockGranted,
    MessageReceived,
    IndexOrderDeviated,
    DeltasAggregated,
    UpdatesApplied,
    MutexGranted,
    InvocationCompleted,
    DigestRecorded,
    ObjectiveLogged,
    RunEnded,
)

__all__ = [
    "EVENT_TYPES",
    "DeltasAggregated",
    "DigestRecorded",
    "Event",
    "IndexOrderDeviated",
    "InvocationCompleted",
    "LockGranted",
    "MessageReceived",
    "MutexGranted",
    "ObjectiveLogged",
    "PlanMade",
    "RunEnded",
    "UpdatesApplied",
]
