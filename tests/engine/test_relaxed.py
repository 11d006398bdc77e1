"""Relaxed DDS: out of conflict analysis, what a body reads, the reconciliation sum, bitwise
replay (in process and under mpiexec with threads), test mode, bad use, undo."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine as ap
from engine.lowlevel import SLOT_BITS
from replay import testing
from tests.engine.relaxed_prog import SLOTS, train

HERE = Path(__file__).parent
PROG = str(HERE / "relaxed_prog.py") + ":train"


def _written_and_read_dds(name: str) -> set[str]:
    """Names of the DDS in operator ``name``'s reconnaissance sets."""
    sess = ap.current()
    sets = sess.ops[name].sets.whole()  # the nodes keep their own bodies' sets after a run
    ids = np.concatenate([sets.r_ids, sets.w_ids]) >> SLOT_BITS
    return {sess.dds[d].name for d in np.unique(ids).tolist()}


# ----------------------------------------------------------------- conflict analysis
def test_relaxed_dds_is_not_in_the_access_sets_nor_in_the_plan() -> None:
    def prog() -> tuple[set[str], Any]:
        train(iterations=1)
        return _written_and_read_dds("acc"), ap.current().planner["acc"]

    seen, planner = ap.run(prog, nodes=2).value
    assert seen == {"X", "Y"}
    assert planner["rounds"] == 4  # the 4 colours of Y, not one body per round
    seen, planner = ap.run(prog, nodes=2, test_mode=True).value
    assert seen == {"X", "Y", "S", "C"}  # test mode: an ordinary DDS again


def test_bodies_that_only_share_a_relaxed_total_run_in_one_round_on_every_node() -> None:
    def prog(relaxed: bool) -> Any:
        T = ap.dvector(1, shape=(), dtype=np.int64, relaxed=relaxed, name="T")
        own = ap.dvector(40, shape=(), name="own")

        def body(j: int) -> None:
            own[j] = float(j)
            T[0] += j

        ap.async_for(0, 40, body, name="sum")
        return int(T[0]), ap.plan_of("sum")

    total, plan = ap.run(prog, {"relaxed": True}, nodes=2, threads=2).value
    assert total == sum(range(40))
    assert len(plan.rounds) == 1 and plan.bodies_per_node().tolist() == [20, 20]
    total, plan = ap.run(prog, {"relaxed": False}, nodes=2, threads=2).value
    assert total == sum(range(40)) and plan.bodies_per_node().tolist() in ([40, 0], [0, 40])


