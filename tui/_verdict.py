"""What a verdict's detail says: where a run diverged, both values, and how to stop there.

Verdicts are stored as JSON by three writers, each with its own shape:

* ``replay cluster``/``single``: ``{"first_difference": {node, op, invocation, event,
  what, expected, actual}, "complete", "checked", "wall_s"}`` (engine's
  ``DivergenceError.as_dict``; ``node`` is -1 when no single node is to blame);
* ``replay dual``: ``{"passed", "divergence": {what, op, invocation, dds, element,
  index, serial, parallel, ...}}`` (``what`` is ``digest``, ``objective``, ``replica``,
  ``operator sequence``, ...);
* anything else (older traces, other tools): any dict.

:func:`explain` reads all of them without trusting any key to be there, and
:func:`orders_target` turns the place into a row of the orders view.  Both are pure.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from typing import Any

#: Detail keys that locate a divergence; the verdicts view highlights them.
LOCATION_KEYS = frozenset(
    {"iteration", "op", "operator", "invocation", "index", "loop_index", "element", "node"}
    | {"dds", "event", "what", "round", "thread", "lock", "channel"}
)
#: Substrings of detail keys that name the two differing values.
VALUE_HINTS = ("expected", "actual", "value", "serial", "parallel", "recorded", "replayed")
#: Keys of the sub-dict that holds a divergence, in the order they are looked for.
DIVERGENCE_KEYS = ("first_difference", "divergence")


def flatten(detail: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``detail`` as (dotted key, value) pairs, nested dicts expanded, in key order."""
    out: list[tuple[str, Any]] = []
    for key, value in detail.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out += flatten(value, name + ".")
        else:
            out.append((name, value))
    return out


def is_highlighted(key: str) -> bool:
    """True for detail keys that say where a run diverged or what the two values were."""
    leaf = key.rsplit(".", 1)[-1].lower()
    return leaf in LOCATION_KEYS or any(h in leaf for h in VALUE_HINTS)


def _as_int(value: Any) -> int | None:
    """``value`` as an integer, None when it is none (a stored detail is hostile: its
    JSON may hold Infinity, which stopped the browser with an OverflowError)."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None


def divergence_of(detail: dict[str, Any]) -> dict[str, Any] | None:
    """The dict that describes the divergence (None: the verdict names none)."""
    for key in DIVERGENCE_KEYS:
        if key in detail:
            sub = detail[key]
            return sub if isinstance(sub, dict) and sub else None
    flat = {k.rsplit(".", 1)[-1].lower(): v for k, v in reversed(flatten(detail))}
    return flat if any(k in flat for k in ("op", "operator", "what", "index")) else None


@dataclass(frozen=True, slots=True)
class Target:
    """A place in the orders view: operator, invocation and node to filter by, the tab,
    and the rows to land on and highlight (columns equal to values; ``last``: the last
    such row, e.g. the last message a channel recorded before the one that was missing).
    ``index`` is a loop index to search for, on the index tab."""

    op: str | None
    invocation: int | None
    node: int | None
    index: int | None
    tab: str = "index"
    where: tuple[tuple[str, Any], ...] = ()
    last: bool = False


#: (at most 18 digits: int() refuses a string of over 4,300 and the browser stopped)
_ROUND = re.compile(r"round (\d{1,18})")
_CLOCK = re.compile(r"clock (-?\d{1,18})")
_MESSAGE = re.compile(r"message \d+ on '(.*)'")
_DIGEST = re.compile(r"digest of (.+)")


def not_tested(detail: dict[str, Any]) -> str:
    """What a verdict did not test ("" if nothing), as the command's line says it: a dual
    verdict's ``relaxed DDS 'claims' tested exact; SSP 'fit' tested as BSP: staleness not
    covered``, a replay's from a checkpoint ``the 5 loop invocation(s) up to the
    checkpoint at sgd#4 were skipped``."""
    got = detail.get("not_tested")
    entries = [e for e in got if isinstance(e, dict)] if isinstance(got, list) else []
    relaxed = ", ".join(repr(e.get("name")) for e in entries if e.get("kind") == "relaxed")
    ssp = ", ".join(repr(e.get("name")) for e in entries if e.get("kind") == "ssp")
    parts = [f"relaxed DDS {relaxed} tested exact"] if relaxed else []
    if ssp:
        parts.append(f"SSP {ssp} tested as BSP: staleness not covered")
    start = detail.get("from")
    if isinstance(start, dict) and start.get("op") is not None:
        parts.append(
            f"the {detail.get('skipped', '?')} loop invocation(s) up to the checkpoint at "
            f"{start.get('op')}#{start.get('invocation')} were skipped"
        )
    return "; ".join(parts)


