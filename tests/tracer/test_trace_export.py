"""Chrome trace-event export, checked against the Trace Event Format at schema level."""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

import engine as ap
import tracer
from tracer._export import CHECKPOINT_TID, NODE_TID

sys.path.insert(0, str(Path(__file__).parent))
from chromeformat import problems  # noqa: E402
from tracehelp import record  # noqa: E402


def load(recorded_trace: Path, tmp_path: Path) -> dict:
    out = tmp_path / "run.json"
    with tracer.open(recorded_trace) as trace:
        n = tracer.export_chrome(trace, None, out)
    doc = json.loads(out.read_text())  # valid JSON
    assert len(doc["traceEvents"]) == n
    return doc


def test_events_follow_the_trace_event_format(recorded_trace: Path, tmp_path: Path) -> None:
    doc = load(recorded_trace, tmp_path)
    assert doc["displayTimeUnit"] == "ms"
    assert problems(doc) == []
    phases = {e["ph"] for e in doc["traceEvents"]}
    assert {"M", "X", "i", "C"} <= phases  # slices, grants and receives, counters
    # schema 7 draws no arrow for a routed write-back, and the file says why
    assert not phases & {"s", "f"} and "no arrow" in doc["otherData"]["routed"]


def test_an_old_traces_messages_are_flows(tmp_path: Path) -> None:
    """A schema-6 trace, whose routed arrivals name their sources, still draws arrows."""
    doc = load(_old_trace(tmp_path), tmp_path)
    assert problems(doc) == [] and "routed" not in doc["otherData"]
    assert {"s", "f"} <= {e["ph"] for e in doc["traceEvents"]}


def _old_trace(tmp_path: Path) -> Path:
    import gzip

    path = tmp_path / "old.sqlite"
    data = Path(__file__).parent.parent / "data" / "sgdmf_rot_4.sqlite.gz"
    path.write_bytes(gzip.decompress(data.read_bytes()))
    return path


def test_routed_arrivals_are_one_instant_per_exchange(recorded_trace: Path, tmp_path: Path) -> None:
    doc = load(recorded_trace, tmp_path)
    with tracer.open(recorded_trace) as trace:
        want = sorted(
            (c.node, int(e), int(n), int(nb))
            for c in trace.run().routed()
            for e, n, nb in zip(c.exchange, c.count, c.nbytes, strict=True)
        )
    got = sorted(
        (e["pid"], e["args"]["exchange"], e["args"]["messages"], e["args"]["nbytes"])
        for e in _by_ph(doc, "i", "message")
        if e["args"]["channel"] == "routed"
    )
    assert want and got == want


def test_one_process_per_node_and_one_track_per_thread(
    recorded_trace: Path, tmp_path: Path
) -> None:
    doc = load(recorded_trace, tmp_path)
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert procs == {0: "node 0", 1: "node 1"}
    threads = {(e["pid"], e["tid"]) for e in meta if e["name"] == "thread_name"}
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {(e["pid"], e["tid"]) for e in slices} == threads
    # 3 worker threads per node, the node's own track and its checkpoints
    assert {tid for _, tid in threads} == {0, 1, 2, NODE_TID, CHECKPOINT_TID}
    # metadata precedes the slices it names
    first_slice = doc["traceEvents"].index(slices[0])
    assert all(doc["traceEvents"].index(m) < first_slice for m in meta)


def test_slices_cover_every_round_and_are_ordered_per_track(
    recorded_trace: Path, tmp_path: Path
) -> None:
    doc = load(recorded_trace, tmp_path)
    with tracer.open(recorded_trace) as trace:
        run = trace.run()
        want = {(i.op, i.invocation, i.node) for i in run.invocations()}
        bodies = sum(i.bodies for i in run.invocations())
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "round"]
    slices = [e for e in slices if e["tid"] != NODE_TID]  # the threads' round slices
    got = {(e["args"]["op"], e["args"]["invocation"], e["pid"]) for e in slices}
    assert got == want
    assert sum(e["args"]["bodies"] for e in slices) == bodies
    tracks: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for e in slices:
        tracks[(e["pid"], e["tid"])].append(e)
    for evs in tracks.values():
        ts = [e["ts"] for e in evs]
        assert ts == sorted(ts)
        for a, b in zip(evs, evs[1:], strict=False):
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3  # slices on one track never overlap


