"""Hypothesis strategies for dual tests: random programs, cluster shapes and orders.

The engine sees data, not strategies.  A strategy draws a *description* — frozen
dataclasses whose ``repr`` is valid Python — and :func:`build` turns a program
description into a driver function for :func:`engine.run` and
:mod:`replay.testing`.  A failing case shrinks to a small description; paste its
``repr`` into a test (``from replay.strategies import *``) to keep it as a regression.

A program has a few DDS (*tables*: dvectors of numeric rows) and a few loops, run
``invocations`` times in order.  Every loop index (``async_for``) or data element
(``sync_for``) has an :class:`Access`: the elements it reads, then — after a
``time.sleep(0)`` that lets threads interleave for real — the elements it updates
with non-commutative float operations (:data:`OPS`), so any order other than the
recorded one shows in the digests.  Some elements are *hot* (touched by many
bodies), so conflict groups get big and are split across threads under locks.

>>> from hypothesis import given
>>> from replay import strategies as rs
>>> @given(rs.cases())
... def test_parallel_equals_serial(case):
...     rs.assert_case(case)
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st

import engine as ap

from . import testing

#: Update arithmetic: ``new = op(old_row, acc)``.  Each program picks a few; none of
#: them commute with each other or with themselves (for different ``acc``).
#: ``set`` ignores the old value, so it makes write-write conflicts.
OPS: dict[str, Callable[[np.ndarray, float], np.ndarray]] = {
    "lerp": lambda x, a: x + 0.5 * (a - x),
    "sin": lambda x, a: 0.5 * x + np.sin(a),
    "tanh": lambda x, a: np.tanh(1.5 * x - a),
    "scale": lambda x, a: x * np.cos(a) + 0.25,
    "set": lambda x, a: np.full_like(x, 0.5 * a + 0.1),
}
#: ``sync_for`` synchronisation models the strategies draw from.
SYNC_MODELS = ("bsp", "ssp", "hybrid")
#: Largest sizes drawn by default: bigger programs find more interleavings, smaller
#: ones run faster and shrink to clearer counterexamples (each example must stay well
#: under a second on one core).
MAX_TABLES = 2
MAX_TABLE_SIZE = 10
MAX_WIDTH = 3
MAX_BODIES = 16
MAX_LOOPS = 2
MAX_INVOCATIONS = 3
MAX_NODES = 4
MAX_THREADS = 3


# ====================================================================== descriptions
@dataclass(frozen=True)
class Table:
    """A numeric dvector of ``size`` rows of ``width`` float64 values."""

    size: int
    width: int = 1

    def __post_init__(self) -> None:
        if self.size < 1 or self.width < 1:
            raise ValueError(f"{self!r}: size and width must be >= 1")


@dataclass(frozen=True)
class Switch:
    """Value-dependent accesses: when the first value of row ``(table, element)``, read
    at the start of the body, exceeds ``above``, the body makes the accesses of ``then``
    instead of its own.  Values change as the program runs, so reconnaissance sees one
    branch and later invocations (or later bodies of the same one) take the other."""

    table: int
    element: int
    above: float
    then: Access


@dataclass(frozen=True)
class Access:
    """One body: read ``reads`` (table, element), yield, then apply ``writes``
    (table, element, op name) in order; ``switch`` may replace them by others."""

    reads: tuple[tuple[int, int], ...] = ()
    writes: tuple[tuple[int, int, str], ...] = ()
    switch: Switch | None = None

    def __post_init__(self) -> None:
        for w in self.writes:
            if w[2] not in OPS:
                raise ValueError(f"{self!r}: unknown op {w[2]!r}; known: {sorted(OPS)}")

    def touched(self) -> list[tuple[int, int]]:
        """Every element this body may read or write, on either branch."""
        out = [*self.reads, *((t, e) for t, e, _ in self.writes)]
        if self.switch is not None:
            out += [(self.switch.table, self.switch.element), *self.switch.then.touched()]
        return out


@dataclass(frozen=True)
class AsyncLoop:
    """``async_for(start, start + len(bodies), ...)``: index ``start + k`` runs ``bodies[k]``."""

    bodies: tuple[Access, ...]
    start: int = 0


@dataclass(frozen=True)
class SyncLoop:
    """``sync_for`` over a data dvector of ``len(bodies)`` elements; element k runs
    ``bodies[k]`` on its worker's cache."""

    bodies: tuple[Access, ...]
    minibatch: int = 1
    per_clock: int = 1
    sync: str = "bsp"

    def __post_init__(self) -> None:
        if self.sync not in SYNC_MODELS:
            raise ValueError(f"{self!r}: sync must be one of {SYNC_MODELS}")
        if not self.bodies or self.minibatch < 1 or self.per_clock < 1:
            raise ValueError(f"{self!r}: needs bodies, minibatch >= 1 and per_clock >= 1")


