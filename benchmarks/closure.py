"""Cost of the closure guard (engine/_asyncfor/closure.py), side by side in one process; one
JSON object.

SGDMF on synthetic data (20 000 bodies), 1 node: reconnaissance CPU time, and the epoch
time of a ``checked=True`` invocation after it, with the guard on and with it replaced by
the bare body, alternated ``--repeat`` times (best and median of each).  Then the normal
run's comparison after every invocation (``closure.watch``): the second SGDMF epoch of an
unchecked run, and an invocation of 100 bodies that capture a 32 MB array (hashed before
and after), each with the comparison on and off.

Usage: python benchmarks/closure.py [--repeat 9]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def main() -> None:
    ap_ = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap_.add_argument("--repeat", type=int, default=9)
    args = ap_.parse_args()

    import engine as ap
    from apps.sgdmf import train
    from engine.lowlevel import recon_cpu_times, without_closure_guard

    res: dict[str, list[float]] = {k: [] for k in ("re_off", "re_on", "checked_off", "checked_on")}
    for _ in range(args.repeat):
        for mode in ("off", "on"):
            with recon_cpu_times() as spent:
                with nullcontext() if mode == "on" else without_closure_guard():
                    r = ap.run(
                        train, {"epochs": 2, "synthetic": True, "kernel": False}, checked=True
                    )
            res["re_" + mode].append(sum(spent))
            res["checked_" + mode].append(r.op_times["sgd"][1])
    big = np.random.default_rng(0).random(4 << 20)  # 32 MB, read by every body

    def reads_big() -> None:
        X = ap.dvector(100, shape=(), name="X")

        def body(j: int) -> None:
            X[j] = X[j] + big[j]

        for _ in range(3):
            ap.async_for(0, 100, body, name="b")

    for k in ("normal_off", "normal_on", "big_off", "big_on"):
        res[k] = []
    for _ in range(args.repeat):
        for mode in ("off", "on"):
            with nullcontext() if mode == "on" else without_closure_guard():
                r = ap.run(train, {"epochs": 2, "synthetic": True, "kernel": False})
                b = ap.run(reads_big)
            res["normal_" + mode].append(r.op_times["sgd"][1])
            res["big_" + mode].append(min(b.op_times["b"][1:]))
    out: dict[str, Any] = {"bodies": 20000, "repeat": args.repeat}
    for k, v in res.items():
        out[k] = {"best_s": round(min(v), 4), "median_s": round(statistics.median(v), 4)}
    out["re_cpu_ratio_best"] = round(min(res["re_on"]) / min(res["re_off"]), 3)
    out["checked_epoch_ratio_best"] = round(min(res["checked_on"]) / min(res["checked_off"]), 3)
    out["guard_us_per_body_re"] = round((min(res["re_on"]) - min(res["re_off"])) / 20000 * 1e6, 2)
    out["normal_epoch_ratio_best"] = round(min(res["normal_on"]) / min(res["normal_off"]), 3)
    out["watch_ms_per_invocation_32mb"] = round((min(res["big_on"]) - min(res["big_off"])) * 1e3, 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
