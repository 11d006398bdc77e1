"""The recorder: nothing lost at scale, concurrent ranks, crashes and failures."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tracehelp import record, toy_program

import engine as ap
import tracer
from tracer._codec import encode


class Counting(tracer.TraceRecorder):
    """Counts what the engine reports before recording it."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.grants = 0
        self.rounds = 0
        self.messages = 0
        self.bodies = 0

    def lock_grants(
        self, op, invocation, node, round, bodies, grants, positions, threads, elements
    ):  # noqa: A002
        self.grants += grants
        self.rounds += 1
        super().lock_grants(
            op, invocation, node, round, bodies, grants, positions, threads, elements
        )

    def message_received(self, node, channel, source, seq, nbytes) -> None:
        self.messages += 1
        super().message_received(node, channel, source, seq, nbytes)

    def invocation_done(self, op, invocation, node, info) -> None:
        self.bodies += info["bodies"]
        super().invocation_done(op, invocation, node, info)


def test_counts_read_back_equal_counts_executed_on_a_threaded_engine_run(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    rec = Counting(path, "r", [0, 1], True)
    ap.run(toy_program(n=6_000, epochs=2), nodes=2, threads=3, recorder=rec)
    rec.close("finished")
    assert rec.grants > 6_000  # split groups took locks
    with tracer.open(path) as trace:
        run = trace.run()
        ops = run.operators()["acc"]
        assert (ops.lock_grants, ops.messages, ops.bodies) == (rec.grants, rec.messages, rec.bodies)
        assert ops.bodies == 12_000
        got = sum(int(run.lock_grants("acc", i, n).grants.sum()) for i in (0, 1) for n in (0, 1))
        assert got == rec.grants
        # one event per node-round that took locks, holding that round's deviations
        assert sum(1 for _ in run.events(kinds=["LockGranted"])) == rec.rounds


def test_thread_times_and_element_names_read_back(tmp_path: Path) -> None:
    """Per-thread times round to whole µs; a recorder call without element names (an
    older engine) stores ``-`` for each hand-over rather than dropping it."""
    path = tmp_path / "t.sqlite"
    rec = tracer.TraceRecorder(path, "r", [0], True)
    rec.lock_grants("op", 0, 0, 0, 8, 8, np.array([2, 5]), np.array([1, 0]), ["W[3]", "H[17]"])
    rec.lock_grants("op", 0, 0, 1, 8, 8, np.array([4]), np.array([1]))
    times = [(0, 0, 0.0, 0.0031234), (0, 1, 0.0000004, 0.0025), (1, 1, 0.001, 0.002)]
    info = {"bodies": 16, "rounds": 2, "seconds": 0.01, "round_seconds": [0.004, 0.003]}
    rec.invocation_done("op", 0, 0, info | {"thread_times": times})
    rec.invocation_done("op", 1, 0, info)  # no times (sync_for): none stored
    rec.close("finished")
    with tracer.open(path) as trace:
        run = trace.run()
        a, b = run.invocations()
        assert a.thread_times == ((0, 0, 0.0, 0.003123), (0, 1, 0.0, 0.0025), (1, 1, 0.001, 0.002))
        assert b.thread_times == ()
        assert a.round_seconds == (0.004, 0.003)

        g = run.lock_grants("op", 0, 0)
        assert g.element.tolist() == ["W[3]", "H[17]", "-"]
        events = list(run.events(kinds=["LockGranted"]))
        assert [e.elements for e in events] == [("W[3]", "H[17]"), ("-",)]


def test_invocation_times_compact_and_old_forms(tmp_path: Path) -> None:
    """Round lengths are stored in whole µs (an integer codec) and thread times column by
    column (a delta codec); a trace written before (f64 seconds, rows of four) reads back
    the same."""
    path = tmp_path / "t.sqlite"
    rec = tracer.TraceRecorder(path, "r", [0], True)
    times = [(0, 0, 0.000001, 0.03), (1, 0, 0.000001, 0.0291), (2, 1, 0.0002, 0.001)]
    info = {"bodies": 4, "rounds": 3, "seconds": 0.2, "round_seconds": [0.0123456, 0.1, 0.0]}
    rec.invocation_done("op", 0, 0, info | {"thread_times": times})
    rec.close("finished")
    want = ((0, 0, 0.000001, 0.03), (1, 0, 0.000001, 0.0291), (2, 1, 0.0002, 0.001))
    con = sqlite3.connect(path)
    (rs_codec,) = con.execute("SELECT round_us_codec FROM invocation_set").fetchone()
    assert not rs_codec.endswith("f64")
    with tracer.open(path) as trace:
        got = trace.run().invocations()[0]
        assert got.round_seconds == (0.012346, 0.1, 0.0) and got.thread_times == want
        assert got.seconds == 0.2  # exact: an f64 per node
    # the same invocation as a schema-6 run wrote it: a row per node, f64 seconds and
    # rows of four (before 2026-12-06), read by the legacy reader
    old_rs = np.array([0.0123456, 0.1, 0.0], dtype="<f8").tobytes()
    rows = [(0, 0, 1, 30000), (1, 0, 1, 29100), (2, 1, 200, 1000)]
    old_tt = np.array(rows, dtype="<u2").ravel().tobytes()
    con.execute("UPDATE run SET versions = '{}'")
    con.execute("DELETE FROM invocation_set")
    con.execute(
        "INSERT INTO invocation (run, op, invocation, node, seq, first_seq, bodies, rounds, "
        "strategy, seconds, round_seconds, round_seconds_codec, thread_times, "
        "thread_times_codec, committed_at, n_lock_grants, n_messages, n_deviations, "
        "n_aggregations, n_visibility, n_mutex_grants, n_digests, blob_bytes) VALUES ('r', "
        "'op', 0, 0, 0, 0, 4, 3, '', 0.2, ?, 'raw-f64', ?, 'raw-u16', 1.0, 0, 0, 0, 0, 0, 0, "
        "0, 0)",
        (old_rs, old_tt),
    )
    con.commit()
    con.close()
    with tracer.open(path) as trace:
        assert trace.run().info.schema == 6
        got = trace.run().invocations()[0]
        assert got.round_seconds == (0.0123456, 0.1, 0.0) and got.thread_times == want


def test_an_engine_run_names_each_hand_over_by_the_lock_its_body_took(tmp_path: Path) -> None:
    """Bodies lock ``X[j % 2]`` and ``Y[j]``; sleeping inside the locks makes threads
    hand over, and each hand-over names the ``X`` element, the one shared across threads."""

    def program() -> None:
        X = ap.dvector(2, shape=(), init=ap.init.zeros(), name="X")
        Y = ap.dvector(90, shape=(), init=ap.init.zeros(), name="Y")

        def body(j: int) -> None:
            Y[j] = X[j % 2] + 1.0
            X[j % 2] += 1.0
            time.sleep(0.0002)  # release the GIL inside the locks

        ap.async_for(0, 90, body, name="hot")

    path = tmp_path / "t.sqlite"
    record(path, nodes=1, threads=3, program=program)
    with tracer.open(path) as trace:
        run = trace.run()
        g = run.lock_grants("hot", 0, 0)
        index, before, _ = g.handovers(run.plan("hot", 0), 0)
    assert len(index) > 0 and (index >= 0).all()
    assert g.element.tolist() == [f"X[{j % 2}]" for j in index.tolist()]
    assert (before != g.thread).all()


class CountingSync(tracer.TraceRecorder):
    """Counts the ``sync_for`` hooks the engine calls before recording them."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.n = {"agg": 0, "vis": 0, "mutex": 0, "msg": 0}

    def aggregation_order(self, op, invocation, node, clock, sources) -> None:
        self.n["agg"] += 1
        super().aggregation_order(op, invocation, node, clock, sources)

    def ssp_visibility(self, op, invocation, node, clock, applied) -> None:
        self.n["vis"] += 1
        super().ssp_visibility(op, invocation, node, clock, applied)

    def body_order(self, op, invocation, node, clock, threads, minibatches) -> None:
        self.n["mutex"] += len(threads)
        super().body_order(op, invocation, node, clock, threads, minibatches)

    def message_received(self, node, channel, source, seq, nbytes) -> None:
        self.n["msg"] += 1
        super().message_received(node, channel, source, seq, nbytes)


@pytest.mark.parametrize("sync,threads", [("bsp", 1), ("ssp", 2), ("hybrid", 3)])
def test_sync_for_orders_read_back_as_recorded(tmp_path: Path, sync: str, threads: int) -> None:
    def program() -> None:
        xs = ap.dvector(96, shape=(2,), data=np.arange(192.0).reshape(96, 2), name="xs")
        w = ap.dvector(4, shape=(2,), name="w")

        def body(batch: Any) -> None:
            k = batch.number % 4
            w[k] += 0.1 * (batch.values.mean(axis=0) - w[k])

        for _ in range(2):
            ap.sync_for(xs, 4, body, sync=sync, name="mean")

    path = tmp_path / "s.sqlite"
    rec = CountingSync(path, "r", [0, 1, 2], True)
    ap.run(program, nodes=3, threads=threads, recorder=rec)
    rec.close("finished")
    assert rec.n["agg"] > 0 and (rec.n["vis"] > 0) == (sync == "ssp")
    assert (rec.n["mutex"] > 0) == (sync == "hybrid")
    with tracer.open(path) as trace:
        run = trace.run()
        op = run.operators()["mean"]
        assert (op.aggregations, op.visibility) == (rec.n["agg"], rec.n["vis"])
        assert (op.mutex_grants, op.messages, op.invocations) == (rec.n["mutex"], rec.n["msg"], 2)
        assert op.rounds > 0  # clocks, since sync_for has no plan
        assert len(run.aggregations()) == rec.n["agg"]
        got = sum(len(run.mutex_grants("mean", i, n).thread) for i in (0, 1) for n in (0, 1, 2))
        assert got == rec.n["mutex"]
        for node in (0, 1, 2):
            seqs = [e.seq for e in run.events(node=node)]
            assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_a_million_bodies_of_lock_grants_on_three_threads(tmp_path: Path) -> None:
    path = tmp_path / "big.sqlite"
    rec = tracer.TraceRecorder(path, "r", [0, 1], True)
    rng = np.random.default_rng(0)
    written: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    per_call = 100_000
    for inv in range(5):
        for node in (0, 1):
            # 100k locked bodies on 3 threads whose GIL switches every ~250 bodies
            runs = rng.integers(100, 400, per_call // 100)
            ends = np.cumsum(runs)
            positions = ends[ends < per_call]
            threads = rng.integers(0, 3, len(positions))
            rec.lock_grants("sgd", inv, node, 0, per_call, 2 * per_call, positions, threads)
            written[(inv, node)] = (positions, threads)
            info = {"bodies": per_call, "rounds": 1, "seconds": 0.1, "round_seconds": [0.1]}
            rec.invocation_done("sgd", inv, node, info)
    rec.close("finished")
    with tracer.open(path) as trace:
        run = trace.run()
        ops = run.operators()["sgd"]
        assert ops.lock_grants == 2_000_000 and ops.bodies == 1_000_000
        for (inv, node), (positions, threads) in written.items():
            g = run.lock_grants("sgd", inv, node)
            assert g.bodies.tolist() == [per_call] and g.grants.tolist() == [2 * per_call]
            pos, thr = g.deviations(0)
            assert np.array_equal(pos, positions) and np.array_equal(thr, threads)
        n0 = sum(1 for _ in run.events(node=0, kinds=["LockGranted"]))
        assert n0 == 5
        # only the hand-overs are stored: far under a byte per body
        assert trace.store_bytes() < 1_000_000


def _writer(path: str, node: int, barrier: Any, invocations: int) -> None:
    rec = tracer.TraceRecorder(path, "r", [node], node == 0)
    barrier.wait()
    for inv in range(invocations):
        k = 1000
        rec.lock_grants("op", inv, node, 0, k, k, np.array([1, 2]), np.array([1, 2]))
        for s in range(3):
            rec.message_received(node, "rows", 1 - node, inv * 3 + s, 128)
        rec.invocation_done("op", inv, node, {"bodies": k, "rounds": 1, "seconds": 0.0})
        if node == 0:
            rec.objective("loss", inv, 1.0 / (inv + 1))
    rec.close("finished")


def test_two_processes_record_into_one_file_at_once(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.sqlite")
    tracer.start_run(path, "r", {"app": "concurrent", "ranks": 2})
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_writer, args=(path, n, barrier, 60)) for n in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with tracer.open(path) as trace:
        run = trace.run("r")
        ops = run.operators()["op"]
        assert (ops.invocations, ops.bodies) == (60, 2 * 60 * 1000)
        assert (ops.lock_grants, ops.messages) == (2 * 60 * 1000, 2 * 60 * 3)
        assert len(run.invocations()) == 120
        assert run.objectives()["loss"][-1] == 1.0 / 60
        assert run.info.status == "finished"
        for node in (0, 1):
            seqs = [e.seq for e in run.events(node=node)]
            assert seqs == list(range(len(seqs)))  # per-node sequence has no gap


def _crasher(path: str, completed: int) -> None:
    rec = tracer.TraceRecorder(path, "r", [0], True)
    for inv in range(completed + 1):
        rec.lock_grants("op", inv, 0, 0, 10, 10, np.array([3]), np.array([1]))
        rec.message_received(0, "rows", 1, inv, 64)
        if inv == completed:
            os.kill(os.getpid(), signal.SIGKILL)  # mid-invocation, nothing flushed
        rec.invocation_done("op", inv, 0, {"bodies": 10, "rounds": 1, "seconds": 0.0})


def test_sigkill_keeps_every_completed_invocation(tmp_path: Path) -> None:
    path = str(tmp_path / "crash.sqlite")
    tracer.start_run(path, "r", {"app": "crash"})
    p = mp.get_context("fork").Process(target=_crasher, args=(path, 3))
    p.start()
    p.join(60)
    assert p.exitcode == -signal.SIGKILL
    with tracer.open(path) as trace:
        assert trace.run().info.status == "running"  # the writer died just now
    with tracer.open(path, assume_finished=True) as trace:
        run = trace.run()
        assert run.info.status == "crashed"
        assert [i.invocation for i in run.invocations()] == [0, 1, 2]
        assert run.operators()["op"].lock_grants == 30
        assert isinstance(list(run.events())[-1], tracer.RunEnded)
    assert tracer.mark_crashed(path, "r", "rank 0 was killed by SIGKILL")
    assert not tracer.mark_crashed(path, "r", "again")  # only a running run is marked
    with tracer.open(path) as trace:
        info = trace.run().info
        assert (info.status, info.error) == ("crashed", "rank 0 was killed by SIGKILL")


def test_a_stale_running_run_is_reported_crashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t.sqlite"
    tracer.start_run(path, "r", {})
    monkeypatch.setattr("tracer._read.CRASH_AFTER_S", -1.0)
    with tracer.open(path) as trace:
        assert trace.run().info.status == "crashed"


def test_a_failing_body_marks_the_run_failed_with_its_traceback(tmp_path: Path) -> None:
    def program() -> None:
        X = ap.dvector(10, shape=(), init=ap.init.zeros(), name="X")

        def good(j: int) -> None:
            X[j] = 1.0

        def bad(j: int) -> None:
            if j == 7 and ap.current().mode != "recon":
                raise ZeroDivisionError("boom at 7")
            X[j] = 2.0

        ap.async_for(0, 10, good, name="ok")
        ap.async_for(0, 10, bad, name="bad")

    path = tmp_path / "f.sqlite"
    with pytest.raises(ap.BodyError):
        record(path, program=program, nodes=1, threads=1)
    with tracer.open(path) as trace:
        run = trace.run()
        assert run.info.status == "failed"
        assert "ZeroDivisionError" in run.info.error
        assert [i.op for i in run.invocations()] == ["ok"]
        end = list(run.events())[-1]
        assert isinstance(end, tracer.RunEnded) and end.status == "failed"


def test_a_second_run_in_the_same_store(recorded_trace: Path, tmp_path: Path) -> None:
    path = tmp_path / "two.sqlite"
    record(path, run_id="first", epochs=1)
    record(path, run_id="second", epochs=3)
    with tracer.open(path) as trace:
        assert [r.run_id for r in trace.runs()] == ["first", "second"]
        assert trace.run().run_id == "second"
        assert trace.run("first").operators()["acc"].invocations == 1
        assert trace.run("second").operators()["acc"].invocations == 3
    with pytest.raises(tracer.RunExistsError, match="already holds a run 'first'"):
        tracer.start_run(path, "first", {})


def test_verdicts_are_added_through_the_writable_handle(trace_copy: Path) -> None:
    with tracer.open_writable(trace_copy) as trace:
        trace.add_verdict("run-1", "dual-forward", True, {"iterations": 2})
        with pytest.raises(ValueError, match="unknown verdict kind 'maybe'"):
            trace.add_verdict("run-1", "maybe", True)
        with pytest.raises(tracer.RunNotFoundError):
            trace.add_verdict("nope", "cluster", False)
    with tracer.open(trace_copy) as trace:
        (v,) = trace.run().verdicts()
        assert (v.kind, v.passed, v.detail) == ("dual-forward", True, {"iterations": 2})


def test_plans_read_back_equal_the_engine_plan(tmp_path: Path) -> None:
    path = tmp_path / "p.sqlite"
    plans = {}

    def program() -> None:
        toy_program(n=300, epochs=1)()
        plans["acc"] = ap.plan_of("acc")

    record(path, program=program, nodes=3, threads=2)
    with tracer.open(path) as trace:
        got = trace.run().plan("acc")
    want = plans["acc"]
    assert got.strategy == want.strategy and len(got.rounds) == len(want.rounds)
    for rg, rw in zip(got.rounds, want.rounds, strict=True):
        for tg, tw in zip(rg, rw, strict=True):
            assert [(t.thread, t.locked, t.indices.tolist()) for t in tg] == [
                (t.thread, t.locked, t.indices.tolist()) for t in tw
            ]


class _Gathers:
    """What an MPI communicator's ``gather`` does for ranks that reach it one after
    another in this process: the others' objects wait here until rank 0 arrives.  The
    funnel under ``mpiexec`` itself runs in test_trace_mpi and the resume tests; this one
    lets a test stop the primary between the gather and its commit."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.waiting: list[Any] = []

    def comm(self, rank: int) -> Any:
        gathers = self

        class Comm:
            def Get_size(self) -> int:  # noqa: N802 - mpi4py's spelling
                return gathers.size

            def Get_rank(self) -> int:  # noqa: N802
                return rank

            def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
                if rank != root:
                    gathers.waiting.append(obj)
                    return None
                got, gathers.waiting = [obj, *gathers.waiting], []
                return got

        return Comm()


def _script(rec: tracer.TraceRecorder, node: int, inv: int) -> None:
    rec.lock_grants("op", inv, node, 0, 4, 4, np.array([1]), np.array([1]))
    rec.message_received(node, "rows", 1 - node, inv, 64 + node)


def _funnelled(
    path: Path, invocations: int, primary_stops: int | None, funnel: bool = True
) -> None:
    """Two ranks record ``invocations`` invocations through a funnel (each on its own
    with ``funnel=False``); with ``primary_stops=k`` the primary takes the gather of
    invocation k and dies before its commit, and rank 1 fails in its next invocation."""
    tracer.start_run(path, "r", {"app": "funnel", "ranks": 2})
    gathers = _Gathers(2)
    recs = [
        tracer.TraceRecorder(path, "r", [n], n == 0, funnel=gathers.comm(n) if funnel else None)
        for n in (0, 1)
    ]
    for inv in range(invocations):
        for node in (1, 0):  # rank 1 reaches the gather first, as it may under MPI
            _script(recs[node], node, inv)
            if node == 0 and inv == primary_stops:
                gathers.waiting = []  # the primary died holding rank 1's rows
                _script(recs[1], 1, inv + 1)
                recs[1].close("failed", "rank 0 died")
                return
            info = {"bodies": 4, "rounds": 1, "seconds": 0.0}
            if node == 0:
                info["digests"] = [("X", f"x3:{inv:032x}")]
            recs[node].invocation_done("op", inv, node, info)
            if node == 0:
                recs[0].objective("loss", inv, 1.0 / (inv + 1))
    for rec in recs[::-1]:
        rec.close("finished")


def test_the_funnel_stores_what_each_rank_writing_its_own_stores(tmp_path: Path) -> None:
    """One writer for every rank's commit: the same rows, chains and events as two."""
    _funnelled(tmp_path / "f.sqlite", 5, None)
    _funnelled(tmp_path / "d.sqlite", 5, None, funnel=False)
    seen = []
    for name in ("f.sqlite", "d.sqlite"):
        with tracer.open(tmp_path / name) as trace:
            assert trace.verify().ok, trace.verify().line()
            run = trace.run()
            events = [(n, [(type(e).__name__, e.seq) for e in run.events(node=n)]) for n in (0, 1)]
            seen.append((events, run.operators()["op"], run.objectives(), run.info.status))
    assert seen[0] == seen[1]
    assert seen[0][1].invocations == 5 and seen[0][3] == "finished"
    # schema 7: the funnel writes one row and one link per invocation for both ranks
    for name, rows, links in (("f.sqlite", 5, 5), ("d.sqlite", 10, 10)):
        with sqlite3.connect(tmp_path / name) as con:
            got = con.execute("SELECT count(*), sum(n_nodes) FROM invocation_set").fetchone()
            (n_links,) = con.execute(
                "SELECT count(*) FROM chain_link WHERE link_no >= 0 AND invocation >= 0"
            ).fetchone()
        con.close()
        assert got == (rows, 10) and n_links == links, name
        with tracer.open(tmp_path / name) as trace:
            assert trace.verify(full=True).ok


@pytest.mark.parametrize("stop", [0, 2])
def test_a_rank_whose_primary_died_writes_what_it_handed_over(
    tmp_path: Path, stop: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tracer._recorder.FUNNEL_WAIT_S", 0.05)
    path = tmp_path / "t.sqlite"
    _funnelled(path, 4, stop)
    with tracer.open(path, assume_finished=True) as trace:
        report = trace.verify()
        assert report.ok, report.line()  # node 1's chain skips nothing
        run = trace.run()
        got = {(i.node, i.invocation) for i in run.invocations()}
        # rank 1's invocation ``stop`` survives although the primary never committed it
        assert got == {(0, i) for i in range(stop)} | {(1, i) for i in range(stop + 1)}
        assert run.info.status == "failed"
        lock_seqs = [e.seq for e in run.events(node=1)]
        assert lock_seqs == list(range(len(lock_seqs)))


def test_a_failing_rank_does_not_write_twice_what_the_primary_committed(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    tracer.start_run(path, "r", {"app": "funnel", "ranks": 2})
    gathers = _Gathers(2)
    recs = [tracer.TraceRecorder(path, "r", [n], n == 0, funnel=gathers.comm(n)) for n in (0, 1)]
    for node in (1, 0):
        _script(recs[node], node, 0)
        recs[node].invocation_done("op", 0, node, {"bodies": 4, "rounds": 1, "seconds": 0.0})
    _script(recs[1], 1, 1)
    t0 = time.monotonic()
    recs[1].close("failed", "a body raised")
    assert time.monotonic() - t0 < 1.0  # it found its rows written, it did not wait them out
    recs[0].close("failed", "rank 1 failed")
    with tracer.open(path) as trace:
        assert trace.verify().ok
        assert sorted((i.node, i.invocation) for i in trace.run().invocations()) == [(0, 0), (1, 0)]


class _Block:
    """One DDS's rows of a checkpoint, as the engine hands them to ``checkpoint``."""

    def __init__(self, node: int) -> None:
        self.dds, self.kind, self.dtype, self.shape, self.length = "W", "array", "<f8", (2,), 4
        self.slots = np.array([2 * node, 2 * node + 1])
        self.values = np.arange(4.0).reshape(2, 2) + 10 * node


@pytest.mark.parametrize("storeless", [False, True])
def test_checkpoints_go_through_the_funnel_even_from_a_rank_without_the_store(
    tmp_path: Path, storeless: bool
) -> None:
    """Rank 1 on another host than the store (``store=None``): its commits and its
    checkpoints reach the file through rank 0, and the trace verifies."""
    path = tmp_path / "t.sqlite"
    tracer.start_run(path, "r", {"app": "funnel", "ranks": 2})
    gathers = _Gathers(2)
    recs = [
        tracer.TraceRecorder(
            None if (n == 1 and storeless) else path, "r", [n], n == 0, funnel=gathers.comm(n)
        )
        for n in (0, 1)
    ]
    for inv in range(3):
        for node in (1, 0):
            _script(recs[node], node, inv)
            recs[node].invocation_done("op", inv, node, {"bodies": 4, "rounds": 1, "seconds": 0})
        for node in (1, 0):  # every rank checkpoints after the same invocation
            recs[node].checkpoint("op", inv, node, inv + 1, [_Block(node)], {})
    for rec in recs[::-1]:
        rec.close("finished")
    with tracer.open(path) as trace:
        assert trace.verify().ok, trace.verify().line()
        run = trace.run()
        assert [(c.op, c.invocation) for c in run.checkpoints()] == [("op", i) for i in range(3)]
        assert sorted((i.node, i.invocation) for i in run.invocations()) == [
            (n, i) for n in (0, 1) for i in range(3)
        ]
    with sqlite3.connect(path) as db:
        nodes = db.execute("SELECT node, count(*) FROM checkpoint GROUP BY node").fetchall()
    assert nodes == [(0, 3), (1, 3)]
    with pytest.raises(ValueError, match="without a store"):
        tracer.TraceRecorder(None, "r", [0], True, funnel=_Gathers(2).comm(0))


def test_message_columns_take_the_shorter_coding_and_read_back(tmp_path: Path) -> None:
    """Sources that step slowly through the nodes (``sync_for`` deltas come from the
    owners in turn) are stored delta-coded, random ones plainly, whichever is shorter (the
    codec says which); every column reads back as recorded."""
    rng = np.random.default_rng(5)
    slow = (np.arange(200) // 3 + rng.integers(0, 2, 200)) % 64
    for sources, delta in ((slow, True), (rng.integers(0, 64, 200), False)):
        path = tmp_path / f"{delta}.sqlite"
        rec = tracer.TraceRecorder(path, "r", [0], True)
        nbytes = 256 * rng.integers(1, 4, 200)
        for k, (s, n) in enumerate(zip(sources.tolist(), nbytes.tolist(), strict=True)):
            rec.message_received(0, "sync_for.delta", s, k, n)
        rec.invocation_done("op", 0, 0, {"bodies": 1, "rounds": 1, "seconds": 0.0})
        rec.close("finished")
        con = sqlite3.connect(path)
        blob, codec = con.execute("SELECT sources, sources_codec FROM message_block").fetchone()
        con.close()
        plain, coded = encode(sources), encode(sources, delta=True)
        assert ("-d" in codec) is delta
        assert len(blob) == min(len(plain[0]), len(coded[0]))
        with tracer.open(path) as trace:
            got = trace.run().messages(0, "op", 0)
        assert got.source.tolist() == sources.tolist()
        assert got.nbytes.tolist() == nbytes.tolist()
        assert got.source_seq.tolist() == list(range(200))


def test_routed_arrivals_are_counted_per_exchange_not_logged(tmp_path: Path) -> None:
    """A routed write-back names its source and size, so schema 7 keeps per node and
    sender exchange number how many arrived and their bytes, and no event: the node's
    sequence numbers go on without them, and ``show`` still counts every message."""
    path = tmp_path / "t.sqlite"
    rec = tracer.TraceRecorder(path, "r", [0, 1], True)
    for node, src, exchange, nbytes in [(0, 1, 7, 256), (0, 1, 8, 512), (1, 0, 7, 256)]:
        rec.message_received(node, "routed", src, exchange, nbytes)
    rec.message_received(1, "routed", 0, 7, 768)  # a second sender in the same exchange
    rec.message_received(1, "sync_for.delta", 0, 0, 8)  # any other channel: an event
    for node in (0, 1):
        rec.invocation_done("op", 0, node, {"bodies": 1, "rounds": 1, "seconds": 0.0})
    rec.close("finished")
    with tracer.open(path) as trace:
        run = trace.run()
        got = {
            c.node: (c.exchange.tolist(), c.count.tolist(), c.nbytes.tolist()) for c in run.routed()
        }
        assert got == {0: ([7, 8], [1, 1], [256, 512]), 1: ([7], [2], [1024])}
        assert run.messages(1).channel.tolist() == ["sync_for.delta"]
        assert [i.seq for i in run.invocations()] == [0, 1]  # node 1's message took seq 0
        assert run.operators()["op"].messages == 5
        assert trace.verify(full=True).ok
