"""The read-only trace repository: the only way the browser reads traces.

Widgets never open a database or write SQL; they ask a :class:`Repository` (which
traces and runs there are) and a :class:`RunView` (one run's summaries, orders,
timelines and event logs).  Everything goes through ``tracer.open`` and the public
read API, is loaded on first use and cached: bulk arrays are read one (operator,
invocation, node) block at a time, which is the unit the trace stores them in, so a
trace of a million loop bodies is read only where the user looks.

An unreadable trace becomes a :class:`TraceEntry` whose ``error`` says why, and a
read that fails later raises :class:`BrowseError` with one line for the UI; neither
ever takes the browser down.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import tracer

from . import _format as fmt
from . import _model

T = TypeVar("T")

#: File name patterns treated as trace stores when a directory is given.
TRACE_GLOBS = ("*.sqlite", "*.db")
#: Decoded order tables and plans kept per run; each may hold tens of MB for a
#: million-body invocation, so this trades memory for instant back-and-forth.
CACHE_ITEMS = 12


class BrowseError(Exception):
    """A trace, or a part of one, could not be read; the message says which and why."""


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if isinstance(exc, tracer.TracerError | BrowseError):
        return first or fmt.words(type(exc).__name__)
    if isinstance(exc, KeyError) and exc.args:
        return str(exc.args[0])
    # the message, not the exception's class: a person reads this, not a programmer
    return first or f"an unexpected {fmt.words(type(exc).__name__)}"


def _guard(what: str, fn: Callable[[], T]) -> T:
    """Run a read; turn any failure into a one-line :class:`BrowseError`."""
    try:
        return fn()
    except BrowseError:
        raise
    # a viewer must survive whatever a damaged or foreign file makes the decoder raise
    except Exception as exc:  # noqa: BLE001
        raise BrowseError(f"cannot read {what}: {_describe(exc)}") from exc


def expand_paths(paths: Sequence[str | os.PathLike[str]]) -> list[str | Path]:
    """Files as given, directories replaced by the trace files in them (sorted);
    database URLs stay strings."""
    out: list[str | Path] = []
    for given in paths:
        if tracer.is_url(given):
            out.append(str(given))
            continue
        p = Path(given)
        if p.is_dir():
            out += sorted({f for g in TRACE_GLOBS for f in p.glob(g)})
        else:
            out.append(p)
    return out


@dataclass(frozen=True, slots=True)
class RunRef:
    """Names one run: the trace file and the run id in it.

    For a database URL ``path`` is the URL without its password; the repository
    keeps the real one, so nothing the screens show can leak it.
    """

    path: str
    run_id: str


@dataclass(frozen=True, slots=True)
class RunRow:
    """A run as the runs list shows it."""

    ref: RunRef
    info: tracer.RunInfo
    verdicts: tuple[tracer.VerdictInfo, ...]
    #: a chaos run's outcome (``replay.chaos.outcome_digest`` of its trace), else None
    outcome: str | None = None
    #: the runs this one resumed (``replay resume``), earliest first: the list shows
    #: them with it as one line
    earlier: tuple[tracer.RunInfo, ...] = ()


def chaos_outcome(run: Any) -> str:
    """The outcome digest ``replay chaos`` groups a run by, read back from its trace: the
    lowest node's DDS digests in program order and every objective."""
    from replay.chaos import outcome_digest  # the same digest the chaos report shows

    digests = run.digests()
    low = min((d.node for d in digests), default=0)
    rows = [(d.op, d.invocation, d.dds, d.digest) for d in digests if d.node == low]
    return outcome_digest(rows, run.objectives())


@dataclass(frozen=True, slots=True)
class TraceEntry:
    """One trace file: its runs, or why it could not be read."""

    path: str
    runs: tuple[RunRow, ...]
    error: str | None = None
    store_bytes: int = 0


