"""Compiled loop bodies (issue 18), measured side by side in one run; prints one JSON object.

* kernel SGDMF epoch on 1 rank / a hand-written numba serial loop, same arithmetic (≤ 2)
* kernel SGDMF epoch, 2 ranks / 1 rank                                              (≤ 0.6)
* recording overhead per epoch, 2 ranks, traced / untraced, steady state           (≤ 1.05)
* cluster replay per epoch / recorded run per epoch, steady state                  (≤ 1.10)
* reconnaissance + planning of the kernel / one epoch of the *Python* body         (≤ 2)
  (compiled, RECORD mode; side by side in this process with the kernel's Python
  function on every body, ``engine.lowlevel.python_kernel_recon``)
* one invocation's digests as the engine takes them (every DDS, collective, the
  run's ``digest_times``) / one kernel epoch, the larger of 1 and 2 ranks             (≤ 0.02)
* lock-split groups: 2 ranks x 2 threads, kernel / Python body (reported, no budget)
* the compiled plan guard: kernel epoch, guarded / unguarded, 1 rank in this process

"Per epoch in steady state" is measured inside one run of ``--hi`` epochs: the time from
the end of epoch ``--lo`` to the end of the last one (each epoch logs its RMSE, and the
run reports when: ``objective_times``), divided by the epochs between.  It holds
everything an epoch costs (the loop, write-back, digests, the trace commit, checkpoints
at the automatic interval, the compiled RMSE) and nothing that is paid once (imports,
data, reconnaissance, compiling), without the noise of two runs' start-ups in it; the
fixed cost is reported separately as ``startup_s`` (the run's wall time less its epochs).

Usage: python benchmarks/kernels.py [--lo 5] [--hi 65] [--repeats 3] [--synthetic] [--only-recon]

``--only-recon`` measures the reconnaissance figures alone (a minute instead of most of an
hour).

Every figure is the best of the interleaved repeats (load only ever adds time).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from datetime import date
from pathlib import Path
from typing import Any

import numba
import numpy as np
import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._common import dataset, replay_cmd, replay_run, steady


@numba.njit(cache=True)
def _numba_epoch(r: np.ndarray, W: np.ndarray, H: np.ndarray, g: float, lam: float) -> None:
    """The hand-written serial loop a numba user writes: the kernel's arithmetic, row copies."""
    for j in range(r.shape[0]):
        u = int(r[j, 0])
        i = int(r[j, 1])
        w = W[u].copy()
        h = H[i].copy()
        err = r[j, 2] - w @ h
        W[u] = w + g * (err * h - lam * w)
        H[i] = h + g * (err * w - lam * h)


def numba_serial(rank: int, epochs: int, synthetic: bool) -> tuple[list[float], dict[str, float]]:
    """Per-epoch times of the hand-written numba loop, and the time of hashing W and H
    alone with each digest hash (blake2b-128, xxh3-128, xxh3-chunks)."""
    from apps.sgdmf._app import data_path, parse_line

    recs = []
    with open(data_path(synthetic=synthetic)) as fh:
        for line in fh:
            rec = parse_line(line.rstrip("\n"))
            if rec is not None:
                recs.append((rec.user, rec.item, rec.rating))
    r = np.array(recs, dtype=np.float64)
    n_users, n_items = int(r[:, 0].max()) + 1, int(r[:, 1].max()) + 1
    rng = np.random.default_rng(0)
    W = rng.normal(0.3, 0.1, (n_users, rank))
    H = rng.normal(0.3, 0.1, (n_items, rank))
    _numba_epoch(r[:1], W.copy(), H.copy(), 0.02, 0.05)  # compile outside the timing
    g, times = 0.02, []
    for _ in range(epochs):
        t = time.perf_counter()
        _numba_epoch(r, W, H, g, 0.05)
        times.append(time.perf_counter() - t)
        g *= 0.95
    hashes: dict[str, Callable[[], Any]] = {
        "blake2b": lambda: hashlib.blake2b(digest_size=16),
        "xxh3": xxhash.xxh3_128,
    }
    alone = {}
    for name, make in hashes.items():
        took = []
        for _ in range(20):
            t = time.perf_counter()
            h = make()
            h.update(np.ascontiguousarray(W).tobytes())
            h.update(np.ascontiguousarray(H).tobytes())
            h.hexdigest()
            took.append(time.perf_counter() - t)
        alone[name] = statistics.median(took)
    took = []
    for _ in range(20):  # xxh3-chunks (8 KiB chunks), every chunk in this process
        t = time.perf_counter()
        for a in (W, H):
            mv = np.ascontiguousarray(a).reshape(-1).view(np.uint8).data
            parts = [xxhash.xxh3_128_digest(mv[o : o + 8192]) for o in range(0, len(mv), 8192)]
            xxhash.xxh3_128_hexdigest(a.nbytes.to_bytes(8, "little") + b"".join(parts))
        took.append(time.perf_counter() - t)
    alone["xxh3_chunks"] = statistics.median(took)
    return times, alone