def test_each_checkpoint_is_a_slice_after_its_invocation_as_long_as_it_took(
    recorded_trace: Path, tmp_path: Path
) -> None:
    doc = load(recorded_trace, tmp_path)
    with tracer.open(recorded_trace) as trace:
        times = trace.run().checkpoint_times()
    assert times, "the toy run keeps checkpoints (the default policy)"
    cps = _by_ph(doc, "X", "checkpoint")
    assert len(cps) == len(times) and all(e["tid"] == CHECKPOINT_TID for e in cps)
    rounds = [e for e in _by_ph(doc, "X", "round") if e["tid"] == NODE_TID]
    for op, inv, node, sec, nbytes in times:
        (e,) = [c for c in cps if c["pid"] == node and c["name"] == f"checkpoint after {op}#{inv}"]
        assert e["args"] == {"seconds": sec, "bytes": nbytes}
        assert e["dur"] == pytest.approx(max(sec * 1e6, 1.0), abs=2e-3)
        mine = [r for r in rounds if r["pid"] == node and r["args"]["op"] == op]
        mine = [r for r in mine if r["args"]["invocation"] == inv]
        assert e["ts"] == pytest.approx(max(r["ts"] + r["dur"] for r in mine), abs=2e-3)
    meta = [m for m in doc["traceEvents"] if m["ph"] == "M" and m["name"] == "thread_name"]
    names = {(m["pid"], m["tid"]): m["args"]["name"] for m in meta}
    assert names[(0, CHECKPOINT_TID)] == "checkpoints"


def _node_track(doc: dict, node: int) -> list[dict]:
    """The slices of ``node``'s own track that are not nested (invocations and phases)."""
    top = [e for e in _by_ph(doc, "X") if e["pid"] == node and e["tid"] == NODE_TID]
    return sorted((e for e in top if e["cat"] in ("invocation", "phase")), key=lambda e: e["ts"])


def test_reconnaissance_planning_and_digests_are_slices_around_their_invocation(
    recorded_trace: Path, tmp_path: Path
) -> None:
    doc = load(recorded_trace, tmp_path)
    assert problems(doc) == []
    with tracer.open(recorded_trace) as trace:
        invs = trace.run().invocations()
    first = {}
    for i in sorted(invs, key=lambda i: i.invocation):
        first.setdefault(i.op, i.invocation)
    for node in {i.node for i in invs}:
        track = _node_track(doc, node)
        for a, b in zip(track, track[1:], strict=False):  # in sequence, never overlapping
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3, (a, b)
        names = [e["name"] for e in track]
        for i in (i for i in invs if i.node == node):
            at = names.index(f"{i.op}#{i.invocation}")
            want = [f"digests {i.op}#{i.invocation}"]  # each invocation hashes its DDS
            assert names[at + 1 : at + 2] == want, names
            if first[i.op] == i.invocation:  # the first one is planned beforehand
                pre = [f"reconnaissance {i.op}#0", f"planning {i.op}#0"]
                assert names[at - 2 : at] == pre, names
        for e in (e for e in track if e["cat"] == "phase"):
            assert e["dur"] > 0 and e["args"]["seconds"] >= 0, e


def test_a_trace_without_phase_rows_exports_without_those_slices(
    trace_copy: Path, tmp_path: Path
) -> None:
    """Traces written before the ``phase`` table existed still export, as before."""
    import sqlite3

    with sqlite3.connect(trace_copy) as db:
        db.execute("DROP TABLE phase")
        db.execute("DROP TABLE phase_set")
    doc = load(trace_copy, tmp_path)
    assert problems(doc) == [] and _by_ph(doc, "X", "phase") == []
    assert _by_ph(doc, "X", "invocation")


