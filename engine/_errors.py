"""Errors raised by the execution engine; all derive from :class:`EngineError`."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class ScheduleExhausted(EngineError):
    """A run followed a schedule past its end where the schedule says the run it was
    recorded from stopped (a crashed trace): everything the trace holds was reproduced."""


class ClosureRuleError(EngineError, TypeError):
    """A loop body assigns to a captured variable that is not a DDS."""


class AccessOutsideReconError(EngineError, RuntimeError):
    """A body touched an element outside its plan or reconnaissance sets and the
    operator runs with ``replan="never"``."""


class ReplicaMismatchError(EngineError, RuntimeError):
    """In test or checked mode, a node's replica of a row differs from its owner's."""

    def __init__(
        self,
        op: str,
        invocation: int,
        dds: str,
        element: str,
        node: int,
        owner: int,
        mine: str,
        theirs: str,
    ) -> None:
        self.op, self.invocation, self.dds, self.element = op, invocation, dds, element
        self.node, self.owner, self.mine, self.theirs = node, owner, mine, theirs
        super().__init__(
            f"after {op}#{invocation}, node {node}'s replica of {element} is {mine} but its "
            f"owner, node {owner}, has {theirs}: a write did not reach every replica (an "
            "engine bug; please report it)"
        )

    def as_dict(self) -> dict[str, object]:
        """The JSON form used in dual-test divergences."""
        return {
            "what": "replica",
            "iteration": self.invocation,
            "op": self.op,
            "invocation": self.invocation,
            "dds": self.dds,
            "element": self.element,
            "node": self.node,
            "owner": self.owner,
            "replica": self.mine,
            "owner_value": self.theirs,
        }


class DataFormatError(EngineError, ValueError):
    """A line of an input file could not be parsed."""


class DDSError(EngineError, KeyError):
    """Misuse of a distributed data structure (unknown key, bad shape, wrong mode)."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else ""


class ShardMissError(EngineError, RuntimeError):
    """A body read a row of a sharded ``dvector`` that the node running it does not
    hold (see ``engine._data.shard``) outside an ``async_for`` round, where the engine
    cannot tell in advance which rows a node needs."""

    def __init__(self, desc: str, name: str, slot: int, node: int, gid: int = -1) -> None:
        self.name = name
        self.slot = slot
        self.node = node
        self.gid = gid
        super().__init__(
            f"{desc} is not held on node {node}: a sharded dvector keeps on each node its "
            "own rows and the rows that node's loop bodies are known to touch beforehand; "
            "read it in an async_for body or a sync_for body with reconnaissance "
            f"(re=True, the default), or create {name!r} with sharded=False to keep a "
            "whole copy on every node"
        )


class NotSeenError(EngineError, RuntimeError):
    """A debugger stopped in a loop body asked for an element that the body does not
    read (or write) where it runs: the node's copy may be out of date, and counting the
    access as the body's would change the run (``engine.lowlevel.inspecting``)."""


class KernelError(EngineError, TypeError):
    """A compiled loop body (``@kernel``) was bound to bad arguments or does not compile."""


class SessionError(EngineError, RuntimeError):
    """An operator was used outside a session or with a session in the wrong state."""


class StaleDriverReadError(EngineError, RuntimeError):
    """The driver read a DDS element while the run fast-forwarded to a checkpoint, where
    its value would not be the recorded run's (the bodies that wrote it were skipped)."""


class BodyError(EngineError, RuntimeError):
    """A loop body raised; carries the operator, invocation and index that failed."""

    def __init__(self, op: str, invocation: int, index: int, node: int, cause: BaseException):
        self.op = op
        self.invocation = invocation
        self.index = index
        self.node = node
        self.cause = cause
        super().__init__(
            f"{op}#{invocation} index {index} on node {node} raised {type(cause).__name__}: {cause}"
        )


class OutputPathError(EngineError, ValueError):
    """A file would be written somewhere it must not be (a link, a device, a trace store,
    an existing file without ``force``, a missing directory)."""


class SaveError(EngineError, ValueError):
    """``ap.save`` was given a model it cannot write in the chosen format (a file name
    that is not ``.npz`` or ``.txt``, Python objects, an embedding without its words)."""


class InputFileError(EngineError, FileNotFoundError):
    """An input file does not exist or cannot be read."""


