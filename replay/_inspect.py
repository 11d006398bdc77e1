"""Questions about a DDS over a whole run, answered by replaying from checkpoints.

``history`` gives an element's value after every invocation and the body that last
wrote it in that invocation; ``watch`` (in ``_watch``) finds the first invocation, then
the first loop body, after which an expression over the DDS holds.  Both run the user's
program in a single-node replay (every recorded node in this process, the recorded
orders enforced, every digest checked), starting at the latest checkpoint before the
range asked about; neither stores every write nor runs anything read from the trace.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import engine
from engine.lowlevel import find_dds, rows_seen, stable_text

from ._apps import recorded_params
from ._controller import ReplayChecker, ReplayFinished, TraceController
from ._dualctl import SERIAL_FALLBACK
from ._errors import UsageError
from ._job import recorded_modes
from ._progress import phases_to, tick_line
from ._timetravel import (
    FastForward,
    Start,
    first_step,
    program_order,
    require_checkpoints,
    start_before,
    step_of,
)


class _Stop(Exception):
    """The inspection has what it needs: end the replay early."""


def _jsonable(v: Any) -> Any:
    """An element's value for JSON: a list of floats for a numeric row."""
    if isinstance(v, np.ndarray):
        return v.astype(np.float64).tolist() if v.dtype.kind in "fiub" else repr(v)
    if isinstance(v, np.generic):
        return v.item()
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return repr(v)


def _where_ran(plan: Any, node: int, index: int) -> tuple[int, int]:
    """(round, thread) of loop index ``index`` on ``node`` in ``plan`` ((-1, -1) if absent)."""
    if plan is None:
        return -1, -1
    for r, rnd in enumerate(plan.rounds):
        if node < len(rnd):
            for task in rnd[node]:
                if index in np.asarray(task.indices):
                    return r, int(task.thread)
    return -1, -1


# ====================================================================== history
_ELEMENT = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*\[(.+)\]\s*$")


@dataclass(frozen=True)
class Element:
    """``DDS[INDEX]`` as typed: the DDS name and the index (a Python literal)."""

    dds: str
    index: Any
    text: str


def parse_element(text: str, names: list[str]) -> Element:
    """Parse ``W[17]``; the DDS must be one of ``names`` (the run's DDS)."""
    m = _ELEMENT.match(text)
    if not m:
        raise UsageError(f"expected an element as DDS[INDEX], such as W[17], got {text!r}")
    name, raw = m.group(1), m.group(2)
    try:
        index = ast.literal_eval(raw.strip())
    except (ValueError, SyntaxError):
        raise UsageError(
            f"the index in {text!r} must be a literal (17, 'key'), got {raw!r}"
        ) from None
    if name not in names:
        raise UsageError(
            f"the run has no DDS named {name!r}; its DDS: {', '.join(names) or 'none'}"
        )
    if isinstance(index, bool) or not isinstance(index, (int, str, tuple, float)):
        raise UsageError(f"the index in {text!r} must be a number, string or tuple")
    return Element(name, index, f"{name}[{index!r}]")


def dds_names(run: Any) -> list[str]:
    """Names of the run's DDS (every DDS is digested after every invocation)."""
    seen: dict[str, None] = {}
    for d in run.digests():
        seen.setdefault(d.dds, None)
    return list(seen)


def steps_between(
    run: Any, between: tuple[tuple[str, int], tuple[str, int]] | None
) -> tuple[list[tuple[str, int]], int, int]:
    """(the program order, first step, last step) of the range asked about."""
    order = program_order(run)
    if not order:
        raise UsageError(f"run {run.info.run_id[:12]} completed no loop invocation")
    if between is None:
        return order, 0, len(order) - 1
    a = step_of(order, between[0], "--between")
    b = step_of(order, between[1], "--between")
    if b < a:
        raise UsageError(
            f"--between: {between[1][0]}#{between[1][1]} runs before "
            f"{between[0][0]}#{between[0][1]}; give the earlier invocation first"
        )
    return order, a, b


def _read_element(el: Element) -> tuple[Any, Any]:
    """(the DDS, the element's current value) in the driver; bad indices are usage errors."""
    d = find_dds(el.dds)
    if d is None:
        raise UsageError(f"the program did not create DDS {el.dds!r} (code changed?)")
    if isinstance(d, engine.dvector):
        if not isinstance(el.index, int) or not -len(d) <= el.index < len(d):
            raise UsageError(
                f"{el.text}: index out of range; {el.dds} has {len(d)} element(s) (0..{len(d) - 1})"
            )
        return d, d[el.index]
    if el.index not in d.keys():
        raise UsageError(f"{el.text}: {el.dds} has no key {el.index!r}")
    return d, d[el.index]


def _serial_fallback(ctl: Any, op: str, invocation: int) -> bool:
    """Whether the recorded run ran ``op``#``invocation`` as a serial fallback."""
    plan = ctl.recorded_plan(op, invocation)
    return plan is not None and plan.strategy == SERIAL_FALLBACK


def _slot_of(d: Any, el: Element) -> int | None:
    """The slot of ``el`` in ``d`` (None: no such element, which ``after`` reports)."""
    if isinstance(d, engine.dvector):
        ok = isinstance(el.index, int) and -len(d) <= el.index < len(d)
        return el.index % len(d) if ok else None
    try:  # a dict lookup: keys() lists every key
        return int(d._slot(el.index))
    except engine.DDSError:  # no such key, or one that cannot be hashed
        return None


def _key(d: Any, value: Any) -> bytes:
    """What tells two values of an element of ``d`` apart, bit for bit: a numeric row's
    bytes, an object's stable text (how digests and dual tests compare it)."""
    if d.shape is not None:
        return np.ascontiguousarray(value).tobytes()
    return stable_text(value).encode()


