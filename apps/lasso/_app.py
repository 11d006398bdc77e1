"""Lasso by coordinate descent, scheduled the STRADS way and run with ``async_for``.

The objective is scikit-learn's, ``(1/(2n)) |y - X beta|^2 + alpha |beta|_1``, on
standardised columns and a centred target (the intercept is the mean of ``y``).  One
iteration is one STRADS round:

1. **schedule** (driver, every rank identically): draw candidates from ``ap.rng()`` with
   probability growing with the change each coordinate's next update would make
   (``priority=next``; STRADS's ``last`` change with ``priority=last``), then keep only
   candidates whose correlation with every coordinate already taken is below
   ``threshold``;
2. **update** (``async_for`` over the chosen coordinates): each body soft-thresholds one
   coordinate against the residual as it was at the start of the round and writes its new
   value and its change.  Bodies only *read* the residual, so they never conflict and any
   order of them gives the same numbers on 1, 2 or 3 nodes;
3. **aggregate** (driver): the residual becomes ``y - X beta`` for the new ``beta``.

The chosen set changes every round, so the loop runs with ``replan="always"``:
reconnaissance and planning on every invocation, through the public API.  The run stops
when the optimality (KKT) violation, computed from the DDS values on the driver, falls
below ``tol * alpha`` - the same test on every rank, so the stop is deterministic.

Where the time goes (1,000 x 10,000 synthetic, 1 rank, 2026-12-07, quiet machine): one
full check ``X^T r`` is 6 ms; one ``async_for`` invocation with ``replan="always"`` 4-5 ms
at 32-64 bodies (planning about a third, the plan guard's set-up a quarter,
reconnaissance an eighth); the dependency check of 256 candidates 4 ms.  STRADS's last
change drew among all 10,000 coordinates and checked every round: 5,000 rounds of 22 ms
without converging.  With ``priority=next`` a round draws only among the coordinates an
update would move (about 60 once the support is found), the full check runs every
``check_every`` rounds, and in between only the moving coordinates' gradient is
computed: 73 rounds to the tolerance, the engine's per-invocation cost the largest part.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import engine as ap

from .._errors import AppError
from .._params import require_finite
from .._tabular import read_table, read_test_table
from ._data import diabetes, standardise, synthetic
from ._schedule import independent, next_change, priorities, sample, violation

#: What ``replay run --save`` writes and ``replay export --model`` reads back from a
#: checkpoint: saved array name -> the DDS it is (the rest of ``train``'s ``model`` entry
#: is data the trace does not hold).
MODEL_DDS = {"coef": "beta"}
#: What the model of ``--save`` holds besides the DDS (the data: an export cannot give it).
MODEL_DATA = ("intercept", "x_mean", "x_std")
#: The data sets ``-p dataset=`` accepts.
DATASETS = ("diabetes", "synthetic")
#: How rounds draw their coordinates (``-p schedule=``): ``priority`` by the size of
#: each coordinate's last change (STRADS), ``uniform`` all alike, ``auto`` by
#: :func:`choose_schedule`.
SCHEDULES = ("auto", "priority", "uniform")
#: What a round's priorities are (``-p priority=``): ``next``, the change each
#: coordinate's next update would make (from the gradient of the optimality check);
#: ``last``, the change of its last update (STRADS's rule).
PRIORITIES = ("next", "last")
#: Share of the coordinates from which the moving ones' own check gives way to the full
#: check every round: it copies their columns, so from about a quarter on one pass over
#: every column is cheaper (10,000 x 1,000: 2,500 rows 5.5 ms, 3,300 rows 10.9 ms, all
#: 10,000 without a copy 6.3 ms).  The first rounds of the synthetic problem move ~4,800.
LIVE_SHARE = 0.25
#: Parameters added after traces were recorded, with the value that replays such a trace
#: as it ran (``replay._apps.recorded_params``): before ``schedule`` every run drew by
#: priority; before 2026-12-07 by the last change, with the full check every round.
ADDED_PARAMS = {"schedule": "priority", "priority": "last", "check_every": 1}


def soft_threshold(z: float, alpha: float) -> float:
    """``sign(z) * max(|z| - alpha, 0)``."""
    return float(np.sign(z) * max(abs(z) - alpha, 0.0))


def kkt_violation(X: np.ndarray, r: np.ndarray, beta: np.ndarray, alpha: float) -> float:
    """Largest violation of the Lasso optimality conditions at ``beta`` (residual ``r``):
    ``x_j.r/n = alpha sign(beta_j)`` where ``beta_j != 0``, ``|x_j.r/n| <= alpha`` elsewhere."""
    return violation(X.T @ r / X.shape[0], beta, alpha)


def objective(r: np.ndarray, beta: np.ndarray, alpha: float) -> float:
    """``(1/(2n)) |r|^2 + alpha |beta|_1``."""
    return float(r @ r) / (2 * len(r)) + alpha * float(np.abs(beta).sum())


def load(
    dataset: str,
    samples: int,
    features: int,
    nonzeros: int,
    rho: float,
    noise: float,
    data: str = "",
) -> tuple[np.ndarray, np.ndarray]:
    """(standardised X, raw y) of the chosen data set."""
    X, y = raw_data(dataset, samples, features, nonzeros, rho, noise, data)
    return standardise(X), y


def raw_data(
    dataset: str,
    samples: int,
    features: int,
    nonzeros: int,
    rho: float,
    noise: float,
    data: str = "",
) -> tuple[np.ndarray, np.ndarray]:
    """(X, y) of the user's file ``data`` if given (see :mod:`apps._tabular`), else of the
    chosen data set, as read or generated."""
    if data:
        table = read_table(data, "lasso")
        return table.X, table.y
    if dataset == "diabetes":
        return diabetes()
    return synthetic(samples, features, nonzeros, rho, noise)


def held_out(
    X: np.ndarray, y: np.ndarray, holdout: float, test: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(training X, y, test X, y): the user's ``test`` table, or a share ``holdout`` of
    the rows drawn from the run's seed (``ap.rng()`` on the driver, the same on every
    rank and replay), or no test set."""
    if test:
        table = read_test_table(test, "lasso", X.shape[1])
        return X, y, table.X, table.y
    if holdout == 0.0:
        return X, y, None, None
    n = len(y)
    k = round(n * holdout)
    if k < 1 or n - k < 2:
        raise AppError(
            f"lasso: holdout={holdout} of {n} rows leaves {k} to test and {n - k} to train; "
            "need at least 1 and 2"
        )
    perm = ap.rng().permutation(n)
    te, tr = np.sort(perm[:k]), np.sort(perm[k:])
    return X[tr], y[tr], X[te], y[te]