def test_absurd_phase_rows_neither_crash_the_export_nor_stretch_it(
    trace_copy: Path, tmp_path: Path
) -> None:
    """The phase_set table is not chained: its rows are hints that may be anything."""
    import sqlite3

    from tracer._export import MAX_PHASE_S
    from tracer._invset import encode_phase

    with tracer.open(trace_copy) as trace:
        invs = trace.run().invocations()
    i = invs[0]

    def row(op, inv, node, kind, started, secs, **blob):
        got = encode_phase([(node, 0.0, secs)]) | blob
        return (op, inv, node, kind, got["n_nodes"], started, got["times"], got["times_codec"])

    bad = [
        row(i.op, i.invocation, i.node, "planning", "yesterday", 1.0),  # text for a time
        row(i.op, i.invocation, i.node, "bogus", 0.0, 1.0),  # unknown kind
        row(i.op, i.invocation, i.node, "digests", 1e308, 1.0, times=b"\x01"),  # no rows
        row(i.op, i.invocation, i.node, "digests", 0.0, 1.0, times_codec="pickle"),
        row(i.op, i.invocation, i.node, "digests", 0.0, 1.0, n_nodes=10**9),
        row(i.op, "x", i.node, "digests", 0.0, 1.0),  # text for an invocation
        row("nosuch", 0, 7, "digests", 0.0, 1.0),  # no such invocation or node
    ] + [row(i.op, i.invocation, i.node, "reconnaissance", 1e308, 1e12)] * 50_000
    with sqlite3.connect(trace_copy) as db:
        db.execute("DELETE FROM phase_set")
        db.executemany(
            "INSERT INTO phase_set (run, op, invocation, node, kind, n_nodes, started_at, "
            "times, times_codec) VALUES ('run-1', ?, ?, ?, ?, ?, ?, ?, ?)",
            bad,
        )
    t = time.perf_counter()
    doc = load(trace_copy, tmp_path)
    assert time.perf_counter() - t < 5  # reads a bounded number of rows
    assert problems(doc) == []
    # only the first two sane rows of a kind count (an invocation is planned at most twice)
    first, again = _by_ph(doc, "X", "phase")
    name = f"reconnaissance {i.op}#{i.invocation}"
    assert [first["name"], again["name"]] == [name, f"{name} (re-plan)"]
    inv = [e for e in _node_track(doc, i.node) if e["name"] == f"{i.op}#{i.invocation}"]
    for recon in (first, again):
        assert recon["pid"] == i.node and recon["dur"] == pytest.approx(MAX_PHASE_S * 1e6)
        assert recon["ts"] + recon["dur"] <= inv[0]["ts"] + 1e-3  # still before its invocation


# ------------------------------------------------------------ what the timeline shows
def _by_ph(doc: dict, ph: str, cat: str | None = None) -> list[dict]:
    return [e for e in doc["traceEvents"] if e["ph"] == ph and cat in (None, e.get("cat"))]


def test_thread_slices_are_the_recorded_per_thread_times(
    recorded_trace: Path, tmp_path: Path
) -> None:
    """Each thread's round slice starts and ends where that thread's task groups did, as
    recorded (µs from the node's start of the round), not at a share of the plan."""
    doc = load(recorded_trace, tmp_path)
    with tracer.open(recorded_trace) as trace:
        invs = trace.run().invocations()
    node_rounds = {
        (e["pid"], e["args"]["op"], e["args"]["invocation"], e["args"]["round"]): e
        for e in _by_ph(doc, "X", "round")
        if e["tid"] == NODE_TID
    }
    threads = {
        (e["pid"], e["tid"], e["args"]["op"], e["args"]["invocation"], e["args"]["round"]): e
        for e in _by_ph(doc, "X", "round")
        if e["tid"] != NODE_TID
    }
    checked = 0
    spans: dict[tuple[int, int], set[tuple[float, float]]] = defaultdict(set)
    for i in invs:
        assert i.thread_times, "async_for records every thread's task-group times"
        for r, t, a, b in i.thread_times:
            assert 0 <= a <= b <= i.round_seconds[r] + 1e-6
            e = threads[(i.node, t, i.op, i.invocation, r)]
            start = node_rounds[(i.node, i.op, i.invocation, r)]["ts"]
            assert e["args"]["timed"] == "recorded"
            assert e["ts"] - start == pytest.approx(a * 1e6, abs=2e-3)
            assert e["dur"] == pytest.approx(min(b - a, i.round_seconds[r] - a) * 1e6, abs=2e-3)
            spans[(i.node, r)].add((round(a, 6), round(b, 6)))
            checked += 1
    assert checked and len(threads) == checked
    assert any(len(v) > 1 for v in spans.values())  # threads ran for different times


