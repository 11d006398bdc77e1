"""Engine budgets, measured side by side in one run (DESIGN §9); prints one JSON object.

* async_for on 1 rank / a hand-written serial numpy loop, same arithmetic   (≤ 1.3)
* 2 ranks / 1 rank epoch time, SGDMF                                       (≤ 0.6)
* reconnaissance + planning / one epoch (1 rank)                           (≤ 2)

Usage: python benchmarks/engine.py [--epochs 5] [--rank 32] [--synthetic]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import dataset, replay_run, steady


def hand_written(rank: int, epochs: int, synthetic: bool) -> list[float]:
    """The serial program the user starts from: a numpy loop over the ratings."""
    from apps.sgdmf._app import data_path, parse_line

    recs = []
    with open(data_path(synthetic=synthetic)) as fh:
        for line in fh:
            rec = parse_line(line.rstrip("\n"))
            if rec is not None:
                recs.append(rec)
    n_users = max(r.user for r in recs) + 1
    n_items = max(r.item for r in recs) + 1
    rng = np.random.default_rng(0)
    W = rng.normal(0.3, 0.1, (n_users, rank))
    H = rng.normal(0.3, 0.1, (n_items, rank))
    g, lam, times = 0.02, 0.05, []
    for _ in range(epochs):
        t = time.perf_counter()
        for j in range(len(recs)):
            u, i, r = recs[j]
            w = W[u]
            h = H[i]
            err = r - w @ h
            dw = g * (err * h - lam * w)
            H[i] = h + g * (err * w - lam * h)
            W[u] = w + dw
        times.append(time.perf_counter() - t)
        g *= 0.95
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--synthetic", action="store_true")
    args = ap.parse_args()
    label, data = dataset(args.synthetic)
    synthetic = label == "synthetic"
    common = [
        "sgdmf",
        "-p",
        f"epochs={args.epochs}",
        "-p",
        f"rank={args.rank}",
        "-p",
        "kernel=false",
        *data,
    ]
    hand, one, two = [], [], []
    recon = []
    for _ in range(2):  # interleave the three so machine noise hits all of them alike
        hand.append(steady(hand_written(args.rank, args.epochs, synthetic)))
        r1 = replay_run([*common, "--ranks", "1"])
        one.append(steady(r1["op_times"]["sgd"]))
        recon.append(r1["planner"]["sgd"]["recon_s"])
        r2 = replay_run([*common, "--ranks", "2"])
        two.append(steady(r2["op_times"]["sgd"]))
    hand_s, one_s, two_s = min(hand), min(one), min(two)
    recon_s = min(recon)
    out = {
        "benchmark": "engine",
        "date": date.today().isoformat(),
        "data": label,
        "rank": args.rank,
        "epochs": args.epochs,
        "machine": f"{platform.machine()} {platform.python_version()}",
        "hand_written_epoch_s": round(hand_s, 4),
        "async_for_1rank_epoch_s": round(one_s, 4),
        "async_for_2rank_epoch_s": round(two_s, 4),
        "recon_plan_s": round(recon_s, 4),
        "ratios": {
            "async_for_1rank_over_serial": {"value": round(one_s / hand_s, 3), "budget": 1.3},
            "2rank_over_1rank_epoch": {"value": round(two_s / one_s, 3), "budget": 0.6},
            "recon_plan_over_epoch": {"value": round(recon_s / one_s, 3), "budget": 2.0},
        },
        "spread": {
            "hand_written": [round(x, 4) for x in hand],
            "one_rank": [round(x, 4) for x in one],
            "two_rank": [round(x, 4) for x in two],
        },
        "final_rmse_1rank": r1["objectives"]["rmse"][-1],
        "imbalance_2rank": r2["planner"]["sgd"]["imbalance"],
    }
    for v in out["ratios"].values():
        v["met"] = v["value"] <= v["budget"]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
