"""How many chaos runs, and how many property-test examples, find each engine mutant
(issue 17, the README's *Chaos against the mutants* table); prints one JSON object.

* chaos: ``replay.chaos.explore(program, runs=BUDGET, check="dual")`` with the mutant of
  ``tests/mutants.py`` switched on, on the program ``tests/replay/test_chaos.py`` uses for
  it; the figure is the number of runs up to and including the first failing one;
* property tests: the generated programs of ``tests/replay/test_dual_property.py``
  (BSP-only programs for the two aggregation mutants), one hunt per hypothesis seed; the
  figure is the number of examples up to the first failing one.

``wrong_lock_order`` is found because a chaos run overlaps the bodies of a lock-split
round at every access to an element the group writes (the baton gate), so a body that
reads an element it did not lock sees another body mid-way.

Usage: python benchmarks/mutant_hunts.py [--chaos-runs 20] [--examples 1000] [--seeds 1 2 3]
       [--mutants NAME ...] [--chaos-seeds 0 1 2]   (--examples 0: chaos hunts only)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ASYNC = ("skip_writeback", "stale_prefetch", "drop_barrier", "wrong_lock_order")
SYNC = ("aggregate_twice", "reorder_aggregation")


def _examples(mutant: str, budget: int, seed: int) -> int | None:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    from replay import strategies as rs
    from tests import mutants

    cases = (
        rs.cases(programs=rs.programs(kinds=("sync",), syncs=("bsp",)))
        if mutant in SYNC
        else rs.cases()
    )
    seen = [0]
    found: list[int] = []

    class Caught(Exception):
        pass

    @hseed(seed)
    @settings(
        max_examples=budget,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(cases)
    def search(case: Any) -> None:
        if found:  # also when hypothesis replays a failure that timing made flaky
            raise Caught()
        seen[0] += 1
        if any(not r.passed for r in rs.check(case).values()):
            found.append(seen[0])
            raise Caught()

    with mutants.active(mutant):
        try:
            search()
        except Caught:
            pass
    return found[0] if found else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chaos-runs", type=int, default=20)
    ap.add_argument("--examples", type=int, default=1000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--mutants", nargs="+", default=None, help="hunt only these mutants")
    ap.add_argument(
        "--chaos-seeds", type=int, nargs="+", default=[0], help="one chaos hunt per seed"
    )
    args = ap.parse_args()
    from replay import chaos
    from tests import mutants
    from tests.replay.chaos_apps import bsp_mix, mini_mf
    from tests.replay.dual_apps import hot_rows

    #: mutant: (app, params, nodes, threads)
    programs: dict[str, tuple[Callable[..., Any], dict[str, Any], int, int]] = {
        "skip_writeback": (mini_mf, {}, 2, 2),
        "stale_prefetch": (mini_mf, {}, 2, 2),
        "drop_barrier": (mini_mf, {}, 2, 2),
        "wrong_lock_order": (hot_rows, {}, 1, 2),
        "aggregate_twice": (bsp_mix, {}, 3, 1),
        "reorder_aggregation": (bsp_mix, {}, 3, 1),
    }
    out: dict[str, Any] = {
        "benchmark": "mutant_hunts",
        "date": date.today().isoformat(),
        "chaos_budget": args.chaos_runs,
        "chaos_seeds": args.chaos_seeds,
        "example_budget": args.examples,
        "mutants": {},
    }
    for name, (app, params, nodes, threads) in programs.items():
        if args.mutants is not None and name not in args.mutants:
            continue
        found: list[int | None] = []
        for cseed in args.chaos_seeds:
            with mutants.active(name):
                rep = chaos.explore(
                    app,
                    params,
                    runs=args.chaos_runs,
                    chaos_seed=cseed,
                    nodes=nodes,
                    threads=threads,
                    check="dual",
                )
            found.append(None if rep.failed is None else rep.failed.run + 1)
        out["mutants"][name] = {
            "chaos_runs": found[0] if len(found) == 1 else found,
            "property_examples": (
                [_examples(name, args.examples, s) for s in args.seeds] if args.examples else None
            ),
        }
        print(name, out["mutants"][name], file=sys.stderr, flush=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