def sklearn_coef(X: np.ndarray, y: np.ndarray, alpha: float) -> np.ndarray:
    """scikit-learn's Lasso on the same standardised X, fitted to the tolerance the oracle
    needs (its default tolerance stops far from the optimum on these data)."""
    from sklearn.linear_model import Lasso

    model = Lasso(alpha=alpha, tol=1e-12, max_iter=10**6, fit_intercept=True)
    return np.asarray(model.fit(X, y).coef_, dtype=np.float64)


def choose_schedule(
    schedule: str, features: int, block: int, priority: str = "last"
) -> tuple[str, str]:
    """(the schedule a run uses, why, in words).

    With ``priority=next`` ``auto`` always draws by priority: every coordinate's priority
    is exact then, and drawing the largest first wins at every size measured, rounds to
    the default tolerance, seeds 0/1/2, block 64 and 128 alike (2026-12-07): diabetes
    (10 features) 106/119/123 against 233/251/206 uniform; synthetic 20 features 63/68/77
    against 161/152/123; 48: 68/62/61 against 181/142/179; 100: 113/133/132 against
    406/365/379; 1,000: 48-52 against 266-304.

    With ``priority=last`` ``auto`` draws by priority only when a round cannot update
    every coordinate (more features than ``block``): then which coordinates a round takes
    matters, and the ones still changing are the ones to take.  With ``features <= block``
    a round can take them all, priorities only reorder it, and the correlation check then
    keeps blocking the same coordinates behind the largest changes.  Measured, rounds to
    the default tolerance (seeds 0/1/2, floor 0.2 against uniform): diabetes (10
    features) 1,225/821/711 against 356/394/421; synthetic 20 features 659 against 352;
    32: 377/499 against 497/413; 48: 528/624 against 616/615; 64: 495/576/803 against
    807/920/948; 100: 762 against 1,316; 1,000: 394 against 5,000 without converging."""
    if schedule != "auto":
        return schedule, f"{schedule} (asked for)"
    if priority == "next":
        return "priority", "priority (by the next change)"
    if features <= block:
        return "uniform", f"uniform ({features} features <= block {block})"
    return "priority", f"priority ({features} features > block {block})"


