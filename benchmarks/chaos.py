"""Chaos-mode speed, measured side by side in one run (issue 17); prints one JSON object.

SGDMF on synthetic ratings, 2 in-process nodes x 2 threads (every task group lock-split,
so every chaos run passes one baton between the threads at each access, drawn from the
seed: ``engine/_machines/baton.py``):

* chaos runs per second, not recorded / recorded into one trace store / with the
  backward dual test (``--check dual``) on each run;
* next to plain runs (no controller, free locks, not recorded) of the same program:
  ``chaos_over_plain`` is a chaos run's median wall time over a plain run's.
* distinct outcomes among the chaos runs (the ticket order, and so the serial order,
  changes from run to run).

Usage: python benchmarks/chaos.py [--epochs 2] [--runs 5] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5, help="chaos runs per measurement")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    import engine
    from apps.sgdmf import train
    from replay import chaos

    params = {"synthetic": True, "epochs": args.epochs, "kernel": False}
    nodes, threads = 2, 2
    plain: list[float] = []
    per_run: dict[str, list[float]] = {"chaos": [], "recorded": [], "dual": []}
    distinct: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.repeats):  # interleaved, so noise hits every variant alike
            t0 = time.perf_counter()
            engine.run(train, params, nodes=nodes, threads=threads)
            plain.append(time.perf_counter() - t0)
            for name in per_run:
                rep = chaos.explore(
                    train,
                    params,
                    runs=args.runs,
                    chaos_seed=k,
                    nodes=nodes,
                    threads=threads,
                    trace=str(Path(tmp) / f"{name}{k}.sqlite") if name != "chaos" else None,
                    check="dual" if name == "dual" else None,
                )
                assert rep.failed is None, rep.lines()
                per_run[name].append(rep.wall_s / len(rep.runs))
                distinct[name] = rep.distinct
    med_plain = statistics.median(plain)
    med = {k: statistics.median(v) for k, v in per_run.items()}
    out = {
        "benchmark": "chaos",
        "date": date.today().isoformat(),
        "data": "synthetic",
        "app": "sgdmf",
        "epochs": args.epochs,
        "nodes": nodes,
        "threads": threads,
        "runs_per_measurement": args.runs,
        "plain_run_s": [round(x, 4) for x in plain],
        "chaos_run_s": {k: [round(x, 4) for x in v] for k, v in per_run.items()},
        "runs_per_second": {
            "plain": round(1 / med_plain, 3),
            **{k: round(1 / v, 3) for k, v in med.items()},
        },
        "distinct_outcomes_last_repeat": distinct,
        "ratios": {
            f"{k}_over_plain": {"value": round(v / med_plain, 4), "budget": None}
            for k, v in med.items()
        },
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