@pytest.fixture(scope="module")
def contended_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-node, 3-thread run whose locked bodies sleep, so threads take turns."""

    def program() -> None:
        X = ap.dvector(4, shape=(), init=ap.init.zeros(), name="X")

        def body(j: int) -> None:
            X[j % 4] += 1.0
            time.sleep(0.0002)  # release the GIL inside the locks: hand-overs happen

        ap.async_for(0, 120, body, name="acc")

    path = tmp_path_factory.mktemp("contended") / "c.sqlite"
    record(path, program=program)
    return path


@pytest.mark.parametrize("which", ["recorded_trace", "contended_trace"])
def test_lock_hand_overs_are_instants_on_the_thread_that_took_over(
    which: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A trace keeps each round's ticket order as deviations from its prediction (where
    another thread took over); each becomes one instant on that thread's track."""
    path = request.getfixturevalue(which)
    doc = load(path, tmp_path)
    want = []
    with tracer.open(path) as trace:
        run = trace.run()
        for i in run.invocations():
            g = run.lock_grants(i.op, i.invocation, i.node)
            for k in range(len(g.seq)):
                positions, threads = g.deviations(k)
                for p, t in zip(positions.tolist(), threads.tolist(), strict=True):
                    want.append((i.node, t, int(g.round[k]), p, int(g.bodies[k])))
    handovers = _by_ph(doc, "i", "lock")
    assert len(handovers) == len(want)
    assert want or which == "recorded_trace"  # the sleeping bodies must hand over
    got = [
        (e["pid"], e["tid"], e["args"]["round"], e["args"]["position"], e["args"]["locked_bodies"])
        for e in handovers
    ]
    assert sorted(got) == sorted(want)
    assert all(e["name"] == f"lock {e['args']['element']}" for e in handovers)
    assert all(e["args"]["placed"] == "by order" for e in handovers)
    # the element is the lock the body took over (every body locks X[j % 4] only), and the
    # plan alone tells which body took each ticket and which thread handed over
    for e in handovers:
        j = e["args"]["index"]
        assert j is not None and e["args"]["element"] == f"X[{j % 4}]", e
        assert e["args"]["from_thread"] not in (None, e["tid"])
    # and the instant sits in its own thread's round slice, inside the group running j
    groups = _by_ph(doc, "X", "task")
    for e in handovers:
        assert any(
            g["pid"] == e["pid"]
            and g["tid"] == e["tid"]
            and g["ts"] <= e["ts"] <= g["ts"] + g["dur"]
            for g in groups
        ), e
    # every hand-over sits inside its round's slice on the node track
    rounds = _by_ph(doc, "X", "round")
    for e in handovers:
        assert any(
            r["pid"] == e["pid"]
            and r["args"].get("round") == e["args"]["round"]
            and r["ts"] <= e["ts"] <= r["ts"] + r["dur"]
            for r in rounds
        ), e


def test_every_received_message_is_a_flow_from_its_sender(tmp_path: Path) -> None:
    recorded_trace = _old_trace(tmp_path)  # schema 7 records no routed message alone
    doc = load(recorded_trace, tmp_path)
    with tracer.open(recorded_trace) as trace:
        run = trace.run()
        want = sorted(
            (int(src), node, str(ch))
            for node in run.nodes()
            for src, ch in zip(run.messages(node).source, run.messages(node).channel, strict=True)
        )
    starts = {e["id"]: e for e in _by_ph(doc, "s", "message")}
    finishes = {e["id"]: e for e in _by_ph(doc, "f", "message")}
    assert want and starts.keys() == finishes.keys()
    got = sorted((starts[k]["pid"], finishes[k]["pid"], finishes[k]["name"]) for k in starts)
    assert got == want
    assert all(e["bp"] == "e" and e["tid"] == NODE_TID for e in finishes.values())
    recvs = _by_ph(doc, "i", "message")
    assert sorted((e["args"]["source"], e["pid"], e["args"]["channel"]) for e in recvs) == want


