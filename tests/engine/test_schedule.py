"""The per-invocation schedule value: built from plain tables, looked up as the engine asks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import engine
from engine.lowlevel import (
    GrantLog,
    MutexLog,
    Schedule,
    Task,
    VisibilityLog,
    encode_grant_order,
    serial_order,
)

_pairs = st.lists(st.tuples(st.integers(0, 50), st.integers(0, 3)), max_size=6).map(
    lambda v: (np.asarray([p for p, _ in v], np.int64), np.asarray([t for _, t in v], np.int64))
)
_grant_rows = st.dictionaries(st.tuples(st.integers(0, 3), st.integers(0, 5)), _pairs, max_size=8)


@given(_grant_rows)
def test_grant_log_gives_back_every_node_round_and_empty_elsewhere(rows) -> None:
    log = GrantLog.build(rows)
    for (node, r), (pos, thr) in rows.items():
        got_pos, got_thr = log.of(node, r)
        assert np.array_equal(got_pos, pos) and np.array_equal(got_thr, thr)
    pos, thr = log.of(99, 0)
    assert len(pos) == len(thr) == 0


def test_a_grant_log_row_needs_as_many_threads_as_positions() -> None:
    with pytest.raises(ValueError, match="node 1, round 2"):
        GrantLog.build({(1, 2): (np.array([0, 3]), np.array([1]))})


def test_a_schedule_is_frozen_data_without_callables() -> None:
    s = Schedule("op", 3, grants=GrantLog.build({(0, 0): (np.array([1]), np.array([0]))}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.serial = True  # type: ignore[misc]
    for f in dataclasses.fields(s):
        value = getattr(s, f.name)
        assert not callable(value), f.name
        if dataclasses.is_dataclass(value):
            for g in dataclasses.fields(value):
                assert isinstance(getattr(value, g.name), np.ndarray), (f.name, g.name)


def test_no_grant_log_is_free_and_an_empty_one_is_the_predicted_order() -> None:
    assert Schedule("op", 0).grant_order(0, 0) is None
    pos, thr = Schedule("op", 0, grants=GrantLog()).grant_order(0, 0)  # type: ignore[misc]
    assert len(pos) == len(thr) == 0


def test_visibility_is_free_for_unrecorded_nodes_and_diverges_on_an_unrecorded_clock() -> None:
    s = Schedule("ssp", 2, visibility=VisibilityLog.build({(1, 0): (-1, -1), (1, 1): (0, -1)}))
    assert not s.has_visibility(0) and s.visible(0, 5) is None
    assert s.has_visibility(1) and s.visible(1, 1) == (0, -1)
    with pytest.raises(engine.DivergenceError) as info:
        s.visible(1, 2)
    assert (info.value.what, info.value.event, info.value.invocation) == (
        "visibility",
        "clock 2",
        2,
    )


def test_mutex_order_keeps_grant_order_per_clock() -> None:
    s = Schedule("h", 0, mutex=MutexLog.build({(0, 1): [(2, 7), (0, 3), (2, 8)], (0, 0): []}))
    assert s.mutex_order(0, 1) == [(2, 7), (0, 3), (2, 8)]
    assert s.mutex_order(0, 4) == []  # the node is scripted: a clock without grants has none
    assert s.mutex_order(1, 1) is None  # nothing recorded for node 1: free


@given(st.lists(st.integers(1, 4), min_size=2, max_size=3), st.randoms(use_true_random=False))
def test_serial_order_merges_locked_bodies_in_the_recorded_ticket_order(lengths, rnd) -> None:
    per = {t: np.arange(100 * t, 100 * t + n, dtype=np.int64) for t, n in enumerate(lengths)}
    # a recorded ticket order: a random merge of the threads' sequences
    pool = [t for t, n in enumerate(lengths) for _ in range(n)]
    rnd.shuffle(pool)
    threads = np.asarray(pool, dtype=np.int64)
    pos, thr = encode_grant_order(threads, lengths)
    tasks = [Task(0, np.array([900, 901]))] + [Task(t, per[t], locked=True) for t in per]
    s = Schedule("op", 0, grants=GrantLog.build({(0, 0): (pos, thr)}), serial=True)
    got = serial_order(s, 0, 0, tasks).tolist()
    cursor = dict.fromkeys(per, 0)
    expected = [900, 901]
    for t in pool:
        expected.append(int(per[t][cursor[t]]))
        cursor[t] += 1
    assert got == expected