# ----------------------------------------------------------------- what a body reads
@pytest.mark.parametrize("nodes,threads", [(1, 1), (2, 1), (2, 2), (3, 2)])
def test_a_read_sees_the_round_start_plus_its_own_thread_deltas(nodes: int, threads: int) -> None:
    out = ap.run(train, {"iterations": 1}, nodes=nodes, threads=threads).value
    seen_c = out["X"][:, 1]
    start = np.zeros(SLOTS)
    for rnd in out["plan"].rounds:
        after = start.copy()
        for tasks in rnd:
            for task in tasks:
                mine = start.copy()  # this node and thread's view
                for j in task.indices.tolist():
                    assert seen_c[j] == mine[j % SLOTS], (j, task.thread)
                    mine[j % SLOTS] += 1
                    after[j % SLOTS] += 1
        start = after  # reconciled: every node and thread's deltas
    assert out["C"].tolist() == start.tolist() == [48 // SLOTS] * SLOTS


def test_reconciliation_sums_every_delta_once() -> None:
    serial = ap.run(train, nodes=1).value
    for nodes, threads in ((2, 1), (3, 2), (2, 3)):
        par = ap.run(train, nodes=nodes, threads=threads).value
        assert par["C"].tolist() == [3 * 48 // SLOTS] * SLOTS
        # the same random deltas (ap.rng() is per index), summed in another order
        assert np.allclose(par["S"], serial["S"], rtol=0, atol=1e-12)


def test_threads_do_not_change_a_bit_between_runs() -> None:
    runs = [ap.run(train, nodes=2, threads=3, seed=5) for _ in range(3)]
    assert all(r.digests == runs[0].digests for r in runs)
    assert all(r.objectives == runs[0].objectives for r in runs)


# ----------------------------------------------------------------- test mode
def test_test_mode_is_the_ordinary_dds_and_dual_tests_are_exact() -> None:
    relaxed = ap.run(train, {"relaxed": True}, nodes=2, threads=2, test_mode=True)
    ordinary = ap.run(train, {"relaxed": False}, nodes=2, threads=2, test_mode=True)
    assert relaxed.digests == ordinary.digests and relaxed.objectives == ordinary.objectives
    serial = ap.run(train, {"relaxed": False}, nodes=1)
    assert relaxed.objectives["C"] == serial.objectives["C"]
    for res in testing.dual(train, {"iterations": 2}, nodes=2, threads=2).values():
        assert res.passed, res.report()


def test_checked_mode_turns_relaxation_off() -> None:
    def prog() -> set[str]:
        train(iterations=1)
        return _written_and_read_dds("acc")

    assert ap.run(prog, nodes=2, checked=True).value == {"X", "Y", "S", "C"}


# ----------------------------------------------------------------- undo
def test_an_undone_attempt_does_not_count_its_relaxed_deltas_twice() -> None:
    def prog() -> tuple[int, set[tuple[str, str]]]:
        T = ap.dvector(1, shape=(), dtype=np.int64, relaxed=True, name="T")
        flag = ap.dvector(1, shape=(), name="flag")
        A = ap.dvector(20, shape=(), name="A")

        def body(j: int) -> None:
            T[0] += 1
            # after the first invocation body 7 writes a row its plan does not allow
            A[j if j != 7 or flag[0] == 0.0 else 3] = 1.0

        ap.async_for(0, 20, body, name="b")
        flag[0] = 1.0
        ap.async_for(0, 20, body, name="b")
        return int(T[0]), ap.current().noted

    total, noted = ap.run(prog, nodes=2).value
    assert ("b", "re-planned it") in noted  # the second invocation was undone and re-run
    assert total == 40


# ----------------------------------------------------------------- bad use
@pytest.mark.parametrize(
    "make,message",
    [
        (
            lambda: ap.dmap(shape=(2,), relaxed=True, name="M"),
            "only supported for a numeric dvector",
        ),
        (lambda: ap.dvector(3, relaxed=True, name="O"), "needs numeric rows"),
        (lambda: ap.dvector(3, shape=(), dtype=bool, relaxed=True, name="B"), "numeric dtype"),
        (lambda: ap.dvector(3, shape=(), dtype="U3", relaxed=True, name="U"), "numeric dtype"),
    ],
)
def test_bad_declarations_are_one_dds_error(make: Any, message: str) -> None:
    with pytest.raises(ap.DDSError, match=message) as err:
        ap.run(make)
    assert "\n" not in str(err.value)


def test_a_sync_for_body_may_read_but_not_write_a_relaxed_dvector() -> None:
    def prog(write: bool) -> float:
        data = ap.dvector(8, shape=(), data=np.arange(8.0), name="data")
        w = ap.dvector(1, shape=(), name="w")
        T = ap.dvector(1, shape=(), data=[2.0], relaxed=True, name="T")

        def body(batch: ap.Batch) -> None:
            w[0] = w[0] + T[0] * float(np.sum(batch.values))
            if write:
                T[0] = 0.0

        ap.sync_for(data, 4, body, name="s")
        return float(w[0])

    assert ap.run(prog, {"write": False}).value > 0
    # the body raised it, so it comes as the BodyError naming the minibatch
    with pytest.raises(ap.BodyError, match="DDSError: T is a relaxed dvector: only async_for"):
        ap.run(prog, {"write": True})


def test_sync_for_without_reconnaissance_refuses_a_relaxed_dvector() -> None:
    """With re=False nothing tells a read from a write, so it is refused in one line."""

    def prog() -> None:
        data = ap.dvector(8, shape=(), data=np.arange(8.0), name="data")
        w = ap.dvector(1, shape=(), name="w")
        T = ap.dvector(1, shape=(), data=[2.0], relaxed=True, name="T")

        def body(batch: ap.Batch) -> None:
            w[0] = w[0] + T[0] * float(np.sum(batch.values))

        ap.sync_for(data, 4, body, name="s", re=False)

    with pytest.raises(ap.DDSError, match="'T', a relaxed dvector; with re=False") as err:
        ap.run(prog)
    assert "\n" not in str(err.value)


def test_cli_bad_relaxed_declaration_is_one_line_exit_2(tmp_path: Path, cli) -> None:
    prog = tmp_path / "bad.py"
    prog.write_text(
        "import engine as ap\n\n\ndef train() -> None:\n"
        "    ap.dmap(shape=(1,), relaxed=True, name='totals')\n"
    )
    proc = cli("run", f"{prog}:train", "--no-trace")
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "relaxed=True is only supported" in errors[0]
    assert "Traceback" not in proc.stderr


# ----------------------------------------------------------------- replay
# in-process commands whose ranks start under mpiexec (the layer scan cannot see it)
@pytest.mark.mpi
@pytest.mark.parametrize(
    "ranks,params",
    [
        (2, {}),
        (3, {}),
        (2, {"groups": 1, "strategy": "components"}),  # lock-split groups on each node
    ],
)
def test_recorded_mpi_run_with_threads_replays_bitwise(
    ranks: int, params: dict[str, Any], tmp_path: Path, cli: Any
) -> None:
    trace = tmp_path / "relaxed.db"
    flags = [a for k, v in params.items() for a in ("-p", f"{k}={v}")]
    shape = ["--ranks", str(ranks), "--threads", "2"]
    proc = cli("run", PROG, *flags, *shape, "--trace", trace, "--json")
    assert proc.returncode == 0, proc.stderr
    recorded = json.loads(proc.stdout)
    if params:
        assert recorded["planner"]["acc"]["strategy"] == "components"
        here = ap.run(train, params, nodes=ranks, threads=2).value
        assert here["plan"].has_locks() and here["C"].tolist() == [3 * 48 // SLOTS] * SLOTS
    else:  # the same program in one process (all nodes, same threads) gives the same bits
        here = ap.run(train, nodes=ranks, threads=2)
        assert recorded["objectives"] == here.objectives
        assert [d["digest"] for d in recorded["digests"]] == [d["digest"] for d in here.digests]
    for mode in ("cluster", "single"):
        proc = cli(mode, trace, "--json")
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["identical"] and out["checked"]["digests"] == len(recorded["digests"])


# ----------------------------------------------------------------- a property
@st.composite
def delta_programs(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 30))
    slots = draw(st.integers(1, 5))
    return {
        "nodes": draw(st.integers(1, 3)),
        "threads": draw(st.integers(1, 3)),
        "slots": slots,
        "deltas": draw(
            st.lists(
                st.lists(st.tuples(st.integers(0, slots - 1), st.integers(-9, 9)), max_size=4),
                min_size=n,
                max_size=n,
            )
        ),
        "chain": draw(st.integers(1, 4)),  # bodies j and j + chain share an ordinary row
    }


def _delta_program(slots: int, deltas: list[list[tuple[int, int]]], chain: int) -> Any:
    n = len(deltas)
    T = ap.dvector(slots, shape=(), dtype=np.int64, relaxed=True, name="T")
    F = ap.dvector(slots, shape=(), relaxed=True, name="F")
    rows = ap.dvector(chain, shape=(), name="rows")

    def body(j: int) -> None:
        for slot, d in deltas[j]:
            T[slot] += d
            F[slot] += d * 0.1
        rows[j % chain] += float(T[j % slots])

    for _ in range(2):
        ap.async_for(0, n, body, name="deltas")
    return T.gather(), F.gather()


@settings(max_examples=25, deadline=None)
@given(delta_programs())
def test_relaxed_totals_are_exact_and_replay_bitwise(case: dict[str, Any]) -> None:
    params = {k: case[k] for k in ("slots", "deltas", "chain")}
    shape = {"nodes": case["nodes"], "threads": case["threads"]}
    (t, f), (t2, f2) = (ap.run(_delta_program, params, **shape).value for _ in range(2))
    want = np.zeros(case["slots"], dtype=np.int64)
    for body in case["deltas"]:
        for slot, d in body:
            want[slot] += 2 * d
    assert t.tolist() == want.tolist()
    assert np.allclose(f, 0.1 * want, atol=1e-9)
    assert t.tobytes() == t2.tobytes() and f.tobytes() == f2.tobytes()
    exact = ap.run(_delta_program, params, **shape, test_mode=True).value
    assert exact[0].tolist() == want.tolist()
