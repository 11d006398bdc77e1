"""Which element a differing digest hides: a replay whose digest of a DDS differs from the
trace compares that DDS, row by row, with the checkpoint the trace holds at the same
invocation, so the report names the first differing element and both of its values.

Only rows this process hosts are read (no collective call: under MPI the other ranks may
have stopped), and only numeric DDS that the checkpoint holds can be compared; otherwise
the report says why it names no element.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import tracer
from engine.lowlevel import find_dds, local_owned_rows

#: Characters of one value in a report (a long row is cut, and says so).
VALUE_CHARS = 120


def _shown(row: Any) -> str:
    text = repr(row.item()) if np.ndim(row) == 0 else np.array2string(np.asarray(row))
    return text if len(text) <= VALUE_CHARS else text[: VALUE_CHARS - 3] + "..."


def _bits(a: np.ndarray) -> np.ndarray:
    """Each row of ``a`` as bytes (so -0.0 differs from 0.0 and equal NaNs are equal)."""
    return np.ascontiguousarray(a).view(np.uint8).reshape(len(a), -1)


def first_difference(run: Any, name: str, op: str, invocation: int) -> dict[str, Any]:
    """``dds``, and either the first differing ``element`` with ``trace_value``,
    ``program_value`` and ``elements_differ`` (of ``elements_compared``), or ``values``: why
    no element is named."""
    out: dict[str, Any] = {"dds": name}
    try:
        state = run.checkpoint_state(op, invocation)
    except KeyError:
        out["values"] = (
            f"not compared: the trace keeps no checkpoint at {op}#{invocation} "
            "(record with --checkpoint-every 1 to keep one after every invocation)"
        )
        return out
    except tracer.TracerError as exc:
        out["values"] = f"not compared: {exc}"
        return out
    live = find_dds(name)
    kept = state.rows.get(name)
    if live is None or kept is None or not isinstance(kept[1], np.ndarray):
        out["values"] = (
            f"not compared: the checkpoint at {op}#{invocation} holds no array of {name}"
        )
        return out
    slots, values = kept
    n = len(live)  # never a size read from the trace: that is hostile input
    if int(state.lengths.get(name, -1)) != n:
        out["values"] = f"not compared: {name} has another number of elements than in the trace"
        return out
    try:
        slots = np.asarray(slots, dtype=np.int64)
        if len(slots) and (slots.min() < 0 or slots.max() >= n):
            raise IndexError(name)
        recorded = np.zeros((n, *values.shape[1:]), values.dtype)
        have = np.zeros(n, bool)
        recorded[slots] = values
        have[slots] = True
    except (ValueError, IndexError, TypeError):
        out["values"] = f"not compared: the checkpoint's rows of {name} do not fit it (damaged?)"
        return out
    first: tuple[int, Any, Any] | None = None
    differ = compared = 0
    for own, rows in local_owned_rows(live):
        rows = np.asarray(rows)
        keep = have[own]
        own, rows = own[keep], rows[keep]
        if rows.dtype != recorded.dtype or rows.shape[1:] != recorded.shape[1:]:
            out["values"] = f"not compared: {name} has another shape or type than in the trace"
            return out
        bad = (_bits(rows) != _bits(recorded[own])).any(axis=1)
        compared += len(own)
        differ += int(bad.sum())
        if bad.any():
            k = int(np.argmax(bad))
            if first is None or own[k] < first[0]:
                first = (int(own[k]), recorded[own[k]], rows[k])
    if first is None:
        out["values"] = (
            f"the {compared} element(s) this process holds equal the trace's: the "
            "difference is in rows another rank owns (replay single names it)"
        )
        return out
    slot, was, now = first
    key = live.key_of(slot)
    out.update(
        element=key if isinstance(key, int | str) else repr(key),  # JSON: a dmap's key
        trace_value=_shown(was),
        program_value=_shown(now),
        elements_differ=differ,
        elements_compared=compared,
    )
    return out
