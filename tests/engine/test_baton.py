"""The chaos grant gate: lock-split bodies overlap at every access, one baton, seeded."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine._errors import DivergenceError
from engine._machines.baton import BatonError, BatonGrants

WHERE = {"node": 0, "op": "op", "invocation": 0}

#: body -> (elements it reads, element it writes): a ring of hot rows, as in hot_rows.
RING = {j: ((j % 4, (j + 1) % 4), j % 4) for j in range(12)}
PER_THREAD = {0: [0, 1, 2, 3, 4, 5], 1: [6, 7, 8, 9, 10, 11]}


def _locks(correct: bool) -> dict[int, np.ndarray]:
    """Every element a body touches (correct), or only the one it writes (the mutant)."""
    return {
        j: np.unique(np.asarray([*reads, w] if correct else [w], dtype=np.int64))
        for j, (reads, w) in RING.items()
    }


def _body(gate: BatonGrants, store: dict[int, float], log: list[tuple[int, str]], j: int) -> None:
    reads, w = RING[j]
    total = 0.0
    for e in reads:
        gate.step()  # what the guard does before each access to a group-written element
        log.append((j, f"r{e}"))
        total += store[e]
    gate.step()
    log.append((j, f"w{w}"))
    store[w] = store[w] * 0.5 + np.sin(j + total)


def _run(
    seed: int, correct: bool = True, fail_at: int = -1
) -> tuple[BatonGrants, dict[int, float], list[tuple[int, str]], list[BaseException]]:
    lengths = np.asarray([len(PER_THREAD[t]) for t in sorted(PER_THREAD)], dtype=np.int64)
    gate = BatonGrants(_locks(correct), lengths, np.random.default_rng(seed), WHERE)
    store = {e: float(e + 1) for e in range(4)}
    log: list[tuple[int, str]] = []
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for j in PER_THREAD[t]:
                gate.acquire(t, j)
                try:
                    if j == fail_at:
                        raise RuntimeError("body failed")
                    _body(gate, store, log, j)
                except BaseException:
                    gate.abort(t, j)
                    raise
                gate.release(t, j)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in PER_THREAD]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert not any(th.is_alive() for th in threads)
    return gate, store, log, errors


def _serial(tickets: list[tuple[int, int]]) -> dict[int, float]:
    store = {e: float(e + 1) for e in range(4)}
    for j, _ in tickets:
        reads, w = RING[j]
        total = sum(store[e] for e in reads)
        store[w] = store[w] * 0.5 + np.sin(j + total)
    return store


def _overlaps(log: list[tuple[int, str]]) -> bool:
    """Whether some body's accesses are not contiguous in the log (bodies interleaved)."""
    seen: list[int] = []
    for j, _ in log:
        if not seen or seen[-1] != j:
            if j in seen:
                return True
            seen.append(j)
    return False


def test_the_same_seed_gives_the_same_interleaving_and_seeds_differ() -> None:
    a = _run(3)
    b = _run(3)
    assert a[2] == b[2] and a[0].tickets == b[0].tickets and a[1] == b[1]
    logs = {tuple(_run(s)[2]) for s in range(8)}
    assert len(logs) > 4
    for s in range(8):
        gate, _, log, errors = _run(s)
        assert not errors
        assert len(gate.tickets) == 12 and gate.steps == 36
        # each thread takes its tickets in its own plan order
        for t, mine in PER_THREAD.items():
            assert [j for j, th in gate.tickets if th == t] == mine


def test_with_correct_locks_every_interleaving_is_the_serial_run_in_ticket_order() -> None:
    overlapped = 0
    for seed in range(20):
        gate, store, log, errors = _run(seed)
        assert not errors
        assert store == _serial(gate.tickets), seed  # bitwise
        overlapped += _overlaps(log)
    # bodies that share no element do run at the same time
    assert overlapped > 0


def test_with_too_few_locks_some_interleaving_is_not_the_ticket_order() -> None:
    wrong = [
        seed
        for seed in range(20)
        if _run(seed, correct=False)[1] != _serial(_run(seed, correct=False)[0].tickets)
    ]
    assert wrong, "a body reading an element it did not lock never saw another body mid-way"


def test_a_failing_body_stops_every_waiter() -> None:
    _, _, _, errors = _run(1, fail_at=7)
    kinds = sorted(type(e).__name__ for e in errors)
    assert "RuntimeError" in kinds
    others = [e for e in errors if isinstance(e, DivergenceError)]
    assert all(e.event == "lock turn" for e in others)


