"""``ap.reconnaissance()``: a body may skip, in reconnaissance, the work that decides no
row.  Honest skipping changes no bit and fires no guard; a body that declares other rows
there than it touches in execution is caught (re-planned), never a wrong result.  Both for
``async_for`` and for ``sync_for`` (BSP, SSP, Hybrid) on 1-3 nodes and 1-2 threads."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import engine as ap

R = 9  # rows of the model
N = 14  # loop indices / data records

#: how a body behaves in reconnaissance: ``plain`` (does the arithmetic), ``honest``
#: (reads and writes the same rows, writes their old values back), ``drop`` (declares
#: one write fewer), ``other`` (declares its first write on another row)
MODES = ("plain", "honest", "drop", "other")


def rows_of(j: int, rng: np.random.Generator, how: str) -> list[int]:
    """The two distinct rows body ``j`` updates: drawn from its rng, or from its index
    (distinct, so that a declaration that drops or moves one always misses a write)."""
    if how == "rng":
        first, gap = (int(r) for r in rng.integers((R, R - 1)))
    else:
        first, gap = j % R, (3 * j) % (R - 1)
    return [first, (first + 1 + gap) % R]


def update(old: float, j: int, threads: int) -> float:
    """An order-sensitive update on one thread (exact in float64 for the sizes used
    here); on more, a node's bodies that share a row run in a timing-dependent order
    (what a trace records), so there an add, which no order changes."""
    return old * 0.5 + float(j) if threads == 1 else old + float(j)


def declare(E: Any, rows: list[int], mode: str) -> bool:
    """In reconnaissance under ``mode``: touch the rows the mode declares (instead of the
    arithmetic) and say so; otherwise do nothing and return False."""
    if mode == "plain" or not ap.reconnaissance():
        return False
    if mode == "drop":
        rows = rows[:-1]
    elif mode == "other":
        rows = [(rows[0] + 1) % R, *rows[1:]]
    for r in rows:
        E[r] = E[r]  # the old value back: a read and a write of the row
    return True


def async_program(how: str, mode: str, epochs: int, threads: int = 1) -> Any:
    def prog() -> dict[str, Any]:
        E = ap.dvector(R, shape=(), init=ap.init.zeros(), name="E")
        seen: list[bool] = []

        def body(j: int) -> None:
            rows = rows_of(j, ap.rng(), how)
            if declare(E, rows, mode):
                return
            for r in rows:
                E[r] = update(float(E[r]), j, threads)

        for _ in range(epochs):
            seen.append(ap.reconnaissance())
            ap.async_for(0, N, body, name="upd")
        return {"E": E.gather(), "planner": dict(ap.current().planner["upd"]), "seen": seen}

    return prog


def sync_program(how: str, mode: str, sync: str, epochs: int) -> Any:
    def prog() -> dict[str, Any]:
        D = ap.dvector(N, shape=(1,), name="D")
        E = ap.dvector(R, shape=(), init=ap.init.zeros(), name="E")

        def body(batch: ap.Batch) -> None:
            m = batch.number
            rows = rows_of(m, ap.rng(), how)
            if declare(E, rows, mode):
                return
            for r in rows:
                E[r] += float(m + 1)

        for _ in range(epochs):
            ap.sync_for(D, 1, body, sync=sync, name="upd")
        return {"E": E.gather(), "planner": dict(ap.current().planner["upd"])}

    return prog


SHAPE = st.sampled_from([(1, 1), (1, 2), (2, 1), (2, 2), (3, 1)])


@settings(max_examples=12, deadline=None)
@given(
    how=st.sampled_from(["rng", "index"]),
    shape=SHAPE,
    epochs=st.integers(1, 2),
    checked=st.booleans(),  # --checked: every access checked against the body's own sets
)
def test_async_for_skipping_honestly_gives_the_same_bits(how, shape, epochs, checked) -> None:
    nodes, threads = shape
    prog = {mode: async_program(how, mode, epochs, threads) for mode in MODES}
    plain = ap.run(prog["plain"], nodes=nodes, threads=threads).value
    for mode in MODES[1:]:
        got = ap.run(prog[mode], nodes=nodes, threads=threads, checked=checked).value
        assert got["seen"] == [False] * epochs  # the driver is not in reconnaissance
        if mode == "honest":  # the same sets: the same plan, the same bits, no re-plan
            assert np.array_equal(got["E"], plain["E"]), (mode, got["E"], plain["E"])
            assert got["planner"] == {**plain["planner"], "recon_s": got["planner"]["recon_s"]}
        else:  # declared other rows: the guard re-plans; the serial result stands
            serial = ap.run(prog["plain"]).value
            assert np.array_equal(got["E"], serial["E"]), (mode, got["E"], serial["E"])


@settings(max_examples=12, deadline=None)
@given(
    how=st.sampled_from(["rng", "index"]),
    sync=st.sampled_from(["bsp", "ssp", "hybrid"]),
    shape=SHAPE,
    epochs=st.integers(1, 2),
)
def test_sync_for_skipping_honestly_gives_the_same_bits(how, sync, shape, epochs) -> None:
    nodes, threads = shape
    plain = ap.run(sync_program(how, "plain", sync, epochs), nodes=nodes, threads=threads).value
    for mode in MODES[1:]:
        got = ap.run(sync_program(how, mode, sync, epochs), nodes=nodes, threads=threads).value
        # adds of whole numbers: exact in any order, so every sync model agrees
        assert np.array_equal(got["E"], plain["E"]), (mode, sync, got["E"], plain["E"])
        replans = got["planner"]["replans"] - plain["planner"]["replans"]
        if mode == "honest":
            assert replans == 0
        else:  # a declared row set that misses a write: caught
            assert got["planner"]["replans"] >= 1, (mode, got["planner"])


@pytest.mark.parametrize("nodes", [1, 2])
def test_true_only_inside_a_body_in_reconnaissance(nodes: int) -> None:
    def prog() -> list[Any]:
        D = ap.dvector(4, shape=(1,), name="D")
        E = ap.dvector(4, shape=(), init=ap.init.zeros(), name="E")
        log = ap.dvector(8, shape=(), init=ap.init.zeros(), name="log")

        def a(j: int) -> None:
            log[j] = 1.0 if ap.reconnaissance() else 6.0
            E[j] += 1.0

        def s(batch: ap.Batch) -> None:
            log[4 + batch.number] = 1.0 if ap.reconnaissance() else 6.0

        ap.async_for(0, 4, a, name="a")
        ap.sync_for(D, 1, s, name="s")
        return [ap.reconnaissance(), log.gather().tolist()]

    # the writes that stand are execution's, never reconnaissance's (sync_for's deltas
    # average over the nodes)
    assert ap.run(prog, nodes=nodes).value == [False, [6.0] * 4 + [6.0 / nodes] * 4]


@pytest.mark.parametrize("loop", ["async_for", "sync_for"])
def test_the_guards_note_names_a_declaration_as_a_cause(loop: str, capfd) -> None:
    """A body that asks ``ap.reconnaissance()`` and is caught: the note says its
    declaration may be why; a body that never asks is not told so."""
    for mode, told in (("drop", True), ("plain", False)):
        if loop == "async_for":
            prog = async_program("index", mode, 1)
        else:
            prog = sync_program("rng", mode, "bsp", 1)
        ap.run(prog, nodes=2)
        err = capfd.readouterr().err
        assert ("it declared other rows there than it touched" in err) == told, (mode, err)
        if told:  # and the guard did fire
            assert "re-planned" in err or "re-ran reconnaissance" in err, err


OPS = st.lists(
    st.tuples(st.sampled_from(["put", "take", "set", "get"]), st.integers(0, 5), st.integers(0, 5)),
    min_size=1,
    max_size=5,
)


def rows_program(ops: list[tuple[str, int, int]], bulk: bool) -> Any:
    """Bodies that read and write rows by ``take``/``put`` (``bulk``) or one ``T[i]`` at a
    time, then choose by the values read which row to write last: reconnaissance must
    see the body's own earlier writes, made either way."""

    def ids_of(j: int, a: int, b: int) -> list[int]:
        return [(j * a + b + k) % R for k in range(1 + b % 3)]

    def prog() -> Any:
        T = ap.dvector(R + 4 * N, shape=(), init=ap.init.zeros(), name="T")

        def body(j: int) -> None:
            seen = 0.0
            for kind, a, b in ops:
                ids = ids_of(j, a, b)
                if kind in ("put", "set"):
                    vals = np.arange(len(ids), dtype=np.float64) + 1 + j + a + (kind == "set")
                    if kind == "put" and bulk:
                        T.put(ids, vals)
                    else:
                        for i, v in zip(ids, vals.tolist(), strict=True):
                            T[i] = v
                else:
                    got = T.take(ids) if kind == "take" and bulk else [T[i] for i in ids]
                    seen += float(np.sum(got))
            # a row the body wrote last (>= 1 then) or the first row it touched
            _, a, b = ([op for op in ops if op[0] in ("put", "set")] or ops)[-1]
            probe = ids_of(j, a, b)[0]
            # to one of four rows only this body may write, chosen by every value read (whole
            # numbers): a read that missed the body's own write leaves the plan's sets
            T[R + 4 * j + int(T[probe]) % 2 + 2 * (int(seen) % 2)] = seen

        ap.async_for(0, N, body, name="rows")
        return T.gather()

    return prog


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS, nodes=st.integers(1, 3))
@example(ops=[("put", 1, 0), ("take", 1, 0)], nodes=2)  # a take of the row just put
@example(ops=[("put", 1, 1), ("get", 1, 1)], nodes=2)
@example(ops=[("put", 1, 0), ("set", 1, 0), ("get", 1, 0)], nodes=2)  # the last write wins
def test_a_body_reads_back_its_own_bulk_writes_in_reconnaissance(ops, nodes, capfd) -> None:
    one = ap.run(rows_program(ops, bulk=False), nodes=nodes)
    one_err = capfd.readouterr().err
    bulk = ap.run(rows_program(ops, bulk=True), nodes=nodes)
    assert capfd.readouterr().err == one_err
    assert bulk.value.tobytes() == one.value.tobytes()
    assert {k: v for k, v in bulk.planner["rows"].items() if k != "recon_s"} == {
        k: v for k, v in one.planner["rows"].items() if k != "recon_s"
    }