class DivergenceError(EngineError, RuntimeError):
    """A replayed program asked for an event its trace does not allow.

    Carries where (node, operator, invocation, event number) and what the trace
    expected versus what happened.
    """

    def __init__(
        self,
        *,
        node: int,
        op: str,
        invocation: int,
        event: int | str,
        expected: str,
        actual: str,
        what: str = "event",
        detail: dict[str, object] | None = None,
    ) -> None:
        self.node = node
        #: more about the difference (the first differing element and its two values)
        self.detail = dict(detail or {})
        self.op = op
        self.invocation = invocation
        self.event = event
        self.expected = expected
        self.actual = actual
        self.what = what
        super().__init__(
            f"replay diverged {self.where(node, op, invocation, what, event)}: "
            f"{self.contrast(expected, actual)}"
        )

    @classmethod
    def where(
        cls, node: object, op: object, invocation: object, what: object, event: object
    ) -> str:
        """``on node 1 at sgd#3, lock round 2``; an objective's value is not an operator's
        event: ``at objective rmse, iteration 3``."""
        if op == "objective" and what == "objective":
            return f"at objective {event}, iteration {invocation}"
        return f"{cls.place(node, op, invocation)}, {cls.label(what, event)}"

    @staticmethod
    def place(node: object, op: object, invocation: object) -> str:
        """``on node N at OP#INV``; without the node when no single node is to blame
        (``node`` -1: the plan, or an invocation every node ran or none did)."""
        at = f"at {op}#{invocation}"
        try:
            known = int(node) >= 0  # type: ignore[call-overload]
        except (TypeError, ValueError):
            known = False
        return f"on node {node} {at}" if known else at

    @staticmethod
    def label(what: object, event: object) -> str:
        """``lock round 2``; the event alone when it already says what it is (``plan``)."""
        e = str(event)
        return e if e.startswith(str(what)) else f"{what} {e}"

    @staticmethod
    def contrast(expected: str, actual: str) -> str:
        """``the trace expected E, the program did A``; an ``actual`` that is already a
        sentence about the program (``the program ended before it``) is kept whole."""
        did = actual if actual.startswith("the program ") else f"the program did {actual}"
        return f"the trace expected {expected}, {did}"

    def as_dict(self) -> dict[str, object]:
        """The JSON form used in ``first_difference``."""
        return {
            "node": self.node,
            "op": self.op,
            "invocation": self.invocation,
            "event": self.event,
            "what": self.what,
            "expected": self.expected,
            "actual": self.actual,
            **self.detail,
        }


class SyncProtocolError(EngineError, RuntimeError):
    """The ``sync_for`` clock machine got an event impossible in its state (a transport
    or replay bug, or a trace that does not belong to this run)."""


class PeerRankFailed(EngineError, RuntimeError):
    """Another MPI rank failed in a step every rank runs together (reconnaissance, a
    data operation).  The lowest failing rank, whose share comes first in index order,
    raises its own error; every other rank raises this one and stays quiet, so the error
    a user sees does not depend on which rank happened to fail first."""

    def __init__(self, rank: int, error: str | None = None) -> None:
        self.rank = rank
        #: the failing rank's error in one line (None when it was not sent): what the
        #: other ranks, rank 0 among them, record as the run's error
        self.error = error
        what = f": {error}" if error else "; see its error"
        super().__init__(f"rank {rank} failed in a step all ranks run together{what}")


#: Characters of a failing rank's error that travel to the other ranks (a user's
#: exception may carry a whole data line; the trace keeps the start of it).
PEER_ERROR_CHARS = 500


def peer_error(exc: BaseException) -> str:
    """``exc`` in one line, as the other ranks name it in their :class:`PeerRankFailed`."""
    text = " ".join(str(exc).split())
    line = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return line if len(line) <= PEER_ERROR_CHARS else line[: PEER_ERROR_CHARS - 3] + "..."