def guard_cost(rank: int, epochs: int, synthetic: bool, repeats: int) -> dict[str, list[float]]:
    """Kernel SGDMF epochs on 1 rank in this process with the plan guard on and off
    (``engine.lowlevel.without_guard``: unchecked compiled accesses, no arming, no undo
    snapshot), alternating; per mode, the steady epoch of each training."""
    import engine
    from apps.sgdmf import train
    from engine.lowlevel import without_guard

    params = {"epochs": epochs, "rank": rank, "synthetic": synthetic, "kernel": True}
    out: dict[str, list[float]] = {"guarded": [], "unguarded": []}
    for k in range(repeats):
        for mode in ("guarded", "unguarded") if k % 2 == 0 else ("unguarded", "guarded"):
            with nullcontext() if mode == "guarded" else without_guard():
                res = engine.run(train, params)
            out[mode].append(steady(res.op_times["sgd"]))
    return out


def recon_side_by_side(rank: int, synthetic: bool, repeats: int) -> dict[str, list[float]]:
    """Reconnaissance + planning of the kernel's first invocation (the planner's
    ``recon_s``), compiled and with the kernel's Python function on every body
    (``python_kernel_recon``), alternating in this process; and the Python body's epoch."""
    import engine
    from apps.sgdmf import train
    from engine.lowlevel import python_kernel_recon

    params = {"epochs": 1, "rank": rank, "synthetic": synthetic, "kernel": True}
    out: dict[str, list[float]] = {"compiled": [], "py_func": [], "python_epoch": []}
    for k in range(repeats):
        for mode in ("compiled", "py_func") if k % 2 == 0 else ("py_func", "compiled"):
            with nullcontext() if mode == "compiled" else python_kernel_recon():
                res = engine.run(train, params)
            out[mode].append(res.planner["sgd"]["recon_s"])
        res = engine.run(
            train, {"epochs": 3, "rank": rank, "synthetic": synthetic, "kernel": False}
        )
        out["python_epoch"].append(steady(res.op_times["sgd"]))
    return out


def recon_figures(side: dict[str, list[float]]) -> dict[str, Any]:
    """The side-by-side reconnaissance figures (best of the repeats)."""
    best = {k: min(v) for k, v in side.items()}
    return {
        "recon_plan_s": {k: round(best[k], 4) for k in ("compiled", "py_func")},
        "python_epoch_s": round(best["python_epoch"], 4),
        "compiled_over_python_epoch": round(best["compiled"] / best["python_epoch"], 3),
        "py_func_over_python_epoch": round(best["py_func"] / best["python_epoch"], 3),
        "py_func_over_compiled": round(best["py_func"] / best["compiled"], 2),
        "spread": {k: [round(x, 4) for x in v] for k, v in side.items()},
    }


