"""The controller: the hooks replay and the dual tests use to steer a run.

The engine asks its session's :class:`Controller` for the
:class:`~engine._machines.schedule.Schedule` of each invocation before it starts (the plan,
and the lock-grant, SSP-visibility, node-mutex and message orders, all as one value).  The
default controller allows whatever happens (a normal run).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._machines.planner import Plan
    from .._machines.schedule import Schedule


class Controller:
    """What a normal run does: nothing is enforced.

    The engine asks :meth:`schedule` once when an invocation starts; everything the
    invocation could do in more than one way is answered by that value (``None``: free).
    The other hooks are for the dual tests (their own ``sync_for``
    executor), for debugging (breakpoints, a stop after an invocation) and for checking
    the plan.
    """

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

    def check_plan(self, op: str, invocation: int, plan: Plan) -> None:
        """Raise :class:`DivergenceError` if ``plan`` is not the recorded one."""

    def sync_executor(self) -> Any:
        """A callable that runs ``sync_for`` instead of the engine (dual tests' serial side)."""
        return None

    def wrap_body(self, op: str, invocation: int, node: int, body: Any) -> Any:
        """The callable to run as the loop body on ``node`` (replay adds breakpoints)."""
        return body

    def after_invocation(self, op: str, invocation: int) -> None:
        """Called in the driver after every operator invocation completes."""


__all__ = ["Controller"]
