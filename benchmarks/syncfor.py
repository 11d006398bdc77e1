"""sync_for figures, measured side by side in one run; prints one JSON object.

* MLR on the digits data (BSP): steady epoch time on 2 ranks / 1 rank, synchronising
  after every minibatch (the default) and after every 4;
* a sparse workload (each minibatch touches a few dozen of 5000 embedding rows):
  bytes moved per clock on 2 ranks with reconnaissance (``re=True``: only touched
  rows move) versus without (``re=False``: every parameter DDS moves whole).

Usage: python benchmarks/syncfor.py [--epochs 10] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import date
from pathlib import Path

import numpy as np
from _common import ROOT, replay_run, steady

sys.path.insert(0, str(ROOT))

import engine as ap  # noqa: E402

#: MLR runs: minibatches per worker between synchronisations (1 is the app's default).
PER_CLOCK = (1, 4)
#: Shape of the sparse workload: embedding rows, their width, elements, minibatch size.
SPARSE_ROWS, SPARSE_DIM, SPARSE_N, SPARSE_MB = 5000, 8, 640, 16


def sparse(re: bool = True, epochs: int = 2) -> dict[str, float]:
    """Pairwise logistic loss on embeddings: each element touches two rows of ``E``."""
    rng = np.random.default_rng(0)
    pairs = rng.integers(0, SPARSE_ROWS, (SPARSE_N, 2))
    labels = rng.integers(0, 2, SPARSE_N)
    data = np.hstack([pairs, labels[:, None]]).astype(np.float64)
    D = ap.dvector(SPARSE_N, shape=(3,), data=data, name="pairs")
    E = ap.dvector(SPARSE_ROWS, shape=(SPARSE_DIM,), init=ap.init.normal(0, 0.1), name="E")

    def body(batch: ap.Batch) -> None:
        for row in batch.values:
            i, j, y = int(row[0]), int(row[1]), row[2]
            a, b = E[i], E[j]
            g = 1.0 / (1.0 + np.exp(-a @ b)) - y
            E[i] = a - 0.1 * g * b
            E[j] = b - 0.1 * g * a

    for _ in range(epochs):
        ap.sync_for(D, SPARSE_MB, body, re=re, name="sparse")
    return {"bytes_per_clock": ap.current().planner["sparse"]["bytes_per_clock"]}


def main() -> None:
    ap_ = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap_.add_argument("--epochs", type=int, default=10)
    ap_.add_argument("--repeat", type=int, default=3)
    args = ap_.parse_args()
    mlr_out = {}
    for per_clock in PER_CLOCK:
        mlr = ["mlr", "-p", f"epochs={args.epochs}", "-p", f"per_clock={per_clock}"]
        one, two, acc = [], [], []
        for _ in range(args.repeat):  # interleave so machine noise hits both alike
            r1 = replay_run([*mlr, "--ranks", "1"])
            one.append(steady(r1["op_times"]["mlr"]))
            r2 = replay_run([*mlr, "--ranks", "2"])
            two.append(steady(r2["op_times"]["mlr"]))
            acc.append(r2["objectives"]["test_accuracy"][-1])
        one_s, two_s = min(one), min(two)
        mlr_out[f"per_clock={per_clock}"] = {
            "1rank_epoch_s": round(one_s, 5),
            "2rank_epoch_s": round(two_s, 5),
            "2rank_over_1rank_epoch": round(two_s / one_s, 3),
            "clocks_per_epoch_2rank": r2["planner"]["mlr"]["rounds"],
            "test_accuracy_2rank": round(acc[-1], 4),
            "spread": {
                "one_rank": [round(x, 5) for x in one],
                "two_rank": [round(x, 5) for x in two],
            },
        }
    app = f"{Path(__file__).resolve()}:sparse"
    by_re = {}
    for re in (True, False):
        r = replay_run([app, "-p", f"re={str(re).lower()}", "--ranks", "2"])
        by_re[re] = {
            "bytes_per_clock": r["planner"]["sparse"]["bytes_per_clock"],
            "epoch_s": round(steady(r["op_times"]["sparse"]), 5),
            "clocks": r["planner"]["sparse"]["rounds"],
        }
    out = {
        "benchmark": "syncfor",
        "date": date.today().isoformat(),
        "machine": f"{platform.machine()} {platform.python_version()}",
        "mlr": {
            "data": "sklearn digits, 1348 train / 449 test",
            "epochs": args.epochs,
            "minibatch": 10,
            "sync": "bsp",
            **mlr_out,
        },
        "sparse": {
            "rows": SPARSE_ROWS,
            "row_bytes": SPARSE_DIM * 8,
            "elements": SPARSE_N,
            "minibatch": SPARSE_MB,
            "ranks": 2,
            "re_true": by_re[True],
            "re_false": by_re[False],
            "re_false_over_re_true_bytes": round(
                by_re[False]["bytes_per_clock"] / by_re[True]["bytes_per_clock"], 1
            ),
        },
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
