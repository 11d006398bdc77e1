"""The async_for write-back as a ring: collectives and wall time, this tree against a
baseline revision, side by side in one run.

``python benchmarks/ring.py [--rev REV] [--ranks 3] [--delay 0.05] [--invocations 10]``
starts ``mpiexec -n RANKS`` on this tree and on ``git archive REV`` (default
:data:`BASELINE`, the last revision with a barrier per round),
each running a rotation SGD (one round per rank) in which one rank, a different one each
round, is late by DELAY seconds (in round r, the first body of node ``r % RANKS`` sleeps
first).  With a barrier per round every round waits for its late rank; with the ring a
rank waits only for the rows it receives.  Each side reports, per invocation after the
first (which plans): the wall seconds (median) and the collectives of the invocation
(the write-backs made ``rounds + 1`` of them before the ring, one after).  Prints one
JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import ENV, ROOT, extract_rev
from benchmarks._counting import Counting

#: the last revision with a barrier per round (main before the ring)
BASELINE = "e4091a0"


def rank_side(delay: float, invocations: int) -> None:
    """Under mpiexec: the delayed rotation SGD; rank 0 prints its figures as JSON."""
    # the engine of the tree on PYTHONPATH (this one or the baseline): not the repository put
    # first above, nor this directory (its engine.py is a benchmark, not the engine)
    sys.path.remove(str(ROOT))
    here = Path(__file__).parent.resolve()
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    import numpy as np
    from mpi4py import MPI

    import engine as ap

    world = MPI.COMM_WORLD
    counts = [0]
    rng = np.random.default_rng(3)
    n, rows = 3000, 60
    users, items = rng.integers(0, rows, n), rng.integers(0, rows, n)

    def prog() -> dict[str, Any]:
        W = ap.dvector(rows, shape=(8,), init=ap.init.normal(0.3, 0.1), name="W")
        H = ap.dvector(rows, shape=(8,), init=ap.init.normal(0.3, 0.1), name="H")
        # seconds the body of index j sleeps first: the same on every rank (a DDS the
        # driver writes), so every rank's bodies and plan stay what they were
        late = ap.dvector(n, shape=(), init=ap.init.zeros(), name="late")

        def body(j: int) -> None:
            pause = late[j]
            if pause > 0:
                time.sleep(pause)
            w, h = W[users[j]], H[items[j]]
            err = 3.0 - w @ h
            W[users[j]] = w + 0.01 * (err * h - 0.05 * w)
            H[items[j]] = h + 0.01 * (err * w - 0.05 * h)

        seconds, every = [], []
        for k in range(invocations):
            world.Barrier()
            c0, t0 = counts[0], time.perf_counter()
            ap.async_for(0, n, body, name="sgd", strategy="rotation")
            seconds.append(time.perf_counter() - t0)
            every.append(counts[0] - c0)
            if k == 0:  # round r: the first body of node r % P is late
                plan = ap.plan_of("sgd")
                for r, per_node in enumerate(plan.rounds):
                    late[int(per_node[r % plan.nodes][0].indices[0])] = delay
        return {
            "rounds": len(ap.plan_of("sgd").rounds),
            "seconds": seconds[1:],
            "collectives": every[1:],
            "digest": hashlib.blake2b(W.gather().tobytes() + H.gather().tobytes()).hexdigest(),
        }

    out = ap.run(prog, comm=Counting(world, counts)).value
    if world.Get_rank() == 0:
        print(json.dumps(out), flush=True)


def side(tree: Path, ranks: int, delay: float, invocations: int) -> dict[str, Any]:
    """One tree's figures (mpiexec with ``PYTHONPATH`` on ``tree``)."""
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    cmd = [mpiexec, "-n", str(ranks), sys.executable, __file__, "--rank-side"]
    cmd += ["--delay", str(delay), "--invocations", str(invocations)]
    env = dict(ENV, PYTHONPATH=str(tree))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tree)
    if proc.returncode != 0:
        raise SystemExit(f"ring benchmark failed on {tree}:\n{proc.stderr[-3000:]}")
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    secs = got.pop("seconds")
    got["seconds_per_invocation"] = round(statistics.median(secs), 4)
    got["collectives_per_invocation"] = statistics.median(got.pop("collectives"))
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default=BASELINE, help=f"baseline git revision (default {BASELINE})")
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--delay", type=float, default=0.05, help="seconds a late rank is late")
    ap.add_argument("--invocations", type=int, default=10)
    ap.add_argument("--rank-side", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_side:
        rank_side(args.delay, args.invocations)
        return
    with tempfile.TemporaryDirectory() as tmp:
        base = extract_rev(args.rev, Path(tmp))
        before = side(base, args.ranks, args.delay, args.invocations)
        after = side(ROOT, args.ranks, args.delay, args.invocations)
    print(
        json.dumps(
            {
                "ranks": args.ranks,
                "delay_s": args.delay,
                "baseline": args.rev,
                "before": before,
                "after": after,
                "same_digest": before["digest"] == after["digest"],
                "speedup": round(
                    before["seconds_per_invocation"] / after["seconds_per_invocation"], 3
                ),
            }
        )
    )


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