def test_objectives_are_counter_tracks(recorded_trace: Path, tmp_path: Path) -> None:
    doc = load(recorded_trace, tmp_path)
    with tracer.open(recorded_trace) as trace:
        want = trace.run().objectives()
    got: dict[str, list[float]] = defaultdict(list)
    for e in _by_ph(doc, "C", "objective"):
        got[e["name"]].append(e["args"][e["name"]])
    assert got == want == {"total": [0.0, 1.0]}
    ends = [e["ts"] + e["dur"] for e in _by_ph(doc, "X", "invocation") if e["pid"] == 0]
    # each value appears when the invocation before it ends on its node
    assert [e["ts"] for e in _by_ph(doc, "C")] == pytest.approx(sorted(ends), abs=1e-3)


@pytest.fixture(scope="module", params=["ssp", "hybrid", "bsp"])
def sync_trace(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-node, 2-thread MLR run (``sync_for``) with the given sync model."""
    from apps.mlr import train

    path = tmp_path_factory.mktemp("sync") / f"{request.param}.sqlite"
    program = functools.partial(train, epochs=2, synthetic=True, sync=request.param)
    record(path, threads=2, program=program)
    return path


def test_sync_for_clocks_carry_their_bodies(sync_trace: Path, tmp_path: Path) -> None:
    doc = load(sync_trace, tmp_path)
    assert problems(doc) == []
    with tracer.open(sync_trace) as trace:
        run = trace.run()
        invs = run.invocations()
    for node in {i.node for i in invs}:  # its reconnaissance, then its first invocation
        names = [e["name"] for e in _node_track(doc, node)]
        op = invs[0].op
        assert names[:3] == [f"reconnaissance {op}#0", f"{op}#0", f"digests {op}#0"], names
        mutex = {(i.invocation, i.node): run.mutex_grants(i.op, i.invocation, i.node) for i in invs}
    clocks = _by_ph(doc, "X", "clock")
    total = defaultdict(int)
    for i in invs:
        total[i.invocation] += i.bodies
        mine = [e for e in clocks if e["pid"] == i.node and e["args"]["invocation"] == i.invocation]
        node = [e for e in mine if e["tid"] == NODE_TID]
        assert [e["args"]["clock"] for e in node] == list(range(i.rounds))
        assert sum(e["args"]["bodies"] for e in node) == i.bodies
        threads = [e for e in mine if e["tid"] != NODE_TID]
        assert sum(e["args"]["bodies"] for e in threads) == i.bodies
        m = mutex[(i.invocation, i.node)]
        if len(m.seq):  # hybrid: the threads' minibatches are the recorded mutex grants
            got = {
                (e["args"]["clock"], e["tid"], b) for e in threads for b in e["args"]["minibatches"]
            }
            assert got == set(
                zip(m.clock.tolist(), m.thread.tolist(), m.minibatch.tolist(), strict=True)
            )
    for e in _by_ph(doc, "i", "mutex"):  # a mutex grant sits in its thread's clock slice
        assert any(
            (t["pid"], t["tid"], t["args"]["clock"]) == (e["pid"], e["tid"], e["args"]["clock"])
            and e["args"]["minibatch"] in t["args"]["minibatches"]
            and t["ts"] <= e["ts"] <= t["ts"] + t["dur"]
            for t in clocks
        ), e
    for inv, n in total.items():  # every minibatch ran once, on one thread of one node
        ran = [
            b
            for e in clocks
            if e["tid"] != NODE_TID and e["args"]["invocation"] == inv
            for b in e["args"]["minibatches"]
        ]
        assert sorted(ran) == list(range(n))


def test_many_task_groups_collapse_into_one_slice(
    recorded_trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    grants = len(_by_ph(load(recorded_trace, tmp_path), "i", "lock"))
    monkeypatch.setattr("tracer._export.MAX_TASK_SLICES", 0)
    doc = load(recorded_trace, tmp_path)
    assert problems(doc) == []
    tasks = _by_ph(doc, "X", "task")
    assert tasks and all(e["name"].endswith(" task groups") for e in tasks)
    assert len(_by_ph(doc, "i", "lock")) == grants  # every grant is still placed


# ------------------------------------------------------------ Perfetto's trace_processor
def _trace_processor_binary() -> str | None:
    """A trace_processor_shell on this machine: $PERFETTO_TRACE_PROCESSOR, PATH, or the
    perfetto package's cache.  Never downloaded here (CI has no internet for it)."""
    cached = sorted(Path.home().glob(".local/share/perfetto/prebuilts/trace_processor_shell*"))
    return (
        os.environ.get("PERFETTO_TRACE_PROCESSOR")
        or shutil.which("trace_processor_shell")
        or shutil.which("trace_processor")
        or (str(cached[-1]) if cached else None)
    )


def test_perfetto_trace_processor_loads_the_export(recorded_trace: Path, tmp_path: Path) -> None:
    try:
        from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig
    except ImportError:
        pytest.skip("the perfetto Python package is not installed (pip install perfetto)")
    binary = _trace_processor_binary()
    if binary is None:
        pytest.skip(
            "no trace_processor binary: set PERFETTO_TRACE_PROCESSOR to a trace_processor_shell "
            "or put one on PATH (the perfetto package would download it; this test never does)"
        )
    doc = load(recorded_trace, tmp_path)
    cfg = TraceProcessorConfig(bin_path=binary)
    tp = TraceProcessor(trace=str(tmp_path / "run.json"), config=cfg)
    try:

        def q(sql: str) -> list:
            return list(tp.query(sql))

        assert q("select count(*) as n from flow")[0].n == len(_by_ph(doc, "s"))
        bound = q(
            "select o.name as src, i.name as dst from flow f "
            "join slice o on f.slice_out = o.id join slice i on f.slice_in = i.id"
        )
        assert bound and all(
            r.src.startswith("round ") and r.dst.startswith("round ") for r in bound
        )
        grants = q("select count(*) as n from slice where name like 'hand-over %'")[0].n
        assert grants == len(_by_ph(doc, "i", "lock"))
        values = [r.value for r in q("select value from counter order by ts")]
        assert values == [e["args"][e["name"]] for e in _by_ph(doc, "C")]
        procs = {r.name for r in q("select name from process where name like 'node %'")}
        assert procs == {"node 0", "node 1"}
    finally:
        tp.close()


# ------------------------------------------------------------ the validator itself
def _valid() -> dict:
    meta = [
        {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "node 0"}},
        *(
            {"name": "thread_name", "ph": "M", "pid": p, "tid": 0, "args": {"name": "t"}}
            for p in (0, 1)
        ),
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "node 1"}},
    ]
    evs = [
        {"name": "a", "ph": "X", "ts": 0, "dur": 10, "pid": 0, "tid": 0},
        {"name": "b", "ph": "X", "ts": 2, "dur": 3, "pid": 0, "tid": 0},
        {"name": "c", "ph": "X", "ts": 0, "dur": 10, "pid": 1, "tid": 0},
        {"name": "m", "cat": "msg", "ph": "s", "id": 1, "ts": 4, "pid": 0, "tid": 0},
        {"name": "m", "cat": "msg", "ph": "f", "bp": "e", "id": 1, "ts": 6, "pid": 1, "tid": 0},
        {"name": "g", "ph": "i", "s": "t", "ts": 3, "pid": 0, "tid": 0},
        {"name": "loss", "ph": "C", "ts": 10, "pid": 0, "args": {"loss": 0.5}},
    ]
    return {"traceEvents": meta + evs, "displayTimeUnit": "ms"}


