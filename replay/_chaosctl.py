"""The controller of a chaos run: every invocation's schedule leaves nothing to timing.

A :class:`ChaosController` answers each invocation with a
:class:`~engine.lowlevel.Schedule` that carries only a :class:`~engine.lowlevel.Chaos`
seed: the engine draws every free choice of the invocation (which lock-split body runs on
at every body start, body end and access to a group-written element, thread dispatch,
message arrivals, SSP visibility within the bound, Hybrid mutex orders) from it.  It holds two integers, so an MPI rank rebuilds the same controller from its job
spec and every rank draws the same choices.

With ``faults`` (in-process only) it also stops one node at a point drawn from the same
seed: the victim node's loop bodies are counted, and in the first invocation whose draw
says so, the body after the drawn count raises :class:`NodeStopped` — the in-process
stand-in for a killed rank.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from engine.lowlevel import FAULT, Chaos, Schedule

from ._dualctl import Steering

#: Chance that a fault fires in a given invocation (until one has fired): spreads the
#: stops over a run's invocations instead of always the first.
FAULT_RATE = 0.5
#: The stop happens after 0..FAULT_BODIES-1 of the victim's bodies in that invocation.
FAULT_BODIES = 16


class NodeStopped(BaseException):
    """A chaos fault stopped a node (not an ``Exception``: no body or engine handler may
    swallow it, as nothing swallows a killed rank)."""

    def __init__(self, node: int, op: str, invocation: int, after: int) -> None:
        super().__init__(
            f"chaos fault: node {node} stopped in {op}#{invocation} after {after} of its "
            "loop bodies"
        )
        self.node, self.op, self.invocation, self.after = node, op, invocation, after


class ChaosController(Steering):
    """Schedules drawn from (chaos seed, run number); ``faults``: also stop a node."""

    def __init__(self, seed: int, run: int, *, faults: bool = False, nodes: int = 1) -> None:
        self.chaos = Chaos(seed, run)
        self.faults = faults
        self.victim = int(self.chaos.rng("", -1, FAULT).integers(nodes)) if faults else -1
        self._armed: dict[tuple[str, int], int] = {}  # (op, inv) -> bodies left (-1: no)
        self.fired: NodeStopped | None = None
        self._count = threading.Lock()  # a node's threads count its bodies together

    def schedule(
        self,
        op: str,
        invocation: int,
        kind: str,
        nodes: int,
        span: tuple[int, int] | None = None,
    ) -> Schedule:
        return Schedule(op, invocation, chaos=self.chaos)

    def wrap_body(self, op: str, invocation: int, node: int, body: Any) -> Any:
        if not self.faults or node != self.victim or self.fired is not None:
            return body
        key = (op, invocation)
        if key not in self._armed:
            rng = self.chaos.rng(op, invocation, FAULT, node)
            fire = rng.random() < FAULT_RATE
            self._armed[key] = int(rng.integers(FAULT_BODIES)) if fire else -1
        if self._armed[key] < 0:
            return body
        return self._stopping(op, invocation, node, body)

    def _stopping(
        self, op: str, invocation: int, node: int, body: Callable[..., Any]
    ) -> Callable[..., Any]:
        key = (op, invocation)
        total = self._armed[key]

        def wrapped(*args: Any) -> Any:
            with self._count:
                left = self._armed[key]
                if left == 0 or self.fired is not None:
                    self.fired = self.fired or NodeStopped(node, op, invocation, total)
                    raise self.fired
                self._armed[key] = left - 1
            return body(*args)

        return wrapped


def labels(seed: int, run: int) -> dict[str, int]:
    """The run labels a chaos run is recorded with (``RunInfo.labels``)."""
    return {"chaos_seed": seed, "chaos_run": run}


__all__ = ["ChaosController", "NodeStopped", "labels"]