def _check(**p: Any) -> None:
    names = ("alpha_ratio", "threshold", "floor", "tol", "rho", "noise", "holdout")
    require_finite("lasso", **{name: p[name] for name in names})
    if p["dataset"] not in DATASETS:
        raise AppError(f"lasso: dataset must be diabetes or synthetic, got {p['dataset']!r}")
    if p["schedule"] not in SCHEDULES:
        raise AppError(f"lasso: schedule must be auto, priority or uniform, got {p['schedule']!r}")
    if p["priority"] not in PRIORITIES:
        raise AppError(f"lasso: priority must be next or last, got {p['priority']!r}")
    bad = [
        f"{name}={p[name]!r} (need {need})"
        for name, ok, need in (
            ("iterations", p["iterations"] >= 0, ">= 0"),
            ("check_every", p["check_every"] >= 1, ">= 1"),
            ("alpha_ratio", 0.0 < p["alpha_ratio"] < 1.0, "0 < alpha_ratio < 1"),
            ("block", p["block"] >= 1, ">= 1"),
            ("candidates", p["candidates"] >= 0, ">= 0, 0 for 2 x block"),
            ("threshold", 0.0 < p["threshold"] <= 1.0, "0 < threshold <= 1"),
            ("floor", 0.0 < p["floor"] <= 1.0, "0 < floor <= 1"),
            ("tol", p["tol"] > 0.0, "> 0"),
            ("samples", p["samples"] >= 2, ">= 2"),
            ("features", p["features"] >= 1, ">= 1"),
            ("nonzeros", 0 <= p["nonzeros"] <= p["features"], "0 <= nonzeros <= features"),
            ("rho", 0.0 <= p["rho"] < 1.0, "0 <= rho < 1"),
            ("noise", p["noise"] >= 0.0, ">= 0"),
            ("holdout", 0.0 <= p["holdout"] < 1.0, "0 <= holdout < 1"),
        )
        if not ok
    ]
    if bad:
        raise AppError("lasso: bad parameter " + "; ".join(bad))
    if p["holdout"] and p["test"]:
        raise AppError("lasso: give holdout or test, not both")


