"""LDA (``apps/lda``): loglik per iteration on 1, 2 and 3 ranks and time per iteration,
side by side with a plain numba collapsed-Gibbs sampler and with scikit-learn's
``LatentDirichletAllocation``.

* **ours**: ``replay run lda --no-trace`` on 1, 2 and 3 ranks (one thread each), with
  its default compiled body (``gibbs_kernel``), and on 1 rank with ``-p kernel=false``
  (the Python body, side ``1_python``; the same bits, so the same loglik).  The
  steady time per iteration is taken inside each run, from the end of iteration
  ``SHORT`` to the end of the last (the run stamps every logged ``loglik``): one
  iteration is the ``async_for`` of the sweep with everything the engine does around
  it (plan guard, write-back, digests, the closure check) and the driver's ``loglik``
  from the gathered counts.  Data loading, the numba compile and reconnaissance are
  paid before and do not count.
* **numba**: the sampler a user would otherwise write (:func:`numba_sweep`): one
  process, one thread, no engine; the same documents and vocabulary the app loads, the
  same K, alpha and beta, and the same initial topics (the app's first draw from the
  run's driver stream); then one loop over the tokens in corpus order per iteration,
  with numba's own uniform draws, and the same ``loglik`` after it.  Timed the same way
  (per iteration after ``SHORT`` warm iterations, the compile excluded);
  ``sweep_ms_per_iteration`` is the sweep alone.
* **ratio** ``ours_1rank_over_numba``: ours on 1 rank / numba, per iteration (issue 37's
  budget: <= 1.2); also against the numba sweep alone, and our ``async_for`` alone
  (median) against it; ``ours_1rank_python_body_over_numba`` is the same ratio for the
  Python body.  Measured 2026-12-07 (best of 5, load average 4-6 from other jobs): lee
  4.98 / 3.07 ms = 1.63 with the kernel, 2.56 with the Python body (2.0 before the kernel
  at load 2, 6.0 before ``take``/``put``); ``--synthetic`` 2.21 / 1.79 ms = 1.23 (Python
  body 2.72).  Over budget: see the README's LDA section for where the rest goes.
* scikit-learn's batch variational LDA is fitted in this process on the same documents,
  with the same number of topics and priors.

Every perplexity on the training documents uses one formula,
``exp(-sum log sum_k theta_dk phi_kw / tokens)`` from each model's point estimates;
scikit-learn's own ``perplexity()`` (its variational bound) is printed too.  Each repeat
runs the numba sampler, then ours on 1, 2 and 3 ranks, then the Python body on 1 rank;
each time is the best of
``--repeats`` repeats (load on a shared machine only ever adds time), and
``ms_per_iteration_per_repeat`` lists them all, with the load average before and after.

    python benchmarks/lda.py                          # lee_background, 10 topics, 100 iterations
    python benchmarks/lda.py --corpus head500 --iterations 50
    python benchmarks/lda.py --synthetic              # offline: planted topics
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from apps.lda._app import load  # noqa: E402
from apps.lda._model import estimates, loglik, perplexity  # noqa: E402
from benchmarks._common import replay_run

#: Iterations at which the loglik table is reported (and the last one).
MARKS = (0, 5, 10, 25, 50, 100, 200)
#: Warm iterations before the steady time per iteration is taken.
SHORT = 5
#: Issue 37's budget: ours on 1 rank / the numba sampler, per iteration.
BUDGET = 1.2
#: What ``load`` is given for the synthetic corpus (the app's defaults).
DOCS, LENGTH, MIN_COUNT, MAX_DF = 200, 60, 3, 0.5


# ---------------------------------------------------------------- the numba reference
@numba.njit(cache=True)
def numba_seed(seed: int) -> None:
    """Seed numba's own generator (the one ``np.random`` calls in compiled code use)."""
    np.random.seed(seed)


@numba.njit(cache=True)
def numba_sweep(
    words: np.ndarray,
    docs: np.ndarray,
    z: np.ndarray,
    nw: np.ndarray,
    nd: np.ndarray,
    nk: np.ndarray,
    alpha: float,
    beta: float,
    vbeta: float,
) -> None:
    """One collapsed-Gibbs iteration: every token, in corpus order, is taken out of the
    counts, given a topic drawn from p(k) ∝ (n_wk + beta)(n_dk + alpha)/(n_k + V beta),
    and put back."""
    K = nk.shape[0]
    acc = np.zeros(K)
    for i in range(words.shape[0]):
        w, d, old = words[i], docs[i], z[i]
        nw[w, old] -= 1
        nd[d, old] -= 1
        nk[old] -= 1
        s = 0.0
        for k in range(K):
            s += (nw[w, k] + beta) * (nd[d, k] + alpha) / (nk[k] + vbeta)
            acc[k] = s
        r = np.random.random() * s
        new = 0
        while new < K - 1 and acc[new] <= r:
            new += 1
        z[i] = new
        nw[w, new] += 1
        nd[d, new] += 1
        nk[new] += 1


