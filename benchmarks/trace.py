"""Recording budgets, measured side by side in one run (DESIGN §9); prints one JSON object.

* traced / untraced wall time, SGDMF MovieLens-100K, 2 ranks, 5 epochs   (≤ 1.05)
* store bytes per executed loop body                                    (≤ 1)

Usage: python benchmarks/trace.py [--epochs 5] [--repeats 3] [--synthetic]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from datetime import date
from pathlib import Path

from _common import dataset, replay_run


def store_bytes(path: Path) -> int:
    """The whole store: the database file plus any WAL and shared-memory files."""
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--synthetic", action="store_true")
    args = ap.parse_args()
    label, data = dataset(args.synthetic)
    common = ["sgdmf", "--ranks", "2", "-p", f"epochs={args.epochs}", *data]
    traced, untraced, sizes, bodies = [], [], [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.repeats):  # interleaved, so noise hits both alike
            untraced.append(replay_run([*common, "--no-trace"])["elapsed_s"])
            path = Path(tmp) / f"t{k}.sqlite"
            res = replay_run([*common, "--trace", str(path)])
            traced.append(res["elapsed_s"])
            sizes.append(store_bytes(path))
            bodies = res["planner"]["sgd"]["bodies"] * args.epochs
    t, u = statistics.median(traced), statistics.median(untraced)
    size = statistics.median(sizes)
    out = {
        "benchmark": "trace",
        "date": date.today().isoformat(),
        "data": label,
        "epochs": args.epochs,
        "ranks": 2,
        "traced_wall_s": [round(x, 4) for x in traced],
        "untraced_wall_s": [round(x, 4) for x in untraced],
        "store_bytes": int(size),
        "bodies": bodies,
        "ratios": {
            "traced_over_untraced": {"value": round(t / u, 4), "budget": 1.05},
            "bytes_per_body": {"value": round(size / bodies, 4), "budget": 1.0},
        },
    }
    for v in out["ratios"].values():
        v["met"] = v["value"] <= v["budget"]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
