"""Replay budgets, measured side by side in one run (DESIGN §9); prints one JSON object.

* cluster replay / recorded run wall time (SGDMF, 2 ranks)                     (≤ 1.10)
* single-node replay of the 2-rank trace / an untraced 1-rank run               (≤ 1.25)
* cluster replay / recorded run wall time, lock-heavy Gauss–Seidel sweeps over a
  power-law graph (``benchmarks/gauss_seidel.py``), 3 ranks x 2 threads, over a
  million lock grants                                                            (≤ 1.10)

Usage: python benchmarks/replay.py [--epochs 5] [--repeats 3] [--synthetic] [--gs-sweeps 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import dataset, replay_cmd, replay_run


def replay_trace(mode: str, trace: Path) -> dict:
    """Replay ``trace``; it must be identical."""
    res = replay_cmd([mode, str(trace)])
    if not res["identical"]:
        raise SystemExit(f"replay {mode} diverged: {res['first_difference']}")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--synthetic", action="store_true")
    ap.add_argument("--gs-sweeps", type=int, default=10)
    args = ap.parse_args()
    label, data = dataset(args.synthetic)
    common = ["sgdmf", "-p", f"epochs={args.epochs}", "-p", "kernel=false", *data]
    rec, cl, one, single = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.repeats):
            path = Path(tmp) / f"t{k}.sqlite"
            rec.append(replay_run([*common, "--ranks", "2", "--trace", str(path)])["elapsed_s"])
            cl.append(replay_trace("cluster", path)["elapsed_s"])
            one.append(replay_run([*common, "--ranks", "1", "--no-trace"])["elapsed_s"])
            single.append(replay_trace("single", path)["elapsed_s"])
        gs = ["benchmarks/gauss_seidel.py:train", "-p", f"sweeps={args.gs_sweeps}"]
        gs_rec, gs_cl, grants = [], [], 0
        for k in range(args.repeats):
            path = Path(tmp) / f"gs{k}.sqlite"
            shape = ["--ranks", "3", "--threads", "2"]
            gs_rec.append(replay_run([*gs, *shape, "--trace", str(path)])["elapsed_s"])
            gs_cl.append(replay_trace("cluster", path)["elapsed_s"])
            shown = replay_cmd(["show", str(path)])
            grants = shown["runs"][0]["operators"]["gs"]["lock_grants"]
    m = statistics.median
    out = {
        "benchmark": "replay",
        "date": date.today().isoformat(),
        "data": label,
        "epochs": args.epochs,
        "recorded_2rank_wall_s": [round(x, 4) for x in rec],
        "cluster_replay_wall_s": [round(x, 4) for x in cl],
        "untraced_1rank_wall_s": [round(x, 4) for x in one],
        "single_replay_wall_s": [round(x, 4) for x in single],
        "gs_lock_grants": grants,
        "gs_recorded_3x2_wall_s": [round(x, 4) for x in gs_rec],
        "gs_cluster_replay_wall_s": [round(x, 4) for x in gs_cl],
        "ratios": {
            "cluster_replay_over_recorded": {"value": round(m(cl) / m(rec), 4), "budget": 1.10},
            "single_replay_over_1rank": {"value": round(m(single) / m(one), 4), "budget": 1.25},
            "gs_cluster_replay_over_recorded": {
                "value": round(m(gs_cl) / m(gs_rec), 4),
                "budget": 1.10,
            },
        },
    }
    for v in out["ratios"].values():
        v["met"] = v["value"] <= v["budget"]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
