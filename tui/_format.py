"""Plain-text formatting shared by the screens: times, sizes, events, verdict labels."""

from __future__ import annotations

import os
import re
import time
from dataclasses import fields
from typing import Any

import tracer

#: Short names of verdict kinds, for narrow columns.
VERDICT_SHORT = {
    "cluster": "clu",
    "single": "one",
    "dual-forward": "fwd",
    "dual-backward": "bwd",
}


#: Most characters of one text read from a trace (a name, an error, a detail) that a view
#: shows: an operator named with 100,000 characters filled the whole timeline and orders
#: screens with its header, and a table column with its cell.
TEXT_CHARS = 120
#: ... and of a name inside a line (an operator, DDS, channel): the diff view folded a
#: 100,000-character operator name over a thousand lines per event, and took minutes.
NAME_CHARS = 40


def text(value: object, width: int = TEXT_CHARS) -> str:
    """Text read from a trace as a view shows it: control characters escaped (as the CLI
    does, :func:`tracer.printable`) and cut to ``width`` characters with ``…``."""
    raw = str(value)
    safe = tracer.printable(raw[:width])
    return safe if len(raw) <= width and len(safe) <= width else safe[: width - 1] + "…"


def last_line(message: str) -> str:
    """The last line of ``message`` that is not blank ("" if none): a recorded error of
    blank lines stopped the runs list with an IndexError."""
    lines = [ln for ln in message.splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


def when(t: float | None) -> str:
    """A local wall-clock time as ``YYYY-MM-DD HH:MM:SS`` (``-`` when unknown)."""
    if t is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def duration(s: float | None) -> str:
    """A duration in the largest unit that keeps it short: ``12ms``, ``3.4s``, ``5m03s``."""
    if s is None:
        return "-"
    if s < 1.0:
        return f"{s * 1000:.0f}ms"
    if s < 60.0:
        return f"{s:.1f}s"
    if s < 3600.0:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def size(n: int) -> str:
    """A byte count in B, kB, MB or GB."""
    value = float(n)
    for unit in ("B", "kB", "MB"):
        if value < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"


def count(n: int) -> str:
    """An integer with thin grouping (``1,000,000``)."""
    return f"{n:,}"


def short_path(path: str, width: int = 60) -> str:
    """``path`` relative to the working directory when inside it, cut from the left
    (a database URL is kept as it is, already without its password)."""
    if "://" in path:
        return path if len(path) <= width else "…" + path[-(width - 1) :]
    try:
        rel = os.path.relpath(path)
        path = rel if not rel.startswith("..") else path
    except ValueError:  # another drive
        pass
    return path if len(path) <= width else "…" + path[-(width - 1) :]


def short_id(run_id: str, width: int = 8) -> str:
    """The first ``width`` characters of a run id, control characters escaped (the id is
    the trace's text: an escape sequence in it reached the terminal in view titles)."""
    return tracer.printable(run_id[:width])


def verdict_summary(verdicts: list[tracer.VerdictInfo]) -> str:
    """The latest verdict of each kind, e.g. ``clu✓ fwd✗`` (clu: cluster replay, one: single-node replay)."""
    latest: dict[str, bool] = {}
    for v in verdicts:  # oldest first, so later ones win
        if v.error is None:
            latest[v.kind] = v.passed
    out = " ".join(f"{VERDICT_SHORT.get(k, k)}{'✓' if ok else '✗'}" for k, ok in latest.items())
    bad = sum(1 for v in verdicts if v.error is not None)
    return f"{out} ?{bad}".strip() if bad else out


#: How a stored JSON true, false and null read on screen (not Python's True/None).
WORDS_FOR = {True: "yes", False: "no", None: "none"}


def scalar(value: Any, width: int = 60) -> str:
    """A detail value on one line, cut to ``width`` characters; true, false and null as
    ``yes``, ``no`` and ``none``."""
    if value is None or isinstance(value, bool):
        return WORDS_FOR[value]
    return text(" ".join(str(value).split()), width)


_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def words(name: str) -> str:
    """A class or field name as lowercase words: ``DeltasAggregated`` → ``deltas
    aggregated``, ``waited_for`` → ``waited for``."""
    return _CAMEL.sub(" ", name).replace("_", " ").lower()


def listing(values: Any) -> str:
    """A sequence as ``0, 1, 2`` (anything else as its text)."""
    if isinstance(values, tuple | list):
        return ", ".join(str(v) for v in values)
    return str(values)


#: Fields every event carries, said by the columns around its description.
_PLACE_FIELDS = ("node", "seq", "op", "invocation", "clock")


def sync_order(ev: Any) -> tuple[str, str]:
    """A ``sync_for`` order event in words: (what happened, the order it recorded), e.g.
    ``("deltas aggregated", "from nodes 0, 1")``.  An event kind this browser does not
    know yet is named in words and its fields listed as ``name value``."""
    if isinstance(ev, tracer.DeltasAggregated):
        return "deltas aggregated", f"from nodes {listing(ev.sources)} (in this order)"
    if isinstance(ev, tracer.UpdatesApplied):
        if all(c < 0 for c in ev.applied):
            return "updates applied", "none yet"
        seen = [
            f"node {q}: " + (f"to clock {c}" if c >= 0 else "none")
            for q, c in enumerate(ev.applied)
        ]
        return "updates applied", ", ".join(seen)
    if isinstance(ev, tracer.MutexGranted):
        return "mutex granted", f"to thread {ev.thread} for minibatch {ev.minibatch}"
    rest = [
        f"{words(f.name)} {listing(getattr(ev, f.name))}"
        for f in fields(ev)
        if f.name not in _PLACE_FIELDS
    ]
    return words(type(ev).__name__), ", ".join(rest)


def _indices(values: tuple[int, ...], shown: int = 4) -> str:
    head = ", ".join(str(j) for j in values[:shown])
    return head + (", …" if len(values) > shown else "")


def event_line(ev: tracer.Event) -> str:
    """One event in words, after its place in the node's log: ``event 3: message 0 of
    node 1 on rows (64 bytes)``."""
    return f"event {ev.seq}: {event_words(ev)}"


def event_words(ev: tracer.Event) -> str:
    """One event in words: ``message 0 of node 1 on rows (64 bytes)``."""
    if isinstance(ev, tracer.LockGranted):
        moves = len(ev.deviations) // 2
        order = f"{moves} hand-over(s)" if moves else "in the predicted order"
        body = (
            f"{text(ev.op, NAME_CHARS)} invocation {ev.invocation} round {ev.round}: {ev.bodies} locked "
            f"bodies, {ev.grants} lock grants, {order}"
        )
    elif isinstance(ev, tracer.MessageReceived):
        body = f"message {ev.source_seq} of node {ev.source} on {text(ev.channel, NAME_CHARS)} ({ev.nbytes} bytes)"
    elif isinstance(ev, tracer.IndexOrderDeviated):
        body = (
            f"{text(ev.op, NAME_CHARS)} invocation {ev.invocation} round {ev.round}: thread {ev.thread} "
            f"left the plan's order, ran {_indices(ev.indices)}"
        )
    elif isinstance(ev, tracer.InvocationCompleted):
        body = (
            f"{text(ev.op, NAME_CHARS)} invocation {ev.invocation} done: {count(ev.bodies)} bodies "
            f"in {ev.rounds} round(s)"
        )
    elif isinstance(ev, tracer.DigestRecorded):
        body = f"digest of {text(ev.dds, NAME_CHARS)} after {text(ev.op, NAME_CHARS)} invocation {ev.invocation}: {text(ev.digest[:19])}…"
    elif isinstance(ev, tracer.ObjectiveLogged):
        # a NaN objective is stored as NULL and read back as None: it stopped the diff
        value = "nan" if ev.value is None else f"{ev.value:.6g}"
        body = f"objective {text(ev.name, NAME_CHARS)} at iteration {ev.iteration}: {value}"
    elif isinstance(ev, tracer.PlanMade):
        body = (
            f"plan {ev.plan_no} of {text(ev.op, NAME_CHARS)}: {text(ev.strategy, NAME_CHARS)}, {ev.rounds} round(s), "
            f"{count(ev.bodies)} bodies"
        )
    elif isinstance(ev, tracer.RunEnded):
        body = f"run ended: {text(ev.status, NAME_CHARS)}"
    else:  # a sync_for order, or a kind this browser does not know yet: in words
        kind, order = sync_order(ev)
        at = (
            [f"{text(ev.op, NAME_CHARS)} invocation {ev.invocation}"]
            if hasattr(ev, "invocation")
            else []
        )
        at += [f"clock {ev.clock}"] if hasattr(ev, "clock") else []
        body = kind + (" in " + " ".join(at) if at else "") + (f": {order}" if order else "")
    return body


__all__ = [
    "NAME_CHARS",
    "TEXT_CHARS",
    "VERDICT_SHORT",
    "count",
    "duration",
    "event_words",
    "event_line",
    "last_line",
    "listing",
    "scalar",
    "short_id",
    "short_path",
    "size",
    "sync_order",
    "text",
    "verdict_summary",
    "when",
    "words",
]
