"""The sync_for programs whose results routing must not change (issue 35 item 5), and
an MPI case that runs the deterministic ones on the ranks of a communicator.

``tests/engine/test_syncfor_routing.py`` pins their fingerprints; ``case(comm)`` returns
the fingerprints of the BSP and single-threaded Hybrid programs for ``comm``'s size,
which must equal the in-process ones (``drive_mpi`` routes as ``drive_in_process``).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import engine as ap
from engine._syncfor.drive import SeededDelays, use_delays

sys.path.insert(0, str(Path(__file__).parent))
from mpi_syncfor import program  # noqa: E402


def _regression(sync: str, epochs: int = 3) -> Callable[[], Any]:
    """Least squares: one parameter row every minibatch reads and writes."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(240, 5))
    rows = np.hstack([X, (X @ rng.normal(size=5))[:, None]])

    def prog() -> Any:
        D = ap.dvector(len(rows), shape=(6,), data=rows, name="D")
        w = ap.dvector(1, shape=(5,), name="w")

        def body(batch: ap.Batch) -> None:
            x, y = batch.values[:, :5], batch.values[:, 5]
            cur = w[0]
            w[0] = cur - 0.1 * x.T @ (x @ cur - y) / len(y)

        for _ in range(epochs):
            ap.sync_for(D, 8, body, sync=sync, name="ls")
        return {"w": w.gather()}

    return prog


def _mlr(sync: str) -> Callable[[], Any]:
    from apps.mlr._app import train

    # averaged, as when these fingerprints were pinned (before MLR summed its deltas)
    return lambda: train(epochs=2, sync=sync, synthetic=True, aggregate="average")


def _sparse(sync: str) -> Callable[[], Any]:
    """Pairs of embedding rows: most rows are read by few nodes in few clocks."""
    rng = np.random.default_rng(0)
    pairs = rng.integers(0, 300, (400, 2))
    data = np.hstack([pairs, rng.integers(0, 2, (400, 1))]).astype(np.float64)

    def prog() -> Any:
        D = ap.dvector(len(data), shape=(3,), data=data, name="pairs")
        E = ap.dvector(300, shape=(4,), init=ap.init.normal(0, 0.1), name="E")

        def body(batch: ap.Batch) -> None:
            for row in batch.values:
                i, j, y = int(row[0]), int(row[1]), row[2]
                a, b = E[i], E[j]
                g = 1.0 / (1.0 + np.exp(-a @ b)) - y
                E[i] = a - 0.1 * g * b
                E[j] = b - 0.1 * g * a

        for _ in range(2):
            ap.sync_for(D, 8, body, sync=sync, staleness=1, name="sparse")
        return {"E": E.gather()}

    return prog


def _programs() -> dict[str, tuple[Callable[[], Any], dict[str, Any], Any]]:
    """name -> (driver, ``ap.run`` options, delay model or None)."""
    out: dict[str, tuple[Callable[[], Any], dict[str, Any], Any]] = {}
    for P in (1, 2, 3, 8):
        for sync in ("bsp", "ssp", "hybrid"):
            out[f"sgd-{sync}-p{P}"] = (program(sync=sync), {"nodes": P}, None)
            out[f"ls-{sync}-p{P}"] = (_regression(sync), {"nodes": P}, None)
            out[f"mlr-{sync}-p{P}"] = (_mlr(sync), {"nodes": P}, None)
            out[f"sparse-{sync}-p{P}"] = (_sparse(sync), {"nodes": P}, None)
        out[f"sgd-ssp-delays-p{P}"] = (
            program(sync="ssp", staleness=2),
            {"nodes": P},
            SeededDelays(9, slow={P - 1: 2.5}),
        )
        out[f"sparse-ssp-delays-p{P}"] = (
            _sparse("ssp"),
            {"nodes": P},
            SeededDelays(7, compute=(0.2, 3.0), latency=(0.0, 1.0), slow={0: 3.0}),
        )
    for P in (2, 3):
        out[f"sgd-bsp-t2-p{P}"] = (program(per_clock=2), {"nodes": P, "threads": 2}, None)
        out[f"sgd-hybrid-t2-p{P}"] = (program(sync="hybrid"), {"nodes": P, "threads": 2}, None)
        out[f"sgd-whole-p{P}"] = (program(re=False), {"nodes": P}, None)
        out[f"mlr-ssp-t2-p{P}"] = (_mlr("ssp"), {"nodes": P, "threads": 2}, None)
    return out


PROGRAMS = _programs()


def fingerprint(name: str, comm: Any = None) -> str:
    """Digests of every invocation, objectives and final values of program ``name`` (on
    the ranks of ``comm`` instead of in-process nodes, when given)."""
    fn, opts, delays = PROGRAMS[name]
    if comm is not None:
        opts = {k: v for k, v in opts.items() if k != "nodes"}
        res = ap.run(fn, comm=comm, **opts)
    elif delays is None:
        res = ap.run(fn, **opts)
    else:
        with use_delays(delays):
            res = ap.run(fn, **opts)
    h = hashlib.sha256(json.dumps([res.digests, res.objectives], sort_keys=True).encode())
    value = res.value or {}
    for key in ("W", "H", "w", "E"):
        if key in value:
            h.update(np.ascontiguousarray(value[key]).tobytes())
    if "coherent" in value:
        h.update(str(value["coherent"]).encode())
    return h.hexdigest()[:24]


def mpi_names(ranks: int) -> list[str]:
    """The programs whose result does not depend on timing, at ``ranks`` nodes."""
    return [
        n
        for n, (_, opts, delays) in PROGRAMS.items()
        if opts["nodes"] == ranks
        and delays is None
        and "-ssp" not in n
        and not ("-hybrid" in n and opts.get("threads", 1) > 1)
    ]


def case(comm: Any) -> dict[str, str]:
    """Fingerprints of :func:`mpi_names` on the ranks of ``comm`` (every rank returns them)."""
    return {n: fingerprint(n, comm) for n in mpi_names(comm.Get_size())}


def main() -> int:
    from mpi4py import MPI

    got = case(MPI.COMM_WORLD)
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps(got, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
