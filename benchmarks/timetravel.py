"""Time-travel figures, measured side by side in one run (issue 16); prints one JSON object.

* checkpoint overhead: a traced run with the default checkpoints (and with one after
  every invocation) over the same traced run without checkpoints     (target <= 1.10)
* bytes per checkpoint (every node's owned rows of W and H, compressed), apart from the
  trace's own bytes
* ``--from`` speed: on a run of N invocations recorded with ``--checkpoint-every 2``,
  ``replay single TRACE --from sgd:N-1`` over a full ``replay single TRACE``  (<= 0.20)
* resume versus re-run: a run killed in its last invocation, ``replay resume`` over an
  uninterrupted re-run (``benchmarks/resume.py``, which also runs alone)

Usage: python benchmarks/timetravel.py [--epochs 20] [--ranks 2] [--repeats 3] [--synthetic]
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
from benchmarks._common import ROOT, dataset, replay_cmd, replay_run
from benchmarks.resume import measure as resume_figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--synthetic", action="store_true")
    args = ap.parse_args()
    label, data = dataset(args.synthetic)
    common = [
        "sgdmf",
        "--ranks",
        str(args.ranks),
        "-p",
        f"epochs={args.epochs}",
        "-p",
        "kernel=false",
        *data,
    ]
    walls: dict[str, list[float]] = {"none": [], "auto": [], "every_1": []}
    flags = {"none": ["--no-checkpoints"], "auto": [], "every_1": ["--checkpoint-every", "1"]}
    shown: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.repeats):  # interleaved, so noise hits every variant alike
            for name, extra in flags.items():
                path = Path(tmp) / f"{name}{k}.sqlite"
                res = replay_run([*common, "--trace", str(path), *extra])
                walls[name].append(res["wall_s"])
                shown[name] = replay_cmd(["show", str(path)])["runs"][0]
        # --from speed on a run recorded with a checkpoint after every second invocation
        path = Path(tmp) / "every2.sqlite"
        replay_run([*common, "--trace", str(path), "--checkpoint-every", "2"])
        last = f"sgd:{args.epochs - 1}"
        full, part, full_e, part_e, cfull, cpart = [], [], [], [], [], []
        for _ in range(args.repeats):
            a = replay_cmd(["single", str(path)])
            b = replay_cmd(["single", str(path), "--from", last])
            c = replay_cmd(["cluster", str(path)])
            d = replay_cmd(["cluster", str(path), "--from", last])
            assert a["identical"] and b["identical"] and c["identical"] and d["identical"]
            full.append(a["wall_s"])
            part.append(b["wall_s"])
            full_e.append(a["elapsed_s"])
            part_e.append(b["elapsed_s"])
            cfull.append(c["wall_s"])
            cpart.append(d["wall_s"])
        started = b["from"]
        rcommon = ["--ranks", str(args.ranks), "-p", f"epochs={args.epochs}", "-p", "rank=32"]
        rcommon += ["-p", f"synthetic={str(label == 'synthetic').lower()}"]
        resumed = resume_figures(rcommon, args.epochs, args.repeats, tmp)
    med = {k: statistics.median(v) for k, v in walls.items()}
    auto_cps = len(shown["auto"]["checkpoints"])
    every_cps = len(shown["every_1"]["checkpoints"])
    out = {
        "benchmark": "timetravel",
        "date": date.today().isoformat(),
        "data": label,
        "epochs": args.epochs,
        "ranks": args.ranks,
        "root": str(ROOT),
        "wall_s": {k: [round(x, 4) for x in v] for k, v in walls.items()},
        "checkpoints": {"auto": auto_cps, "every_1": every_cps},
        "checkpoint_bytes": {
            "auto": shown["auto"]["checkpoint_bytes"],
            "every_1": shown["every_1"]["checkpoint_bytes"],
            "per_checkpoint": round(shown["every_1"]["checkpoint_bytes"] / max(every_cps, 1)),
        },
        "trace_store_bytes_without_checkpoints": shown["none"]["store_bytes"],
        # measured by the recorder (encoding and writing, slowest node per checkpoint):
        # robust where the wall times above are noisy
        "checkpoint_seconds": {
            "auto": shown["auto"]["checkpoint_seconds"],
            "every_1": shown["every_1"]["checkpoint_seconds"],
        },
        "from": {"point": last, "started_after": started},
        "single_replay_wall_s": {"full": full, "from_last": part},
        "single_replay_elapsed_s": {"full": full_e, "from_last": part_e},
        "cluster_replay_wall_s": {"full": cfull, "from_last": cpart},
        "resume": resumed,
        "ratios": {
            "checkpoints_auto_over_none": {
                "value": round(med["auto"] / med["none"], 4),
                "budget": 1.10,
            },
            "checkpoint_seconds_over_run_auto": {
                "value": round(shown["auto"]["checkpoint_seconds"] / walls["auto"][-1], 4),
                "budget": 0.10,
            },
            "checkpoint_every_1_over_none": {
                "value": round(med["every_1"] / med["none"], 4),
                "budget": None,
            },
            "single_from_last_over_full": {
                "value": round(statistics.median(part) / statistics.median(full), 4),
                "budget": 0.20,
            },
            "single_from_last_over_full_whole_command": {
                "value": round(statistics.median(part_e) / statistics.median(full_e), 4),
                "budget": None,
            },
            "cluster_from_last_over_full": {
                "value": round(statistics.median(cpart) / statistics.median(cfull), 4),
                "budget": 0.20,
            },
        },
    }
    for v in out["ratios"].values():
        v["met"] = None if v["budget"] is None else v["value"] <= v["budget"]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
