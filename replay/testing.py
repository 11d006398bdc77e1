"""Discrepancy-free dual tests: prove a parallel program equal to its serial version.

*Forward*: a serial run (one node, one thread, a plain loop over a given order —
the identity or a seeded permutation) gives ``Strace`` and ``Sbaseout``; a parallel
run in test mode plans wavefront rounds equivalent to ``Strace`` and its outcome
must equal ``Sbaseout`` exactly.  *Backward*: a parallel run in test mode gives
``Ptrace`` and ``Pbaseout``; a serial run executes the bodies in ``Ptrace`` order and
must give ``Pbaseout`` exactly.  The outcome is every per-invocation DDS digest and
every logged objective.

For ``sync_for`` the serial side runs the synchronous semantics of the same P × T
workers one worker at a time (``replay._syncref``: written from the definition, not
from the engine's code), with aggregation in node, thread order and Hybrid bodies in
the recorded order; test mode turns SSP staleness off.

Where the parallel side runs is ``parallel=``: ``"in-process"`` (default) hosts its
nodes in this process; ``"mpi"`` runs it under ``mpiexec`` (``replay._dualjob``),
where each node has its own interpreter — the only way to see a program that keeps
per-process Python state.  The serial side always runs in this process.  The first
divergence reported is the earliest in program order: digests and objectives are
compared in the order the program produced them.

>>> from replay import testing
>>> result = testing.forward(train, {"epochs": 2}, nodes=3, threads=2)  # doctest: +SKIP
>>> assert result.passed, result.report()                                # doctest: +SKIP
>>> testing.assert_dual("path/to/train.py:train", nodes=2, parallel="mpi")  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import engine
from engine.lowlevel import SLOT_BITS, SLOT_MASK

from ._dualctl import (
    Capture,
    Outcome,
    Replayed,
    Serial,
    Tap,
    Wavefront,
    comparable,
    not_in_trace,
    outcome_of,
    same_value,
)
from ._dualjob import MpiSide, importable_target
from ._progress import stage

#: Errors of a test-mode run that are a dual test's FAIL verdict, not a crash: the
#: program is not deterministic, or a replica missed a write.
_VERDICTS = (engine.DivergenceError, engine.ReplicaMismatchError)

#: Where the parallel side of a dual test may run.
PARALLEL = ("in-process", "mpi")


@dataclass
class DualResult:
    """The verdict of one direction; ``divergence`` locates the first difference."""

    direction: str
    passed: bool
    divergence: dict[str, Any] | None
    bodies: int = 0

    def report(self) -> str:
        """One paragraph saying what diverged where, with both values."""
        if self.passed:
            return f"{self.direction}: PASS ({self.bodies} bodies compared)"
        d = self.divergence or {}
        keys = ("objective", "iteration", "op", "invocation", "index", "dds", "element")
        where = ", ".join(f"{k} {d[k]}" for k in keys if d.get(k) is not None)
        if d.get("what") == "replica":
            return (
                f"{self.direction}: FAIL at {where}: node {d.get('node')}'s replica is "
                f"{d.get('replica')} but its owner, node {d.get('owner')}, has "
                f"{d.get('owner_value')} (a write did not reach every replica)"
            )
        return (
            f"{self.direction}: FAIL at {where}: serial gave {d.get('serial')}, "
            f"parallel gave {d.get('parallel')}"
        )

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (``{"passed", "divergence"}``)."""
        return {"passed": self.passed, "divergence": self.divergence}