@dataclass(frozen=True)
class Program:
    """Tables, then ``invocations`` times every loop in order; with ``rng`` bodies draw
    from ``engine.rng()``; with ``objective`` the sum of all tables is logged per
    iteration."""

    tables: tuple[Table, ...]
    loops: tuple[AsyncLoop | SyncLoop, ...]
    invocations: int = 1
    rng: bool = False
    objective: bool = False

    def __post_init__(self) -> None:
        for loop in self.loops:
            for a in loop.bodies:
                for t, e in a.touched():
                    if not (0 <= t < len(self.tables) and 0 <= e < self.tables[t].size):
                        raise ValueError(f"{a!r} touches ({t}, {e}), outside {self.tables!r}")

    @property
    def uses_sync(self) -> bool:
        """True when some loop is a ``sync_for``."""
        return any(isinstance(loop, SyncLoop) for loop in self.loops)


@dataclass(frozen=True)
class Shape:
    """A cluster: ``nodes`` in-process nodes (or MPI ranks) of ``threads`` threads."""

    nodes: int = 2
    threads: int = 1


@dataclass(frozen=True)
class Order:
    """The serial order of the forward test: ``identity`` or ``random`` with ``seed``."""

    kind: str = "identity"
    seed: int = 0


@dataclass(frozen=True)
class Case:
    """One dual test: a program on a cluster shape, forward from a serial order."""

    program: Program
    shape: Shape = field(default_factory=Shape)
    order: Order = field(default_factory=Order)
    seed: int = 0


# ====================================================================== driver
def _apply(T: list[Any], acc: float, access: Access) -> None:
    """The body of every generated loop: reads, a real thread yield, then the updates."""
    sw = access.switch
    if sw is not None and float(T[sw.table][sw.element][0]) > sw.above:
        access = sw.then
    for t, e in access.reads:
        acc = acc * 0.9 + float(np.sin(T[t][e]).sum())
    time.sleep(0)
    for t, e, op in access.writes:
        T[t][e] = OPS[op](T[t][e], acc)


def build(program: Program) -> Callable[[], None]:
    """The driver function (no parameters) that runs ``program`` on the current session."""
    loops = program.loops

    def driver() -> None:
        T = [
            ap.dvector(t.size, shape=(t.width,), init=ap.init.normal(0, 1), name=f"T{i}")
            for i, t in enumerate(program.tables)
        ]
        data = {
            k: ap.dvector(len(loop.bodies), shape=(1,), init=ap.init.uniform(-1, 1), name=f"D{k}")
            for k, loop in enumerate(loops)
            if isinstance(loop, SyncLoop)
        }
        bodies = [_body(T, loop, program.rng) for loop in loops]
        for _ in range(program.invocations):
            for k, loop in enumerate(loops):
                if isinstance(loop, AsyncLoop):
                    stop = loop.start + len(loop.bodies)
                    ap.async_for(loop.start, stop, bodies[k], name=f"a{k}")
                else:
                    ap.sync_for(
                        data[k],
                        loop.minibatch,
                        bodies[k],
                        sync=loop.sync,
                        per_clock=loop.per_clock,
                        name=f"s{k}",
                    )
            if program.objective:
                ap.log_objective("total", float(sum(float(t.gather().sum()) for t in T)))

    driver.__qualname__ = driver.__name__ = "generated_program"
    return driver


def _body(T: list[Any], loop: AsyncLoop | SyncLoop, rng: bool) -> Callable[[Any], None]:
    """The loop body of one loop description (closes over data only)."""
    accesses = loop.bodies
    if isinstance(loop, AsyncLoop):
        start = loop.start

        def async_body(j: int) -> None:
            acc = 0.5 + 0.01 * j + (1e-3 * float(ap.rng().random()) if rng else 0.0)
            _apply(T, acc, accesses[j - start])

        return async_body

    def sync_body(batch: Any) -> None:
        noise = 1e-3 * float(ap.rng().random()) if rng else 0.0
        for k, v in batch:
            _apply(T, 0.5 + 0.01 * k + 0.1 * float(v[0]) + noise, accesses[k])

    return sync_body


