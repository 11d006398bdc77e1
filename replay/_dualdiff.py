"""Comparing the outcomes of a dual test's two sides: the earliest difference in program
order, then localised to the DDS element and the loop index that first wrote it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine.lowlevel import SLOT_BITS, SLOT_MASK

from ._dualctl import Outcome, Steering, comparable, same_value
from ._dualsides import InProcessSide, MpiParallelSide, tap_side
from ._progress import phase_reporter


def first_difference(serial: Outcome, parallel: Outcome) -> dict[str, Any] | None:
    """The earliest difference in program order: digests and objectives are compared in
    the order the program produced them (an objective logged before an invocation is
    checked before that invocation's digests)."""
    a_ev, b_ev = serial.events(), parallel.events()
    for k, ((a, x), (b, y)) in enumerate(zip(a_ev, b_ev, strict=False)):
        if a != b:
            return sequence_difference(k, a, b)
        if same_value(x, y):
            continue
        if a[0] == "digest":
            return {
                "op": a[1],
                "invocation": a[2],
                "dds": a[3],
                "what": "digest",
                "serial": x,
                "parallel": y,
            }
        return {
            "what": "objective",
            "objective": a[1],
            "iteration": a[2],
            "serial": x,
            "parallel": y,
        }
    if len(a_ev) == len(b_ev):
        return None
    if len(serial.digests) != len(parallel.digests):
        return {
            "what": "invocation count",
            "serial": len(serial.digests),
            "parallel": len(parallel.digests),
        }
    longer = a_ev if len(a_ev) > len(b_ev) else b_ev
    name = longer[min(len(a_ev), len(b_ev))][0][1]
    return {
        "what": "objective count",
        "objective": name,
        "serial": len(serial.objectives.get(name, [])),
        "parallel": len(parallel.objectives.get(name, [])),
    }


def sequence_difference(k: int, a: tuple[Any, ...], b: tuple[Any, ...]) -> dict[str, Any]:
    """The two sides produced different outcome events at position ``k``."""

    def show(e: tuple[Any, ...]) -> str:
        return f"{e[1]}#{e[2]}" if e[0] == "digest" else f"objective {e[1]}[{e[2]}]"

    out: dict[str, Any] = {"event": k, "serial": show(a), "parallel": show(b)}
    if a[0] == b[0] == "digest":
        return {"op": b[1], "invocation": b[2], "what": "operator sequence", **out}
    where = b if b[0] == "digest" else a
    if where[0] == "digest":
        out.update(op=where[1], invocation=where[2])
    return {"what": "outcome sequence", **out}


def localise(
    diff: dict[str, Any],
    fn: Callable[..., Any],
    params: dict[str, Any],
    serial_cfg: dict[str, Any],
    side: InProcessSide | MpiParallelSide,
    p_controller: Steering | None,
    serial_order: Callable[[str, int, int, int], np.ndarray] | None,
) -> dict[str, Any]:
    """Re-run both sides up to the diverging invocation; name the element and loop index.

    The parallel side is re-run where it ran (under mpiexec for ``parallel="mpi"``): a
    divergence that comes from per-process state only shows there.
    """
    if diff.get("what") != "digest":
        return diff
    op, inv, dds = diff["op"], diff["invocation"], diff["dds"]
    diff["iteration"] = inv
    phases = phase_reporter()
    if phases is not None:  # both sides run again up to there: minutes on a long run
        phases(f"locating the first difference in {dds} after {op}#{inv}")
    tap = tap_side(fn, params, serial_cfg, op, inv)
    a = tap.snapshot.get(dds)
    b = side.snapshot(p_controller, op, inv, dds)
    if a is None or b is None:
        return diff
    a = comparable(a)
    if a.shape != b.shape:
        return diff
    neq = a != b
    if neq.ndim > 1:
        neq = neq.reshape(len(neq), -1).any(axis=1)
    bad = np.flatnonzero(neq)
    if not len(bad):
        return diff
    slot = int(bad[0])
    diff["element"] = slot
    diff["serial"] = shown_value(a[slot])
    diff["parallel"] = shown_value(b[slot])
    if tap.sets is not None and serial_order is not None:
        sets, names = tap.sets
        gid = (names.index(dds) << SLOT_BITS) | (slot & SLOT_MASK)
        order = serial_order(op, inv, sets.start, sets.n)
        writers = [j for j in order.tolist() if gid in sets.writes_of(j - sets.start)]
        if writers:
            diff["index"] = writers[0]
    return diff


def shown_value(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return [float(x) for x in np.ravel(v)][:8]
    if isinstance(v, np.generic):
        return v.item()
    return repr(v)


__all__ = ["first_difference", "localise", "sequence_difference", "shown_value"]