def initial_topics(args: argparse.Namespace, tokens: int) -> np.ndarray:
    """The app's initial topics: its first draw from the run's driver stream (seed 0)."""
    import engine as ap

    def draw() -> np.ndarray:
        return ap.rng().integers(args.topics, size=tokens)

    return np.asarray(ap.run(draw).value, dtype=np.int64)


class Reference:
    """The plain sampler on the app's data, compiled once; :meth:`run` is one timed run."""

    def __init__(self, args: argparse.Namespace) -> None:
        data, _ = load(args.corpus, args.synthetic, args.topics, DOCS, LENGTH, MIN_COUNT, MAX_DF)
        self.args, self.data = args, data
        self.words = np.concatenate(data.docs)
        self.docs = np.concatenate(
            [np.full(len(d), i, dtype=np.int64) for i, d in enumerate(data.docs)]
        )
        self.shape = (len(data.vocab), len(data.docs), args.topics)
        self.z0 = initial_topics(args, len(self.words))
        # compiled before anything is timed (on a copy, so the timed runs start from z0)
        z, nw, nd, nk = counts(self.words, self.docs, self.z0, *self.shape)
        numba_seed(0)
        numba_sweep(self.words, self.docs, z, nw, nd, nk, args.alpha, args.beta, 1.0)

    def run(self) -> dict[str, Any]:
        """``--iterations`` iterations from the app's initial topics: the loglik marks,
        perplexity and steady seconds per iteration (with loglik, and the sweep alone)."""
        a = self.args
        vbeta = self.shape[0] * a.beta
        z, nw, nd, nk = counts(self.words, self.docs, self.z0, *self.shape)
        numba_seed(0)
        ends, sweeps, ll = [], [], []
        t0 = time.perf_counter()
        for _ in range(a.iterations):
            s0 = time.perf_counter()
            numba_sweep(self.words, self.docs, z, nw, nd, nk, a.alpha, a.beta, vbeta)
            sweeps.append(time.perf_counter() - s0)
            ll.append(loglik(nw, nd, a.alpha, a.beta))
            ends.append(time.perf_counter() - t0)
        _, want_w, want_d, want_k = counts(self.words, self.docs, z, *self.shape)
        theta, phi = estimates(nw, nd, a.alpha, a.beta)
        return {
            "loglik": marks(ll),
            "perplexity": round(perplexity(self.data.doc_term(), theta, phi), 2),
            # the counts are those of the topics it ended with
            "counts_consistent": bool(
                (nw == want_w).all() and (nd == want_d).all() and (nk == want_k).all()
            ),
            "steady_s": (ends[-1] - ends[SHORT - 1]) / (a.iterations - SHORT),
            "sweep_s": float(np.mean(sweeps[SHORT:])),
        }


