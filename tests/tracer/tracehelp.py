"""Helpers of the tracer tests: record small real traces from engine runs."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import engine as ap
import tracer


def toy_program(n: int = 240, epochs: int = 2, width: int = 4):
    """A loop where bodies share a few hot rows (so split groups take locks) and logs."""

    def program() -> None:
        X = ap.dvector(width, shape=(), init=ap.init.zeros(), name="X")
        Y = ap.dvector(n, shape=(), init=ap.init.zeros(), name="Y")

        def body(j: int) -> None:
            X[j % width] += 1.0
            Y[j] = X[j % width] * 0.5

        for it in range(epochs):
            ap.async_for(0, n, body, name="acc")
            ap.log_objective("total", float(it))

    return program


def record(
    path: Path,
    *,
    nodes: int = 2,
    threads: int = 3,
    n: int = 240,
    epochs: int = 2,
    run_id: str = "run-1",
    program: Any = None,
) -> ap.RunResult:
    """Record one in-process run of ``program`` (default: the toy loop) into ``path``."""
    meta = {"app": "toy", "params": {"n": n}, "ranks": nodes, "threads": threads, "seed": 0}
    tracer.start_run(path, run_id, meta)
    rec = tracer.TraceRecorder(path, run_id, range(nodes), True)
    try:
        res = ap.run(program or toy_program(n, epochs), nodes=nodes, threads=threads, recorder=rec)
    except BaseException as exc:
        rec.close("failed", repr(exc))
        raise
    rec.close("finished")
    return res


def digest(path: Path) -> str:
    """blake2b of a file's bytes (to check a file was not modified)."""
    return hashlib.blake2b(path.read_bytes()).hexdigest()