def check(case: Case, direction: str = "both") -> dict[str, testing.DualResult]:
    """Run the dual test(s) of ``case``; returns ``{direction: result}``."""
    return testing.dual(
        build(case.program),
        nodes=case.shape.nodes,
        threads=case.shape.threads,
        seed=case.seed,
        order=case.order.kind,
        order_seed=case.order.seed,
        direction=direction,
    )


def assert_case(case: Case, direction: str = "both") -> None:
    """:func:`check` that raises AssertionError with the case and the divergence report."""
    failed = [r.report() for r in check(case, direction).values() if not r.passed]
    if failed:
        raise AssertionError("\n".join([f"case: {case!r}", *failed]))


# ====================================================================== strategies
@functools.cache
def tables(
    max_tables: int = MAX_TABLES, max_size: int = MAX_TABLE_SIZE, max_width: int = MAX_WIDTH
) -> st.SearchStrategy[tuple[Table, ...]]:
    """One to ``max_tables`` tables with their sizes and row widths."""
    one = st.builds(Table, size=st.integers(1, max_size), width=st.integers(1, max_width))
    return st.lists(one, min_size=1, max_size=max_tables).map(tuple)


# Strategies are made once per distinct argument and then reused (the same objects give
# the same draws): a program's bodies draw hundreds of elements, and making a new strategy
# for each draw was most of what generating a program cost (half of it, measured over
# 600 programs; the programs drawn are the same).
@functools.cache
def _element_of(t: int, size: int) -> st.SearchStrategy[tuple[int, int]]:
    return st.tuples(st.just(t), st.integers(0, size - 1))


@functools.lru_cache(maxsize=4096)
def _elements(ts: tuple[Table, ...]) -> st.SearchStrategy[tuple[int, int]]:
    return st.integers(0, len(ts) - 1).flatmap(lambda t: _element_of(t, ts[t].size))


@functools.lru_cache(maxsize=4096)
def accesses(
    ts: tuple[Table, ...],
    ops: tuple[str, ...],
    hot: tuple[tuple[int, int], ...] = (),
    max_reads: int = 3,
    max_writes: int = 2,
    switches: bool = False,
) -> st.SearchStrategy[Access]:
    """Bodies over tables ``ts``: each element is one of ``hot`` about half the time.
    With ``switches``, most bodies make value-dependent accesses (:class:`Switch`)."""
    elem = _elements(ts)
    pick = st.one_of(st.sampled_from(hot), elem) if hot else elem
    write = st.tuples(pick, st.sampled_from(ops)).map(lambda p: (p[0][0], p[0][1], p[1]))
    plain = st.builds(
        Access,
        reads=st.lists(pick, max_size=max_reads).map(tuple),
        writes=st.lists(write, max_size=max_writes).map(tuple),
    )
    if not switches:
        return plain
    switch = st.builds(
        lambda te, above, then: Switch(te[0], te[1], above, then),
        pick,
        st.sampled_from([-0.5, 0.0, 0.3, 0.7]),
        plain,
    )
    return st.builds(
        Access,
        reads=st.lists(pick, max_size=max_reads).map(tuple),
        writes=st.lists(write, max_size=max_writes).map(tuple),
        switch=st.one_of(st.none(), switch, switch),
    )


@st.composite
def programs(
    draw: st.DrawFn,
    *,
    kinds: tuple[str, ...] = ("async", "sync"),
    syncs: tuple[str, ...] = SYNC_MODELS,
    max_tables: int = MAX_TABLES,
    max_size: int = MAX_TABLE_SIZE,
    max_width: int = MAX_WIDTH,
    max_bodies: int = MAX_BODIES,
    max_loops: int = MAX_LOOPS,
    max_invocations: int = MAX_INVOCATIONS,
    switches: bool = False,
) -> Program:
    """Random programs: tables, hot elements, a few ops, ``async_for``/``sync_for`` loops;
    with ``switches``, bodies whose accesses depend on values (see
    :func:`value_dependent_programs`)."""
    ts = draw(tables(max_tables, max_size, max_width))
    hot = tuple(draw(_hot(ts)))
    ops = tuple(draw(_OPS))
    body = accesses(ts, ops, hot, switches=switches)
    loops = tuple(draw(_loops(body, kinds, syncs, max_bodies, max_loops)))
    return Program(
        tables=ts,
        loops=loops,
        invocations=draw(_counts(max_invocations, 1)),
        rng=draw(st.booleans()),
        objective=draw(st.booleans()),
    )


