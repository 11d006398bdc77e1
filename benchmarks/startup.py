"""Start-up of the ``replay`` command: wall time of short commands, side by side; prints JSON.

Every command here does almost no work, so its wall time is the start-up a user pays on
every command: the interpreter, imports, the re-execution for the hash seed (commands
that run a program in this process), MPI launch.  Run as users run it, without
``PYTHONHASHSEED`` in the environment.  With ``--baseline REV`` the same commands of git
``REV`` run interleaved with this tree's (``python -m replay`` with ``PYTHONPATH`` on an
extracted copy), so load hits both alike.

Usage: python benchmarks/startup.py [--repeats 5] [--baseline REV]
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import ROOT, extract_rev

APP = f"{ROOT / 'tests' / 'replay' / 'env_apps.py'}:hash_order"
COMMANDS = {
    "help": ["--help"],
    "run_in_process": ["run", APP, "--no-trace"],
    "run_in_process_traced": ["run", APP, "--trace", "{trace}"],
    "run_2_ranks": ["run", APP, "--ranks", "2", "--no-trace"],
    "show": ["show", "{shown}"],
}


def _time(tree: Path, args: list[str], work: Path) -> float:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    env.update(PYTHONPATH=str(tree), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    fresh = str(work / f"t{time.monotonic_ns()}.sqlite")
    args = [a.format(trace=fresh, shown=work / "shown.sqlite") for a in args]
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "replay", *args], capture_output=True, text=True, env=env, cwd=work
    )
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"benchmark command failed: replay {' '.join(args)}: {proc.stderr}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline", metavar="REV", help="also time the commands of git REV")
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="startup-") as tmp:
        work = Path(tmp)
        trees = {"after": ROOT}
        if opts.baseline is not None:
            (work / "before").mkdir()
            trees = {"before": extract_rev(opts.baseline, work / "before"), "after": ROOT}
        _time(ROOT, ["run", APP, "--trace", str(work / "shown.sqlite")], work)
        runs: dict[str, dict[str, list[float]]] = {k: {c: [] for c in COMMANDS} for k in trees}
        for _ in range(opts.repeats):
            for name, args in COMMANDS.items():
                for label, tree in trees.items():
                    runs[label][name].append(_time(tree, args, work))
    out: dict[str, object] = {"benchmark": "startup", "date": date.today().isoformat()}
    for label, per in runs.items():
        out[f"{label}_median_s"] = {k: round(statistics.median(v), 3) for k, v in per.items()}
    if opts.baseline is not None:
        out["baseline"] = opts.baseline
        out["after_over_before_median"] = {
            k: round(statistics.median(runs["after"][k]) / statistics.median(v), 2)
            for k, v in runs["before"].items()
        }
    out["spread"] = {
        label: {k: [round(x, 2) for x in v] for k, v in per.items()} for label, per in runs.items()
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