def test_no_thread_that_can_run_is_an_engine_error_not_a_hang() -> None:
    gate = BatonGrants(
        _locks(True), np.asarray([1], dtype=np.int64), np.random.default_rng(0), WHERE
    )
    gate._owner[0] = 9  # an element held by no body of the round: only a gate bug does that
    with pytest.raises(BatonError, match="no thread can run"):
        gate.acquire(0, 0)


def _generic(
    seed: int,
    bodies: dict[int, list[tuple[tuple[int, ...], int]]],
    delay: dict[int, float] | None = None,
) -> tuple[BatonGrants, dict[int, float], list[tuple[int, int, str]]]:
    """Run ``bodies`` (thread -> [(reads, write)]) through a gate whose locks are every
    element each body touches; ``delay`` holds a thread back before each body (as
    unlocked tasks or a late start do)."""
    import time

    index = {}
    lock_of = {}
    for t in sorted(bodies):
        for reads, w in bodies[t]:
            j = len(index)
            index[j] = (t, reads, w)
            lock_of[j] = np.unique(np.asarray([*reads, w], dtype=np.int64))
    lengths = np.zeros(max(bodies, default=-1) + 1, dtype=np.int64)
    for t, mine in bodies.items():
        lengths[t] = len(mine)
    gate = BatonGrants(lock_of, lengths, np.random.default_rng(seed), WHERE)
    store = {e: float(e + 1) for e in range(6)}
    log: list[tuple[int, int, str]] = []

    def work(t: int) -> None:
        for j in [j for j, (th, _, _) in index.items() if th == t]:
            if delay and t in delay:
                time.sleep(delay[t])
            gate.acquire(t, j)
            _, reads, w = index[j]
            total = 0.0
            for e in reads:
                gate.step()
                log.append((t, j, f"r{e}"))
                total += store[e]
            gate.step()
            log.append((t, j, f"w{w}"))
            store[w] = store[w] * 0.5 + np.cos(j + total)
            gate.release(t, j)

    threads = [threading.Thread(target=work, args=(t,)) for t in bodies]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert not any(th.is_alive() for th in threads)
    serial = {e: float(e + 1) for e in range(6)}
    for j, _ in gate.tickets:
        _, reads, w = index[j]
        total = sum(serial[e] for e in reads)
        serial[w] = serial[w] * 0.5 + np.cos(j + total)
    assert store == serial  # two-phase locks: the serial run in ticket order, bitwise
    return gate, store, log


_body_st = st.tuples(
    st.lists(st.integers(0, 5), min_size=1, max_size=3).map(tuple), st.integers(0, 5)
)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    bodies=st.dictionaries(st.integers(0, 2), st.lists(_body_st, max_size=5), max_size=3),
)
def test_any_bodies_with_their_locks_give_the_serial_run_in_ticket_order(
    seed: int, bodies: dict[int, list[tuple[tuple[int, ...], int]]]
) -> None:
    gate, _, _ = _generic(seed, bodies)
    assert len(gate.tickets) == sum(map(len, bodies.values()))


def test_a_thread_that_arrives_late_does_not_change_the_draws() -> None:
    bodies = {
        0: [((0, 1), 0), ((2,), 2), ((1, 3), 1)],
        1: [((3, 4), 4), ((0,), 3), ((4, 5), 5)],
        2: [((5,), 5), ((2, 3), 2)],
    }
    for seed in range(3):
        a = _generic(seed, bodies)
        b = _generic(seed, bodies, delay={1: 0.01, 2: 0.003})
        assert a[0].tickets == b[0].tickets and a[2] == b[2] and a[1] == b[1]


def test_an_access_from_a_thread_without_the_baton_is_refused() -> None:
    gate = BatonGrants(
        _locks(True), np.asarray([1], dtype=np.int64), np.random.default_rng(0), WHERE
    )
    with pytest.raises(BatonError, match="does not hold the baton"):
        gate.step()  # nobody holds it yet
    gate.acquire(0, 0)
    gate.step()  # the holder may
    seen: list[BaseException] = []

    def other() -> None:
        try:
            gate.step()
        except BaseException as e:
            seen.append(e)

    th = threading.Thread(target=other)
    th.start()
    th.join(10)
    assert len(seen) == 1 and "does not hold the baton" in str(seen[0])
    gate.release(0, 0)
    assert gate.tickets == [(0, 0)] and gate.steps == 1