def counts(
    words: np.ndarray, docs: np.ndarray, z0: np.ndarray, V: int, D: int, K: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(topics, word-topic, document-topic and topic counts) of the assignment ``z0``."""
    z = z0.copy()
    nw = np.zeros((V, K), dtype=np.int64)
    np.add.at(nw, (words, z), 1)
    nd = np.zeros((D, K), dtype=np.int64)
    np.add.at(nd, (docs, z), 1)
    return z, nw, nd, nw.sum(axis=0)


def marks(ll: list[float]) -> dict[str, float]:
    """The loglik table: its value at each of ``MARKS`` and at the last iteration."""
    at = [i for i in MARKS if i < len(ll)] + [len(ll) - 1]
    return {str(i): round(ll[i], 1) for i in at}


# ---------------------------------------------------------------- ours
def ours(args: argparse.Namespace, ranks: int, kernel: bool = True) -> dict[str, Any]:
    """One untraced ``replay run lda`` on ``ranks`` ranks, timed inside the run (the
    compiled body, or the Python one with ``kernel=False``)."""
    params = [
        "-p", f"kernel={str(kernel).lower()}",
        "-p", f"corpus={args.corpus}",
        "-p", f"synthetic={str(args.synthetic).lower()}",
        "-p", f"topics={args.topics}",
        "-p", f"alpha={args.alpha}",
        "-p", f"beta={args.beta}",
        "-p", f"iterations={args.iterations}",
    ]  # fmt: skip
    out = replay_run(["lda", "--no-trace", "--ranks", str(ranks), *params])
    ends = out["objective_times"]["loglik"]
    return {
        "loglik": marks(out["objectives"]["loglik"]),
        "perplexity": round(out["objectives"]["perplexity"][0], 2),
        "wall_s": out["wall_s"],
        "steady_s": (ends[-1] - ends[SHORT - 1]) / (args.iterations - SHORT),
        "loop_s": float(np.median(out["op_times"]["gibbs"][SHORT:])),
        "planner": out["planner"].get("gibbs"),
    }


def sklearn_side(args: argparse.Namespace) -> dict[str, Any]:
    from sklearn.decomposition import LatentDirichletAllocation

    data, _ = load(args.corpus, args.synthetic, args.topics, DOCS, LENGTH, MIN_COUNT, MAX_DF)
    X = data.doc_term()
    model = LatentDirichletAllocation(
        n_components=args.topics,
        doc_topic_prior=args.alpha,
        topic_word_prior=args.beta,
        learning_method="batch",
        max_iter=args.iterations,
        random_state=0,
    )
    t0 = time.perf_counter()
    model.fit(X)
    fit_s = time.perf_counter() - t0
    phi = model.components_ / model.components_.sum(axis=1, keepdims=True)
    return {
        "documents": int(X.shape[0]),
        "words": int(X.shape[1]),
        "tokens": int(X.sum()),
        "em_iterations": int(model.n_iter_),
        "fit_s": round(fit_s, 3),
        "ms_per_iteration": round(1000 * fit_s / max(int(model.n_iter_), 1), 2),
        "perplexity": round(perplexity(X, model.transform(X), phi), 2),
        "perplexity_variational_bound": round(float(model.perplexity(X)), 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="lee", choices=("lee", "head500"))
    ap.add_argument("--synthetic", action="store_true")
    ap.add_argument("--topics", type=int, default=10)
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--beta", type=float, default=0.01)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.iterations <= SHORT:
        raise SystemExit(f"--iterations must be > {SHORT}")
    if args.repeats < 1:
        raise SystemExit("--repeats must be >= 1")
    load_before = os.getloadavg()
    ref = Reference(args)
    runs: dict[str, Any] = {}
    spread: dict[str, list[float]] = {}
    for _ in range(args.repeats):  # interleaved, so that a burst of load hits every side
        got = {"numba": ref.run(), **{str(r): ours(args, r) for r in (1, 2, 3)}}
        got["1_python"] = ours(args, 1, kernel=False)
        for side, res in got.items():
            best = runs.setdefault(side, res)
            spread.setdefault(side, []).append(round(1000 * res["steady_s"], 3))
            for key in ("steady_s", "loop_s", "sweep_s", "wall_s"):
                if key in res:
                    best[key] = min(best[key], res[key])
    numba = runs.pop("numba")
    numba["ms_per_iteration"] = round(1000 * numba.pop("steady_s"), 3)
    numba["sweep_ms_per_iteration"] = round(1000 * numba.pop("sweep_s"), 3)
    for r in runs.values():
        r["ms_per_iteration"] = round(1000 * r.pop("steady_s"), 3)
        r["loop_ms"] = round(1000 * r.pop("loop_s"), 3)
    one = runs["1"]["ms_per_iteration"]
    for r in ("2", "3"):
        runs[r]["time_ratio_to_1_rank"] = round(runs[r]["ms_per_iteration"] / one, 3)
    ratio = one / numba["ms_per_iteration"]
    out = {
        "date": date.today().isoformat(),
        "corpus": "synthetic" if args.synthetic else args.corpus,
        "topics": args.topics,
        "iterations": args.iterations,
        "alpha": args.alpha,
        "beta": args.beta,
        "repeats": args.repeats,
        "gibbs": runs,
        "numba": numba,
        "ratios": {
            "ours_1rank_python_body_over_numba": round(
                runs["1_python"]["ms_per_iteration"] / numba["ms_per_iteration"], 3
            ),
            "ours_1rank_over_numba": {
                "value": round(ratio, 3),
                "budget": BUDGET,
                "met": ratio <= BUDGET,
            },
            "ours_1rank_over_numba_sweep": round(one / numba["sweep_ms_per_iteration"], 3),
            "ours_1rank_loop_over_numba_sweep": round(
                runs["1"]["loop_ms"] / numba["sweep_ms_per_iteration"], 3
            ),
        },
        "ms_per_iteration_per_repeat": spread,
        "sklearn": sklearn_side(args),
        "loadavg": {
            "before": [round(x, 2) for x in load_before],
            "after": [round(x, 2) for x in os.getloadavg()],
        },
    }
    print(json.dumps({"lda": out}, indent=1))


if __name__ == "__main__":
    main()
