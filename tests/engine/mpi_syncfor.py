"""sync_for programs and their plain-numpy BSP reference; run under mpiexec as a script.

``python mpi_syncfor.py THREADS`` on P ranks checks, for BSP, SSP and Hybrid, that the
MPI run finishes with coherent replicas, that BSP (and SSP with staleness 0) equals
both the in-process cluster and the numpy reference bitwise, and that the SSP bound
held on every clock of every rank.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import engine as ap

NAME = "sgd"
LR, LAM = 0.05, 0.01


def make_data(seed: int, n: int, n_w: int, n_h: int) -> np.ndarray:
    """Rows (a, b, rating): each element touches one row of W and one of H."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, n_w, n)
    b = rng.integers(0, n_h, n)
    return np.stack([a, b, rng.normal(3.0, 1.0, n)], axis=1).astype(np.float64)


def sgd_rows(values: np.ndarray, W: Any, H: Any, noise: float) -> None:
    """The body's arithmetic, for DDS (in sync_for) and numpy arrays (reference) alike."""
    for row in values:
        a, b, r = int(row[0]), int(row[1]), float(row[2])
        w, h = np.array(W[a]), np.array(H[b])
        err = r - w @ h + noise
        W[a] = w + LR * (err * h - LAM * w)
        H[b] = h + LR * (err * w - LAM * h)


def body_rng(seed: int, op: str, invocation: int, minibatch: int) -> np.random.Generator:
    """What ``engine.rng()`` gives minibatch ``minibatch`` of ``op#invocation``."""
    key = hashlib.blake2b(f"{op}#{invocation}".encode(), digest_size=8).digest()
    return np.random.Generator(
        np.random.Philox(
            key=[seed & (2**64 - 1), int.from_bytes(key, "little")], counter=[minibatch, 0, 0, 0]
        )
    )


def program(
    *,
    sync: str = "bsp",
    re: bool = True,
    staleness: int = 2,
    minibatch: int = 4,
    per_clock: int = 1,
    invocations: int = 2,
    n: int = 120,
    shape: tuple[int, int] = (20, 28),
    agg: Callable[[np.ndarray], np.ndarray] | None = None,
    slow_node: int | None = None,
) -> Callable[[], dict[str, Any]]:
    """A driver for ``ap.run``: sparse SGD over ``n`` elements with sync_for."""
    data = make_data(7, n, *shape)

    def prog() -> dict[str, Any]:
        D = ap.dvector(n, shape=(3,), data=data, name="D")
        W = ap.dvector(shape[0], shape=(4,), init=ap.init.normal(0.3, 0.1), name="W")
        H = ap.dvector(shape[1], shape=(4,), init=ap.init.normal(0.3, 0.1), name="H")
        if agg is not None:
            ap.register_aggregation(W, agg)
        init = (W.gather(), H.gather())

        def body(batch: ap.Batch) -> None:
            if slow_node is not None and ap.current().current_node == slow_node:
                time.sleep(0.002)
            sgd_rows(batch.values, W, H, float(ap.rng().normal(0.0, 1e-3)))

        for _ in range(invocations):
            ap.sync_for(
                D,
                minibatch,
                body,
                sync=sync,
                staleness=staleness,
                re=re,
                per_clock=per_clock,
                name=NAME,
            )
        local = [np.array_equal(W._bufs[p], W.gather()) for p in W._bufs]
        local += [np.array_equal(H._bufs[p], H.gather()) for p in H._bufs]
        return {
            "init": init,
            "W": W.gather(),
            "H": H.gather(),
            "coherent": all(local),
            "planner": dict(ap.current().planner[NAME]),
        }

    return prog


