"""sync_for figures, measured side by side in one run; prints one JSON object.

* MLR on the digits data (BSP): steady epoch time on 2 ranks / 1 rank, synchronising
  after every minibatch (the default) and after every 4;
* a sparse workload (each minibatch touches a few dozen of 5000 embedding rows):
  bytes moved per clock on 2 ranks with reconnaissance (``re=True``: only touched
  rows move) versus without (``re=False``: every parameter DDS moves whole);
* ``per_clock_overhead_us``: what one clock costs the engine (BSP, SSP, Hybrid on 1 and
  2 ranks) with a trivial body on MLR's parameter shape (10 rows of 65 floats, one row
  read and written per minibatch of 10): the best steady invocation time divided by
  its clocks, untraced.  With ``--baseline REV`` the same runs are made, interleaved,
  from the engine of git revision ``REV`` (extracted into a temporary directory), and
  both are printed side by side.

Usage: python benchmarks/syncfor.py [--epochs 10] [--repeat 3] [--baseline REV] [--overhead-only]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import engine as ap  # noqa: E402
from benchmarks._common import ENV, ROOT, extract_rev, replay_run, steady

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


#: The overhead workload: elements, minibatch size, parameter rows and their width.
OVERHEAD_N, OVERHEAD_MB, OVERHEAD_ROWS, OVERHEAD_DIM = 2000, 10, 10, 65
#: sync_for invocations per overhead run (the first one, with reconnaissance, is skipped).
OVERHEAD_EPOCHS = 12


def overhead(sync: str = "bsp", epochs: int = OVERHEAD_EPOCHS) -> dict[str, float]:
    """A trivial body, so that an invocation's time is the engine's per-clock work."""
    D = ap.dvector(OVERHEAD_N, shape=(OVERHEAD_DIM,), init=ap.init.zeros(), name="data")
    W = ap.dvector(OVERHEAD_ROWS, shape=(OVERHEAD_DIM,), init=ap.init.zeros(), name="W")

    def body(batch: ap.Batch) -> None:
        k = batch.number % OVERHEAD_ROWS
        W[k] = W[k] + 1.0

    for _ in range(epochs):
        ap.sync_for(D, OVERHEAD_MB, body, sync=sync, name="overhead")
    return {"clocks": ap.current().planner["overhead"]["rounds"]}


def _overhead_run(tree: Path, sync: str, ranks: int) -> float:
    """µs per clock of one untraced overhead run with the engine of ``tree``."""
    app = f"{Path(__file__).resolve()}:overhead"
    cmd = [sys.executable, "-m", "replay", "run", app, "-p", f"sync={sync}"]
    cmd += ["--ranks", str(ranks), "--no-trace", "--json"]
    env = dict(ENV, PYTHONPATH=str(tree))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=tree)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark command failed in {tree}: {proc.stderr.strip()}")
    r = json.loads(proc.stdout)
    return min(r["op_times"]["overhead"][1:]) / r["planner"]["overhead"]["rounds"] * 1e6


def per_clock_overhead(repeat: int, baseline: str | None) -> dict[str, object]:
    """The per-clock figures, best of ``repeat`` interleaved runs each (and the baseline's)."""
    trees = {"after": ROOT}
    tmp = None
    if baseline is not None:
        tmp = tempfile.TemporaryDirectory(prefix="syncfor-baseline-")
        trees = {"before": extract_rev(baseline, Path(tmp.name)), "after": ROOT}
    runs: dict[str, dict[str, list[float]]] = {k: {} for k in trees}
    try:
        for _ in range(repeat):
            for sync in ("bsp", "ssp", "hybrid"):
                for ranks in (1, 2):
                    for label, tree in trees.items():  # interleaved: load hits both alike
                        us = _overhead_run(tree, sync, ranks)
                        runs[label].setdefault(f"{sync}_{ranks}rank", []).append(us)
    finally:
        if tmp is not None:
            tmp.cleanup()
    out: dict[str, object] = {
        label: {k: round(min(v), 1) for k, v in per.items()} for label, per in runs.items()
    }
    if baseline is not None:
        out["baseline"] = baseline
        out["after_over_before"] = {
            k: round(min(runs["after"][k]) / min(runs["before"][k]), 2) for k in runs["after"]
        }
    out["spread"] = {
        label: {k: [round(x, 1) for x in v] for k, v in per.items()} for label, per in runs.items()
    }
    return out


def main() -> None:
    ap_ = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap_.add_argument("--epochs", type=int, default=10)
    ap_.add_argument("--repeat", type=int, default=3)
    ap_.add_argument(
        "--baseline", metavar="REV", help="also measure the per-clock overhead of git REV"
    )
    ap_.add_argument(
        "--overhead-only", action="store_true", help="measure only per_clock_overhead_us"
    )
    args = ap_.parse_args()
    t0 = time.perf_counter()
    overhead_out = per_clock_overhead(args.repeat, args.baseline)
    if args.overhead_only:
        print(json.dumps({"per_clock_overhead_us": overhead_out}, indent=2))
        return
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
        "per_clock_overhead_us": {
            "workload": f"trivial body, {OVERHEAD_N} elements, minibatch {OVERHEAD_MB}, "
            f"W {OVERHEAD_ROWS}x{OVERHEAD_DIM} float64, untraced, best steady invocation "
            "/ its clocks",
            **overhead_out,
        },
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
