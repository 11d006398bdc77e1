"""The message-order machine: fed by hand, and driving real MPI receives."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import DivergenceError
from engine.lowlevel import MessageLog, MessageOrder, Schedule, ScheduleExhausted


def test_free_machine_lets_anything_arrive_and_logs_it() -> None:
    m = MessageOrder()
    assert m.expect(0, "rows") is None
    m.arrived(0, "rows", 2)
    m.arrived(0, "rows", 1)
    m.arrived(1, "rows", 0)
    log = m.log()
    assert log.of(0, "rows").tolist() == [2, 1]
    assert log.of(1, "rows").tolist() == [0]
    assert log.of(2, "rows").tolist() == []


def test_following_machine_answers_the_logged_sources_in_order() -> None:
    log = MessageLog.build({(0, "rows"): [2, 1, 2], (1, "rows"): [0]})
    m = MessageOrder(log, op="sgd", invocation=3)
    got = []
    for _ in range(3):
        src = m.expect(0, "rows")
        got.append(src)
        m.arrived(0, "rows", src)
    assert got == [2, 1, 2]
    with pytest.raises(DivergenceError) as e:
        m.expect(0, "rows")
    d = e.value.as_dict()
    assert d["op"] == "sgd" and d["invocation"] == 3 and "only 3 message" in d["expected"]


def test_partial_schedule_ends_instead_of_diverging() -> None:
    """A crashed run's last invocation: past the log the trace is exhausted."""
    sched = Schedule("sgd", 1, messages=MessageLog.build({(0, "rows"): [1]}), partial=True)
    m = sched.message_order()
    m.arrived(0, "rows", m.expect(0, "rows"))
    with pytest.raises(ScheduleExhausted):
        m.expect(0, "rows")


@given(
    st.dictionaries(
        st.tuples(st.integers(0, 3), st.sampled_from(["rows", "deltas"])),
        st.lists(st.integers(0, 3), max_size=6),
        max_size=5,
    ),
    st.integers(0, 5),
)
def test_log_round_trips_and_rewind_forgets_an_undone_attempt(rows, cut) -> None:
    """Feeding a free machine the arrivals of a log gives the log back; rewinding to a
    mark taken midway forgets exactly what arrived after it."""
    m = MessageOrder()
    flat = [(k, s) for k, srcs in sorted(rows.items()) for s in srcs]
    for (node, ch), s in flat[:cut]:
        m.arrived(node, ch, s)
    mark = m.mark()
    before = m.log()
    for (node, ch), s in flat[cut:]:
        m.arrived(node, ch, s)
    got = m.log()
    for (node, ch), srcs in rows.items():
        assert got.of(node, ch).tolist() == srcs
    m.rewind(mark)
    after = m.log()
    for key in rows:
        assert np.array_equal(after.of(*key), before.of(*key))
