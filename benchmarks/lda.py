"""LDA (``apps/lda``): loglik per iteration on 1, 2 and 3 ranks, time per iteration, and
perplexity side by side with scikit-learn's ``LatentDirichletAllocation``.

``replay run lda`` runs untraced on 1, 2 and 3 ranks (one thread each) in this one
invocation, each twice: ``--iterations`` iterations and 5 iterations, so that the steady
time per iteration is ``(wall(N) - wall(5)) / (N - 5)`` (data loading, the compile of the
sweep and reconnaissance cancel out).  scikit-learn's batch variational LDA is fitted in
this process on the same documents (the app's vocabulary), with the same number of topics
and the same priors.  Both perplexities on the training documents are computed with one
formula, ``exp(-sum log sum_k theta_dk phi_kw / tokens)`` from each model's point
estimates; scikit-learn's own ``perplexity()`` (its variational bound) is printed too.

    python benchmarks/lda.py                          # lee_background, 10 topics, 100 iterations
    python benchmarks/lda.py --corpus head500 --iterations 50
    python benchmarks/lda.py --synthetic              # offline: planted topics
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from apps.lda._app import load  # noqa: E402
from apps.lda._model import perplexity  # noqa: E402
from benchmarks._common import replay_run

#: Iterations at which the loglik table is reported (and the last one).
MARKS = (0, 5, 10, 25, 50, 100, 200)
#: Iterations of the short run whose wall time is subtracted.
SHORT = 5


def sklearn_side(args: argparse.Namespace) -> dict[str, Any]:
    from sklearn.decomposition import LatentDirichletAllocation

    data, _ = load(args.corpus, args.synthetic, args.topics, 200, 60, 3, 0.5)
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
    args = ap.parse_args()
    if args.iterations <= SHORT:
        raise SystemExit(f"--iterations must be > {SHORT}")
    params = [
        "-p", f"corpus={args.corpus}",
        "-p", f"synthetic={str(args.synthetic).lower()}",
        "-p", f"topics={args.topics}",
        "-p", f"alpha={args.alpha}",
        "-p", f"beta={args.beta}",
    ]  # fmt: skip
    runs: dict[str, Any] = {}
    for ranks in (1, 2, 3):
        long = replay_run(["lda", "--no-trace", "--ranks", str(ranks), *params,
                           "-p", f"iterations={args.iterations}"])  # fmt: skip
        short = replay_run(["lda", "--no-trace", "--ranks", str(ranks), *params,
                            "-p", f"iterations={SHORT}"])  # fmt: skip
        ll = long["objectives"]["loglik"]
        marks = [i for i in MARKS if i < len(ll)] + [len(ll) - 1]
        runs[str(ranks)] = {
            "loglik": {str(i): round(ll[i], 1) for i in marks},
            "perplexity": round(long["objectives"]["perplexity"][0], 2),
            "wall_s": long["wall_s"],
            "ms_per_iteration": round(
                1000 * (long["wall_s"] - short["wall_s"]) / (args.iterations - SHORT), 2
            ),
            "planner": long["planner"].get("gibbs"),
        }
    one = runs["1"]["ms_per_iteration"]
    for r in ("2", "3"):
        runs[r]["time_ratio_to_1_rank"] = round(runs[r]["ms_per_iteration"] / one, 3)
    out = {
        "corpus": "synthetic" if args.synthetic else args.corpus,
        "topics": args.topics,
        "iterations": args.iterations,
        "alpha": args.alpha,
        "beta": args.beta,
        "gibbs": runs,
        "sklearn": sklearn_side(args),
    }
    print(json.dumps({"lda": out}, indent=1))


if __name__ == "__main__":
    main()