_OPS = st.lists(st.sampled_from(sorted(OPS)), min_size=1, max_size=3, unique=True)


@functools.lru_cache(maxsize=4096)
def _hot(ts: tuple[Table, ...]) -> st.SearchStrategy[list[tuple[int, int]]]:
    return st.lists(_elements(ts), max_size=2, unique=True)


@functools.lru_cache(maxsize=4096)
def _loops(
    body: st.SearchStrategy[Access],
    kinds: tuple[str, ...],
    syncs: tuple[str, ...],
    max_bodies: int,
    max_loops: int,
) -> st.SearchStrategy[list[AsyncLoop | SyncLoop]]:
    bodies = st.lists(body, min_size=1, max_size=max_bodies).map(tuple)
    async_loop = st.builds(AsyncLoop, bodies=bodies, start=st.integers(0, 3))
    sync_loop = st.builds(
        SyncLoop,
        bodies=bodies,
        minibatch=st.integers(1, 3),
        per_clock=st.integers(1, 2),
        sync=st.sampled_from(syncs),
    )
    loop = st.one_of(*[async_loop if k == "async" else sync_loop for k in kinds])
    return st.lists(loop, min_size=1, max_size=max_loops)


def value_dependent_programs(**kw: Any) -> st.SearchStrategy[Program]:
    """Programs whose bodies read a value and choose their other accesses by it, so the
    plan reconnaissance made can be left by later invocations or by later bodies of the
    same invocation (the class of program the plan guard exists for)."""
    kw.setdefault("max_invocations", MAX_INVOCATIONS)
    return programs(switches=True, **kw).filter(
        lambda p: p.invocations > 1 and any(a.switch for loop in p.loops for a in loop.bodies)
    )


def _counts(top: int, first: int) -> st.SearchStrategy[int]:
    """1..top, uniformly, shrinking towards ``first`` (hypothesis' integers favour 1)."""
    first = min(first, top)
    return st.sampled_from([first, *(k for k in range(1, top + 1) if k != first)])


def shapes(max_nodes: int = MAX_NODES, max_threads: int = MAX_THREADS) -> st.SearchStrategy[Shape]:
    """Cluster shapes: 1..``max_nodes`` nodes of 1..``max_threads`` threads, uniformly;
    counterexamples shrink towards 2 nodes of 1 thread."""
    return st.builds(Shape, nodes=_counts(max_nodes, 2), threads=_counts(max_threads, 1))


def orders() -> st.SearchStrategy[Order]:
    """Serial orders of the forward test: the identity or a seeded permutation."""
    return st.one_of(
        st.just(Order()), st.builds(Order, kind=st.just("random"), seed=st.integers(0, 2**32 - 1))
    )


@st.composite
def cases(
    draw: st.DrawFn,
    programs: st.SearchStrategy[Program] | None = None,
    shapes: st.SearchStrategy[Shape] | None = None,
    orders: st.SearchStrategy[Order] | None = None,
) -> Case:
    """A program, a cluster shape, a serial order and a run seed."""
    prog = draw(programs if programs is not None else _DEFAULT_PROGRAMS)
    shape = draw(shapes if shapes is not None else _DEFAULT_SHAPES)
    order = draw(orders if orders is not None else _DEFAULT_ORDERS)
    return Case(prog, shape, order, seed=draw(st.integers(0, 3)))


_DEFAULT_PROGRAMS = programs()
_DEFAULT_SHAPES = shapes()
_DEFAULT_ORDERS = orders()


__all__ = [
    "OPS",
    "SYNC_MODELS",
    "Access",
    "AsyncLoop",
    "Case",
    "Order",
    "Program",
    "Shape",
    "Switch",
    "SyncLoop",
    "Table",
    "accesses",
    "assert_case",
    "build",
    "cases",
    "check",
    "orders",
    "programs",
    "shapes",
    "tables",
    "value_dependent_programs",
]
