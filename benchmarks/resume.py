"""Resume versus re-run, measured side by side in one run (issue 16 item 7); prints JSON.

A 2-rank SGDMF run of N epochs, recorded with the default checkpoints, is SIGKILLed in
its last invocation (one rank dies in a loop body); ``replay resume`` continues it.  The
figure is the resume's time over an uninterrupted re-run of the same app and
parameters: the run's own wall time (``wall_s``) and the whole command (process start,
MPI launch, imports, the fast-forward to the checkpoint, recording).  The resumed run is
checked to be bitwise the re-run (digests and objectives).

The app is the built-in SGDMF behind the test suite's kill switch
(``tests/replay/resume_apps.py``, environment ``RESUME_KILL``); without the switch it is
SGDMF itself.  ``benchmarks/timetravel.py`` reports the same figures with its others.

Usage: python benchmarks/resume.py [--epochs 20] [--ranks 2] [--repeats 3] [--synthetic]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import ENV, ROOT, dataset, replay_cmd

APP = f"{ROOT / 'tests' / 'replay' / 'resume_apps.py'}:sgdmf"
#: the rank that dies, and the loop body (counted on that rank) it dies in
KILL_RANK, KILL_BODY = 1, 100


def crash(args: list[str], kill: str) -> float:
    """Record ``replay run`` with the kill switch set; returns its elapsed seconds (it
    must fail: a rank died)."""
    cmd = [sys.executable, "-m", "replay", "run", *args]
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=dict(ENV, RESUME_KILL=kill), cwd=ROOT
    )
    if proc.returncode == 0:
        raise SystemExit(f"the run with RESUME_KILL={kill} did not crash")
    return time.perf_counter() - t0


def measure(common: list[str], epochs: int, repeats: int, tmp: str) -> dict[str, Any]:
    """Resume-versus-rerun figures (``common``: the run's arguments after ``run APP``)."""
    kill = f"{KILL_RANK}:{epochs - 1}:{KILL_BODY}"
    walls: dict[str, list[float]] = {"rerun": [], "resume": []}
    elapsed: dict[str, list[float]] = {"rerun": [], "resume": [], "crashed_run": []}
    started: Any = None
    for k in range(repeats):  # interleaved, so noise hits both alike
        path = Path(tmp) / f"crash{k}.sqlite"
        elapsed["crashed_run"].append(crash([APP, *common, "--trace", str(path)], kill))
        res = replay_cmd(["resume", str(path)])
        whole = replay_cmd(["run", APP, *common, "--trace", str(Path(tmp) / f"whole{k}.sqlite")])
        if res["digests"] != whole["digests"] or res["objectives"] != whole["objectives"]:
            raise SystemExit("the resumed run is not bitwise the uninterrupted one")
        started = res["resumed_from"]
        walls["resume"].append(res["wall_s"])
        walls["rerun"].append(whole["wall_s"])
        elapsed["resume"].append(res["elapsed_s"])
        elapsed["rerun"].append(whole["elapsed_s"])
    med = {k: statistics.median(v) for k, v in walls.items()}
    med_e = {k: statistics.median(v) for k, v in elapsed.items()}
    return {
        "killed_in": f"sgd#{epochs - 1} (rank {KILL_RANK}, its body {KILL_BODY})",
        "resumed_after": started,
        "wall_s": {k: [round(x, 4) for x in v] for k, v in walls.items()},
        "elapsed_s": {k: [round(x, 4) for x in v] for k, v in elapsed.items()},
        "ratios": {
            "resume_over_rerun_wall": round(med["resume"] / med["rerun"], 4),
            "resume_over_rerun_whole_command": round(med_e["resume"] / med_e["rerun"], 4),
        },
        "bitwise_equal": True,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--synthetic", action="store_true")
    args = ap.parse_args()
    label, _ = dataset(args.synthetic)
    common = ["--ranks", str(args.ranks), "-p", f"epochs={args.epochs}", "-p", "rank=32"]
    common += ["-p", f"synthetic={str(label == 'synthetic').lower()}"]
    with tempfile.TemporaryDirectory() as tmp:
        figures = measure(common, args.epochs, args.repeats, tmp)
    out = {
        "benchmark": "resume",
        "date": date.today().isoformat(),
        "data": label,
        "epochs": args.epochs,
        "ranks": args.ranks,
        "root": str(ROOT),
        "cpu_count": os.cpu_count(),
        **figures,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
