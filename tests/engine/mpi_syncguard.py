"""sync_for programs whose rows reconnaissance cannot predict, and a hand-written serial
simulation of their BSP semantics; run under mpiexec as a script.

Three kinds of body, each touching rows reconnaissance may not have seen:

* ``rng``: rows drawn from ``ap.rng()`` (negative sampling): new rows every invocation;
* ``value``: the row written depends on a parameter value that changes every clock,
  so even a reconnaissance of the same invocation is wrong (the whole fallback);
* ``flag``: a flag the driver flips after the first epoch sends the writes to other
  rows and to a DDS (``G``) that was never written before.

``python mpi_syncguard.py THREADS`` on P ranks checks every kind under BSP against the
in-process cluster and the simulation, that ``replan="never"`` raises the same error
on every rank (no rank hangs), and the aggregation arithmetic on fixed counts.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from mpi_syncfor import body_rng

import engine as ap

R = 8  # rows of E and G
N = 12  # data records (minibatch 1: 12 minibatches)
OP = "guarded"
KINDS = ("rng", "value", "flag")


def step(kind: str, m: int, E: Any, G: Any, flag: bool, rng: np.random.Generator) -> None:
    """One minibatch's body, on DDS (sync_for) or numpy arrays (simulation) alike."""
    if kind == "rng":
        E[int(rng.integers(R))] += 1.0
        E[int(rng.integers(R))] += 0.5
    elif kind == "value":
        k = 1 + int(E[0]) % (R - 1)
        E[k] += 1.0
        E[0] += 1.0
    elif flag:
        G[m % R] += 1.0
        E[(m + 3) % R] += 2.0
    else:
        E[m % R] += 1.0


def program(
    kind: str,
    *,
    sync: str = "bsp",
    epochs: int = 3,
    replan: str = "auto",
    per_clock: int = 1,
) -> Any:
    """A driver for ``ap.run``: ``epochs`` invocations of the ``kind`` body."""

    def prog() -> dict[str, Any]:
        D = ap.dvector(N, shape=(1,), name="D")
        E = ap.dvector(R, shape=(), name="E")
        G = ap.dvector(R, shape=(), name="G")
        F = ap.dvector(1, shape=(), name="F")

        def body(batch: ap.Batch) -> None:
            step(kind, batch.number, E, G, bool(F[0] > 0), ap.rng())

        totals = []
        for epoch in range(epochs):
            F[0] = 1.0 if epoch >= 1 else 0.0
            ap.sync_for(D, 1, body, sync=sync, replan=replan, per_clock=per_clock, name=OP)
            totals.append(float(E.gather().sum() + G.gather().sum()))
        coherent = all(np.array_equal(X._bufs[p], X.gather()) for X in (E, G) for p in X._bufs)
        return {
            "E": E.gather(),
            "G": G.gather(),
            "totals": totals,
            "coherent": coherent,
            "planner": dict(ap.current().planner[OP]),
        }

    return prog


def simulate(
    kind: str, *, nodes: int, threads: int, epochs: int = 3, seed: int = 0, per_clock: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """BSP ``sync_for`` from its definition: per clock every worker runs its minibatches
    on a copy of the parameters; a node's delta is the sum of its threads' deltas; the
    nodes' deltas are summed in node order and divided by the nodes that ran."""
    E, G = np.zeros(R), np.zeros(R)
    per = nodes * threads * per_clock
    for inv in range(epochs):
        flag = inv >= 1
        for c in range(-(-N // per)):
            total = [np.zeros(R), np.zeros(R)]
            ran = 0
            for p in range(nodes):
                node = [np.zeros(R), np.zeros(R)]
                did = False
                for t in range(threads):
                    lo = c * per + (p * threads + t) * per_clock
                    ms = range(lo, min(lo + per_clock, N))
                    if not len(ms):
                        continue
                    did = True
                    e, g = E.copy(), G.copy()
                    for m in ms:
                        step(kind, m, e, g, flag, body_rng(seed, OP, inv, m))
                    node[0] += e - E
                    node[1] += g - G
                ran += did
                total[0] += node[0]
                total[1] += node[1]
            E = E + total[0] / ran
            G = G + total[1] / ran
    return E, G


def counts_program(n: int) -> Any:
    """Aggregation arithmetic: minibatch m adds 1 to X[0] and 3 to Y[m]."""

    def prog() -> tuple[np.ndarray, np.ndarray]:
        D = ap.dvector(n, shape=(1,), name="D")
        X = ap.dvector(1, shape=(), name="X")
        Y = ap.dvector(n, shape=(), name="Y")

        def body(batch: ap.Batch) -> None:
            X[0] += 1.0
            Y[batch.number] += 3.0

        ap.sync_for(D, 1, body, name="counts")
        return X.gather(), Y.gather()

    return prog


def case(comm: Any, threads: int) -> int:
    """Rank 0 prints ``ranks=P threads=T OK|FAIL ...``; the exit status."""
    P, rank = comm.Get_size(), comm.Get_rank()
    fails: list[str] = []

    def check(ok: bool, what: str) -> None:
        if not ok:
            fails.append(what)

    for kind in KINDS:
        mpi = ap.run(program(kind), comm=comm, threads=threads).value
        here = ap.run(program(kind), nodes=P, threads=threads).value
        e, g = simulate(kind, nodes=P, threads=threads)
        check(mpi["coherent"], f"{kind}: replicas differ")
        check(np.array_equal(mpi["E"], here["E"]), f"{kind}: MPI != in-process (E)")
        check(np.array_equal(mpi["G"], here["G"]), f"{kind}: MPI != in-process (G)")
        check(np.allclose(mpi["E"], e, rtol=0, atol=1e-12), f"{kind}: MPI != simulation (E)")
        check(np.allclose(mpi["G"], g, rtol=0, atol=1e-12), f"{kind}: MPI != simulation (G)")
        check(mpi["planner"]["replans"] >= 1, f"{kind}: no re-plan counted")
    try:
        ap.run(program("rng", replan="never"), comm=comm, threads=threads)
        check(False, "never: no error")
    except ap.AccessOutsideReconError as exc:
        check(getattr(exc, "invocation", None) == 1, f"never: wrong invocation in {exc}")
        check("'guarded'" in str(exc) and "E[" in str(exc), f"never: vague message {exc}")
    x, y = ap.run(counts_program(14), comm=comm, threads=threads).value
    # 3 nodes x 2 threads: clocks of 6, 6 and 2 minibatches (the last one on node 0 only)
    if (P, threads) == (3, 2):
        check(x.tolist() == [6.0], f"counts: X = {x.tolist()}, expected [6.0]")
        check(y.tolist() == [1.0] * 12 + [3.0, 3.0], f"counts: Y = {y.tolist()}")
    fails = sum(comm.allgather(fails), [])
    if rank == 0:
        status = "OK" if not fails else "FAIL " + "; ".join(fails)
        print(f"ranks={P} threads={threads} {status}", flush=True)
    return 1 if fails else 0


def main() -> int:
    from mpi4py import MPI

    return case(MPI.COMM_WORLD, int(sys.argv[1]))


if __name__ == "__main__":
    sys.exit(main())
