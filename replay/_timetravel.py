"""Time travel in a replay: start at a checkpoint instead of at the beginning.

The driver (the user's program) runs from the start, as in any replay; loop
invocations up to the chosen checkpoint are skipped, the values its collective
operators returned in the recorded run are served from the trace, and at the
checkpoint the DDS are restored (``engine.DebugHooks.fast_forward`` and the hooks
after it).  The restored DDS are checked against the digests the trace holds for that
invocation, so a damaged checkpoint is named at once.  Nothing read from the trace
is executed: checkpoints and collective values are arrays and tagged plain data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tracer
from engine import DivergenceError
from engine.lowlevel import check_same_digest_kind

from ._errors import UsageError


def parse_point(text: str, option: str) -> tuple[str, int]:
    """``OP:INVOCATION`` → (op, invocation); a bad one is a :class:`UsageError`."""
    op, sep, inv = text.rpartition(":")
    if not sep or not op:
        raise UsageError(f"{option} expects OP:INVOCATION, got {text!r}")
    try:
        n = int(inv)
    except ValueError:
        raise UsageError(
            f"INVOCATION in {text!r} must be an integer, got {inv!r} ({option})"
        ) from None
    return op, n


def program_order(run: Any) -> list[tuple[str, int]]:
    """The run's completed loop invocations in program order (the lowest node's)."""
    invs = run.invocations()
    if not invs:
        return []
    node = min(i.node for i in invs)
    return [(i.op, i.invocation) for i in sorted(invs, key=lambda i: i.seq) if i.node == node]


def first_step(run: Any) -> int:
    """The step (loop invocations since the driver started) of the run's first recorded
    invocation: 0, or for a resumed run (``continues``) the one after the checkpoint it
    started from, which is its first checkpoint."""
    if run.info.continues is None:
        return 0
    cps = run.checkpoints()
    return cps[0].step + 1 if cps else 0


def completed(order: list[tuple[str, int]]) -> dict[str, tuple[int, int]]:
    """Per operator, the first and last of its invocations in ``order``: 0 and n - 1,
    except in a resumed run, whose invocations start after the checkpoint it resumed
    from (the earlier ones are the run it continues)."""
    out: dict[str, tuple[int, int]] = {}
    for op, inv in order:
        lo, hi = out.get(op, (inv, inv))
        out[op] = (min(lo, inv), max(hi, inv))
    return out


def step_of(order: list[tuple[str, int]], point: tuple[str, int], option: str) -> int:
    """The place of ``point`` among ``order``; a point the run never reached is a
    :class:`UsageError` naming what exists."""
    try:
        return order.index(point)
    except ValueError:
        pass
    op, inv = point
    have = completed(order)
    if op not in have:
        ops = ", ".join(f"{o} ({a}..{b})" for o, (a, b) in have.items()) or "none"
        raise UsageError(f"{option}: the run has no operator {op!r}; its operators: {ops}")
    lo, hi = have[op]
    earlier = (
        " (this run resumed an earlier run of the trace, which ran the invocations before "
        "those: name that run with --run)"
        if inv < lo
        else ""
    )
    raise UsageError(
        f"{option}: {op}#{inv} does not exist; the run completed {op}#{lo} to {op}#{hi}{earlier}"
    )


def require_checkpoints(run: Any) -> list[Any]:
    """The run's complete checkpoints; none is a :class:`UsageError`."""
    cps = run.checkpoints()
    if not cps:
        raise UsageError(
            f"run {run.info.run_id[:12]} has no checkpoints (recorded with --no-checkpoints, "
            "or before its first loop invocation ended); re-record it with 'replay run'"
        )
    return cps


def restartable(cp: Any) -> bool:
    """Whether a run can restart from checkpoint ``cp``: it holds every DDS a loop body
    had written.  One it left out (objects that are not plain data) would keep the value
    it had before the skipped bodies, so a replay from there would report a divergence
    the program never made, and a resume would quietly finish with another result."""
    return not cp.refused


def left_out(cp: Any) -> str:
    """The DDS checkpoint ``cp`` leaves out, and why: ``DDS 'B' (it holds a Box ...)``."""
    return ", ".join(f"DDS {dds!r} ({why})" for dds, why in cp.refused)


@dataclass(frozen=True)
class Start:
    """Where a time-travelling replay starts: after checkpoint ``op``#``invocation``
    (``step`` among the loop invocations), or at the beginning (``op`` None).  ``note``
    says why a later checkpoint before the target was passed over (None: none was)."""

    op: str | None
    invocation: int
    step: int
    note: str | None = None

    def as_json(self) -> dict[str, Any] | None:
        if self.op is None:
            return None
        return {"op": self.op, "invocation": self.invocation, "step": self.step}


