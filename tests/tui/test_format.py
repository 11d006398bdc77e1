"""Plain-text formatting of the browser: events and errors in words, never class names."""

from __future__ import annotations

from dataclasses import dataclass

import tracer
from tui import _format as fmt
from tui._repo import BrowseError, _guard


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
    assert line == "#9 barrier passed late fit/2 clock 4 waited for 1, 2"
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