def _h(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


class OrderSource:
    """The serial order of each invocation: ``identity`` or a seeded ``random`` permutation."""

    def __init__(self, kind: str = "identity", seed: int = 0) -> None:
        if kind not in ("identity", "random"):
            raise ValueError(f"order must be 'identity' or 'random', got {kind!r}")
        self.kind = kind
        self.seed = seed

    def __call__(self, op: str, invocation: int, start: int, n: int) -> np.ndarray:
        idx = np.arange(start, start + n, dtype=np.int64)
        if self.kind == "identity":
            return idx
        rng = np.random.default_rng([self.seed & (2**63 - 1), _h(op), invocation])
        return rng.permutation(idx)


# ====================================================================== the two sides
def _run(
    fn: Callable[..., Any],
    params: dict[str, Any],
    *,
    nodes: int,
    threads: int,
    seed: int,
    controller: engine.Controller | None = None,
    recorder: engine.Recorder | None = None,
) -> Outcome:
    capture = Capture(recorder)
    res = engine.run(
        fn,
        params,
        nodes=nodes,
        threads=threads,
        seed=seed,
        controller=controller,
        recorder=capture,
        test_mode=True,
    )
    return outcome_of(res, capture.body_orders)


def _tap(
    fn: Callable[..., Any], params: dict[str, Any], cfg: dict[str, Any], op: str, invocation: int
) -> Tap:
    """Run ``cfg``'s side up to invocation (op, invocation); the tap holds its DDS."""
    tap = Tap(cfg["controller"], op, invocation)
    try:
        engine.run(
            fn,
            params,
            nodes=cfg["nodes"],
            threads=cfg["threads"],
            seed=cfg["seed"],
            controller=tap,
            test_mode=True,
        )
    except Tap.Stop:
        pass
    return tap


class _InProcess:
    """The parallel side as an in-process cluster (its nodes share every Python object)."""

    kind = "in-process"

    def __init__(
        self, fn: Callable[..., Any], params: dict[str, Any], nodes: int, threads: int, seed: int
    ) -> None:
        self.fn, self.params = fn, params
        self.cfg = {"nodes": nodes, "threads": threads, "seed": seed}

    def run(
        self, controller: engine.Controller | None, recorder: engine.Recorder | None = None
    ) -> Outcome:
        return _run(self.fn, self.params, **self.cfg, controller=controller, recorder=recorder)

    def snapshot(
        self, controller: engine.Controller | None, op: str, invocation: int, dds: str
    ) -> np.ndarray | None:
        tap = _tap(self.fn, self.params, dict(self.cfg, controller=controller), op, invocation)
        snap = tap.snapshot.get(dds)
        return None if snap is None else comparable(snap)


class _Mpi:
    """The parallel side under ``mpiexec`` (``replay._dualjob``), one node per rank."""

    kind = "mpi"

    def __init__(self, side: MpiSide, trace: tuple[str, str] | None) -> None:
        self.side, self.trace = side, trace

    def run(self, controller: engine.Controller | None, recorder: Any = None) -> Outcome:
        return self.side.run(controller, self.trace if recorder is not None else None)

    def snapshot(
        self, controller: engine.Controller | None, op: str, invocation: int, dds: str
    ) -> np.ndarray | None:
        return self.side.snapshot(controller, op, invocation, dds)


def _sides(
    fn: Callable[..., Any] | str,
    params: dict[str, Any] | None,
    *,
    nodes: int,
    threads: int,
    seed: int,
    parallel: str,
    recorder: engine.Recorder | None,
    mpi_trace: tuple[str, str] | None,
    timeout: float | None,
) -> tuple[Callable[..., Any], dict[str, Any], _InProcess | _Mpi, Any]:
    """The driver, its parameters, the parallel side, and what records the parallel run."""
    if parallel not in PARALLEL:
        raise ValueError(f"parallel must be 'in-process' or 'mpi', got {parallel!r}")
    params = dict(params or {})
    if isinstance(fn, str):
        from ._apps import resolve

        driver = resolve(fn).fn
    else:
        driver = fn
    if parallel == "in-process" or nodes == 1:  # one node: nothing to launch
        if mpi_trace is not None:
            raise ValueError("mpi_trace needs parallel='mpi' with nodes > 1; use recorder=")
        return driver, params, _InProcess(driver, params, nodes, threads, seed), recorder
    if recorder is not None:
        raise ValueError(
            "a recorder object cannot follow the parallel side into MPI ranks; "
            "pass mpi_trace=(path, run_id) to record it with parallel='mpi'"
        )
    side = MpiSide(
        importable_target(fn), params, ranks=nodes, threads=threads, seed=seed, timeout=timeout
    )
    return driver, params, _Mpi(side, mpi_trace), mpi_trace


def _invocations(o: Outcome) -> int:
    """How many invocations ``o``'s run completed (the other side's progress total)."""
    return len({(d["op"], d["invocation"]) for d in o.digests})


# ====================================================================== comparing outcomes
def _first_difference(serial: Outcome, parallel: Outcome) -> dict[str, Any] | None:
    """The earliest difference in program order: digests and objectives are compared in
    the order the program produced them (an objective logged before an invocation is
    checked before that invocation's digests)."""
    a_ev, b_ev = serial.events(), parallel.events()
    for k, ((a, x), (b, y)) in enumerate(zip(a_ev, b_ev, strict=False)):
        if a != b:
            return _sequence_difference(k, a, b)
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


def _sequence_difference(k: int, a: tuple[Any, ...], b: tuple[Any, ...]) -> dict[str, Any]:
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


def _localise(
    diff: dict[str, Any],
    fn: Callable[..., Any],
    params: dict[str, Any],
    serial_cfg: dict[str, Any],
    side: _InProcess | _Mpi,
    p_controller: engine.Controller | None,
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
    tap = _tap(fn, params, serial_cfg, op, inv)
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
    diff["serial"] = _show(a[slot])
    diff["parallel"] = _show(b[slot])
    if tap.sets is not None and serial_order is not None:
        sets, names = tap.sets
        gid = (names.index(dds) << SLOT_BITS) | (slot & SLOT_MASK)
        order = serial_order(op, inv, sets.start, sets.n)
        writers = [j for j in order.tolist() if gid in sets.writes_of(j - sets.start)]
        if writers:
            diff["index"] = writers[0]
    return diff


def _show(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return [float(x) for x in np.ravel(v)][:8]
    if isinstance(v, np.generic):
        return v.item()
    return repr(v)


# ====================================================================== public API
def forward(
    fn: Callable[..., Any] | str,
    params: dict[str, Any] | None = None,
    *,
    nodes: int = 2,
    threads: int = 1,
    seed: int = 0,
    order: str = "identity",
    order_seed: int = 0,
    recorder: engine.Recorder | None = None,
    parallel: str = "in-process",
    timeout: float | None = None,
    mpi_trace: tuple[str, str] | None = None,
) -> DualResult:
    """Serial run over a given order, then a parallel run planned from its trace.

    ``fn`` is the driver, or (needed for ``parallel="mpi"`` when it is not a
    module-level function) its target ``"path/to/train.py:train"``.  ``parallel``:
    ``"in-process"`` or ``"mpi"`` (the parallel side under ``mpiexec -n nodes``;
    ``timeout`` seconds per MPI job).  ``recorder`` (in-process) or ``mpi_trace``
    ((path, run id), MPI) records the parallel run into a trace store.
    """
    driver, params, side, record = _sides(
        fn,
        params,
        nodes=nodes,
        threads=threads,
        seed=seed,
        parallel=parallel,
        recorder=recorder,
        mpi_trace=mpi_trace,
        timeout=timeout,
    )
    orders = OrderSource(order, order_seed)
    serial = Serial(orders, sync_shape=(nodes, threads))
    s_cfg: dict[str, Any] = {"nodes": 1, "threads": 1, "seed": seed, "controller": serial}
    with stage("forward: serial run"):
        s = _run(driver, params, **s_cfg)
    serial.body_orders = s.body_orders  # localisation re-runs follow the same choices
    p_controller = Wavefront(s.orders, threads, s.body_orders)
    try:
        with stage("forward: parallel run", _invocations(s)):
            p = side.run(p_controller, record)
    except _VERDICTS as exc:
        return DualResult("forward", False, exc.as_dict())
    diff = _first_difference(s, p)
    if diff is not None:
        diff = _localise(diff, driver, params, s_cfg, side, p_controller, orders)
    return DualResult("forward", diff is None, diff, s.bodies)


def backward(
    fn: Callable[..., Any] | str,
    params: dict[str, Any] | None = None,
    *,
    nodes: int = 2,
    threads: int = 1,
    seed: int = 0,
    recorder: engine.Recorder | None = None,
    parallel: str = "in-process",
    timeout: float | None = None,
    mpi_trace: tuple[str, str] | None = None,
) -> DualResult:
    """Parallel run in test mode, then a serial run over its loop-index orders.

    ``fn``, ``parallel``, ``timeout``, ``recorder`` and ``mpi_trace`` as for
    :func:`forward`; the recorded parallel run is ``Ptrace``.
    """
    driver, params, side, record = _sides(
        fn,
        params,
        nodes=nodes,
        threads=threads,
        seed=seed,
        parallel=parallel,
        recorder=recorder,
        mpi_trace=mpi_trace,
        timeout=timeout,
    )
    try:
        with stage("backward: parallel run"):
            p = side.run(None, record)
    except engine.ReplicaMismatchError as exc:
        return DualResult("backward", False, exc.as_dict())

    def recorded(op: str, invocation: int, start: int, n: int) -> np.ndarray:
        got = p.orders.get((op, invocation))
        if got is None:
            raise not_in_trace(op, invocation, "parallel")
        return got

    s_cfg: dict[str, Any] = {
        "nodes": 1,
        "threads": 1,
        "seed": seed,
        "controller": Serial(recorded, p.body_orders, sync_shape=(nodes, threads)),
    }
    try:
        with stage("backward: serial run", _invocations(p)):
            s = _run(driver, params, **s_cfg)
    except _VERDICTS as exc:
        return DualResult("backward", False, exc.as_dict())
    diff = _first_difference(s, p)
    if diff is not None:
        replayed = Replayed(p.orders, p.body_orders)
        diff = _localise(diff, driver, params, s_cfg, side, replayed, recorded)
    return DualResult("backward", diff is None, diff, p.bodies)


def dual(
    fn: Callable[..., Any] | str,
    params: dict[str, Any] | None = None,
    *,
    nodes: int = 2,
    threads: int = 1,
    seed: int = 0,
    order: str = "identity",
    order_seed: int = 0,
    direction: str = "both",
    recorder: engine.Recorder | None = None,
    parallel: str = "in-process",
    timeout: float | None = None,
    mpi_trace: tuple[str, str] | None = None,
) -> dict[str, DualResult]:
    """Run the forward and/or backward test; returns {direction: result}.

    ``recorder`` (in-process) or ``mpi_trace`` (MPI) records one parallel run: the
    backward one when it runs, else the forward one.  ``parallel`` and ``timeout``
    as for :func:`forward`.
    """
    if direction not in ("forward", "backward", "both"):
        raise ValueError(f"direction must be forward, backward or both, got {direction!r}")
    if parallel not in PARALLEL:
        raise ValueError(f"parallel must be 'in-process' or 'mpi', got {parallel!r}")
    common: dict[str, Any] = {
        "nodes": nodes,
        "threads": threads,
        "seed": seed,
        "parallel": parallel,
        "timeout": timeout,
    }
    out: dict[str, DualResult] = {}
    if direction in ("forward", "both"):
        last = direction == "forward"
        out["forward"] = forward(
            fn,
            params,
            **common,
            order=order,
            order_seed=order_seed,
            recorder=recorder if last else None,
            mpi_trace=mpi_trace if last else None,
        )
    if direction in ("backward", "both"):
        out["backward"] = backward(fn, params, **common, recorder=recorder, mpi_trace=mpi_trace)
    return out


def assert_dual(
    fn: Callable[..., Any] | str, params: dict[str, Any] | None = None, **kw: Any
) -> None:
    """``dual(...)`` that raises AssertionError with the divergence report on failure."""
    results = dual(fn, params, **kw)
    failed = [r.report() for r in results.values() if not r.passed]
    if failed:
        raise AssertionError("\n".join(failed))


__all__ = ["DualResult", "OrderSource", "Outcome", "assert_dual", "backward", "dual", "forward"]