def train(
    dataset: str = "diabetes",
    iterations: int = 5000,
    alpha_ratio: float = 0.1,
    block: int = 128,
    candidates: int = 0,
    threshold: float = 0.1,
    floor: float = 0.2,
    schedule: str = "auto",
    priority: str = "next",
    check_every: int = 10,
    tol: float = 1e-10,
    compare: bool = True,
    samples: int = 1000,
    features: int = 10000,
    nonzeros: int = 50,
    rho: float = 0.3,
    noise: float = 1.0,
    data: str = "",
    holdout: float = 0.0,
    test: str = "",
) -> dict[str, Any]:
    """Fit the Lasso by STRADS-scheduled coordinate descent; logs ``objective`` per
    iteration, ``kkt`` at every full optimality check and, with ``compare``,
    ``max_abs_diff_sklearn`` at the end.

    ``alpha = alpha_ratio * alpha_max`` where ``alpha_max = max|X^T y|/n`` is the smallest
    alpha whose solution is all zero.  Each round draws ``candidates`` coordinates (0: twice
    ``block``) and updates at most ``block`` of them whose pairwise correlations stay below
    ``threshold``.  ``samples``, ``features``, ``nonzeros``, ``rho`` and ``noise`` shape the
    synthetic problem.  ``data`` is the user's own table instead (CSV/TSV, NPY/NPZ or
    LibSVM, the target last; see :mod:`apps._tabular`): it overrides ``dataset``.
    ``holdout`` (a share of the rows, drawn from the run's seed) or ``test`` (the user's
    table) is held out of the fit, and ``test_mse`` is the mean squared error of the
    model's predictions on it.  Both are off by default, so a trace recorded before they
    existed replays with the same data.  ``schedule`` is how a round draws its
    candidates: by ``priority`` (plus ``floor``), ``uniform``, or ``auto``
    (:func:`choose_schedule`); the result's ``schedule`` says which and why.

    ``priority=next`` (the default) ranks coordinates by the change their next update
    would make and draws only among those it would move; the full check (``X^T r``, all
    features) runs every ``check_every`` rounds, whenever the moving coordinates' own
    check passes, and after the last round, and only a full check stops the run.
    ``priority=last`` is STRADS's rule: the change of each coordinate's last update,
    among all coordinates, with the full check after every round.
    """
    _check(**locals())
    raw, y = raw_data(dataset, samples, features, nonzeros, rho, noise, data)
    raw, y, test_X, test_y = held_out(raw, y, holdout, test)
    X = standardise(raw)
    x_mean, x_std = raw.mean(axis=0), raw.std(axis=0)
    del raw
    n, p = X.shape
    yc = y - y.mean()
    alpha = alpha_ratio * float(np.abs(X.T @ yc).max()) / n
    if alpha == 0.0:
        raise AppError("lasso: the target is constant, so every coefficient is zero")
    draw = candidates or 2 * block
    used, why = choose_schedule(schedule, p, block, priority)
    weight = floor if used == "priority" else 1.0  # floor 1: every coordinate alike
    # X column by column: row j of the DDS is feature j (the coordinate a body updates)
    cols = ap.dvector(p, shape=(n,), data=X.T, name="X")
    beta = ap.dvector(p, shape=(), init=ap.init.zeros(), name="beta")
    # the change a first update from zero would make seeds the priorities
    change = ap.dvector(
        p, shape=(), data=[soft_threshold(g, alpha) for g in X.T @ yc / n], name="change"
    )
    chosen = ap.dvector(min(block, p), shape=(), dtype=np.int64, name="chosen")
    resid = ap.dvector(1, shape=(n,), data=yc[None, :], name="residual")

    def update(k: int) -> None:
        j = int(chosen[k])
        x = cols[j]
        old = float(beta[j])
        norm = float(x @ x) / n
        new = soft_threshold(float(x @ resid[0]) / n + norm * old, alpha) / norm
        beta[j] = new
        change[j] = new - old

    def one_round(round_: np.ndarray) -> np.ndarray:
        """Run the round's updates; the gathered coefficients after them."""
        for k, j in enumerate(round_.tolist()):
            chosen[k] = j
        ap.async_for(0, len(round_), update, name="lasso", replan="always")
        return beta.gather()

    b = np.zeros(p)
    r = yc.copy()
    done = updates = checks = 0
    if priority == "last":
        kkt = kkt_violation(X, r, b, alpha)
        while done < iterations and kkt > tol * alpha:
            cand = sample(ap.rng(), priorities(change.gather(), weight), draw)
            round_ = independent(cand, X, threshold, block)
            b = one_round(round_)
            nz = np.flatnonzero(b)
            r = yc - X[:, nz] @ b[nz]
            resid[0] = r
            kkt = kkt_violation(X, r, b, alpha)
            done += 1
            updates += len(round_)
            checks += 1
            ap.log_objective("objective", objective(r, b, alpha))
            ap.log_objective("kkt", kkt)
    else:
        # the driver's own copy, feature by feature: gradients, residual and the
        # dependency check read whole features as contiguous rows
        XT = np.ascontiguousarray(X.T)
        del X
        grad = XT @ r / n
        kkt = violation(grad, b, alpha)
        step = next_change(grad, b, alpha)
        live = np.flatnonzero((step != 0) | (b != 0))
        full = True  # kkt and step come from a full check at the current residual
        since = 0
        while done < iterations and not (full and kkt <= tol * alpha):
            hot = np.flatnonzero(step)
            if len(hot) == 0:
                if full:  # no update would move any coefficient: nothing left to do
                    break
                full = True  # the live coordinates are settled: check all of them now
            else:
                cand = hot[sample(ap.rng(), priorities(step[hot], weight), draw)]
                round_ = independent(cand, XT.T, threshold, block)
                b = one_round(round_)
                nz = np.flatnonzero(b)
                r = yc - b[nz] @ XT[nz]
                resid[0] = r
                done += 1
                updates += len(round_)
                since += 1
                ap.log_objective("objective", objective(r, b, alpha))
                # the moving coordinates' own check; the others were inside their
                # bounds at the last full check and are checked again at the next
                full = since >= check_every or done >= iterations or len(live) >= LIVE_SHARE * p
                if not full:
                    g_live = XT[live] @ r / n
                    full = violation(g_live, b[live], alpha) <= tol * alpha
                if not full:
                    step = np.zeros(p)
                    step[live] = next_change(g_live, b[live], alpha)
            if full:
                grad = XT @ r / n
                kkt = violation(grad, b, alpha)
                checks += 1
                since = 0
                step = next_change(grad, b, alpha)
                live = np.flatnonzero((step != 0) | (b != 0))
                ap.log_objective("kkt", kkt)
        X = XT.T  # for the comparison below
    held: dict[str, Any] = {}
    if test_X is not None and test_y is not None:
        pred = (test_X - x_mean) / x_std @ b + y.mean()
        held = {"test_samples": len(test_y), "test_mse": float(np.mean((test_y - pred) ** 2))}
        ap.log_objective("test_mse", held["test_mse"])
    out: dict[str, Any] = {
        "dataset": data or dataset,
        "samples": n,
        "features": p,
        "alpha": alpha,
        "iterations": done,
        "converged": kkt <= tol * alpha,
        "kkt": kkt,
        "tolerance": tol * alpha,
        "updates": updates,
        # full checks after a round: each logged its kkt
        "checks": checks,
        "schedule": why,
        "priority": priority,
        "nonzeros": int(np.count_nonzero(b)),
        "objective": objective(r, b, alpha),
        **held,
        # coef is on standardised columns: predict (x - x_mean) / x_std @ coef + intercept
        "model": {
            "coef": beta,
            "intercept": np.float64(y.mean()),
            "x_mean": x_mean,
            "x_std": x_std,
        },
    }
    if compare:
        diff = float(np.abs(sklearn_coef(X, y, alpha) - b).max())
        ap.log_objective("max_abs_diff_sklearn", diff)
        out["max_abs_diff_sklearn"] = diff
    return out