def bsp_reference(
    init: tuple[np.ndarray, np.ndarray],
    *,
    nodes: int,
    threads: int,
    seed: int = 0,
    minibatch: int = 4,
    per_clock: int = 1,
    invocations: int = 2,
    n: int = 120,
    shape: tuple[int, int] = (20, 28),
    agg: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The same BSP semantics as plain numpy: per worker a full copy, deltas summed in
    thread order per node, nodes summed in node order, divided by the nodes that ran a
    minibatch (or ``agg`` on the (node, thread)-ordered stack) and added."""
    data = make_data(7, n, *shape)
    params = [init[0].copy(), init[1].copy()]
    M = -(-n // minibatch)
    per = nodes * threads * per_clock
    for inv in range(invocations):
        for c in range(-(-M // per)):
            node_sums, stacks, active = [], [], 0
            for p in range(nodes):
                before = len(stacks)
                node_sum = [np.zeros_like(x) for x in params]
                for t in range(threads):
                    lo = c * per + (p * threads + t) * per_clock
                    ms = range(lo, min(lo + per_clock, M))
                    if not len(ms):
                        continue
                    cache = [x.copy() for x in params]
                    for m in ms:
                        noise = float(body_rng(seed, NAME, inv, m).normal(0.0, 1e-3))
                        sgd_rows(data[m * minibatch : (m + 1) * minibatch], *cache, noise)
                    delta = [cx - x for cx, x in zip(cache, params, strict=True)]
                    stacks.append(delta)
                    for s, dx in zip(node_sum, delta, strict=True):
                        s += dx
                node_sums.append(node_sum)
                active += len(stacks) > before
            for i, x in enumerate(params):
                if agg is not None and i == 0:
                    x += agg(np.stack([s[0] for s in stacks]))
                    continue
                total = np.zeros_like(x)
                for ns in node_sums:
                    total += ns[i]
                x += total / active
    return params[0], params[1]


def weighted(deltas: np.ndarray) -> np.ndarray:
    """An order-sensitive aggregation: worker i's delta weighs 1/(1+i)."""
    out = np.zeros(deltas.shape[1:])
    for i, d in enumerate(deltas):
        out = out + d / (1.0 + i)
    return out


class VisibilityLog(ap.Recorder):
    """Keeps what sync_for reports about SSP visibility and aggregation order."""

    def __init__(self) -> None:
        self.visibility: list[tuple[int, int, np.ndarray]] = []
        self.arrivals: list[tuple[int, int, np.ndarray]] = []
        self.bodies: list[tuple[int, int, np.ndarray, np.ndarray]] = []

    def ssp_visibility(self, op, invocation, node, clock, applied) -> None:  # noqa: ANN001
        self.visibility.append((node, clock, applied.copy()))

    def aggregation_order(self, op, invocation, node, clock, sources) -> None:  # noqa: ANN001
        self.arrivals.append((node, clock, sources.copy()))

    def body_order(self, op, invocation, node, clock, threads, minibatches) -> None:  # noqa: ANN001
        self.bodies.append((node, clock, threads.copy(), minibatches.copy()))


def stale_clocks(log: VisibilityLog, staleness: int) -> tuple[int, int]:
    """(violations of the SSP bound, clocks that ran with an update missing)."""
    bad = sum(int(a.min()) < c - staleness - 1 for _, c, a in log.visibility)
    stale = sum(int(a.min()) < c - 1 for _, c, a in log.visibility)
    return bad, stale


def case(comm: Any, threads: int) -> int:
    """Rank 0 prints ``ranks=P threads=T OK|FAIL ...``; the exit status."""
    P, rank = comm.Get_size(), comm.Get_rank()
    fails: list[str] = []

    def check(ok: bool, what: str) -> None:
        if not ok:
            fails.append(what)

    for label, kw in [("bsp", {}), ("bsp-re0", {"re": False}), ("bsp-agg", {"agg": weighted})]:
        mpi = ap.run(program(**kw), comm=comm, threads=threads).value
        here = ap.run(program(**kw), nodes=P, threads=threads).value
        ref = bsp_reference(here["init"], nodes=P, threads=threads, agg=kw.get("agg"))
        check(mpi["coherent"], f"{label}: replicas differ")
        check(np.array_equal(mpi["W"], here["W"]), f"{label}: MPI != in-process (W)")
        check(np.array_equal(mpi["H"], here["H"]), f"{label}: MPI != in-process (H)")
        check(np.array_equal(mpi["W"], ref[0]), f"{label}: MPI != numpy reference (W)")
        check(np.array_equal(mpi["H"], ref[1]), f"{label}: MPI != numpy reference (H)")
    bsp = ap.run(program(), comm=comm, threads=threads).value

    ssp0 = ap.run(program(sync="ssp", staleness=0), comm=comm, threads=threads).value
    check(np.array_equal(ssp0["W"], bsp["W"]), "ssp staleness=0 != bsp")
    log = VisibilityLog()
    ssp = ap.run(
        program(sync="ssp", staleness=2, slow_node=0), comm=comm, threads=threads, recorder=log
    ).value
    check(ssp["coherent"], "ssp: replicas differ")
    bad, stale = stale_clocks(log, 2)
    bad = comm.allreduce(bad)
    stale = comm.allreduce(stale)
    check(bad == 0, f"ssp: {bad} clocks broke the staleness bound")
    hyb = ap.run(program(sync="hybrid", invocations=3), comm=comm, threads=threads).value
    check(hyb["coherent"], "hybrid: replicas differ")
    check(bool(np.isfinite(hyb["W"]).all()), "hybrid: not finite")
    fails = sum(comm.allgather(fails), [])
    if rank == 0:
        status = "OK" if not fails else "FAIL " + "; ".join(fails)
        print(f"ranks={P} threads={threads} {status} stale_clocks={stale}", flush=True)
    return 1 if fails else 0


def main() -> int:
    from mpi4py import MPI

    return case(MPI.COMM_WORLD, int(sys.argv[1]))


if __name__ == "__main__":
    sys.exit(main())