def _break(doc: dict, name: str, **change: object) -> dict:
    for e in doc["traceEvents"]:
        if e["name"] == name and e["ph"] != "M":
            e.update(change)
    return doc


@pytest.mark.parametrize(
    ("mutate", "complaint"),
    [
        (lambda d: _break(d, "b", dur=20), "overlaps"),
        (lambda d: _break(d, "b", ts=-1), "non-negative"),
        (lambda d: _break(d, "a", pid="0"), "not an integer"),
        (lambda d: _break(d, "loss", args={"loss": "high"}), "not numbers"),
        (lambda d: _break(d, "g", s="x"), "instant scope"),
        (lambda d: d["traceEvents"].remove(_by_ph(d, "f")[0]), "start(s)"),
        (lambda d: _break(d, "m", ts=50), "binds to no slice"),
        (lambda d: _break(d, "a", ph="Q"), "unknown phase"),
        (
            lambda d: d["traceEvents"].append(
                {"name": "x", "ph": "X", "ts": 0, "pid": 0, "tid": 0}
            ),
            "no 'dur'",
        ),
        (
            lambda d: d["traceEvents"].append(
                {"name": "x", "ph": "i", "ts": 0, "pid": 0, "tid": 7}
            ),
            "no thread_name",
        ),
        (
            lambda d: d["traceEvents"].append(
                {"name": "x", "ph": "E", "ts": 0, "pid": 0, "tid": 0}
            ),
            "without a B",
        ),
    ],
)
def test_the_validator_catches_broken_documents(mutate: Callable, complaint: str) -> None:
    assert problems(_valid()) == []
    doc = _valid()
    mutate(doc)
    assert any(complaint in p for p in problems(doc)), problems(doc)