def _shown(value: Any, width: int = 60) -> str:
    """A value as the divergence errors show it, on one line of at most ``width``."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        text = repr(value.item())
    elif isinstance(value, np.ndarray):
        text = " ".join(np.array2string(value, threshold=6, precision=8).split())
    else:
        text = repr(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def _per_rank(texts: list[str]) -> str:
    """``a on rank 0 and b on ranks 1, 2``: each rank's text, ranks with the same together."""
    groups: dict[str, list[int]] = {}
    for rank, text in enumerate(texts):
        groups.setdefault(text, []).append(rank)
    parts = [
        f"{text} on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
        for text, ranks in groups.items()
    ]
    return f"{', '.join(parts[:-1])} and {parts[-1]}" if len(parts) > 1 else parts[0]


class DriverDivergenceError(EngineError, RuntimeError):
    """The SPMD driver computed different values on different MPI ranks.

    Every rank runs the same driver, so its logged objectives must be bitwise equal;
    a difference means some state lives in one rank's Python objects.  Raised on
    every rank alike, so none waits for the others.
    """

    def __init__(self, name: str, iteration: int, values: list[float]) -> None:
        self.name = name
        self.iteration = iteration
        self.values = values
        groups: dict[bytes, list[int]] = {}
        for rank, v in enumerate(values):
            groups.setdefault(struct.pack("<d", v), []).append(rank)
        shown = "; ".join(
            f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: "
            f"{values[ranks[0]]!r}"
            for ranks in groups.values()
        )
        super().__init__(
            f"the driver diverged between MPI ranks: objective {name!r} at iteration "
            f"{iteration} is {shown}; the driver must compute the same values on every rank "
            "(state kept in one rank's Python objects, outside DDS, breaks this)"
        )


class DriverCapturesDivergedError(DriverDivergenceError):
    """A loop body reads a number from outside DDS (a closure variable, a global, a
    default or kernel argument) whose value differs between MPI ranks: an unseeded random
    number, the time or the process id taken in the driver.  The bodies of each rank would
    compute with their own value, and no digest or objective would tell, so every rank
    compares the numbers its body can reach at each loop invocation, before any body
    runs; raised on every rank."""

    def __init__(self, op: str, label: str, shown: list[str]) -> None:
        self.name, self.iteration, self.values = "", -1, []
        self.op, self.label, self.shown = op, label, shown
        RuntimeError.__init__(
            self,
            f"the driver diverged between MPI ranks: the body of {op} reads {label}, which "
            f"is {_per_rank(shown)}; every rank must compute the same values (a random "
            "number, time or process id taken in one rank's driver breaks this): seed it, "
            "compute it from the data, or keep it in a DDS",
        )


class DriverWritesDivergedError(DriverDivergenceError):
    """The driver wrote different DDS elements or values on different MPI ranks.  The
    driver writes every replica a rank holds (SPMD: each rank makes the same write), so a
    value from one rank's Python state would give the nodes different copies of the
    element, which no digest of the owners' rows sees; each rank's writes are compared at
    the next driver operation, and this is raised on every rank."""

    def __init__(self, before: str, what: str, verb: str, writes: list[str]) -> None:
        self.name, self.iteration, self.values = "", -1, []
        self.before, self.writes = before, writes
        RuntimeError.__init__(
            self,
            f"the driver diverged between MPI ranks: {what} before {before} {verb} "
            f"{_per_rank(writes)}; every rank must write the same (a random number, the "
            "time or a shard of data taken in one rank's driver breaks this): compute it "
            "the same way on every rank",
        )


class DriverStepsDivergedError(DriverDivergenceError):
    """The SPMD driver reached different operations on different MPI ranks (a loop count,
    branch or operator range taken from one rank's Python state).  Every rank checks at
    each driver operation that all ranks are at the same one, before any other message,
    so a divergent driver stops there instead of waiting forever; raised on every rank."""

    def __init__(self, steps: list[str], verb: str = "at", why: str | None = None) -> None:
        self.name, self.iteration, self.values = "", -1, []
        self.steps = steps
        groups: dict[str, list[int]] = {}
        for rank, step in enumerate(steps):
            groups.setdefault(step, []).append(rank)
        shown = "; ".join(
            f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} {verb} {step}"
            for step, ranks in groups.items()
        )
        rule = (
            "run the same operations in the same order"
            if verb == "at"
            else "compute the same values from the same data"
        )
        why = why or (
            "a loop count, branch, range or value taken from one rank's Python state, "
            "outside DDS, breaks this"
        )
        RuntimeError.__init__(
            self, f"the driver diverged between MPI ranks: {shown}; every rank must {rule} ({why})"
        )
