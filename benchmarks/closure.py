"""Cost of the closure guard (engine/_closure.py), side by side in one process; one JSON object.

SGDMF on synthetic data (20 000 bodies), 1 node: reconnaissance CPU time, and the epoch
time of a ``checked=True`` invocation after it, with the guard on and with it replaced by
the bare body, alternated ``--repeat`` times (best and median of each).

Usage: python benchmarks/closure.py [--repeat 9]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from contextlib import nullcontext
from typing import Any

from _common import ROOT

sys.path.insert(0, str(ROOT))
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
                    r = ap.run(train, {"epochs": 2, "synthetic": True}, checked=True)
            res["re_" + mode].append(sum(spent))
            res["checked_" + mode].append(r.op_times["sgd"][1])
    out: dict[str, Any] = {"bodies": 20000, "repeat": args.repeat}
    for k, v in res.items():
        out[k] = {"best_s": round(min(v), 4), "median_s": round(statistics.median(v), 4)}
    out["re_cpu_ratio_best"] = round(min(res["re_on"]) / min(res["re_off"]), 3)
    out["checked_epoch_ratio_best"] = round(min(res["checked_on"]) / min(res["checked_off"]), 3)
    out["guard_us_per_body_re"] = round((min(res["re_on"]) - min(res["re_off"])) / 20000 * 1e6, 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
