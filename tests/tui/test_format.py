"""Plain-text formatting of the browser: events and errors in words, never class names."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import tracer
from tui import _format as fmt
from tui._repo import BrowseError, _guard
from tui._rundiff import setup_differences


def test_sync_orders_in_words() -> None:
    agg = tracer.DeltasAggregated(0, 3, "fit", 1, 2, (1, 0))
    assert fmt.sync_order(agg) == ("deltas aggregated", "from nodes 1, 0 (in this order)")
    applied = tracer.UpdatesApplied(1, 4, "fit", 1, 2, (0, -1, 3))
    assert fmt.sync_order(applied) == (
        "updates applied",
        "node 0: to clock 0, node 1: none, node 2: to clock 3",
    )
    none = tracer.UpdatesApplied(1, 4, "fit", 1, 0, (-1, -1))
    assert fmt.sync_order(none) == ("updates applied", "none yet")
    mutex = tracer.MutexGranted(0, 5, "fit", 0, 1, 2, 7)
    assert fmt.sync_order(mutex) == ("mutex granted", "to thread 2 for minibatch 7")


@dataclass(frozen=True, slots=True)
class BarrierPassedLate:
    node: int
    seq: int
    op: str
    invocation: int
    clock: int
    waited_for: tuple[int, ...]


def test_an_unknown_event_kind_is_named_in_words() -> None:
    ev = BarrierPassedLate(0, 9, "fit", 2, 4, (1, 2))
    assert fmt.sync_order(ev) == ("barrier passed late", "waited for 1, 2")
    line = fmt.event_line(ev)  # type: ignore[arg-type]
    assert line == "event 9: barrier passed late in fit invocation 2 clock 4: waited for 1, 2"
    assert "BarrierPassedLate" not in line and "=" not in line


def test_a_failed_read_says_the_message_not_the_exception_class() -> None:
    def bad() -> None:
        raise ValueError("block 3 is truncated")

    def silent() -> None:
        raise ZeroDivisionError

    for fn, want in (
        (bad, "cannot read the plan: block 3 is truncated"),
        (silent, "cannot read the plan: an unexpected zero division error"),
    ):
        try:
            _guard("the plan", fn)
        except BrowseError as exc:
            assert str(exc) == want
        else:
            raise AssertionError("no BrowseError")


def _info(**changes: Any) -> tracer.RunInfo:
    base = tracer.RunInfo(
        run_id="r",
        app="sgdmf",
        target="apps.sgdmf:train",
        params={"epochs": 10, "rank": 32},
        code_digest="c0ffee00",
        ranks=2,
        threads=1,
        seed=0,
        versions={"numpy": "2.4.6", "python": "3.11.7"},
        started_at=0.0,
        ended_at=1.0,
        status="finished",
        error=None,
        last_commit_at=None,
        duration=1.0,
    )
    return dataclasses.replace(base, **changes)


def _summary(op: str, **changes: Any) -> tracer.OperatorSummary:
    base = tracer.OperatorSummary(op, "rotation", 2, 1.0, 1, 10, 1000, 0, 0, 0, 0, 0, 0, 0)
    return dataclasses.replace(base, **changes)


def test_setup_differences_name_parameters_versions_and_plans_in_words() -> None:
    a = _info()
    b = _info(
        params={"epochs": 5, "rank": 32, "lam": 0.1},
        versions={"numpy": "2.0.0", "python": "3.11.7"},
        threads=2,
        labels={"chaos_run": 3, "exact_reduce": True, "ring_routes": True},
    )
    ops_a = {"sgd": _summary("sgd")}
    ops_b = {"sgd": _summary("sgd", strategy="components", rounds=5), "eval": _summary("eval")}
    assert setup_differences(a, b, ops_a, ops_b) == [
        "parameters differ: epochs 10 vs 5, lam unset vs 0.1",
        "shape differs: 2 rank(s) × 1 thread(s) vs 2 rank(s) × 2 thread(s)",
        "versions differ: numpy 2.4.6 vs 2.0.0",
        "labels differ: chaos run unset vs 3, exact reduce unset vs yes, ring routes unset vs yes",
        "plan of sgd differs: rotation vs components, 2 vs 5 round(s)",
        "operator eval ran only in B",
    ]
    assert setup_differences(a, a, ops_a, ops_a) == []


def test_an_empty_setting_is_said_in_a_word_not_left_blank() -> None:
    """A run recorded through the library has no code digest, and sgdmf's ``data`` is
    an empty string: "digest  vs c0ffee00" read as if a word were missing."""
    b = _info(params={"epochs": 10, "rank": 32, "data": ""}, code_digest="")
    assert setup_differences(_info(), b, {}, {}) == [
        "parameters differ: data unset vs empty",
        "code differs: digest c0ffee00 vs empty",
    ]


def test_json_true_false_and_null_read_as_words() -> None:
    from tui.screens.history import short_value

    assert [fmt.scalar(v) for v in (True, False, None, 0, "x")] == ["yes", "no", "none", "0", "x"]
    assert short_value([0.5, None, True, 2]) == "[0.5, none, yes, …]"
    assert short_value("w") == "w" and short_value(3) == "3"
