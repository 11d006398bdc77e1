"""The two sides of a dual test: the serial run in this process, and the parallel run in
this process (an in-process cluster) or under ``mpiexec`` (``replay._dualjob``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import engine

from ._dualctl import Capture, Outcome, Steering, Tap, comparable, outcome_of
from ._dualjob import MpiSide, importable_target
from ._progress import phase_reporter

#: Where the parallel side of a dual test may run.
PARALLEL = ("in-process", "mpi")


def run_side(
    fn: Callable[..., Any],
    params: dict[str, Any],
    *,
    nodes: int,
    threads: int,
    seed: int,
    controller: Steering | None = None,
    recorder: engine.Recorder | None = None,
) -> Outcome:
    capture = Capture(recorder)
    res = engine.run(
        fn,
        params,
        nodes=nodes,
        threads=threads,
        seed=seed,
        schedules=controller,
        hooks=controller,
        recorder=capture,
        test_mode=True,
        phases=phase_reporter(),  # to the dual test's stage, when someone listens
    )
    out = outcome_of(res, capture.body_orders)
    out.fallbacks = list(capture.fallbacks)
    return out


def tap_side(
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
            schedules=tap,
            hooks=tap,
            test_mode=True,
        )
    except Tap.Stop:
        pass
    return tap


class InProcessSide:
    """The parallel side as an in-process cluster (its nodes share every Python object)."""

    kind = "in-process"

    def __init__(
        self, fn: Callable[..., Any], params: dict[str, Any], nodes: int, threads: int, seed: int
    ) -> None:
        self.fn, self.params = fn, params
        self.cfg = {"nodes": nodes, "threads": threads, "seed": seed}

    def run(self, controller: Steering | None, recorder: engine.Recorder | None = None) -> Outcome:
        return run_side(self.fn, self.params, **self.cfg, controller=controller, recorder=recorder)

    def snapshot(
        self, controller: Steering | None, op: str, invocation: int, dds: str
    ) -> np.ndarray | None:
        tap = tap_side(self.fn, self.params, dict(self.cfg, controller=controller), op, invocation)
        snap = tap.snapshot.get(dds)
        return None if snap is None else comparable(snap)


class MpiParallelSide:
    """The parallel side under ``mpiexec`` (``replay._dualjob``), one node per rank."""

    kind = "mpi"

    def __init__(self, side: MpiSide, trace: tuple[str, str] | None) -> None:
        self.side, self.trace = side, trace

    def run(self, controller: Steering | None, recorder: Any = None) -> Outcome:
        return self.side.run(controller, self.trace if recorder is not None else None)

    def snapshot(
        self, controller: Steering | None, op: str, invocation: int, dds: str
    ) -> np.ndarray | None:
        return self.side.snapshot(controller, op, invocation, dds)


def make_sides(
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
) -> tuple[Callable[..., Any], dict[str, Any], InProcessSide | MpiParallelSide, Any]:
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
        return driver, params, InProcessSide(driver, params, nodes, threads, seed), recorder
    if recorder is not None:
        raise ValueError(
            "a recorder object cannot follow the parallel side into MPI ranks; "
            "pass mpi_trace=(path, run_id) to record it with parallel='mpi'"
        )
    side = MpiSide(
        importable_target(fn), params, ranks=nodes, threads=threads, seed=seed, timeout=timeout
    )
    return driver, params, MpiParallelSide(side, mpi_trace), mpi_trace


def invocations_of(o: Outcome) -> int:
    """How many invocations ``o``'s run completed (the other side's progress total)."""
    return len({(d["op"], d["invocation"]) for d in o.digests})


__all__ = [
    "PARALLEL",
    "InProcessSide",
    "MpiParallelSide",
    "invocations_of",
    "make_sides",
    "run_side",
    "tap_side",
]