def start_before(run: Any, target_step: int) -> Start:
    """The latest checkpoint taken before loop invocation ``target_step`` runs that a run
    can restart from (:func:`restartable`)."""
    best = passed = None
    for cp in require_checkpoints(run):
        if cp.step < target_step:
            if restartable(cp):
                best, passed = cp, None
            else:
                passed = cp
    note = passed_over(passed, best) if passed is not None else None
    if best is None:
        return Start(None, -1, -1, note)
    return Start(best.op, best.invocation, best.step, note)


def passed_over(passed: Any, best: Any) -> str:
    """The ``note:`` line for starting at checkpoint ``best`` (None: at the beginning)
    instead of the later checkpoint ``passed``, which is not :func:`restartable`."""
    where = f"after {best.op}#{best.invocation}" if best is not None else "at the beginning"
    return (
        f"note: the checkpoint at {passed.op}#{passed.invocation} leaves out "
        f"{left_out(passed)}, which loop bodies write, so no run can start there; "
        f"starting {where}"
    )


class FastForward:
    """Answers the engine's fast-forward hooks for one replay from a checkpoint."""

    def __init__(self, run: Any, start: Start) -> None:
        self.run = run
        self.start = start
        self._values: list[Any] | None = None
        #: loop invocations skipped so far (the outcome checker does not expect them)
        self.skipped: set[tuple[str, int]] = set()
        self._count = 0
        #: the checkpoint has been restored: from here on the program computes everything
        self.restored = False

    def fast_forward(self) -> tuple[str, int] | None:
        if self.start.op is None:
            return None
        return (self.start.op, self.start.invocation)

    def restore(self, op: str, invocation: int) -> Any:
        try:
            return self.run.checkpoint_state(op, invocation)
        except KeyError:
            raise tracer.TraceFormatError(
                f"the checkpoint at {op}#{invocation} is missing from run "
                f"{self.run.info.run_id[:12]}; the trace is damaged"
            ) from None

    def check_restored(self, op: str, invocation: int, digests: list[tuple[str, str]]) -> None:
        want = {
            d.dds: d.digest for d in self.run.digests() if (d.op, d.invocation) == (op, invocation)
        }
        for dds, got in digests:
            exp = want.get(dds)
            if exp is not None:
                check_same_digest_kind(exp, got)
            if exp is not None and exp != got:
                raise DivergenceError(
                    node=-1,
                    op=op,
                    invocation=invocation,
                    event=f"checkpoint of {dds}",
                    what="checkpoint",
                    expected=f"the recorded digest {exp}",
                    actual=f"{got} after restoring it (the checkpoint is damaged)",
                )
        self.restored = True

    def served_value(self, k: int, kind: str) -> Any:
        if self._values is None:
            self._values = self.run.collective_values()
        values = self._values
        op, inv = self.start.op, self.start.invocation
        if k >= len(values) or values[k].kind != kind:
            raise DivergenceError(
                node=-1,
                op=str(op),
                invocation=inv,
                event=f"collective call {k}",
                what="collective",
                expected=(
                    f"a {values[k].kind}" if k < len(values) else f"only {len(values)} call(s)"
                ),
                actual=f"a {kind} (code changed?)",
            )
        v = values[k]
        if v.encoding == "refused":
            raise UsageError(
                f"cannot start at the checkpoint after {op}#{inv}: the value of collective "
                f"call {k} ({kind}) was not recorded because {v.detail}; replay from the start"
            )
        return v.value

    def note_skipped(self, op: str, invocation: int) -> None:
        self.skipped.add((op, invocation))
        self._count += 1
        # the fast-forward's work is bounded by the recorded run's progress: the
        # checkpoint's own invocation is loop invocation ``step``, never later
        start = self.start
        if start.op is None or self._count <= start.step:
            return
        if (op, invocation) != (start.op, start.invocation):
            raise DivergenceError(
                node=-1,
                op=op,
                invocation=invocation,
                event="fast-forward",
                what="program order",
                expected=f"{start.op}#{start.invocation} as loop invocation {start.step} "
                "(the checkpoint's)",
                actual=f"{op}#{invocation} there (its parameters or code differ from the "
                "recorded run's)",
            )


__all__ = [
    "FastForward",
    "Start",
    "first_step",
    "left_out",
    "parse_point",
    "passed_over",
    "program_order",
    "require_checkpoints",
    "restartable",
    "start_before",
    "step_of",
    "completed",
]
