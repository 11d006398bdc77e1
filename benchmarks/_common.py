"""Helpers shared by the benchmark scripts: data selection and timed subprocess runs.

A script imports them as ``benchmarks._common`` after putting the repository first on
``sys.path``: then ``engine`` is the package, not the benchmark ``benchmarks/engine.py`` that
Python's own ``sys.path[0]`` (the script's directory) would find, and mypy checks the scripts as
the modules they are, ``benchmarks.*``, with the sibling import resolved.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")


def dataset(synthetic: bool) -> tuple[str, list[str]]:
    """(label, extra -p args): MovieLens-100K unless it is unavailable or ``synthetic``."""
    if not synthetic:
        try:
            sys.path.insert(0, str(ROOT))
            from apps._datasets import movielens_100k

            movielens_100k()
            return "movielens-100k", []
        except Exception as exc:  # noqa: BLE001 - fall back, and say so in the output
            print(f"MovieLens-100K unavailable ({exc}); using synthetic data", file=sys.stderr)
    return "synthetic", ["-p", "synthetic=true"]


def extract_rev(rev: str, into: Path) -> Path:
    """Git ``rev`` of this repository extracted into the existing directory ``into`` (a
    baseline tree to run side by side with this one, ``PYTHONPATH`` on it)."""
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def replay_run(args: list[str], timeout: float = 1800) -> dict[str, Any]:
    """Run ``replay run ... --json`` and return its JSON object."""
    return replay_cmd(["run", *args], timeout)


def replay_cmd(args: list[str], timeout: float = 1800) -> dict[str, Any]:
    """Run ``replay ARGS --json``; the JSON object plus ``elapsed_s``, the whole command's
    wall time (process start, MPI launch, imports, recording set-up and all)."""
    cmd = [sys.executable, "-m", "replay", *args, "--json"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=timeout, cwd=ROOT)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"benchmark command failed: {' '.join(args)}: {proc.stderr.strip()}")
    out = json.loads(proc.stdout)
    out["elapsed_s"] = elapsed
    return out


def steady(times: list[float]) -> float:
    """Median epoch time, skipping the first (it may pay for warm-up)."""
    return statistics.median(times[1:] if len(times) > 2 else times)