def test_an_infinite_objective_is_a_marker_and_the_file_stays_strict_json(tmp_path: Path) -> None:
    import engine as ap

    def program() -> None:
        X = ap.dvector(8, shape=(), init=ap.init.zeros(), name="X")

        def body(j: int) -> None:
            X[j] = X[j] + 1.0

        for it in range(2):
            ap.async_for(0, 8, body, name="inc")
            ap.log_objective("loss", float("inf") if it else 1.0)

    path = tmp_path / "nan.sqlite"
    record(path, threads=1, program=program)
    doc = load(path, tmp_path)
    assert problems(doc) == []
    assert [e["args"]["loss"] for e in _by_ph(doc, "C")] == [1.0]
    marks = _by_ph(doc, "i", "objective")
    assert [(e["name"], e["args"]["iteration"]) for e in marks] == [("loss = inf", 1)]


def _replanned_program():
    """A loop whose bodies write where values written in the same invocation lead them,
    so the plan guard undoes the first invocation, plans it again, and runs it serially."""

    def program() -> None:
        X = ap.dvector(31, shape=(2,), init=ap.init.normal(0, 1), name="X")

        def chain(j: int) -> None:
            if X[j][0] > 0.0:
                X[j + 1] = X[j] + 1.0

        for _ in range(2):
            ap.async_for(0, 30, chain, name="chain")

    return program


def test_a_replanned_invocation_shows_both_plannings_and_every_later_phase(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The second reconnaissance and planning of an invocation the guard re-planned are
    slices of their own, and the extra rows do not push later invocations' phases out."""
    path = tmp_path / "replan.sqlite"
    record(path, nodes=2, threads=1, program=_replanned_program())
    assert "re-planned it" in capsys.readouterr().err  # the guard did re-plan chain#0
    doc = load(path, tmp_path)
    assert problems(doc) == []
    for node in (0, 1):
        names = [e["name"] for e in _node_track(doc, node)]
        assert names[:6] == [
            "reconnaissance chain#0",
            "planning chain#0",
            "reconnaissance chain#0 (re-plan)",
            "planning chain#0 (re-plan)",
            "chain#0",
            "digests chain#0",
        ], names
        assert names[-2:] == ["chain#1", "digests chain#1"], names
    again = [e for e in _by_ph(doc, "X", "phase") if e["name"].endswith("(re-plan)")]
    assert len(again) == 4 and all(e["args"]["attempt"] == 2 for e in again), again


def test_a_postgres_trace_exports_its_re_planning_and_is_refused_once_damaged(
    pg_url: str, tmp_path: Path, cli, capsys: pytest.CaptureFixture
) -> None:
    """The same timeline from a trace stored in PostgreSQL (phase rows come back in the
    order written there too), and export refuses it, in one line without the password,
    once a chained row is altered."""
    import sqlalchemy as sa

    from tests.pg import PASSWORD

    record(pg_url, nodes=2, threads=1, program=_replanned_program())
    capsys.readouterr()
    out = tmp_path / "pg.json"
    res = cli("export", pg_url, "-o", out)
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    assert problems(doc) == []
    names = [e["name"] for e in _node_track(doc, 1)]
    assert names[2:5] == [
        "reconnaissance chain#0 (re-plan)",
        "planning chain#0 (re-plan)",
        "chain#0",
    ], names
    engine = sa.create_engine(pg_url)
    try:
        with engine.begin() as db:
            db.execute(sa.text("UPDATE digest SET digest = 'xc:' || repeat('0', 32) WHERE id = 1"))
    finally:
        engine.dispose()
    out.unlink()
    res = cli("export", pg_url, "-o", out)
    err = res.stderr.strip()
    assert res.returncode == 2 and len(err.splitlines()) == 1, res.stderr
    assert "is damaged: table digest" in err and "--damaged" in err and PASSWORD not in err
    assert not out.exists()