def _seen(d: Any, node: int, slot: np.ndarray) -> bytes:
    """:func:`_key` of the element at ``slot`` as a body on ``node`` sees it (a sharded
    row the node does not hold counts as a value of its own)."""
    if d.shape is not None:
        return _key(d, rows_seen(d, node, slot)[0])
    return _key(d, d.rows(node, slot, absent_ok=True)[0])


def history(
    run: Any,
    app: Any,
    el: Element,
    between: tuple[tuple[str, int], tuple[str, int]] | None,
    *,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The element's value after every invocation in the range, and its last writer;
    ``progress`` gets tick lines (invocations done of those in the range) and phase
    lines (the fast-forward to the checkpoint it starts from, planning, ...)."""
    require_checkpoints(run)
    order, a, b = steps_between(run, between)
    step = {point: k for k, point in enumerate(order)}
    start = start_before(run, first_step(run) + a)
    phases = phases_to(progress)
    if phases is not None and start.op is not None:
        phases(f"fast-forward to the checkpoint after {start.op}#{start.invocation}")
    entries: list[dict[str, Any]] = []
    #: per invocation: the last body that changed the element as its node (and thread)
    #: sees it, and the element's key (:func:`_key`) right after that body
    writer: dict[tuple[str, int], tuple[Any, int, bytes]] = {}
    #: the element's key as each invocation in the range began (on its home node, whose
    #: replica holds every last value between invocations), and what its bodies were: a
    #: value that changed with no body as its writer was merged or aggregated
    before: dict[tuple[str, int], bytes] = {}
    batches: set[tuple[str, int]] = set()
    changes: list[str | None] = []
    #: the element's key after the invocation before (None: not replayed)
    last: list[bytes | None] = [None]

    def wrap(op: str, invocation: int, node: int, body: Any) -> Any:
        k = step.get((op, invocation), -1)
        if not a <= k <= b:
            return body
        d = find_dds(el.dds)
        at = _slot_of(d, el) if d is not None else None
        if at is None:
            return body  # reported by ``after``
        slot = np.array([at], dtype=np.int64)
        # the first wrap comes before any body of the invocation has run
        before.setdefault((op, invocation), _seen(d, d.owner(el.index), slot))

        def probe(j: Any) -> Any:
            if isinstance(j, engine.Batch):
                batches.add((op, invocation))
            # what the body sees: its thread's copy of a relaxed DDS on several threads
            was = _seen(d, node, slot)
            out = body(j)
            now = _seen(d, node, slot)
            if now != was:
                writer[(op, invocation)] = (getattr(j, "number", j), node, now)
            return out

        return probe

    def after(op: str, invocation: int) -> None:
        k = step.get((op, invocation), -1)
        d, value = _read_element(el)  # checks the index after the first invocation
        now, prev = _key(d, value), last[0]
        last[0] = now
        if a <= k <= b:
            w = writer.pop((op, invocation), None)
            was = before.pop((op, invocation), None)
            how = None
            if w is not None and now != w[2]:
                # the value is not the one the last body left on its node: the round-end
                # merge of relaxed deltas (or an aggregation) made it from several bodies
                w = None
            if w is None and was is None and _serial_fallback(ctl, op, invocation):
                # every node ran every body on its replica, outside the hooks that see
                # a body (engine/_asyncfor/loop.py ``_execute_replicated``): unknown
                how = "serial" if prev is not None and now != prev else "serial_unknown"
                if prev is not None and now == prev:
                    how = None
            elif w is None and was is not None and now != was:
                how = (
                    "relaxed"
                    if getattr(d, "_relaxed", False)
                    else "aggregated"
                    if (op, invocation) in batches
                    else "unattributed"
                )
            elif w is None and prev is not None and now != prev:
                how = "driver"  # between the invocations: the driver wrote it
            changes.append(how)
            who = None
            if w is not None:
                index, node, _ = w
                rnd, thread = _where_ran(ctl.recorded_plan(op, invocation), node, int(index))
                who = {"index": int(index), "node": node, "thread": thread, "round": rnd}
            entries.append(
                {"op": op, "invocation": invocation, "value": _jsonable(value), "writer": who}
            )
            if progress is not None:
                progress(tick_line(len(entries), b - a + 1, "invocations"))
        if k >= b:
            raise _Stop()

    ctl = _controller_for(run, start)
    replay_with(ctl, run, app, wrap=wrap, after=after, phases=phases)
    return {"element": el.text, "history": entries, "from": start.as_json(), "changes": changes}


def _controller_for(run: Any, start: Start) -> TraceController:
    return TraceController(run, single=True, travel=FastForward(run, start))


def replay_with(
    ctl: TraceController,
    run: Any,
    app: Any,
    *,
    wrap: Callable[..., Any] | None = None,
    after: Callable[[str, int], None] | None = None,
    phases: Callable[[str], None] | None = None,
) -> None:
    """Single-node replay of ``run`` under ``ctl`` with inspection hooks, until the
    program ends or a hook raises :class:`_Stop`; divergence raises as usual."""
    info = run.info
    ctl.set_body_hook(wrap)
    if after is not None:
        ctl.set_until(after)
    checker = ReplayChecker(run, skipped=ctl.travel.skipped)
    try:
        engine.run(
            app.fn,
            recorded_params(app.fn, info.params),
            nodes=info.ranks,
            threads=info.threads,
            seed=info.seed,
            recorder=checker,
            schedules=ctl,
            hooks=ctl,
            phases=phases,
            **recorded_modes(info),
        )
        checker.finish()
    except (_Stop, ReplayFinished):
        pass


__all__ = [
    "SERIAL_FALLBACK",
    "Element",
    "dds_names",
    "history",
    "parse_element",
    "replay_with",
]