def only_recon(args: argparse.Namespace) -> None:
    """``--only-recon``: the reconnaissance figures, from the CLI and in this process."""
    label, data = dataset(args.synthetic)
    synthetic = label == "synthetic"
    base = ["sgdmf", "-p", f"rank={args.rank}", "-p", "kernel=false", *data]
    kern = [*base, "-p", "kernel=true"]
    replay_run([*kern, "-p", "epochs=1", "--ranks", "1", "--no-trace"])  # fill numba's cache
    recon, py1 = [], []
    for _ in range(args.repeats):
        r1 = replay_run([*kern, "-p", "epochs=1", "--ranks", "1", "--no-trace"])
        recon.append(r1["planner"]["sgd"]["recon_s"])
        p1 = replay_run([*base, "-p", "epochs=3", "--ranks", "1", "--no-trace"])
        py1.append(steady(p1["op_times"]["sgd"]))
    ratio = min(recon) / min(py1)
    out = {
        "benchmark": "kernels --only-recon",
        "date": date.today().isoformat(),
        "data": label,
        "rank": args.rank,
        "repeats": args.repeats,
        "machine": f"{platform.machine()} {platform.python_version()} numba {numba.__version__}",
        "recon_plan_over_python_epoch": round(ratio, 3),
        "ratios": {
            "recon_plan_over_python_epoch": {
                "value": round(ratio, 3),
                "budget": 2.0,
                "met": ratio <= 2.0,
            }
        },
        "recon_plan_s": round(min(recon), 4),
        "python_epoch_s": round(min(py1), 4),
        "recon_side_by_side": recon_figures(recon_side_by_side(args.rank, synthetic, args.repeats)),
        "spread": {"recon": [round(x, 4) for x in recon], "py1": [round(x, 4) for x in py1]},
    }
    print(json.dumps(out, indent=2))