def divergence_target(detail: dict[str, Any]) -> Target:
    """The orders-view row a verdict's detail points at (any key may be missing)."""
    d = divergence_of(detail) or {}
    op = d.get("op", d.get("operator"))
    op = None if op is None or str(op) == "objective" or d.get("what") == "objective" else op
    node = _as_int(d.get("node"))
    node = node if node is not None and node >= 0 else None
    index = _as_int(d.get("index", d.get("loop_index")))
    base = (str(op) if op is not None else None, _as_int(d.get("invocation")), node, index)
    if index is not None:
        return Target(*base)
    what, event = str(d.get("what", "")), str(d.get("event", ""))
    dds = d.get("dds")
    if dds is None and (m := _DIGEST.fullmatch(event)):
        dds = m.group(1)
    if what == "lock" and (m := _ROUND.fullmatch(event)):
        return Target(*base, tab="locks", where=(("round", int(m.group(1))),))
    if what == "message" and (m := _MESSAGE.fullmatch(event)):
        return Target(*base, tab="messages", where=(("channel", m.group(1)),), last=True)
    if what == "visibility" and (m := _CLOCK.fullmatch(event)):
        return Target(*base, tab="sync", where=(("clock", int(m.group(1))),))
    if what in ("plan", "task set") and (m := _ROUND.fullmatch(event)):
        return Target(*base, tab="index", where=(("round", int(m.group(1))),))
    if dds is not None:  # a digest (or a replica) differed: the digest row of that DDS
        return Target(*base, tab="outcome", where=(("dds", str(dds)),))
    return Target(*base)


# ============================================================= explanation
@dataclass(frozen=True, slots=True)
class Explanation:
    """A divergence said plainly: what, where, the two values, a command to stop there."""

    what: str
    where: str
    expected_label: str
    expected: Any
    got_label: str
    got: Any
    command: str | None
    #: the detail keys the lines above already show (the rest is listed after them)
    shown: frozenset[str]


#: How each writer names its two values: (key, label) for the expected and the actual one.
_VALUE_PAIRS = (
    (("expected", "the trace expected"), ("actual", "the program did")),
    (("serial", "serial run gave"), ("parallel", "parallel run gave")),
    (("owner_value", "owner node had"), ("replica", "replica had")),
)


def _what(d: dict[str, Any]) -> str:
    what = str(d.get("what", "values differ"))
    event = d.get("event")
    if what == "outcome" and event is not None:
        return f"outcome: {event} differs"
    if what == "digest":
        return f"outcome: digest of {d.get('dds', '?')} differs"
    if what == "replica":
        return "a replica differs from its owner (a write did not reach every replica)"
    if what == "objective":
        return f"objective {d.get('objective', d.get('event', '?'))} differs"
    return f"{what}: {event}" if event is not None else what


def _where(d: dict[str, Any], target: Target) -> str:
    parts = []
    if target.op is not None:
        inv = d.get("invocation")
        parts.append(f"{target.op} invocation {inv}" if inv is not None else target.op)
    elif d.get("iteration") is not None:
        parts.append(f"iteration {d['iteration']}")
    if target.node is not None:
        parts.append(f"node {target.node}")
    elif _as_int(d.get("node")) == -1:
        parts.append("no single node")
    if target.index is not None:
        parts.append(f"loop index {target.index}")
    if d.get("element") is not None:
        element = d["element"]
        dds = d.get("dds")
        label = f"{dds}[{element}]" if dds is not None and _as_int(element) is not None else element
        parts.append(f"element {label}")
    elif d.get("event") is not None and d.get("what") != "outcome":
        parts.append(str(d["event"]))
    return ", ".join(str(p) for p in parts) or "-"


