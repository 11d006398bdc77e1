"""The engine's extension point: a schedule source and a debug-hooks object.

The engine asks its session's :class:`ScheduleSource` for the
:class:`~engine._machines.schedule.Schedule` of each invocation before it starts (the plan,
and the lock-grant, SSP-visibility, node-mutex and message orders, all as one value); the
default source answers None, a free run.  Everything else that steers a run from outside
is a :class:`DebugHooks` method: breakpoints, per-invocation checks, the dual tests' own
``sync_for`` arithmetic, and the time-travel fast-forward.  Replay, the dual tests and
chaos exploration provide one or both; a normal run uses neither.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._machines.planner import Plan
    from .._machines.schedule import Schedule


class ScheduleSource:
    """Where each invocation's schedule comes from; this default leaves every run free."""

    #: the hash of the replayed trace's digests (``engine._data.digest``); None: the default
    digest_kind: str | None = None

    def schedule(
        self,
        op: str,
        invocation: int,
        kind: str,
        nodes: int,
        span: tuple[int, int] | None = None,
    ) -> Schedule | None:
        """The schedule of invocation ``invocation`` of ``op`` (``kind``: ``async_for`` or
        ``sync_for``) on ``nodes`` nodes, or None for a free run.  Called before it starts;
        ``span`` is an ``async_for``'s ``(start, stop)``."""
        return None


class DebugHooks:
    """Breakpoints, per-invocation checks and time travel; this default does nothing."""

    #: the hash of the digests the hooks compare with (``engine._data.digest``)
    digest_kind: str | None = None

    def check_plan(self, op: str, invocation: int, plan: Plan) -> None:
        """Raise :class:`DivergenceError` if ``plan`` is not the recorded one."""

    def wrap_body(self, op: str, invocation: int, node: int, body: Any) -> Any:
        """The callable to run as the loop body on ``node`` (replay adds breakpoints)."""
        return body

    def after_invocation(self, op: str, invocation: int) -> None:
        """Called in the driver after every operator invocation completes."""

    def ran_exact(self, entry: dict[str, Any]) -> None:
        """Test or checked mode runs exactly what the program declared relaxed or stale
        (``entry``: ``{"kind": "relaxed"|"ssp", "name": ...}``, see ``RunResult.ran_exact``);
        called in the driver, once per (kind, name), when first met."""

    # ------------------------------------------------------------ time travel
    # Replay from a checkpoint: the driver runs from the start, loop invocations up to
    # the checkpoint are skipped, the values collective operators returned are served
    # from the trace, and at the checkpoint the DDS are restored.
    def fast_forward(self) -> tuple[str, int] | None:
        """The invocation (op, invocation) whose checkpoint the run restores: every loop
        invocation up to it is skipped.  None (a normal run): nothing is skipped."""
        return None

    def restore(self, op: str, invocation: int) -> Any:
        """The checkpoint at the end of ``op``#``invocation``: an object with ``rows``
        (dds name -> (slots, values), every node's owned rows merged) and ``counters``
        (node -> message counters)."""
        raise NotImplementedError("these hooks do not fast-forward")

    def check_restored(self, op: str, invocation: int, digests: list[tuple[str, str]]) -> None:
        """The restored DDS have these (dds, digest): raise :class:`DivergenceError` if
        they are not the recorded ones (a damaged checkpoint)."""

    def served_value(self, k: int, kind: str) -> Any:
        """The value the ``k``-th collective call (``reduce``, ``gather``) returned in the
        recorded run, while fast-forwarding."""
        raise NotImplementedError("these hooks do not fast-forward")

    def skipped(self, op: str, invocation: int) -> None:
        """A loop invocation was skipped while fast-forwarding (replay's checker notes it)."""


__all__ = ["DebugHooks", "ScheduleSource"]
