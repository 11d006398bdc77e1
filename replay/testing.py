"""Discrepancy-free dual tests: prove a parallel program equal to its serial version.

*Forward*: a serial run (one node, one thread, a plain loop over a given order —
the identity or a seeded permutation) gives ``Strace`` and ``Sbaseout``; a parallel
run in test mode plans wavefront rounds equivalent to ``Strace`` and its outcome
must equal ``Sbaseout`` exactly.  *Backward*: a parallel run in test mode gives
``Ptrace`` and ``Pbaseout``; a serial run executes the bodies in ``Ptrace`` order and
must give ``Pbaseout`` exactly.  The outcome is every per-invocation DDS digest and
every logged objective.

For ``sync_for`` the serial side runs the synchronous semantics of the same P × T
workers one worker at a time (its schedule values say ``workers=(P, T)``, and the
engine runs its serial definition, written apart from the distributed code), with aggregation in node, thread order and Hybrid bodies in
the recorded order; test mode turns SSP staleness off.  Test mode also runs relaxed DDS
exactly, so a verdict names what it did not test as declared (``DualResult.not_tested``,
said in :meth:`DualResult.report`): check such a program's property under the real
execution with ``replay chaos APP --check 'objective:NAME<=VALUE'``.

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
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import engine

from ._dualctl import (
    Outcome,
    Replayed,
    Serial,
    Steering,
    Wavefront,
    not_in_trace,
)
from ._dualdiff import first_difference, localise
from ._dualsides import PARALLEL, invocations_of, make_sides, run_side
from ._progress import stage
from ._untested import UntestedWarning, not_tested, phrase

#: Errors of a test-mode run that are a dual test's FAIL verdict, not a crash: the
#: program is not deterministic, or a replica missed a write.
_VERDICTS = (engine.DivergenceError, engine.ReplicaMismatchError)


@dataclass
class DualResult:
    """The verdict of one direction; ``divergence`` locates the first difference."""

    direction: str
    passed: bool
    divergence: dict[str, Any] | None
    bodies: int = 0
    #: the backward test's parallel run (its digests and objectives), when it completed
    parallel: Outcome | None = field(default=None, repr=False, compare=False)
    #: what the runs did not test as the program declared it: relaxed DDS run exactly,
    #: SSP operators run as BSP (``{"kind", "name", "tested_as"[, "staleness"]}``)
    not_tested: list[dict[str, Any]] = field(default_factory=list)
    #: the names of the objectives the runs logged (for the advice on what to check)
    objectives: list[str] = field(default_factory=list, repr=False, compare=False)
    #: the invocations (``op#inv``) the parallel side ran as a serial fallback (both its
    #: plans failed): compared, but not run in parallel
    serial_fallbacks: list[str] = field(default_factory=list)

    def report(self) -> str:
        """One paragraph saying what diverged where, with both values, and what the
        test did not test as declared."""
        untested = "; ".join(
            x for x in (phrase(self.not_tested), fallback_phrase(self.serial_fallbacks)) if x
        )
        if self.passed:
            extra = f"; {untested}" if untested else ""
            return f"{self.direction}: PASS ({self.bodies} bodies compared{extra})"
        return self._failure() + (f" ({untested})" if untested else "")

    def _failure(self) -> str:
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
        """The JSON form (``{"passed", "divergence", "not_tested"}``)."""
        return {
            "passed": self.passed,
            "divergence": self.divergence,
            "not_tested": self.not_tested,
            "serial_fallbacks": self.serial_fallbacks,
        }


def _verdict(
    direction: str,
    passed: bool,
    divergence: dict[str, Any] | None,
    *sides: Outcome | None,
    par: Outcome | None = None,
    **kw: Any,
) -> DualResult:
    """A :class:`DualResult` naming what the completed ``sides`` ran exactly, and which
    invocations the completed parallel side ``par`` ran as a serial fallback."""
    done = [o for o in sides if o is not None]
    return DualResult(
        direction,
        passed,
        divergence,
        not_tested=not_tested(*(o.ran_exact for o in done)),
        objectives=list(dict.fromkeys(k for o in done for k in o.objectives)),
        serial_fallbacks=list(par.fallbacks) if par is not None else [],
        **kw,
    )


def fallback_phrase(fallbacks: list[str]) -> str:
    """``sgd#0 ran as a serial fallback, not in parallel`` ("" for none)."""
    if not fallbacks:
        return ""
    shown = ", ".join(fallbacks[:4]) + (
        f" and {len(fallbacks) - 4} more" if len(fallbacks) > 4 else ""
    )
    verb = "ran" if len(fallbacks) == 1 else "each ran"
    return f"{shown} {verb} as a serial fallback (both plans failed), not in parallel"


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
    driver, params, side, record = make_sides(
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
        s = run_side(driver, params, **s_cfg)
    serial.body_orders = s.body_orders  # localisation re-runs follow the same choices
    p_controller = Wavefront(s.orders, threads, s.body_orders)
    try:
        with stage("forward: parallel run", invocations_of(s)):
            p = side.run(p_controller, record)
    except _VERDICTS as exc:
        return _verdict("forward", False, exc.as_dict(), s)
    diff = first_difference(s, p)
    if diff is not None:
        diff = localise(diff, driver, params, s_cfg, side, p_controller, orders)
    return _verdict("forward", diff is None, diff, s, p, par=p, bodies=s.bodies)


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
    controller: Steering | None = None,
) -> DualResult:
    """Parallel run in test mode, then a serial run over its loop-index orders.

    ``fn``, ``parallel``, ``timeout``, ``recorder`` and ``mpi_trace`` as for
    :func:`forward`; the recorded parallel run is ``Ptrace``.  ``controller`` steers
    the parallel run in process (chaos mode: ``replay.chaos``); default: free.
    """
    driver, params, side, record = make_sides(
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
            p = side.run(controller, record)
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
        with stage("backward: serial run", invocations_of(p)):
            s = run_side(driver, params, **s_cfg)
    except _VERDICTS as exc:
        return _verdict("backward", False, exc.as_dict(), p, par=p, parallel=p)
    diff = first_difference(s, p)
    if diff is not None:
        replayed = Replayed(p.orders, p.body_orders)
        diff = localise(diff, driver, params, s_cfg, side, replayed, recorded)
    return _verdict("backward", diff is None, diff, p, s, par=p, bodies=p.bodies, parallel=p)


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
    """``dual(...)`` that raises AssertionError with the divergence report on failure,
    and warns (:class:`UntestedWarning`) when a pass ran relaxed DDS or SSP exactly."""
    results = dual(fn, params, **kw)
    failed = [r.report() for r in results.values() if not r.passed]
    if failed:
        raise AssertionError("\n".join(failed))
    warn_untested(results.values())


def warn_untested(results: Any, where: str = "") -> None:
    """Warn (:class:`UntestedWarning`) once with what passing ``results`` did not test."""
    import warnings

    untested = not_tested(*(r.not_tested for r in results))
    if untested:
        warnings.warn(
            UntestedWarning(
                f"dual test{where} passed with {phrase(untested)}; check a property under "
                "the real execution: replay chaos APP --check 'objective:NAME<=VALUE'"
            ),
            stacklevel=3,
        )


__all__ = [
    "DualResult",
    "OrderSource",
    "Outcome",
    "UntestedWarning",
    "assert_dual",
    "backward",
    "dual",
    "forward",
    "warn_untested",
]
