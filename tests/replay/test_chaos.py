"""Chaos mode: seeded legal schedules, recorded, reproducible and checked."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tracer
from engine.lowlevel import Chaos
from replay import chaos
from tests.replay.dual_apps import hot_rows

#: A small program with lock-split groups on 2 threads (bodies share four hot rows).
HOT = {"epochs": 2, "n": 40}


# ====================================================================== the seed
def test_a_merge_keeps_each_threads_plan_order_and_is_keyed_by_the_seed() -> None:
    lengths = np.array([3, 0, 4])
    turns = Chaos(5, 1).merge("op", 0, 1, 2, lengths)
    assert sorted(turns.tolist()) == [0, 0, 0, 2, 2, 2, 2]
    assert np.array_equal(turns, Chaos(5, 1).merge("op", 0, 1, 2, lengths))
    others = {tuple(Chaos(5, run).merge("op", 0, 1, 2, lengths).tolist()) for run in range(2, 12)}
    assert len(others) > 3  # the run number changes the draw
    assert Chaos(5, 1).dispatch("op", 0, 0, 0, 3) != [] and sorted(
        Chaos(5, 1).dispatch("op", 0, 0, 0, 3)
    ) == [0, 1, 2]
    with pytest.raises(ValueError, match="chaos seed"):
        Chaos(-1, 0)


# ====================================================================== explore
def test_same_seed_and_run_give_the_same_digests_and_runs_differ() -> None:
    a = chaos.explore(hot_rows, HOT, runs=6, chaos_seed=3, nodes=2, threads=2)
    b = chaos.explore(hot_rows, HOT, runs=6, chaos_seed=3, nodes=2, threads=2)
    assert [r.digests for r in a.runs] == [r.digests for r in b.runs]
    assert [r.outcome for r in a.runs] == [r.outcome for r in b.runs]
    assert a.distinct > 1  # lock-split merges really vary with the run number
    only = chaos.explore(hot_rows, HOT, runs=6, chaos_seed=3, nodes=2, threads=2, only=4)
    assert [r.run for r in only.runs] == [4]
    assert only.runs[0].outcome == a.runs[4].outcome
    other = chaos.explore(hot_rows, HOT, runs=6, chaos_seed=4, nodes=2, threads=2)
    assert [r.outcome for r in other.runs] != [r.outcome for r in a.runs]


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**63 - 1), nodes=st.integers(1, 3))
def test_one_thread_per_node_gives_one_outcome(seed: int, nodes: int) -> None:
    report = chaos.explore(hot_rows, HOT, runs=4, chaos_seed=seed, nodes=nodes, threads=1)
    assert report.distinct == 1, report.lines()


def test_every_distinct_outcome_passes_the_backward_dual_test() -> None:
    report = chaos.explore(hot_rows, HOT, runs=6, chaos_seed=11, nodes=2, threads=3, check="dual")
    assert report.failed is None, report.lines()
    assert report.distinct > 1
    assert len(report.runs) == 6


def test_every_run_is_recorded_with_its_labels_and_replays(tmp_path) -> None:
    from replay._replay import replay_here

    path = str(tmp_path / "chaos.sqlite")
    report = chaos.explore(hot_rows, HOT, runs=3, chaos_seed=9, nodes=2, threads=2, trace=path)
    with tracer.open(path) as store:
        infos = {r.run_id: r for r in store.runs()}
    assert set(infos) == {r.run_id for r in report.runs}
    for r in report.runs:
        assert infos[r.run_id].labels == {"chaos_seed": 9, "chaos_run": r.run}
        rep = replay_here({"kind": "replay", "mode": "single", "trace": path, "run_id": r.run_id})
        assert rep["identical"], rep


def test_an_objective_check_stops_at_the_first_failing_run(tmp_path) -> None:
    path = str(tmp_path / "chaos.sqlite")
    report = chaos.explore(
        hot_rows,
        HOT,
        runs=5,
        chaos_seed=3,
        nodes=2,
        threads=2,
        check="objective:norm<=0.5",
        trace=path,
    )
    f = report.failed
    assert f is not None and f.run == 0 and len(report.runs) == 1
    assert "norm" in f.message and f.check == "objective:norm<=0.5"
    assert f.replay_command == f"replay single {path} --run {report.runs[0].run_id}"
    going = chaos.explore(
        hot_rows,
        HOT,
        runs=3,
        chaos_seed=3,
        nodes=2,
        threads=2,
        check="objective:norm<=0.5",
        keep_going=True,
    )
    assert len(going.runs) == 3 and going.failures == 3 and going.failed.run == 0
    ok = chaos.explore(
        hot_rows, HOT, runs=2, chaos_seed=3, nodes=2, threads=2, check="objective:norm>0"
    )
    assert ok.failed is None


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"runs": 0}, "--runs"),
        ({"runs": 2, "only": 2}, "--only"),
        ({"runs": 2, "check": "objective:norm=1"}, "--check"),
        ({"runs": 2, "check": "objective:nope<=1"}, "never logged"),
        ({"runs": 2, "check": "sometimes"}, "--check"),
    ],
)
def test_bad_input_is_one_usage_error(kw: dict, match: str) -> None:
    from replay._errors import UsageError

    with pytest.raises(UsageError, match=match):
        chaos.explore(hot_rows, HOT, chaos_seed=1, nodes=2, threads=2, **kw)
