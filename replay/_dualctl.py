"""The controllers of dual tests and the outcome of one side.

Every side of a dual test is an ``engine.run`` in test mode steered by one of these
controllers: :class:`Serial` (one plain loop per invocation in a given order),
:class:`Wavefront` (a parallel run planned from a serial order), :class:`Replayed`
(a parallel run re-following its own recorded orders) and :class:`Tap` (any of
them, stopped after one invocation with every DDS snapshotted).  They hold only
data — orders and Hybrid body orders — so that the MPI side of a dual test
(:mod:`replay._dualjob`) rebuilds the same controller on every rank from arrays.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import engine
from engine.lowlevel import MutexLog, Schedule, stable_text

from ._progress import InvocationTicker

#: The strategy of the plan an invocation falls back to when its accesses depend on
#: values written in it: every node runs every body, in one order, on its own replica.
SERIAL_FALLBACK = "replicated"

#: Hybrid sync_for body orders: (op, invocation, node, clock) -> [(thread, minibatch), ...].
BodyOrders = dict[tuple[str, int, int, int], list[tuple[int, int]]]


@dataclass
class Outcome:
    """What a run produced: digests per invocation, objectives, loop-index orders.

    ``log`` is the outcome in program order (``RunResult.outcome_log``): digest and
    objective entries interleaved as the program produced them.
    """

    digests: list[dict[str, Any]]
    objectives: dict[str, list[float]]
    orders: dict[tuple[str, int], np.ndarray]
    sync_ops: set[str] = field(default_factory=set)
    body_orders: BodyOrders = field(default_factory=dict)
    bodies: int = 0
    log: list[tuple[Any, ...]] = field(default_factory=list)
    #: what test mode ran exactly though the program declared it relaxed or stale
    #: (``engine.RunResult.ran_exact``)
    ran_exact: list[dict[str, Any]] = field(default_factory=list)
    #: the invocations (``op#inv``) that ran as a serial fallback (both plans failed:
    #: every node ran every body on its replica), so not in parallel
    fallbacks: list[str] = field(default_factory=list)

    def events(self) -> list[tuple[tuple[Any, ...], Any]]:
        """(key, value) per outcome event in program order: key ``("digest", op, inv,
        dds)`` or ``("objective", name, iteration)``."""
        log = self.log or [("digest", d["op"], d["invocation"], d["dds"]) for d in self.digests] + [
            ("objective", name, it)
            for name, vals in self.objectives.items()
            for it in range(len(vals))
        ]
        digests = iter(self.digests)
        out = []
        for entry in log:
            key = tuple(entry)
            if key[0] == "digest":
                out.append((key, next(digests)["digest"]))
            else:
                out.append((key, self.objectives[key[1]][key[2]]))
        return out


def same_value(a: Any, b: Any, *, signed_zero: bool = True) -> bool:
    """Outcome equality: floats by their bits (any NaN equals any NaN, since a trace keeps
    no NaN payload; 0.0 differs from -0.0 unless ``signed_zero`` is False, for a value
    read back from SQLite, which stores -0.0 as 0), everything else by ``==``."""
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        if not signed_zero:
            return a == b
        return struct.pack("<d", a) == struct.pack("<d", b)
    return bool(a == b)


class Capture(engine.Recorder):
    """Keeps the Hybrid body orders of a run, from each invocation's schedule value (and
    forwards everything to ``tee``)."""

    def __init__(self, tee: engine.Recorder | None) -> None:
        self.tee = tee or engine.Recorder()
        self.body_orders: BodyOrders = {}
        self.ticker = InvocationTicker()  # progress, when someone listens
        #: ``op#inv`` of each invocation that completed under a serial fallback plan
        self.fallbacks: list[str] = []
        self._fell_back: set[str] = set()  # operators whose plan just made is one

    def schedule_done(self, sched: Schedule) -> None:
        for (node, clock), pairs in sched.mutex.groups().items():
            self.body_orders[(sched.op, sched.invocation, node, clock)] = pairs
        self.tee.schedule_done(sched)

    def plan_made(self, op: str, plan: Any) -> None:
        # called once per process as an invocation that made a plan ends, before its
        # invocation_done; a serial fallback's plan is the one it completed under
        if plan.strategy == SERIAL_FALLBACK:
            self._fell_back.add(op)
        self.tee.plan_made(op, plan)

    def invocation_done(self, op: str, invocation: int, node: int, info: dict[str, Any]) -> None:
        self.tee.invocation_done(op, invocation, node, info)
        if "digests" in info:  # the invocations an Outcome counts
            self.ticker.done(op, invocation)
            if op in self._fell_back:
                self._fell_back.discard(op)
                self.fallbacks.append(f"{op}#{invocation}")

    def __getattribute__(self, name: str) -> Any:
        own = (
            "tee",
            "body_orders",
            "schedule_done",
            "ticker",
            "invocation_done",
            "plan_made",
            "fallbacks",
            "_fell_back",
            "__class__",
            "__dict__",
        )
        if name in own or name.startswith("__"):
            return object.__getattribute__(self, name)
        return getattr(object.__getattribute__(self, "tee"), name)


def outcome_of(res: engine.RunResult, body_orders: BodyOrders) -> Outcome:
    """The :class:`Outcome` of a finished ``engine.run``."""
    sync_ops = {op for op, info in res.planner.items() if "staleness" in info}
    bodies = sum(
        int(info.get("bodies", 0)) * len(res.op_times.get(op, []))
        for op, info in res.planner.items()
    )
    return Outcome(
        res.digests,
        res.objectives,
        res.orders,
        sync_ops,
        body_orders,
        bodies,
        res.outcome_log,
        res.ran_exact,
    )


class Steering(engine.ScheduleSource, engine.DebugHooks):
    """What steers one side of a dual test: its schedules and its debug hooks, in one
    object (``engine.run(..., schedules=s, hooks=s)``); this default leaves the side free."""


class Hybrid(Steering):
    """Builds the schedule of every invocation of a dual-test side: a ``sync_for``'s from
    the other side's ``body_orders`` (its Hybrid node-mutex orders), an ``async_for``'s
    from :meth:`order` (the serialization order it must follow; None: the planner's)."""

    body_orders: BodyOrders | None = None
    serial = False
    #: a ``sync_for`` runs as the serial definition of (nodes, threads) workers (None: the
    #: engine's distributed implementation)
    sync_shape: tuple[int, int] | None = None
    #: threads per node of the wavefront plan built from an order (0: the run's)
    order_threads = 0

    def order(self, op: str, invocation: int, start: int, n: int) -> np.ndarray | None:
        """The loop-index order invocation ``invocation`` of ``op`` must serialize to."""
        return None

    def schedule(
        self,
        op: str,
        invocation: int,
        kind: str,
        nodes: int,
        span: tuple[int, int] | None = None,
    ) -> Schedule | None:
        if kind == "async_for":
            start, stop = span or (0, 0)
            order = self.order(op, invocation, start, stop - start)
            if order is None:
                return None
            return Schedule(
                op,
                invocation,
                serial=self.serial,
                order=np.asarray(order, dtype=np.int64),
                order_threads=self.order_threads,
            )
        mine = self._by_invocation().get((op, invocation)) if self.body_orders else None
        if not mine and self.sync_shape is None:
            return None
        mutex = MutexLog.build(mine) if mine else MutexLog()
        return Schedule(op, invocation, mutex=mutex, serial=self.serial, workers=self.sync_shape)

    def _by_invocation(self) -> dict[tuple[str, int], dict[tuple[int, int], list[tuple[int, int]]]]:
        """``body_orders`` grouped by invocation (built once per orders object and size)."""
        orders = self.body_orders or {}
        key = (id(orders), len(orders))
        cached = getattr(self, "_grouped", None)
        if cached is None or cached[0] != key:
            grouped: dict[tuple[str, int], dict[tuple[int, int], list[tuple[int, int]]]] = {}
            for (o, inv, node, clock), order in orders.items():
                grouped.setdefault((o, inv), {})[(node, clock)] = order
            cached = self._grouped = (key, grouped)
        return cached[1]


class Serial(Hybrid):
    """Every async_for invocation is one plain loop on node 0 in a given order."""

    def __init__(
        self,
        orders: Callable[[str, int, int, int], np.ndarray],
        body_orders: BodyOrders | None = None,
        sync_shape: tuple[int, int] = (1, 1),
    ) -> None:
        self.orders = orders
        self.body_orders = body_orders
        self.serial = True
        self.sync_shape = sync_shape

    def order(self, op: str, invocation: int, start: int, n: int) -> np.ndarray | None:
        return self.orders(op, invocation, start, n)


class Wavefront(Hybrid):
    """Every async_for invocation runs wavefront levels of a recorded serial order."""

    def __init__(
        self,
        orders: dict[tuple[str, int], np.ndarray],
        threads: int,
        body_orders: BodyOrders | None = None,
    ) -> None:
        self.orders = orders
        self.order_threads = threads
        self.body_orders = body_orders

    def order(self, op: str, invocation: int, start: int, n: int) -> np.ndarray | None:
        got = self.orders.get((op, invocation))
        if got is None:
            raise not_in_trace(op, invocation, "serial")
        return got


class Replayed(Hybrid):
    """Re-runs the parallel side with its own recorded serialization orders, one thread per
    node (for localisation: the first run's thread interleavings are not repeatable)."""

    order_threads = 1

    def __init__(
        self, orders: dict[tuple[str, int], np.ndarray], body_orders: BodyOrders | None
    ) -> None:
        self.orders = orders
        self.body_orders = body_orders

    def order(self, op: str, invocation: int, start: int, n: int) -> np.ndarray | None:
        return self.orders.get((op, invocation))


def not_in_trace(op: str, invocation: int, side: str) -> engine.DivergenceError:
    """The other side's trace has no such invocation: the program is not deterministic."""
    return engine.DivergenceError(
        node=-1,
        op=op,
        invocation=invocation,
        event="order",
        what="trace",
        expected=f"no such invocation in the {side} trace",
        actual="the program ran it",
    )


class Tap(Steering):
    """Wraps another side's steering; after invocation (op, inv) snapshots every DDS and stops."""

    class Stop(Exception):
        """Raised to end the run once the snapshot is taken."""

    def __init__(self, inner: Steering | None, op: str, invocation: int) -> None:
        self.inner = inner or Steering()
        self.target = (op, invocation)
        self.snapshot: dict[str, np.ndarray] = {}
        self.sets: Any = None

    def schedule(
        self,
        op: str,
        invocation: int,
        kind: str,
        nodes: int,
        span: tuple[int, int] | None = None,
    ) -> Schedule | None:
        return self.inner.schedule(op, invocation, kind, nodes, span)

    def after_invocation(self, op: str, invocation: int) -> None:
        if (op, invocation) != self.target:
            return
        sess = engine.current()
        self.snapshot = {d.name: d.gather() for d in sess.dds}  # collective under MPI
        st = sess.ops.get(op)
        self.sets = None if st is None else (st.sets, [d.name for d in sess.dds])
        raise Tap.Stop()


def comparable(a: np.ndarray) -> np.ndarray:
    """``a`` as an array whose elements compare by value: Python-object elements become
    their stable text (``engine.lowlevel.stable_text``: the ``repr``, or the state where
    that shows an address), which is how the MPI side ships them: never pickled."""
    if a.dtype != object:
        return a
    return np.array([stable_text(x) for x in a], dtype=str).reshape(len(a))


__all__ = [
    "BodyOrders",
    "Capture",
    "Hybrid",
    "Outcome",
    "Replayed",
    "Serial",
    "Tap",
    "Wavefront",
    "comparable",
    "not_in_trace",
    "outcome_of",
]