class _Cache:
    """A small least-recently-used map (thread-safe through the owner's lock)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.items: OrderedDict[Any, Any] = OrderedDict()

    def get(self, key: Any, load: Callable[[], T]) -> T:
        if key in self.items:
            self.items.move_to_end(key)
            return self.items[key]
        value = load()
        self.items[key] = value
        while len(self.items) > self.size:
            self.items.popitem(last=False)
        return value


class RunView:
    """Cached, read-only access to one run; every method may raise BrowseError."""

    def __init__(self, ref: RunRef, run: tracer.RunTrace) -> None:
        self.ref = ref
        self.info: tracer.RunInfo = run.info
        self._run = run
        # two locks, taken in the order big then small only, so a long bulk load in a
        # worker never blocks the UI thread's summary reads
        self._small_lock = threading.RLock()
        self._big_lock = threading.RLock()
        self._small: dict[Any, Any] = {}
        self._big = _Cache(CACHE_ITEMS)

    def __repr__(self) -> str:
        return f"<RunView {self.ref.run_id} of {self.ref.path}>"

    def _once(self, key: Any, what: str, load: Callable[[], T]) -> T:
        with self._small_lock:
            if key not in self._small:
                self._small[key] = _guard(what, load)
            return self._small[key]

    def _bulk(self, key: Any, what: str, load: Callable[[], T]) -> T:
        with self._big_lock:
            return self._big.get(key, lambda: _guard(what, load))

    # ------------------------------------------------------------ summaries
    def operators(self) -> dict[str, tracer.OperatorSummary]:
        """Per-operator summary counts, in plan order."""
        return self._once("ops", "the operators", self._run.operators)

    def nodes(self) -> list[int]:
        """Node ids that recorded anything."""
        return self._once("nodes", "the node list", self._run.nodes)

    def objectives(self) -> dict[str, list[float]]:
        """Objective values per name, by iteration."""
        return self._once("objectives", "the objectives", self._run.objectives)

    def verdicts(self) -> list[tracer.VerdictInfo]:
        """Replay and dual-test verdicts, oldest first."""
        return self._once("verdicts", "the verdicts", lambda: self._run.verdicts(strict=False))

    def store_bytes(self) -> int:
        """Bytes this run takes in its store."""
        return self._once("bytes", "the store size", self._run.store_bytes)

    def invocations(self, op: str) -> list[tracer.InvocationInfo]:
        """Every node's record of every invocation of ``op``."""
        return self._once(("inv", op), f"the invocations of {op}", lambda: self._invs(op))

    def _invs(self, op: str) -> list[tracer.InvocationInfo]:
        return sorted(self._run.invocations(op=op), key=lambda i: (i.invocation, i.node))

    def invocation_numbers(self, op: str) -> list[int]:
        """The invocation numbers of ``op`` that completed on some node."""
        return sorted({i.invocation for i in self.invocations(op)})

    def op_seconds(self, op: str) -> float:
        """Wall time of ``op``: per invocation the slowest node, summed."""
        slowest: dict[int, float] = {}
        for i in self.invocations(op):
            slowest[i.invocation] = max(slowest.get(i.invocation, 0.0), i.seconds)
        return sum(slowest.values())

    def plan(self, op: str, invocation: int) -> Any:
        """The plan (``engine.Plan``) in force at that invocation."""
        what = f"the plan of {op}"
        return self._bulk(("plan", op, invocation), what, lambda: self._run.plan(op, invocation))

    # ------------------------------------------------------------ orders
    def _node_list(self, node: int | None) -> list[int]:
        return self.nodes() if node is None else [node]

    def lock_table(self, op: str, invocation: int, node: int | None = None) -> _model.RowTable:
        """Deviations of each (node, round)'s lock-ticket order from its prediction."""

        def load() -> _model.RowTable:
            parts = [(n, self._run.lock_grants(op, invocation, n)) for n in self._node_list(node)]
            try:
                plan = self._run.plan(op, invocation) if parts else None
            except KeyError:  # no plan (sync_for): no loop index per hand-over
                plan = None
            return _model.lock_table(parts, plan)

        what = f"the lock grants of {op}#{invocation}"
        return self._bulk(("locks", op, invocation, node), what, load)

    def message_table(self, op: str, invocation: int, node: int | None = None) -> _model.RowTable:
        """Message arrivals of one invocation per (node, channel) in arrival order."""

        def load() -> _model.RowTable:
            parts = [(n, self._run.messages(n, op, invocation)) for n in self._node_list(node)]
            nodes = set(self._node_list(node))
            routed = [c for c in self._run.routed(op, invocation) if c.node in nodes]
            return _model.message_table(parts + _model.routed_parts(routed))

        what = f"the messages of {op}#{invocation}"
        return self._bulk(("msgs", op, invocation, node), what, load)

    def outcome_table(self, op: str, invocation: int, node: int | None = None) -> _model.RowTable:
        """The DDS digests recorded after one invocation, per node in sequence order."""

        def load() -> _model.RowTable:
            digests = self._run.digests(op)
            return _model.outcome_table(
                d
                for d in digests
                if d.invocation == invocation and (node is None or d.node == node)
            )

        what = f"the digests of {op}#{invocation}"
        return self._bulk(("outcome", op, invocation, node), what, load)

    def has_plan(self, op: str) -> bool:
        """True when ``op`` recorded a plan (``async_for``; ``sync_for`` has none)."""
        summary = self.operators().get(op)
        return summary is not None and summary.plans > 0

    def index_table(self, op: str, invocation: int, node: int | None = None) -> _model.RowTable:
        """Loop indices per (node, thread) in execution order (plan plus deviations)."""

        def load() -> _model.RowTable:
            if not self.has_plan(op):
                raise BrowseError(
                    f"{op} recorded no plan (only async_for has one), so it has no loop-index order"
                )
            plan = self.plan(op, invocation)
            devs = self._run.events(
                node=node, op=op, invocation=invocation, kinds=[tracer.IndexOrderDeviated]
            )
            return _model.index_table(
                plan, [d for d in devs if isinstance(d, tracer.IndexOrderDeviated)], node
            )

        what = f"the index order of {op}#{invocation}"
        return self._bulk(("index", op, invocation, node), what, load)

    def sync_table(self, op: str, invocation: int, node: int | None = None) -> _model.RowTable:
        """``sync_for`` orders (aggregation, visibility, mutex) of one invocation."""

        def load() -> _model.RowTable:
            kinds = _model.sync_kinds()
            if not kinds:
                return _model.sync_table([])
            events = self._run.events(node=node, op=op, invocation=invocation, kinds=kinds)
            return _model.sync_table(events)

        what = f"the sync orders of {op}#{invocation}"
        return self._bulk(("sync", op, invocation, node), what, load)

    def timeline(self, op: str, invocation: int) -> _model.Timeline:
        """Rounds and task groups of one invocation laid out in time (rounds only, and one
        lane per node, for an operator without a plan)."""

        def load() -> _model.Timeline:
            invs = [i for i in self.invocations(op) if i.invocation == invocation]
            if not self.has_plan(op):
                return _model.round_timeline(op, invocation, invs)
            return _model.timeline_layout(op, invocation, self.plan(op, invocation), invs)

        return self._bulk(("timeline", op, invocation), f"the timeline of {op}", load)

    # ------------------------------------------------------------ logs
    def events(self, node: int) -> Iterator[tracer.Event]:
        """Every event of ``node`` in sequence order, decoded as iterated."""
        what = f"the log of node {node}"
        try:
            yield from self._run.events(node=node)
        except Exception as exc:  # noqa: BLE001 - see _guard
            raise BrowseError(f"cannot read {what}: {_describe(exc)}") from exc