_PASSWORD = re.compile(r"(://[^:/@]*):[^@/]*@")


def trace_argument(path: str) -> str:
    """How a command names the trace: relative to the working directory when inside it; a
    URL with its password replaced by ``***`` (passwords never appear on screen)."""
    if "://" in path:
        return _PASSWORD.sub(r"\1:***@", path)
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def stop_command(d: dict[str, Any], target: Target, trace: str, run_id: str | None) -> str | None:
    """The ``replay single`` command that stops in pdb at (or just before) the divergence.

    With a loop index: ``--break OP:INVOCATION:INDEX[@NODE]`` (in that body).  Without
    one: after the invocation whose outcome differed (``--until OP:INVOCATION``) for a dual
    test, whose trace is sound up to there; for a replay divergence, after the invocation
    before it, since the replay stops at the divergence itself.  None when no operator
    invocation is named (an objective, a count).
    """
    if target.op is None or target.invocation is None:
        return None
    head = _head(trace, run_id)
    if target.index is not None:
        at = f"@{target.node}" if target.node is not None else ""
        spec = f"{target.op}:{target.invocation}:{target.index}{at}"
        return f"{head} --break {shlex.quote(spec)}"
    replay_divergence = "expected" in d and "actual" in d
    inv = target.invocation - 1 if replay_divergence else target.invocation
    return f"{head} --until {shlex.quote(f'{target.op}:{inv}')}" if inv >= 0 else None


def _head(trace: str, run_id: str | None) -> str:
    head = f"replay single {shlex.quote(trace_argument(trace))}"
    return head + (f" --run {shlex.quote(run_id)}" if run_id is not None else "")


#: A stop a replay verdict stored (``stop``): an option and a value with no blank or
#: control character (the trace is data: anything else is not shown as a command).
_STORED_STOP = re.compile(r"(--break|--until) ([^\s\x00-\x1f\x7f]+)")


def stored_stop(detail: dict[str, Any], trace: str, run_id: str | None) -> str | None:
    """The command that stops where ``replay cluster``/``single`` said to stop when its
    verdict was stored (``stop``: the one it worked out from the trace, e.g. a body of
    the run's first invocation); None when the verdict holds none or a malformed one."""
    m = _STORED_STOP.fullmatch(str(detail.get("stop", "")))
    return None if m is None else f"{_head(trace, run_id)} {m[1]} {shlex.quote(m[2])}"


def explain(detail: dict[str, Any], trace: str, run_id: str | None = None) -> Explanation | None:
    """The divergence of a verdict said plainly (None: the detail names no divergence).

    ``run_id`` goes into the command only when the trace holds more than one run.
    """
    d = divergence_of(detail)
    if d is None:
        return None
    target = divergence_target(detail)
    labels = ("expected", "expected", "got", "got")
    shown = {"what", "event", "op", "operator", "invocation", "node", "index", "loop_index"}
    shown |= {"dds", "element", "iteration"}
    for (ek, el), (gk, gl) in _VALUE_PAIRS:
        if ek in d or gk in d:
            labels = (ek, el, gk, gl)
            shown |= {ek, gk}
            break
    return Explanation(
        what=_what(d),
        where=_where(d, target),
        expected_label=labels[1],
        expected=d.get(labels[0]),
        got_label=labels[3],
        got=d.get(labels[2]),
        command=stop_command(d, target, trace, run_id) or stored_stop(detail, trace, run_id),
        shown=frozenset(shown),
    )


__all__ = [
    "Explanation",
    "Target",
    "divergence_of",
    "divergence_target",
    "explain",
    "flatten",
    "is_highlighted",
    "stop_command",
    "stored_stop",
    "trace_argument",
]
