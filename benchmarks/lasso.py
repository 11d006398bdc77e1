"""Lasso (``apps/lasso``): convergence per iteration and time against scikit-learn.

For each data set, ``replay run lasso`` runs untraced on 1 and 2 ranks, side by side in
this one invocation, and scikit-learn's ``Lasso`` is fitted in this process on the same
standardised data (in Fortran order, so its fit copies nothing), with the oracle's
tolerance (1e-12) and with its default (1e-4).
Prints one JSON object: per data set, the suboptimality ``f(beta_t) - f*`` at selected
iterations (``f*`` is scikit-learn's objective at tol=1e-12), the iterations, coordinate
updates and wall time of each run, scikit-learn's fit times and distances from the
oracle, and the side-by-side ratio ``ours / sklearn``:

* ``to_sklearn_quality``: the 1-rank run's rounds up to the first whose objective is
  within scikit-learn's default-tolerance suboptimality of ``f*`` (the times between the
  run's logged objectives, and the first round taken as long as the median one), over
  scikit-learn's fit at its default tolerance;
* ``to_converged``: the same for all the run's rounds (KKT <= tol * alpha, far
  stricter), over scikit-learn's fit at tol 1e-12;
* ``..._with_setup``: the run's time from its start to that round, less the wall time
  of the same command with ``-p iterations=0 -p compare=false`` (generating and
  standardising the data, which scikit-learn's side gets ready-made), so the driver's
  set-up after the data (the DDS copy of X, the first full check) counts too.  Two runs
  subtracted: noisier on a busy machine.

Each timing is the median of ``--repeats`` runs, ours and scikit-learn's interleaved.

    python benchmarks/lasso.py                      # diabetes and 1,000 x 10,000 synthetic
    python benchmarks/lasso.py --features 2000      # a smaller synthetic problem
    python benchmarks/lasso.py --skip-diabetes -p priority=last -p check_every=1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from apps.lasso._app import load, objective  # noqa: E402
from benchmarks._common import replay_run

#: Iterations at which the convergence table reports the suboptimality.
MARKS = (0, 10, 30, 100, 300, 1000, 3000)


def sklearn_fit(X: np.ndarray, y: np.ndarray, alpha: float, tol: float) -> dict[str, Any]:
    """One scikit-learn fit: its time, epochs, objective and coefficients."""
    from sklearn.linear_model import Lasso

    model = Lasso(alpha=alpha, tol=tol, max_iter=10**6)
    XF = np.asfortranarray(X)  # its own layout: the fit copies nothing
    t0 = time.perf_counter()
    model.fit(XF, y)
    seconds = time.perf_counter() - t0
    coef = np.asarray(model.coef_)
    yc = y - y.mean()
    return {
        "fit_s": seconds,
        "epochs": int(model.n_iter_),
        "updates": int(model.n_iter_) * X.shape[1],
        "objective": objective(yc - X @ coef, coef, alpha),
        "coef": coef,
    }


def first_within(obj: list[float], f_star: float, gap: float) -> int | None:
    """The first iteration whose objective is within ``gap`` of ``f_star``."""
    return next((i for i, f in enumerate(obj) if f - f_star <= gap), None)


def one_dataset(
    name: str, params: list[str], X: np.ndarray, y: np.ndarray, repeats: int
) -> dict[str, Any]:
    # the app's alpha, recomputed the way the app does (alpha_ratio x alpha_max)
    yc = y - y.mean()
    given = dict(p.split("=", 1) for p in params[1::2])
    alpha = float(given.get("alpha_ratio", 0.1)) * float(np.abs(X.T @ yc).max()) / len(y)
    setup_params = [*params, "-p", "iterations=0", "-p", "compare=false"]
    runs: list[dict[str, Any]] = []
    setups: list[float] = []
    fits: dict[str, list[dict[str, Any]]] = {"tol_1e-12": [], "tol_default": []}
    for _ in range(repeats):  # interleaved, so a busy moment hits both sides
        runs.append(replay_run(["lasso", "--no-trace", "--ranks", "1", *params]))
        setups.append(replay_run(["lasso", "--no-trace", *setup_params])["wall_s"])
        fits["tol_1e-12"].append(sklearn_fit(X, y, alpha, 1e-12))
        fits["tol_default"].append(sklearn_fit(X, y, alpha, 1e-4))
    two = replay_run(["lasso", "--no-trace", "--ranks", "2", *params])
    sk = {k: {**v[0], "fit_s": statistics.median(f["fit_s"] for f in v)} for k, v in fits.items()}
    f_star = sk["tol_1e-12"]["objective"]
    gap = sk["tol_default"]["objective"] - f_star
    setup = statistics.median(setups)
    one = runs[0]
    obj1 = one["objectives"]["objective"]
    hit = first_within(obj1, f_star, gap)

    def rounds_s(run: dict[str, Any], last: int) -> float:
        t = run["objective_times"]["objective"]
        steps = np.diff(t)
        first = float(np.median(steps)) if len(steps) else float(t[0])
        return float(t[last] - t[0] + first)

    found = hit is not None
    with_setup = [r["objective_times"]["objective"][hit] - setup for r in runs] if found else []
    quality = [rounds_s(r, hit) for r in runs] if hit is not None else []
    converged = [rounds_s(r, -1) for r in runs]
    table = {str(i): {"suboptimality": obj1[i] - f_star} for i in MARKS if i < len(obj1)}
    table[str(len(obj1) - 1)] = {"suboptimality": obj1[-1] - f_star}
    default_diff = float(np.abs(sk["tol_default"]["coef"] - sk["tol_1e-12"]["coef"]).max())
    to_quality = statistics.median(quality) if quality else None
    to_converged = statistics.median(converged)
    setup_quality = statistics.median(with_setup) if with_setup else None
    return {
        "dataset": name,
        "shape": list(X.shape),
        "alpha": alpha,
        "f_star": f_star,
        "sklearn_default_suboptimality": gap,
        "convergence": table,
        "same_objectives_on_1_and_2_ranks": one["objectives"] == two["objectives"],
        "runs": {
            str(r): {
                "iterations": o["result"]["iterations"],
                "updates": o["result"].get("updates"),
                "full_checks": o["result"].get("checks"),
                "converged": o["result"]["converged"],
                "kkt": o["result"]["kkt"],
                "wall_s": o["wall_s"],
                "ms_per_iteration": round(
                    1000 * o["wall_s"] / max(1, len(o["objectives"]["objective"])), 2
                ),
                "max_abs_diff_sklearn": o["objectives"]["max_abs_diff_sklearn"][0],
                "planner": o["planner"].get("lasso"),
            }
            for r, o in ((1, one), (2, two))
        },
        "ours_1_rank": {
            "setup_s": round(setup, 4),
            "iteration_at_sklearn_quality": hit,
            "to_sklearn_quality_s": None if to_quality is None else round(to_quality, 4),
            "to_converged_s": round(to_converged, 4),
            "to_sklearn_quality_with_setup_s": None
            if setup_quality is None
            else round(setup_quality, 4),
        },
        "sklearn": {
            k: {kk: (round(vv, 4) if kk == "fit_s" else vv) for kk, vv in v.items() if kk != "coef"}
            for k, v in sk.items()
        },
        "ratio_ours_over_sklearn": {
            "to_sklearn_quality": None
            if to_quality is None
            else round(to_quality / sk["tol_default"]["fit_s"], 2),
            "to_converged": round(to_converged / sk["tol_1e-12"]["fit_s"], 2),
            "to_sklearn_quality_with_setup": None
            if setup_quality is None
            else round(setup_quality / sk["tol_default"]["fit_s"], 2),
        },
        "sklearn_default_tol_max_abs_diff": default_diff,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--features", type=int, default=10000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-synthetic", action="store_true")
    ap.add_argument("--skip-diabetes", action="store_true")
    ap.add_argument("-p", dest="extra", action="append", default=[], metavar="NAME=VALUE")
    args = ap.parse_args()
    extra = [a for p in args.extra for a in ("-p", p)]
    results = []
    if not args.skip_diabetes:
        X, y = load("diabetes", 0, 0, 0, 0.0, 0.0)
        results.append(
            one_dataset("diabetes", ["-p", "dataset=diabetes", *extra], X, y, args.repeats)
        )
    if not args.skip_synthetic:
        params = [
            "-p", "dataset=synthetic",
            "-p", f"samples={args.samples}",
            "-p", f"features={args.features}",
            *extra,
        ]  # fmt: skip
        X, y = load("synthetic", args.samples, args.features, 50, 0.3, 1.0)
        results.append(one_dataset("synthetic", params, X, y, args.repeats))
    print(json.dumps({"lasso": results}, indent=1))


if __name__ == "__main__":
    main()