def in_run_epoch(times: list[float], lo: int, hi: int) -> float:
    """Seconds per epoch from the end of epoch ``lo`` to the end of epoch ``hi`` of one
    run, from when it logged each epoch's objective."""
    if len(times) < hi or not 0 < lo < hi:
        raise SystemExit(f"need {hi} logged epochs and 0 < --lo < --hi, got {len(times)}")
    return (times[hi - 1] - times[lo - 1]) / (hi - lo)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lo", type=int, default=5)
    ap.add_argument("--hi", type=int, default=65)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--synthetic", action="store_true")
    ap.add_argument("--only-recon", action="store_true")
    args = ap.parse_args()
    if args.only_recon:
        only_recon(args)
        return
    label, data = dataset(args.synthetic)
    synthetic = label == "synthetic"
    base = ["sgdmf", "-p", f"rank={args.rank}", "-p", "kernel=false", *data]
    kern = [*base, "-p", "kernel=true"]
    lo, hi = args.lo, args.hi
    res: dict[str, list[float]] = {
        k: []
        for k in (
            "numba",
            "hash_blake2b",
            "hash_xxh3",
            "hash_xxh3_chunks",
            "digest1",
            "digest2",
            "k1",
            "k2",
            "py1",
            "recon",
            "rec_per",
            "rec_fixed",
            "free_per",
            "free_fixed",
            "cl_per",
            "cl_fixed",
            "k2x2",
            "py2x2",
        )
    }
    rmse: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        replay_run([*kern, "-p", "epochs=1", "--ranks", "2", "--no-trace"])  # fill numba's cache
        for k in range(args.repeats):  # interleaved, so machine noise hits every side alike
            times, alone = numba_serial(args.rank, hi, synthetic)
            res["numba"].append(steady(times))
            res["hash_blake2b"].append(alone["blake2b"])
            res["hash_xxh3"].append(alone["xxh3"])
            res["hash_xxh3_chunks"].append(alone["xxh3_chunks"])
            r1 = replay_run([*kern, "-p", f"epochs={hi}", "--ranks", "1", "--no-trace"])
            res["k1"].append(steady(r1["op_times"]["sgd"]))
            res["digest1"].append(steady(r1["digest_times"]))
            res["recon"].append(r1["planner"]["sgd"]["recon_s"])
            p1 = replay_run([*base, "-p", "epochs=3", "--ranks", "1", "--no-trace"])
            res["py1"].append(steady(p1["op_times"]["sgd"]))
            ep = ["-p", f"epochs={hi}", "--ranks", "2"]
            free = replay_run([*kern, *ep, "--no-trace"])
            path = Path(tmp) / f"k{k}.sqlite"
            rec = replay_run([*kern, *ep, "--trace", str(path)])
            cl = replay_cmd(["cluster", str(path)])
            if not cl["identical"]:
                raise SystemExit(f"cluster replay diverged: {cl['first_difference']}")
            for key, out in (("free", free), ("rec", rec), ("cl", cl)):
                per = in_run_epoch(out["objective_times"]["rmse"], lo, hi)
                res[f"{key}_per"].append(per)
                res[f"{key}_fixed"].append(out["wall_s"] - hi * per)
            res["k2"].append(steady(free["op_times"]["sgd"]))
            res["digest2"].append(steady(free["digest_times"]))
            rmse["kernel_2rank"] = free["objectives"]["rmse"][-1]
            shape = ["-p", "epochs=3", "--ranks", "2", "--threads", "2", "--no-trace"]
            res["k2x2"].append(steady(replay_run([*kern, *shape])["op_times"]["sgd"]))
            res["py2x2"].append(steady(replay_run([*base, *shape])["op_times"]["sgd"]))
        rmse["kernel_1rank"] = r1["objectives"]["rmse"][-1]
    guard = guard_cost(args.rank, 10, synthetic, 2 * args.repeats)
    side = recon_side_by_side(args.rank, synthetic, args.repeats)
    res["guarded"], res["unguarded"] = guard["guarded"], guard["unguarded"]
    # the best of the interleaved repeats: load on a shared machine only ever adds time
    m = {k: min(v) for k, v in res.items()}
    free_per, free_fixed = m["free_per"], m["free_fixed"]
    rec_per, rec_fixed = m["rec_per"], m["rec_fixed"]
    cl_per, cl_fixed = m["cl_per"], m["cl_fixed"]
    ratios = {
        "kernel_1rank_over_numba_serial": (m["k1"] / m["numba"], 2.0),
        "kernel_2rank_over_1rank": (m["k2"] / m["k1"], 0.6),
        "recording_overhead_per_epoch": (rec_per / free_per, 1.05),
        "cluster_replay_over_recorded_per_epoch": (cl_per / rec_per, 1.10),
        "recon_plan_over_python_epoch": (m["recon"] / m["py1"], 2.0),
        "digest_over_kernel_epoch": (max(m["digest1"] / m["k1"], m["digest2"] / m["k2"]), 0.02),
    }
    guard_ratio = m["guarded"] / m["unguarded"]
    out = {
        "benchmark": "kernels",
        "date": date.today().isoformat(),
        "data": label,
        "rank": args.rank,
        "epochs": [lo, hi],
        "repeats": args.repeats,
        "machine": f"{platform.machine()} {platform.python_version()} numba {numba.__version__}",
        **{name: round(v, 3) for name, (v, _) in ratios.items()},
        "ratios": {
            name: {"value": round(v, 3), "budget": b, "met": v <= b}
            for name, (v, b) in ratios.items()
        },
        "epoch_s": {
            "numba_serial": round(m["numba"], 5),
            "kernel_1rank": round(m["k1"], 5),
            "kernel_2rank": round(m["k2"], 5),
            "python_1rank": round(m["py1"], 5),
            "kernel_2rank_2threads_lock_split": round(m["k2x2"], 5),
            "python_2rank_2threads_lock_split": round(m["py2x2"], 5),
        },
        "per_epoch_steady_s": {
            "untraced_2rank": round(free_per, 5),
            "recorded_2rank": round(rec_per, 5),
            "cluster_replay": round(cl_per, 5),
        },
        "startup_s": {
            "untraced_2rank": round(free_fixed, 3),
            "recorded_2rank": round(rec_fixed, 3),
            "cluster_replay": round(cl_fixed, 3),
        },
        "compiled_guard_over_unguarded_1rank": round(guard_ratio, 3),
        "recon_plan_s": round(m["recon"], 4),
        "recon_side_by_side": recon_figures(side),
        "digest_s": {  # per invocation, as the engine takes them, and hashing W and H alone
            "engine_1rank": round(m["digest1"], 6),
            "engine_2rank": round(m["digest2"], 6),
            "over_kernel_epoch_1rank": round(m["digest1"] / m["k1"], 4),
            "over_kernel_epoch_2rank": round(m["digest2"] / m["k2"], 4),
            "hash_W_H_blake2b": round(m["hash_blake2b"], 6),
            "hash_W_H_xxh3": round(m["hash_xxh3"], 6),
            "hash_W_H_xxh3_chunks": round(m["hash_xxh3_chunks"], 6),
        },
        "final_rmse": rmse,
        "spread": {k: [round(x, 5) for x in v] for k, v in res.items()},
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
