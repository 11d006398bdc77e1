"""The colouring strategy's budget, measured side by side in one run; prints one JSON object.

* 2 ranks / 1 rank sweep time, label propagation (Gauss–Seidel style) over a synthetic
  power-law graph whose conflict graph is one giant component            (≤ 0.75)

The workload is ``benchmarks/gauss_seidel.py:propagate``: every body reads its neighbours'
label distributions (``labels`` floats each), applies a label-compatibility matrix and
writes its own row.  On 2 ranks the planner colours the conflict graph; each colour class
is a round spread over both ranks.  For contrast, the 2-rank run with
``strategy=components`` shows what the planner could do before: one component, one node.

Usage: python benchmarks/colouring.py [--vertices 20000] [--labels 16] [--sweeps 5] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import replay_run, steady

APP = "benchmarks/gauss_seidel.py:propagate"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vertices", type=int, default=20000)
    ap.add_argument("--degree", type=int, default=4)
    ap.add_argument("--labels", type=int, default=16)
    ap.add_argument("--sweeps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if min(args.vertices - 1, args.degree, args.labels - 1, args.sweeps - 1, args.repeats) < 1:
        ap.error("need vertices >= 2, degree >= 1, labels >= 2, sweeps >= 2 and repeats >= 1")
    common = [
        APP,
        *("-p", f"vertices={args.vertices}", "-p", f"degree={args.degree}"),
        *("-p", f"labels={args.labels}", "-p", f"sweeps={args.sweeps}", "--no-trace"),
    ]
    one, two, comp = [], [], []
    r1 = r2 = rc = {}
    for _ in range(args.repeats):  # interleaved so machine noise hits all of them alike
        r1 = replay_run([*common, "--ranks", "1"])
        one.append(steady(r1["op_times"]["lp"]))
        r2 = replay_run([*common, "--ranks", "2"])
        two.append(steady(r2["op_times"]["lp"]))
        rc = replay_run([*common, "--ranks", "2", "-p", "strategy=components"])
        comp.append(steady(rc["op_times"]["lp"]))
    one_s, two_s, comp_s = min(one), min(two), min(comp)
    plan = r2["planner"]["lp"]
    out = {
        "benchmark": "colouring",
        "date": date.today().isoformat(),
        "machine": f"{platform.machine()} {platform.python_version()}",
        "vertices": args.vertices,
        "degree": args.degree,
        "labels": args.labels,
        "sweeps": args.sweeps,
        "one_rank_sweep_s": round(one_s, 4),
        "two_rank_sweep_s": round(two_s, 4),
        "two_rank_components_sweep_s": round(comp_s, 4),
        "plan_2rank": {
            "strategy": plan["strategy"],
            "colours": plan.get("colours"),
            "rounds": plan["rounds"],
            "imbalance": plan["imbalance"],
            "plan_s": plan["recon_s"],
        },
        "plan_2rank_components": {
            "strategy": rc["planner"]["lp"]["strategy"],
            "rounds": rc["planner"]["lp"]["rounds"],
            "node_imbalance": rc["planner"]["lp"]["node_imbalance"],
        },
        "ratios": {
            "2rank_over_1rank_sweep": {"value": round(two_s / one_s, 3), "budget": 0.75},
            "2rank_components_over_1rank_sweep": {"value": round(comp_s / one_s, 3)},
        },
        # each repeat's 2-rank / 1-rank ratio: how much the machine's load moved the figure
        "paired_ratios": [round(b / a, 3) for a, b in zip(one, two, strict=True)],
        "spread": {
            "one_rank": [round(x, 4) for x in one],
            "two_rank": [round(x, 4) for x in two],
            "two_rank_components": [round(x, 4) for x in comp],
        },
        "final_change": {
            "1rank": r1["objectives"]["change"][-1],
            "2rank": r2["objectives"]["change"][-1],
        },
    }
    budget = out["ratios"]["2rank_over_1rank_sweep"]
    budget["met"] = budget["value"] <= budget["budget"]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
