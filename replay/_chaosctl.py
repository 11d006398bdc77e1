"""The controller of a chaos run: every invocation's schedule leaves nothing to timing.

A :class:`ChaosController` answers each invocation with a
:class:`~engine.lowlevel.Schedule` that carries only a :class:`~engine.lowlevel.Chaos`
seed: the engine draws every free choice of the invocation (lock-split merges, thread
dispatch, message arrivals, SSP visibility within the bound, Hybrid mutex orders) from
it.  It holds two integers, so an MPI rank rebuilds the same controller from its job
spec and every rank draws the same choices.
"""

from __future__ import annotations

import engine
from engine.lowlevel import Chaos, Schedule


class ChaosController(engine.Controller):
    """Schedules drawn from (chaos seed, run number)."""

    def __init__(self, seed: int, run: int) -> None:
        self.chaos = Chaos(seed, run)

    def schedule(
        self,
        op: str,
        invocation: int,
        kind: str,
        nodes: int,
        span: tuple[int, int] | None = None,
    ) -> Schedule:
        return Schedule(op, invocation, chaos=self.chaos)


def labels(seed: int, run: int) -> dict[str, int]:
    """The run labels a chaos run is recorded with (``RunInfo.labels``)."""
    return {"chaos_seed": seed, "chaos_run": run}


__all__ = ["ChaosController", "labels"]
