"""Word2vec against gensim, side by side in one run; prints one JSON object.

For each seed: ``gensim.models.Word2Vec`` (skip-gram, negative sampling, ``workers=1``)
and ``replay run word2vec`` on 1 and on 2 ranks train on the same sentences of
``head500.noblanks.cor`` with the same hyper-parameters.  All three are scored by the
same code (``apps.word2vec._eval``): WordSim353 Spearman on the pairs in the
vocabulary, and 3CosAdd accuracy on the analogy questions whose words are all in it.
Reported per system: mean, standard deviation and range over the seeds, and the time
per epoch.  For ours, ``exec_s`` is the median ``sync_for`` execution per epoch and
``epoch_s`` adds the per-epoch reconnaissance (the whole run's wall time, minus
loading, over the epochs); ``per_clock_ms`` splits a clock into body and
synchronisation cost (2-rank clock time minus the 1-rank per-minibatch time).

gensim is a benchmark/test dependency (``pip install '.[test]'``), not a runtime one.

Usage: python benchmarks/word2vec.py [--seeds 5] [--epochs 5] [--ranks 1 2]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import date
from typing import Any

import numpy as np
from _common import ROOT, replay_run, steady

sys.path.insert(0, str(ROOT))

from apps.word2vec import _data, _eval  # noqa: E402

#: Hyper-parameters shared by gensim and ours (gensim's defaults, skip-gram).
HYPER = {
    "dim": 100,
    "window": 5,
    "negative": 5,
    "min_count": 5,
    "sample": 1e-3,
    "alpha": 0.025,
    "min_alpha": 0.0001,
}
#: Ours only: words per sentence piece, pieces per minibatch, shared negatives (0: per pair).
OURS = {"sentence_len": 100, "minibatch": 32, "pool": 0}


def gensim_run(
    sentences: list[list[str]], epochs: int, seed: int, pairs: Any, questions: Any
) -> dict[str, float]:
    """Train gensim on ``sentences``; its scores and seconds per epoch."""
    from gensim.models import Word2Vec

    h = HYPER
    model = Word2Vec(
        vector_size=h["dim"],
        window=h["window"],
        negative=h["negative"],
        min_count=h["min_count"],
        sample=h["sample"],
        alpha=h["alpha"],
        min_alpha=h["min_alpha"],
        sg=1,
        hs=0,
        workers=1,
        seed=seed,
    )
    model.build_vocab(sentences)
    t0 = time.perf_counter()
    model.train(sentences, total_examples=len(sentences), epochs=epochs)
    seconds = (time.perf_counter() - t0) / epochs
    index = dict(model.wv.key_to_index)
    vectors = model.wv.vectors
    return {
        "wordsim": _eval.wordsim(vectors, index, pairs).value,
        "analogy": _eval.analogies(vectors, index, questions).value,
        "epoch_s": seconds,
        "vocab": len(index),
    }


def ours_run(ranks: int, epochs: int, seed: int) -> dict[str, float]:
    """``replay run word2vec`` on ``ranks`` ranks (no trace); scores and timings."""
    params = {**HYPER, **OURS, "epochs": epochs, "corpus": "head500"}
    args = ["word2vec", "--ranks", str(ranks), "--seed", str(seed), "--no-trace"]
    for k, v in params.items():
        args += ["-p", f"{k}={v}"]
    out = replay_run(args)
    plan = out["planner"]["sgns"]
    exec_s = steady(out["op_times"]["sgns"])
    return {
        "wordsim": out["objectives"]["wordsim"][-1],
        "analogy": out["objectives"]["analogy"][-1],
        "exec_s": exec_s,
        "epoch_s": out["wall_s"] / epochs,
        "recon_first_s": plan["recon_s"],
        "clocks": plan["rounds"],
        "bytes_per_clock": plan["bytes_per_clock"],
    }


def summary(values: list[float]) -> dict[str, Any]:
    """Mean, sample standard deviation, range and the values."""
    return {
        "mean": round(statistics.fmean(values), 4),
        "std": round(statistics.stdev(values), 4) if len(values) > 1 else None,
        "min": round(min(values), 4),
        "max": round(max(values), 4),
        "values": [round(v, 4) for v in values],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    where = _data.gensim_test_data()
    sentences = _data.read_corpus(where / "head500.noblanks.cor", OURS["sentence_len"])
    pairs = _data.read_wordsim(where / "wordsim353.tsv")
    questions = _data.read_questions(where / "questions-words.txt")
    runs: dict[str, list[dict[str, float]]] = {"gensim": []}
    runs.update({f"ours_{r}rank": [] for r in args.ranks})
    for seed in range(args.seeds):
        runs["gensim"].append(gensim_run(sentences, args.epochs, seed, pairs, questions))
        for r in args.ranks:
            runs[f"ours_{r}rank"].append(ours_run(r, args.epochs, seed))
        done = {name: rs[-1] for name, rs in runs.items()}
        print(json.dumps({"seed": seed, **done}), file=sys.stderr, flush=True)
    table: dict[str, Any] = {}
    for name, rs in runs.items():
        table[name] = {k: summary([r[k] for r in rs]) for k in rs[0]}
    out: dict[str, Any] = {
        "benchmark": "word2vec",
        "date": date.today().isoformat(),
        "machine": f"{platform.machine()} {platform.python_version()}",
        "corpus": "head500.noblanks.cor (gensim 4.4.0 test data)",
        "sentences": len(sentences),
        "epochs": args.epochs,
        "seeds": args.seeds,
        "hyper": HYPER,
        "ours": OURS,
        "results": table,
    }
    g = table["gensim"]["wordsim"]["mean"]
    checks: dict[str, Any] = {}
    if "ours_1rank" in table:
        one = table["ours_1rank"]
        checks["wordsim_gensim_minus_ours_1rank"] = round(g - one["wordsim"]["mean"], 4)
        if "ours_2rank" in table:
            two = table["ours_2rank"]
            checks["wordsim_1rank_minus_2rank"] = round(
                one["wordsim"]["mean"] - two["wordsim"]["mean"], 4
            )
            m1 = float(np.median([r["exec_s"] for r in runs["ours_1rank"]]))
            m2 = float(np.median([r["exec_s"] for r in runs["ours_2rank"]]))
            c1 = runs["ours_1rank"][0]["clocks"]
            c2 = runs["ours_2rank"][0]["clocks"]
            body_ms = 1000 * m1 / c1  # one minibatch with nothing to synchronise
            clock_ms = 1000 * m2 / c2  # one minibatch per rank, then the exchange
            checks["exec_2rank_over_1rank"] = round(m2 / m1, 3)
            checks["per_clock_ms"] = {
                "body_1rank": round(body_ms, 3),
                "clock_2rank": round(clock_ms, 3),
                "sync_2rank": round(clock_ms - body_ms, 3),
            }
    out["checks"] = checks
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