class Repository:
    """The trace files given on the command line and the runs they hold (read-only)."""

    def __init__(self, paths: Sequence[str | os.PathLike[str]]) -> None:
        #: the files, directories and URLs as given; directories are rescanned on reload
        self.given = list(paths)
        self._scan()
        self._lock = threading.RLock()
        self._traces: dict[str, tracer.Trace] = {}
        self._entries: list[TraceEntry] | None = None
        self._views: dict[RunRef, RunView] = {}

    def __repr__(self) -> str:
        return f"<Repository of {len(self.paths)} trace(s)>"

    def _scan(self) -> None:
        self.paths = expand_paths(self.given)
        #: shown name -> what to open, for URLs (whose shown name hides the password)
        self._targets = {tracer.describe(p): p for p in self.paths if isinstance(p, str)}

    def _trace(self, path: str) -> tracer.Trace:
        with self._lock:
            if path not in self._traces:
                self._traces[path] = tracer.open(self._targets.get(path, path))
            return self._traces[path]

    def entries(self) -> list[TraceEntry]:
        """Every trace file with its runs (or its error), loaded once."""
        with self._lock:
            if self._entries is None:
                self._entries = [self._entry(tracer.describe(p)) for p in self.paths]
            return self._entries

    def _entry(self, path: str) -> TraceEntry:
        try:
            trace = self._trace(path)
            for info in trace.runs():
                trace.ensure_intact(info.run_id)  # a damaged run is refused like a bad file
            rows = tuple(
                RunRow(
                    RunRef(path, info.run_id),
                    info,
                    tuple(trace.run(info.run_id).verdicts(strict=False)),
                    chaos_outcome(trace.run(info.run_id)) if "chaos_seed" in info.labels else None,
                )
                for info in trace.runs()
            )
            return TraceEntry(path, rows, None, trace.store_bytes())
        except Exception as exc:  # noqa: BLE001 - an unreadable file is shown, not raised
            return TraceEntry(path, (), _describe(exc))

    def rows(self) -> list[RunRow]:
        """Every readable run of every trace, in file then start order."""
        return [r for e in self.entries() for r in e.runs]

    def errors(self) -> list[TraceEntry]:
        """The traces that could not be read."""
        return [e for e in self.entries() if e.error is not None]

    def latest(self, path: str | os.PathLike[str]) -> RunRef | None:
        """The latest run of the trace at ``path`` (None: unreadable or empty)."""
        shown = tracer.describe(path)
        for e in self.entries():
            if (e.path == shown or Path(e.path) == Path(path)) and e.runs:
                return e.runs[-1].ref
        return None

    def target(self, ref: RunRef) -> str:
        """What to open for ``ref``: its file path, or the full URL of a database (with
        the password the shown name hides)."""
        return str(self._targets.get(ref.path, ref.path))

    def run(self, ref: RunRef) -> RunView:
        """Cached access to one run."""
        with self._lock:
            if ref not in self._views:
                what = f"run {ref.run_id} of {ref.path}"
                trace = _guard(what, lambda: self._trace(ref.path))
                self._views[ref] = RunView(ref, _guard(what, lambda: trace.run(ref.run_id)))
            return self._views[ref]

    def reload(self) -> None:
        """Forget everything loaded and rescan the directories given, so the next read
        sees the trace files as they are now (new ones included, deleted ones gone)."""
        with self._lock:
            self.close()
            self._scan()
            self._entries = None
            self._views.clear()

    def close(self) -> None:
        """Release every open trace."""
        with self._lock:
            for trace in self._traces.values():
                trace.close()
            self._traces.clear()


__all__ = [
    "CACHE_ITEMS",
    "TRACE_GLOBS",
    "BrowseError",
    "Repository",
    "RunRef",
    "RunRow",
    "RunView",
    "TraceEntry",
    "expand_paths",
]
