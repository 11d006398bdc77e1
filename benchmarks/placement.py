"""Does placement change what MLR learns?  Side by side in one run; prints one JSON object.

Issue 37 asks that placement not change quality beyond seed noise at default settings:
MLR on 3 nodes x 2 threads within 0.005 of one worker's test accuracy.  MLR has no
random draw (zero initial weights, the minibatches in data order), so one worker's run
is one number and its "seed noise" has to come from somewhere a user would not care
about: the order of the training images.  So the benchmark makes ``--orders`` orders (0
is the app's own, the others seeded permutations of the digits' training split),
writes each as an ``.npz`` table beside the same held-out images (``-p data=... -p
test=...``: the app's own reader, nothing else changes), and trains the default model
(BSP, minibatch 10, lr 0.5, ``aggregate=sum``, 10 epochs) on each placement of
``--placements`` for every order, in-process nodes (``engine.run(nodes=, threads=)``).

Reported per placement: the test accuracy and final loss of each order, and the
difference from one worker's on the same order (mean, standard deviation, range).  The
noise floor is one worker's spread over the orders (standard deviation and range).
``met`` holds when the mean difference over the orders is within ``--target`` (0.005)
of zero; a single order's difference is reported too, never averaged away.  One test
image is 1/449 = 0.0022 of accuracy.

Usage: python benchmarks/placement.py [--orders 10] [--placements 2x1 3x1 3x2 8x1]
                                       [--epochs 10] [--target 0.005]
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
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import engine as ap  # noqa: E402
from apps.mlr import train  # noqa: E402
from apps.mlr._data import digits_split  # noqa: E402


def tables(where: Path, orders: int) -> tuple[list[Path], Path]:
    """The training split in ``orders`` orders (0: as the app reads it) and the test
    split, as ``.npz`` tables (arrays ``X`` and ``y``)."""
    Xtr, ytr, Xte, yte = digits_split()
    test = where / "test.npz"
    np.savez(test, X=Xte, y=yte)
    out = []
    for k in range(orders):
        perm = np.arange(len(ytr)) if k == 0 else np.random.default_rng(k).permutation(len(ytr))
        path = where / f"train{k}.npz"
        np.savez(path, X=Xtr[perm], y=ytr[perm])
        out.append(path)
    return out, test


def fit(train_path: Path, test: Path, nodes: int, threads: int, epochs: int) -> dict[str, float]:
    res = ap.run(
        lambda: train(epochs=epochs, data=str(train_path), test=str(test)),
        nodes=nodes,
        threads=threads,
    )
    return {
        "accuracy": float(res.objectives["test_accuracy"][-1]),
        "loss": float(res.objectives["loss"][-1]),
    }


def spread(xs: list[float]) -> dict[str, float]:
    return {
        "mean": round(statistics.fmean(xs), 5),
        "sd": round(statistics.stdev(xs), 5) if len(xs) > 1 else 0.0,
        "min": round(min(xs), 5),
        "max": round(max(xs), 5),
    }


def main() -> None:
    ap_ = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap_.add_argument("--orders", type=int, default=10)
    ap_.add_argument("--placements", nargs="+", default=["2x1", "3x1", "3x2", "8x1"])
    ap_.add_argument("--epochs", type=int, default=10)
    ap_.add_argument("--target", type=float, default=0.005)
    args = ap_.parse_args()
    placements = [tuple(int(x) for x in p.split("x")) for p in args.placements]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        trains, test = tables(Path(tmp), args.orders)
        one = [fit(t, test, 1, 1, args.epochs) for t in trains]
        out: dict[str, Any] = {
            "date": date.today().isoformat(),
            "app": "mlr",
            "data": "digits (1,348 training images in each order, 449 held out)",
            "orders": args.orders,
            "epochs": args.epochs,
            "one_worker": {
                "accuracy": [round(r["accuracy"], 5) for r in one],
                "loss": [round(r["loss"], 5) for r in one],
                "accuracy_spread": spread([r["accuracy"] for r in one]),
            },
            "placements": {},
        }
        for nodes, threads in placements:
            got = [fit(t, test, nodes, threads, args.epochs) for t in trains]
            diff = [g["accuracy"] - o["accuracy"] for g, o in zip(got, one, strict=True)]
            loss = [g["loss"] / o["loss"] for g, o in zip(got, one, strict=True)]
            mean = statistics.fmean(diff)
            out["placements"][f"{nodes}x{threads}"] = {
                "accuracy": [round(g["accuracy"], 5) for g in got],
                "accuracy_minus_one_worker": spread(diff),
                "loss_over_one_worker": spread(loss),
                "met": abs(mean) <= args.target,
            }
    out["target"] = args.target
    out["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
