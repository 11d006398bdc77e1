"""The plan guard's cost on SGDMF, measured side by side in one run; prints one JSON object.

Budget (issue "No silent wrong answers"): the guard costs at most 5% of SGDMF epoch
time on 1 and 2 ranks.  Each measurement runs the same SGDMF training twice in one
process (per rank), alternating, once as shipped and once with the guard switched off
by this script (the DDS guard modes replaced by the plain exec modes, no per-round
arming, no undo snapshot), so machine noise hits both alike.

Usage: python benchmarks/guard.py [--epochs 5] [--rank 32] [--repeats 3] [--synthetic]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from contextlib import nullcontext
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import ENV, ROOT, dataset, steady


def worker(args: argparse.Namespace) -> None:
    """One rank (or the only process): guarded and unguarded trainings, alternating."""
    import engine
    from apps.sgdmf import train
    from engine.lowlevel import without_guard

    comm = None
    if args.ranks > 1:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    params = {
        "epochs": args.epochs,
        "rank": args.rank,
        "synthetic": args.synthetic,
        "kernel": False,
    }
    out: dict[str, list[float]] = {"guarded": [], "unguarded": []}
    for k in range(args.repeats):
        for mode in ("guarded", "unguarded") if k % 2 == 0 else ("unguarded", "guarded"):
            with nullcontext() if mode == "guarded" else without_guard():
                res = engine.run(train, params, comm=comm)
            out[mode].append(steady(res.op_times["sgd"]))
    if comm is None or comm.Get_rank() == 0:
        print(json.dumps(out))


def measure(ranks: int, args: argparse.Namespace, data: list[str]) -> dict[str, list[float]]:
    """Run the worker on ``ranks`` ranks; per mode, the median epoch of each training."""
    cmd = [sys.executable, __file__, "--worker", "--ranks", str(ranks)]
    cmd += ["--epochs", str(args.epochs), "--rank", str(args.rank)]
    cmd += ["--repeats", str(args.repeats)]
    if data:
        cmd.append("--synthetic")
    if ranks > 1:
        mpiexec = Path(sys.executable).parent / "mpiexec"
        cmd = [str(mpiexec), "-n", str(ranks), *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"guard benchmark failed on {ranks} rank(s): {proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--synthetic", action="store_true")
    ap.add_argument("--worker", action="store_true")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    label, data = dataset(args.synthetic)
    out: dict[str, Any] = {
        "benchmark": "guard",
        "date": date.today().isoformat(),
        "data": label,
        "rank": args.rank,
        "epochs": args.epochs,
        "machine": f"{platform.machine()} {platform.python_version()}",
        "ratios": {},
        "spread": {},
    }
    for ranks in (1, 2):
        got = measure(ranks, args, data)
        g, u = min(got["guarded"]), min(got["unguarded"])
        out[f"{ranks}rank_epoch_s"] = {"guarded": round(g, 4), "unguarded": round(u, 4)}
        out["spread"][f"{ranks}rank"] = {k: [round(x, 4) for x in v] for k, v in got.items()}
        ratio = round(g / u, 3)
        out["ratios"][f"guarded_over_unguarded_{ranks}rank"] = {
            "value": ratio,
            "budget": 1.05,
            "met": ratio <= 1.05,
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
