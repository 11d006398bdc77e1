"""How two runs were set up differently, said in words before their logs are compared.

A diff of two logs that starts at event 0 tells the reader *that* the runs differ; what
they mostly want first is *why*: other parameters (``epochs 10 vs 5``), another shape,
seed, code or package version, or another plan.  :func:`setup_differences` lists those
from what the runs recorded about themselves.  It is pure: the diff view hands it the
two runs' :class:`tracer.RunInfo` and operator summaries.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tracer

from . import _format as fmt

#: How wide a value may be in a difference line before it is cut with "…".
VALUE_WIDTH = 24
#: Differing keys named in one line (parameters, versions, ...); the rest are counted.
MAX_KEYS = 6
#: Run labels said in words (other labels are named by their key).
LABEL_WORDS = {
    "chaos_run": "chaos run",
    "chaos_seed": "chaos seed",
    "checked": "checked mode",
    "test_mode": "test mode",
    "exact_reduce": "exact reduce",  # unset: recorded before 2026-12-06 (index-order folds)
    "coalesced_sends": "coalesced sends",  # unset: before 2026-12-06 (a message per round)
    "ring_routes": "ring routes",  # unset: before 2026-12-07 (other rotations and messages)
    "exact_seed_keys": "exact seed keys",  # unset: before 2026-12-07 (seeds >= 2**53 rounded)
}

_MISSING = object()


def _value(v: Any) -> str:
    if v is _MISSING:
        return "unset"
    if v is None:
        return "none"
    if v == "":
        return "empty"  # blank, "data  vs x" reads as a missing word
    return fmt.scalar(v, VALUE_WIDTH)


def _keyed(title: str, a: Mapping[str, Any], b: Mapping[str, Any], names: Mapping[str, str]) -> str:
    """``title: k 10 vs 5, j 1 vs unset`` over the keys whose values differ ("" if none)."""
    keys = sorted(k for k in set(a) | set(b) if a.get(k, _MISSING) != b.get(k, _MISSING))
    if not keys:
        return ""
    parts = [
        f"{fmt.text(names.get(k, k), VALUE_WIDTH)} {_value(a.get(k, _MISSING))} "
        f"vs {_value(b.get(k, _MISSING))}"
        for k in keys[:MAX_KEYS]
    ]
    if len(keys) > MAX_KEYS:
        parts.append(f"and {len(keys) - MAX_KEYS} more")
    return f"{title}: " + ", ".join(parts)


def _shape(info: tracer.RunInfo) -> str:
    return f"{info.ranks} rank(s) × {info.threads} thread(s)"


def _plans(
    a: Mapping[str, tracer.OperatorSummary], b: Mapping[str, tracer.OperatorSummary]
) -> list[str]:
    """Per operator, what differs in its plan and how much it ran (A's value first)."""
    out = []
    for op in list(a) + [op for op in b if op not in a]:
        sa, sb = a.get(op), b.get(op)
        name = fmt.text(op, fmt.NAME_CHARS)
        if sa is None or sb is None:
            out.append(f"operator {name} ran only in {'B' if sa is None else 'A'}")
            continue
        parts = []
        if (sa.strategy or "no plan") != (sb.strategy or "no plan"):
            parts.append(f"{sa.strategy or 'no plan'} vs {sb.strategy or 'no plan'}")
        for value_a, value_b, unit in (
            (sa.rounds, sb.rounds, "round(s)"),
            (sa.invocations, sb.invocations, "invocation(s)"),
            (sa.bodies, sb.bodies, "bodies"),
        ):
            if value_a != value_b:
                parts.append(f"{fmt.count(value_a)} vs {fmt.count(value_b)} {unit}")
        if parts:
            out.append(f"plan of {name} differs: " + ", ".join(parts))
    return out


def setup_differences(
    a: tracer.RunInfo,
    b: tracer.RunInfo,
    ops_a: Mapping[str, tracer.OperatorSummary],
    ops_b: Mapping[str, tracer.OperatorSummary],
) -> list[str]:
    """One line per way run B was set up differently from run A (A's value first):
    program, parameters, shape, seed, code, package versions, environment, labels and
    each operator's plan, e.g. ``parameters differ: epochs 10 vs 5``.  Empty when they
    were set up alike."""
    out = []
    if (a.target or a.app) != (b.target or b.app):
        pa, pb = (fmt.text(i.target or i.app, VALUE_WIDTH * 2) for i in (a, b))
        out.append(f"program differs: {pa} vs {pb}")
    out.append(_keyed("parameters differ", a.params, b.params, {}))
    if (a.ranks, a.threads) != (b.ranks, b.threads):
        out.append(f"shape differs: {_shape(a)} vs {_shape(b)}")
    if a.seed != b.seed:
        out.append(f"seed differs: {a.seed} vs {b.seed}")
    if a.code_digest != b.code_digest:
        da, db = (_value(d[:12]) for d in (a.code_digest, b.code_digest))
        out.append(f"code differs: digest {da} vs {db}")
    out.append(_keyed("versions differ", a.versions, b.versions, {}))
    out.append(_keyed("environment differs", a.environment, b.environment, {}))
    out.append(_keyed("labels differ", a.labels, b.labels, LABEL_WORDS))
    out += _plans(ops_a, ops_b)
    return [line for line in out if line]


__all__ = ["setup_differences"]
