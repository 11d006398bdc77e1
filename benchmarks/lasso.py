"""Lasso (``apps/lasso``): convergence per iteration and time against scikit-learn.

For each data set, ``replay run lasso`` runs untraced on 1 and 2 ranks, side by side in
this one invocation, and scikit-learn's ``Lasso`` is fitted in this process on the same
standardised data, with the oracle's tolerance (1e-12) and with its default (1e-4).
Prints one JSON object: per data set, the suboptimality ``f(beta_t) - f*`` at selected
iterations (``f*`` is scikit-learn's objective at tol=1e-12), the iterations and wall
time of each run, and scikit-learn's fit times and distances from the oracle.

    python benchmarks/lasso.py                      # diabetes and 1,000 x 10,000 synthetic
    python benchmarks/lasso.py --features 2000      # a smaller synthetic problem
"""

from __future__ import annotations

import argparse
import json
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


def sklearn_side(X: np.ndarray, y: np.ndarray, alpha: float) -> dict[str, Any]:
    """Fit times, objectives and coefficients of scikit-learn at tol 1e-12 and the default."""
    from sklearn.linear_model import Lasso

    out: dict[str, Any] = {}
    yc = y - y.mean()
    for label, tol in (("tol_1e-12", 1e-12), ("tol_default", 1e-4)):
        model = Lasso(alpha=alpha, tol=tol, max_iter=10**6)
        t0 = time.perf_counter()
        model.fit(X, y)
        seconds = time.perf_counter() - t0
        coef = np.asarray(model.coef_)
        out[label] = {
            "fit_s": round(seconds, 4),
            "epochs": int(model.n_iter_),
            "objective": objective(yc - X @ coef, coef, alpha),
            "coef": coef,
        }
    return out


def one_dataset(name: str, params: list[str], X: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    runs = {}
    for ranks in (1, 2):
        out = replay_run(["lasso", "--no-trace", "--ranks", str(ranks), *params])
        runs[ranks] = out
    # the app's alpha, recomputed the way the app does (alpha_ratio x alpha_max)
    yc = y - y.mean()
    ratio = float(dict(p.split("=", 1) for p in params[1::2]).get("alpha_ratio", 0.1))
    alpha = ratio * float(np.abs(X.T @ yc).max()) / len(y)
    sk = sklearn_side(X, y, alpha)
    f_star = sk["tol_1e-12"]["objective"]
    obj1 = runs[1]["objectives"]["objective"]
    table = {
        str(i): {"suboptimality": obj1[i] - f_star, "kkt": runs[1]["objectives"]["kkt"][i]}
        for i in MARKS
        if i < len(obj1)
    }
    table[str(len(obj1) - 1)] = {
        "suboptimality": obj1[-1] - f_star,
        "kkt": runs[1]["objectives"]["kkt"][-1],
    }
    default_diff = float(np.abs(sk["tol_default"]["coef"] - sk["tol_1e-12"]["coef"]).max())
    return {
        "dataset": name,
        "shape": list(X.shape),
        "alpha": alpha,
        "f_star": f_star,
        "convergence": table,
        "same_objectives_on_1_and_2_ranks": runs[1]["objectives"] == runs[2]["objectives"],
        "runs": {
            str(r): {
                "iterations": len(o["objectives"]["objective"]),
                "wall_s": o["wall_s"],
                "ms_per_iteration": round(
                    1000 * o["wall_s"] / len(o["objectives"]["objective"]), 2
                ),
                "max_abs_diff_sklearn": o["objectives"]["max_abs_diff_sklearn"][0],
                "planner": o["planner"].get("lasso"),
            }
            for r, o in runs.items()
        },
        "sklearn": {k: {kk: vv for kk, vv in v.items() if kk != "coef"} for k, v in sk.items()},
        "sklearn_default_tol_max_abs_diff": default_diff,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--features", type=int, default=10000)
    ap.add_argument("--skip-synthetic", action="store_true")
    args = ap.parse_args()
    results = []
    X, y = load("diabetes", 0, 0, 0, 0.0, 0.0)
    results.append(one_dataset("diabetes", ["-p", "dataset=diabetes"], X, y))
    if not args.skip_synthetic:
        params = [
            "-p", "dataset=synthetic",
            "-p", f"samples={args.samples}",
            "-p", f"features={args.features}",
        ]  # fmt: skip
        X, y = load("synthetic", args.samples, args.features, 50, 0.3, 1.0)
        results.append(one_dataset("synthetic", params, X, y))
    print(json.dumps({"lasso": results}, indent=1))


if __name__ == "__main__":
    main()
