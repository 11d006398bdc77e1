"""The lock-grant order codec: a ticket order round-trips through prediction + deviations."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import engine
import engine.lowlevel as ap
from engine._machines.grants import TurnSequencer, handover_elements


def _merges(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    lengths = draw(st.lists(st.integers(0, 12), min_size=1, max_size=5))
    pool = [t for t, n in enumerate(lengths) for _ in range(n)]
    order = draw(st.permutations(pool))
    return np.asarray(order, dtype=np.int64), np.asarray(lengths, dtype=np.int64)


merges = st.composite(_merges)


@given(merges())
def test_any_ticket_order_round_trips(case: tuple[np.ndarray, np.ndarray]) -> None:
    threads, lengths = case
    pos, thr = ap.encode_grant_order(threads, lengths)
    assert len(pos) == len(thr) <= len(threads)
    assert np.all(np.diff(pos) > 0)
    assert np.array_equal(ap.decode_grant_order(pos, thr, lengths), threads)


@pytest.mark.parametrize(
    ("threads", "lengths", "deviations"),
    [
        ([0, 0, 0, 1, 1, 1], [3, 3], 0),  # each thread ran to its end: the prediction
        ([1, 1, 0, 0], [2, 2], 1),  # thread 1 went first
        ([0, 1, 0, 1, 0, 1], [3, 3], 4),  # pathological: a hand-over at every body but the last
        ([2, 2, 0, 1], [1, 1, 2], 1),  # exhausted thread 2 hands over cyclically to 0
        ([], [0, 0], 0),
        ([3], [0, 0, 0, 1], 0),  # the first body goes to the lowest thread with bodies
    ],
)
def test_deviations_are_the_hand_overs_the_prediction_misses(
    threads: list[int], lengths: list[int], deviations: int
) -> None:
    t = np.asarray(threads, dtype=np.int64)
    pos, thr = ap.encode_grant_order(t, lengths)
    assert len(pos) == deviations
    assert np.array_equal(ap.decode_grant_order(pos, thr, lengths), t)


@pytest.mark.parametrize(
    ("pos", "thr", "lengths"),
    [
        ([1], [0], [2, 2]),  # names the thread that holds the turn anyway
        ([0], [5], [2, 2]),  # no such thread
        ([9], [1], [2, 2]),  # past the last body
        ([1, 1], [1, 0], [2, 2]),  # positions not increasing
        ([0, 1, 2], [1, 0, 1], [1, 1]),  # more hand-overs than bodies
        ([0], [], [1, 1]),
    ],
)
def test_a_log_that_cannot_fit_is_refused(
    pos: list[int], thr: list[int], lengths: list[int]
) -> None:
    with pytest.raises(ap.GrantOrderError):
        ap.decode_grant_order(np.asarray(pos), np.asarray(thr), lengths)


def test_merge_places_each_threads_bodies_in_plan_order() -> None:
    turns = np.array([0, 1, 1, 0])
    got = ap.merge_grant_order(turns, {0: np.array([10, 11]), 1: np.array([20, 21])})
    assert got.tolist() == [10, 20, 21, 11]


def test_sequencer_runs_threads_in_the_decoded_order() -> None:
    turns = np.array([1, 0, 0, 1, 0])
    seqs = {0: np.array([1, 2, 3]), 1: np.array([7, 8])}
    idx = ap.merge_grant_order(turns, seqs)
    seqr = TurnSequencer(turns, idx, {"node": 0, "op": "t", "invocation": 0})
    seen: list[int] = []

    def work(t: int) -> None:
        for j in seqs[t].tolist():
            seqr.wait(t, j)
            seen.append(j)
            seqr.done(t)

    ths = [threading.Thread(target=work, args=(t,)) for t in (0, 1)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(10)
    assert seen == idx.tolist() == [7, 1, 2, 8, 3]


def test_sequencer_reports_a_body_out_of_turn() -> None:
    turns = np.array([0, 0])
    seqr = TurnSequencer(turns, np.array([4, 5]), {"node": 1, "op": "t", "invocation": 2})
    with pytest.raises(engine.DivergenceError, match="lock"):
        seqr.wait(0, 5)


def test_a_hand_over_names_the_lock_it_took_from_another_thread() -> None:
    """The element is the lowest lock shared with the nearest earlier ticket of another
    thread; without one, the body's first lock; -1 for a body that locked nothing."""
    locks = {
        10: np.array([1, 5]),
        11: np.array([2, 7]),
        20: np.array([3, 7]),  # shares 7 with body 11 (thread 0, just before)
        12: np.array([4, 9]),
        21: np.array([6, 8]),  # shares nothing with anyone: its first lock
        22: np.array([], dtype=np.int64),
    }
    indices = np.array([10, 11, 20, 12, 21, 22])
    threads = np.array([0, 0, 1, 0, 1, 1])
    got = handover_elements(indices, threads, np.array([2, 3, 4]), locks)
    assert got.tolist() == [7, 4, 6]
    # the nearest earlier ticket of another thread, skipping the thread's own
    locks[12] = np.array([1, 3])  # thread 0's third body shares 3 with body 20
    got = handover_elements(indices, threads, np.array([3]), locks)
    assert got.tolist() == [3]
    got = handover_elements(indices, threads, np.array([5]), locks)
    assert got.tolist() == [-1]
