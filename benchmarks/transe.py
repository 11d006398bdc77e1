"""TransE figures, measured side by side in one run; prints one JSON object.

* Link prediction on Nations, Kinships and UMLS: filtered MRR and Hits@10 on the test split
  for 1 and 2 ranks, mean, standard deviation and range over ``--seeds`` run seeds
  (``replay run transe --seed S --no-trace``), and the parallel-minus-serial MRR gap.
* Epoch time for 1 and 2 ranks: (wall time of a full run - wall time of a 1-epoch run) /
  (epochs - 1), which takes process start, MPI launch, data loading, reconnaissance and the
  final evaluation out.
* Where an epoch's time goes, from a recorded run's per-invocation times (median over
  epochs, slowest node): the three entity rounds (the bodies' arithmetic plus their
  write-back) and the relation update (25-55 tiny bodies: almost pure round cost).
* What an epoch costs without the engine: the same bucket arithmetic (``run_bucket``) in a
  plain loop in this process, so the engine's share (DDS row copies, rounds, write-back) is
  the difference.

Usage: python benchmarks/transe.py [--seeds 5] [--datasets nations,kinships,umls] [--synthetic]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from datetime import date
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import tracer  # noqa: E402
from apps.transe._app import entity_blocks, make_buckets, run_bucket  # noqa: E402
from apps.transe._data import graph_dir, read_graph  # noqa: E402
from benchmarks._common import replay_run

#: Epochs per data set: Kinships has 5x the triples of Nations and learns more slowly.
EPOCHS = {"nations": 100, "kinships": 200, "umls": 100, "synthetic": 100}


class Hyper(TypedDict):
    """The app's hyper-parameters, each with the type its functions take."""

    dim: int
    lr: float
    margin: float
    norm: int
    blocks: int
    minibatch: int


#: Hyper-parameters every run uses (the app's defaults, written out for the record).
PARAMS: Hyper = {"dim": 50, "lr": 0.003, "margin": 1.0, "norm": 1, "blocks": 4, "minibatch": 64}


def spread(values: list[float]) -> dict[str, Any]:
    """Mean, sample standard deviation and range of a list of figures."""
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
        "values": values,
    }


def data_args(name: str) -> list[str]:
    """The ``-p`` arguments that select a data set."""
    return ["-p", "synthetic=true"] if name == "synthetic" else ["-p", f"dataset={name}"]


def bare_epoch_s(name: str, epochs: int = 5) -> float:
    """Seconds per epoch of the bucket arithmetic alone: numpy arrays, no DDS, one process."""
    kg = read_graph(graph_dir(name, synthetic=name == "synthetic"))
    blocks = PARAMS["blocks"]
    buckets = make_buckets(kg.train, entity_blocks(kg.train, kg.n_entities, blocks), blocks)
    rng = np.random.default_rng(0)
    E = rng.uniform(-0.8, 0.8, (kg.n_entities, PARAMS["dim"]))
    R = rng.uniform(-0.8, 0.8, (kg.n_relations, PARAMS["dim"]))
    t0 = time.perf_counter()
    for _ in range(epochs):
        for per_round in buckets:
            for bk in per_round:
                local_e = E[bk.rows]
                G, _ = run_bucket(
                    bk, local_e, R[bk.rels], rng, lr=PARAMS["lr"], margin=PARAMS["margin"],
                    norm=PARAMS["norm"], minibatch=PARAMS["minibatch"],
                )  # fmt: skip
                E[bk.rows] = local_e
                R[bk.rels] += PARAMS["lr"] * G
    return (time.perf_counter() - t0) / epochs


def recorded_split(name: str, ranks: int, epochs: int = 20) -> dict[str, float]:
    """Median seconds per epoch spent in entity rounds and in relation updates, read from
    the per-invocation times a recorded run stores (slowest node per invocation)."""
    fixed = [x for k, v in PARAMS.items() for x in ("-p", f"{k}={v}")]
    with tempfile.TemporaryDirectory(prefix="transe-bench-") as tmp:
        path = os.path.join(tmp, "t.sqlite")
        replay_run(
            ["transe", *data_args(name), *fixed, "-p", f"epochs={epochs}",
             "--ranks", str(ranks), "--trace", path]
        )  # fmt: skip
        with tracer.open(path) as trace:
            run = trace.run()
            ent: dict[int, float] = defaultdict(float)
            rel: dict[int, float] = defaultdict(float)
            slowest: dict[tuple[str, int], float] = defaultdict(float)
            for inv in run.invocations():
                k = (inv.op, inv.invocation)
                slowest[k] = max(slowest[k], inv.seconds)
            for (op, i), sec in slowest.items():
                if op == "rel":
                    rel[i] += sec  # one relation update per epoch
                else:
                    ent[i] += sec  # each entity round runs once per epoch
    # the first epoch pays for reconnaissance and planning
    ent_s = statistics.median([v for e, v in ent.items() if e > 0])
    rel_s = statistics.median([v for e, v in rel.items() if e > 0])
    return {"entity_rounds_s": ent_s, "relation_updates_s": rel_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--datasets", default="nations,kinships,umls")
    parser.add_argument("--synthetic", action="store_true", help="only the synthetic graph")
    args = parser.parse_args()
    names = ["synthetic"] if args.synthetic else args.datasets.split(",")
    fixed = [x for k, v in PARAMS.items() for x in ("-p", f"{k}={v}")]

    out: dict[str, Any] = {
        "date": date.today().isoformat(),
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "params": PARAMS,
        "seeds": args.seeds,
        "datasets": {},
    }
    for name in names:
        epochs = EPOCHS[name]
        res: dict[str, Any] = {"epochs": epochs}
        for ranks in (1, 2):
            runs = []
            for seed in range(args.seeds):
                runs.append(
                    replay_run(
                        [
                            "transe",
                            *data_args(name),
                            *fixed,
                            "-p",
                            f"epochs={epochs}",
                            "--ranks",
                            str(ranks),
                            "--seed",
                            str(seed),
                            "--no-trace",
                        ]
                    )  # fmt: skip
                )
                print(f"{name} ranks={ranks} seed={seed}: {runs[-1]['objectives']}"[:160],
                      file=sys.stderr)  # fmt: skip
            one = replay_run(
                ["transe", *data_args(name), *fixed, "-p", "epochs=1",
                 "--ranks", str(ranks), "--seed", "0", "--no-trace"]
            )  # fmt: skip
            res[f"ranks{ranks}"] = {
                "mrr": spread([r["objectives"]["mrr"][-1] for r in runs]),
                "hits10": spread([r["objectives"]["hits10"][-1] for r in runs]),
                "epoch_s": (runs[0]["wall_s"] - one["wall_s"]) / (epochs - 1),
                "planner": runs[0]["planner"],
            }
        res["mrr_gap_parallel_minus_serial"] = (
            res["ranks2"]["mrr"]["mean"] - res["ranks1"]["mrr"]["mean"]
        )
        res["epoch_ratio_2_over_1"] = res["ranks2"]["epoch_s"] / res["ranks1"]["epoch_s"]
        res["bare_numpy_epoch_s"] = bare_epoch_s(name)
        res["recorded_split"] = {f"ranks{r}": recorded_split(name, r) for r in (1, 2)}
        out["datasets"][name] = res
        print(json.dumps({name: res}), file=sys.stderr)
    out["load_average_at_end"] = os.getloadavg()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
