"""``dvector.take`` / ``dvector.put``: many rows in one call, the same as one ``X[i]`` each.

The failure class: a bulk path that skips what a per-row access does (a guard check, a
reconnaissance id, a relaxed thread copy, the order of writes to a repeated id), so a
run that uses it gives other bits, plans or verdicts than the per-row program.  Each
test runs one program both ways and compares everything a user sees.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import engine as ap

N, BODIES = 24, 8
#: Rows body ``j`` reads, in this order and with a repeat: its own two rows and two of
#: the rows 16..22 that no body writes.  It writes its own rows, in decreasing order for
#: some bodies and one of them twice for others (so that ``put`` takes its row-by-row
#: path too).  No two bodies conflict,
#: so the result cannot depend on timing, with threads or without.
READS = [
    np.array([2 * j + 1, 16 + j % 7, 2 * j, 16 + (j + 3) % 7, 2 * j + 1], dtype=np.int64)
    for j in range(BODIES)
]
WRITES = [
    np.array([2 * j, 2 * j + 1] if j % 3 else [2 * j + 1, 2 * j], dtype=np.int64)
    for j in range(BODIES)
]
#: The row even bodies also write once the flag flips: outside their plan, so the guard
#: must catch it.  They all write the same value and nobody reads it, so the order of
#: those writes cannot change the result either.
LATE = 23


def program(bulk: bool, invocations: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """The bodies above, over ``T`` and a relaxed integer counter ``S``, reading and
    writing rows with ``take``/``put`` (``bulk``) or one ``X[i]`` per row."""
    T = ap.dvector(N, shape=(3,), init=ap.init.normal(0, 1), name="T")
    S = ap.dvector(2, shape=(3,), dtype=np.int64, relaxed=True, name="S")
    flag = ap.dvector(1, shape=(), dtype=np.int64, name="flag")

    def body(j: int) -> None:
        ids = READS[j]
        rows = T.take(ids) if bulk else np.array([T[i] for i in ids.tolist()])
        new = np.tanh(rows[:2] + rows.sum(axis=0) * 0.5)
        out = WRITES[j]
        if j % 4 == 1:  # a repeated id: its last row is the one kept
            out, new = np.append(out, out[0]), np.vstack([new, 2 * new[0]])
        if flag[0] and j % 2 == 0:
            out = np.append(out, LATE)
            new = np.vstack([new, np.ones(3)])
        if bulk:
            T.put(out, new)
            S.put([0, 1], S.take([0, 1]) + [[j], [2 * j + 1]])
        else:
            for i, r in zip(out.tolist(), new, strict=True):
                T[i] = r
            S[0] = S[0] + j
            S[1] = S[1] + 2 * j + 1

    for it in range(invocations):
        ap.async_for(0, BODIES, body, name="blk")
        ap.log_objective("t", float(T.gather().sum()))
        if it == 0:
            flag[0] = 1
    return T.gather(), S.gather()


@pytest.mark.parametrize("nodes,threads", [(1, 1), (2, 1), (2, 2), (3, 2)])
@pytest.mark.parametrize("checked", [False, True])
def test_take_and_put_give_the_bits_plans_and_digests_of_one_access_per_row(
    nodes: int, threads: int, checked: bool, capfd: pytest.CaptureFixture[str]
) -> None:
    runs, notes = [], []
    for bulk in (False, True):
        runs.append(ap.run(program, {"bulk": bulk}, nodes=nodes, threads=threads, checked=checked))
        notes.append(capfd.readouterr().err)
    rows, bulk = runs
    for a, b in zip(rows.value, bulk.value, strict=True):
        assert a.tobytes() == b.tobytes()
    assert bulk.digests == rows.digests and bulk.objectives == rows.objectives
    assert {k: v for k, v in bulk.planner["blk"].items() if k != "recon_s"} == {
        k: v for k, v in rows.planner["blk"].items() if k != "recon_s"
    }
    # the flag broke the plan where bodies run in parallel: both runs said so alike (with
    # threads, which of a node's bodies reaches its stray write first is timing: the
    # note names that body's index)
    if threads > 1:
        notes = [re.sub(r"index \d+", "index J", n) for n in notes]
    assert notes[0] == notes[1]
    if nodes * threads > 1:
        assert "note: async_for 'blk' invocation 1" in notes[1], notes[1]


@pytest.mark.parametrize("nodes,threads", [(2, 1), (1, 2), (2, 2)])
@pytest.mark.parametrize("late", ["read", "write", "write read-only"])
def test_an_access_outside_the_plan_is_reported_as_the_same_row_is(
    nodes: int, threads: int, late: str
) -> None:
    """After the flag flips, body 2 reads every row of X (the others' too, written in
    the same round elsewhere), writes row 5 (nobody's) or writes Y (which no body
    wrote before): the plan guard must stop it."""

    def prog(bulk: bool) -> None:
        X = ap.dvector(6, shape=(2,), name="X")
        Y = ap.dvector(6, shape=(2,), name="Y")
        flag = ap.dvector(1, shape=(), dtype=np.int64, name="flag")

        def body(j: int) -> None:
            now = bool(flag[0]) and j == 2
            if now and late == "read":
                _ = X.take(range(5)) if bulk else [X[i] for i in range(5)]
            ids = [j, 5] if now and late == "write" else [j]
            Z = Y if now and late == "write read-only" else X
            if bulk:
                Z.put(ids, np.ones((len(ids), 2)))
            else:
                for i in ids:
                    Z[i] = np.ones(2)

        ap.async_for(0, 5, body, name="strict", replan="never")
        flag[0] = 1
        ap.async_for(0, 5, body, name="strict", replan="never")

    got = []
    for bulk in (False, True):
        with pytest.raises(ap.AccessOutsideReconError) as info:
            ap.run(prog, {"bulk": bulk}, nodes=nodes, threads=threads)
        got.append(str(info.value))
    assert got[0] == got[1] and "'strict' invocation 1 index 2" in got[1]
    want = {"read": "read X[", "write": "wrote X[5]", "write read-only": "wrote Y[2]"}
    assert want[late] in got[1], got[1]


def test_negative_ids_name_the_same_rows_in_a_body() -> None:
    """-1 and 3 are one row of 4: ``put`` keeps the last, as row by row (not one numpy
    assignment, whose order with a repeated index numpy leaves open)."""

    def prog() -> Any:
        R = ap.dvector(4, shape=(2,), relaxed=True, name="R")  # exec mode on one node
        X = ap.dvector(4, shape=(2,), name="X")  # guarded

        def body(j: int) -> None:
            for D in (R, X):
                D.put(np.array([-1, 3]), [[1.0, 1.0], [2.0, 2.0]])
                D.put(np.array([-4, 0])[::-1], [[5.0, 5.0], [6.0, 6.0]])

        ap.async_for(0, 1, body, name="neg")
        return R.gather(), X.gather(), R.take(np.array([-1, 0])).tolist()

    r, x, got = ap.run(prog).value
    for a in (r, x):
        assert a.tolist() == [[6.0, 6.0], [0.0, 0.0], [0.0, 0.0], [2.0, 2.0]]
    assert got == [[2.0, 2.0], [6.0, 6.0]]


def test_in_the_driver_ids_count_from_the_end_and_a_repeated_id_keeps_its_last_row() -> None:
    def prog() -> Any:
        X = ap.dvector(4, shape=(2,), data=np.arange(8.0), name="X")
        got = X.take(np.array([-1, 0, -1]))
        X.put([1, 2, 1], [[10.0, 11.0], [20.0, 21.0], [30.0, 31.0]])
        X.put([], np.empty((0, 2)))
        X.put([3], [7.0, 8.0])  # one row for one id broadcasts
        return got, X.gather(), X.take([]).shape

    got, after, empty = ap.run(prog).value
    assert got.tolist() == [[6.0, 7.0], [0.0, 1.0], [6.0, 7.0]]
    assert after.tolist() == [[0.0, 1.0], [30.0, 31.0], [20.0, 21.0], [7.0, 8.0]]
    assert empty == (0, 2)


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda X, W, R: X.take([4]), "X: index 4 out of range for length 4"),
        (lambda X, W, R: X.take(np.array([1, -5])), "X: index -5 out of range for length 4"),
        (lambda X, W, R: X.put(np.array([2, 4]), np.ones((2, 2))), "X: index 4 out of range"),
        (lambda X, W, R: X.put([-5], [[1.0, 2.0]]), "X: index -5 out of range for length 4"),
        (lambda X, W, R: X.take([[0, 1]]), "X: ids must be a 1-d sequence of integers"),
        (lambda X, W, R: X.take([0.5]), "X: ids must be a 1-d sequence of integers"),
        (lambda X, W, R: X.put([0, 1], [[1.0, 2.0, 3.0]]), "cannot put values of shape (1, 3)"),
        (lambda X, W, R: W.take([0]), "W: take and put need a dvector of numeric rows"),
        (lambda X, W, R: R.put(np.array([1, 4]), np.ones((2, 2))), "R: index 4 out of"),
        (lambda X, W, R: R.take(np.array([0, -5])), "R: index -5 out of"),
    ],
)
@pytest.mark.parametrize("where", ["driver", "body"])
def test_bad_ids_or_rows_are_one_dds_error(call: Any, message: str, where: str) -> None:
    def prog() -> None:
        X = ap.dvector(4, shape=(2,), name="X")
        W = ap.dvector(2, data=["a", "b"], name="W")
        R = ap.dvector(4, shape=(2,), relaxed=True, name="R")
        if where == "driver":
            call(X, W, R)
            return

        flag = ap.dvector(1, shape=(), dtype=np.int64, name="flag")

        def body(j: int) -> None:
            X[j] = np.zeros(2)
            if flag[0] and j == 1:
                call(X, W, R)

        ap.async_for(0, 2, body, name="bad")  # reconnaissance: the row-by-row path
        flag[0] = 1
        ap.async_for(0, 2, body, name="bad")  # under the plan: the fast paths

    with pytest.raises(ap.DDSError if where == "driver" else ap.BodyError) as info:
        ap.run(prog)
    if where == "body":  # the body's error, named with its index
        assert "bad#1 index 1 on node 0 raised DDSError" in str(info.value)
    assert message in str(info.value) and "\n" not in str(info.value)


def sync_program(bulk: bool, sync: str, re: bool, stray: bool = False) -> np.ndarray:
    """A ``sync_for`` whose body reads rows of ``W`` named by its minibatch (with a
    repeat, in data order) and writes them back once each, sorted, by ``take``/``put``
    (``bulk``) or one ``W[i]`` per row; ``stray``: minibatch 3 also writes a row its
    reconnaissance did not see it write."""
    ids = ap.dvector(
        40, shape=(2,), dtype=np.int64, data=(np.arange(80) * 7 % 13).reshape(40, 2), name="ids"
    )
    W = ap.dvector(14, shape=(4,), init=ap.init.normal(0, 1), name="W")  # row 13: no id
    flag = ap.dvector(1, shape=(), dtype=np.int64, name="flag")

    def body(batch: ap.Batch) -> None:
        want = np.concatenate([batch.values.ravel(), batch.values[:1, 0]])
        rows = W.take(want) if bulk else np.array([W[i] for i in want.tolist()])
        keys = np.unique(want)
        new = np.array([rows[want == k].sum(axis=0) * 0.1 for k in keys])
        if stray and flag[0] and batch.number == 3:
            keys, new = np.append(keys, 13), np.vstack([new, np.ones(4)])
        if bulk:
            W.put(keys, new)
        else:
            for k, r in zip(keys.tolist(), new, strict=True):
                W[k] = r

    for it in range(3):
        ap.sync_for(ids, 4, body, sync=sync, re=re, replan="never" if stray else "auto", name="s")
        if it == 0:
            flag[0] = 1
    return W.gather()


@pytest.mark.parametrize("nodes,threads", [(1, 1), (2, 1), (2, 2)])
@pytest.mark.parametrize("sync,re", [("bsp", True), ("bsp", False), ("ssp", True)])
def test_take_and_put_in_a_sync_for_body_give_the_same_bits(
    nodes: int, threads: int, sync: str, re: bool
) -> None:
    got = [
        ap.run(sync_program, {"bulk": b, "sync": sync, "re": re}, nodes=nodes, threads=threads)
        for b in (False, True)
    ]
    assert got[0].value.tobytes() == got[1].value.tobytes()
    assert got[0].digests == got[1].digests


@pytest.mark.parametrize("nodes,threads", [(1, 1), (2, 2)])
def test_a_sync_for_write_outside_the_minibatchs_rows_is_the_same_error(
    nodes: int, threads: int
) -> None:
    errors = []
    for bulk in (False, True):
        with pytest.raises(ap.EngineError) as err:
            ap.run(
                sync_program,
                {"bulk": bulk, "sync": "bsp", "re": True, "stray": True},
                nodes=nodes,
                threads=threads,
            )
        errors.append(str(err.value))
    assert errors[0] == errors[1] and "W[13]" in errors[0], errors
