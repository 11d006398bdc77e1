"""Time travel (issue 16): checkpoints, replay --from, history and watch.

Commands run in this process (tests/cli.py), but where pdb reads its commands from stdin
(a real process).  The module's traces are recorded when a test first asks for one, so a
test of the 1-rank traces records no 2-rank one; a test that reads a 2-rank trace, or
replays one on its ranks, starts ``mpiexec`` and is marked ``mpi``.
"""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import engine
import tracer
from engine._runtime.checkpoint import BUDGET, BYTES_PER_BODY, FREE_BYTES
from tests import cli as tcli
from tests.conftest import run_cli
from tests.tracer.tracehelp import reseal
from tracer._codec import encode
from tracer._plain import NotPlain, decode_plain, encode_plain

HERE = Path(__file__).parent
TT_APPS = HERE / "tt_apps.py"
SGD = ["-p", "synthetic=true", "-p", "synthetic_ratings=5000", "-p", "rank=4", "-p", "epochs=5"]
MLR = ["-p", "synthetic=true", "-p", "epochs=5"]
#: The Python body (its RMSE is an ``ap.reduce``, its bodies Python calls); the default
#: since 2026-12-07 is the compiled body, which ``sgdk2`` runs.
PY = ["-p", "kernel=false"]
TIMEOUT = 180


def cli(*args: str) -> tuple[int, str, str]:
    proc = tcli.invoke(args)
    return proc.returncode, proc.stdout, proc.stderr


def record(path: Path, app: str, *args: str) -> Path:
    rc, out, err = cli("run", app, *args, "--trace", str(path), "--json", "--timeout", "120")
    assert rc == 0, err
    return path


EVERY = ["--checkpoint-every", "2"]
#: The module's traces by name: SGDMF and MLR on 1 and 2 ranks, checkpoints every 2.
TRACES: dict[str, tuple[str, ...]] = {
    "sgd1": ("sgdmf", *SGD, *PY, *EVERY),
    "sgd2": ("sgdmf", *SGD, *PY, *EVERY, "--ranks", "2"),
    "mlr1": ("mlr", *MLR, *EVERY),
    "mlr2": ("mlr", *MLR, *EVERY, "--ranks", "2"),
    "sgdk2": ("sgdmf", *SGD, *EVERY, "--ranks", "2"),
    # the digests of traces recorded before xxh3 (and of --digest blake2b), and of
    # traces recorded before xxh3-chunks (and of --digest xxh3)
    "sgdb2": ("sgdmf", *SGD, *PY, *EVERY, "--ranks", "2", "--digest", "blake2b"),
    "sgdx2": ("sgdmf", *SGD, *PY, *EVERY, "--ranks", "2", "--digest", "xxh3"),
}


class _Traces(dict[str, Path]):
    """``TRACES``, each recorded into ``root`` the first time a test asks for it."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, name: str) -> Path:
        app, *args = TRACES[name]
        self[name] = record(self.root / f"{name}.sqlite", app, *args)
        return self[name]


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small traces recorded once per module, on first use (``TRACES``)."""
    return _Traces(tmp_path_factory.mktemp("tt"))


# ---------------------------------------------------------------- checkpoints
@pytest.mark.mpi
@pytest.mark.parametrize("name,op,dds", [("sgd2", "sgd", {"W", "H"}), ("mlr2", "mlr", {"W"})])
def test_each_node_stores_only_the_rows_it_owns(
    traces: dict[str, Path], name: str, op: str, dds: set[str]
) -> None:
    run = tracer.open(traces[name]).run()
    cps = run.checkpoints()
    assert [(c.op, c.invocation, c.step) for c in cps] == [(op, k, k) for k in (0, 2, 4)]
    con = sqlite3.connect(traces[name])
    rows = con.execute(
        "select node, dds, count, length from checkpoint_block where invocation = 2"
    ).fetchall()
    assert {r[1] for r in rows} == dds  # never the loaded data: no body writes it
    for name_ in dds:
        per_node = {r[0]: r[2] for r in rows if r[1] == name_}
        length = next(r[3] for r in rows if r[1] == name_)
        assert set(per_node) == {0, 1}
        assert sum(per_node.values()) == length  # owned rows: a partition, nothing gathered
        assert all(0 < n < length for n in per_node.values())
    state = run.checkpoint_state(op, 2)
    for name_ in dds:
        slots, _ = state.rows[name_]
        assert sorted(slots.tolist()) == list(range(state.lengths[name_]))


def test_checkpoint_bytes_are_reported_apart(traces: dict[str, Path]) -> None:
    rc, out, err = cli("show", str(traces["sgd1"]), "--json")
    assert rc == 0, err
    r = json.loads(out)["runs"][0]
    assert r["checkpoints"] == ["sgd#0", "sgd#2", "sgd#4"]
    cp = tracer.open(traces["sgd1"]).run().checkpoint_bytes()
    assert r["checkpoint_bytes"] == cp > 0
    size = traces["sgd1"].stat().st_size
    assert r["store_bytes"] == size - cp


@pytest.mark.mpi
def test_collective_values_are_recorded(traces: dict[str, Path]) -> None:
    vals = tracer.open(traces["sgd1"]).run().collective_values()
    assert [v.kind for v in vals] == ["reduce"] * (3 + 5)  # users, items, mean, 5 x rmse
    assert all(v.encoding == "plain" for v in vals)
    objs = tracer.open(traces["sgd1"]).run().objectives()["rmse"]
    n = 5000  # synthetic_ratings
    assert [math.sqrt(v.value / n) for v in vals[3:]] == objs
    gathers = tracer.open(traces["mlr2"]).run().collective_values()
    assert [v.kind for v in gathers] == ["gather"] * 5
    assert all(v.value.shape == (10, 65) and v.value.dtype == np.float64 for v in gathers)


@pytest.mark.mpi
def test_a_compiled_metric_records_its_value_not_the_model(traces: dict[str, Path]) -> None:
    """The kernel SGDMF's RMSE (``ap.evaluate`` over W and H) is one float per epoch in the
    trace, and a run fast-forwarding to a checkpoint is served it, on the cluster and in
    one process."""
    run = tracer.open(traces["sgdk2"]).run()
    vals = run.collective_values()
    # users, items, mean, the (user, item, rating) rows once, then 5 x rmse
    assert [v.kind for v in vals] == ["reduce"] * 3 + ["gather"] + ["evaluate"] * 5
    assert [v.value for v in vals[4:]] == run.objectives()["rmse"]
    for mode, at in (("cluster", "sgd:3"), ("single", "sgd:4")):
        rc, out, err = cli(mode, str(traces["sgdk2"]), "--from", at, "--json")
        assert rc == 0, err
        res = json.loads(out)
        assert res["identical"] and res["from"]["invocation"] == 2, res


class _Box:
    pass


#: values a driver can get from collective calls: plain data, arrays (numeric rows of a
#: gather, compressible or not), and objects that cannot be stored (refused)
_COLLECTIVE_VALUES = st.one_of(
    st.floats(allow_nan=False) | st.integers(-(2**40), 2**40) | st.text(max_size=5),
    st.tuples(st.integers(0, 300), st.integers(1, 3), st.booleans()),
    st.just("box"),
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls=st.lists(_COLLECTIVE_VALUES, min_size=1, max_size=8))
def test_collective_values_of_every_kind_read_back_as_recorded(
    tmp_path_factory: pytest.TempPathFactory, calls: list[object]
) -> None:
    """Whatever the mix of value kinds in one commit (a plain reduce before an array
    gather wrote the gather with no dtype: a trace time travel could not read), each value
    reads back as the driver got it, and a refused one says why."""
    got: list[object] = []

    def prog() -> None:
        for c in calls:
            if c == "box":
                got.append(engine.evaluate(lambda: _Box()))
            elif isinstance(c, tuple):
                n, width, noisy = c
                rng = np.random.default_rng(n)
                rows = rng.normal(size=(n, width)) if noisy else np.ones((n, width))
                got.append(engine.evaluate(lambda r: r, rows))
            else:
                got.append(engine.evaluate(lambda v: v, c))

    path = tmp_path_factory.mktemp("cv") / "t.sqlite"
    run_id = "cv"
    tracer.start_run(str(path), run_id, {"app": "cv", "ranks": 1, "threads": 1})
    rec = tracer.TraceRecorder(str(path), run_id, nodes=[0], is_primary=True)
    engine.run(prog, recorder=rec)
    rec.close("finished")
    vals = tracer.open(path).run(run_id).collective_values()
    assert [v.k for v in vals] == list(range(len(calls)))
    for v, want in zip(vals, got, strict=True):
        if isinstance(want, _Box):
            assert v.encoding == "refused" and "not plain data" in v.detail, v
        elif isinstance(want, np.ndarray):
            assert v.encoding == "array" and v.value.dtype == want.dtype
            assert v.value.shape == want.shape and np.array_equal(v.value, want)
        else:
            assert v.encoding == "plain" and repr(v.value) == repr(want)


def test_no_checkpoints_and_the_automatic_default(tmp_path: Path) -> None:
    none = record(tmp_path / "n.sqlite", "sgdmf", *SGD, "--no-checkpoints")
    assert tracer.open(none).run().checkpoints() == []
    rc, out, err = cli("single", str(none), "--from", "sgd:3")
    assert rc == 2 and "no checkpoints" in err and len(err.strip().splitlines()) == 1
    auto = record(tmp_path / "a.sqlite", "sgdmf", *SGD)
    steps = [c.step for c in tracer.open(auto).run().checkpoints()]
    assert steps[0] == 0  # the first one measures what a checkpoint costs
    rc, out, err = cli("run", "sgdmf", *SGD, "--checkpoint-every", "0", "--no-trace")
    assert rc == 2 and "--checkpoint-every must be >= 1" in err


class _Captured(engine.Recorder):
    def __init__(self, every: int | None, cost: float, nbytes: int = 0) -> None:
        self.checkpoint_every = every
        self.cost = cost
        self.nbytes = nbytes
        self.steps: list[int] = []

    def checkpoint(self, op, invocation, node, step, blocks, counters, refused=()) -> int:
        import time

        self.steps.append(step)
        time.sleep(self.cost)
        return self.nbytes


def _loop(n: int, nap: float = 0.0) -> None:
    import time

    X = engine.dvector(16, shape=(), init=engine.init.zeros(), name="X")
    for _ in range(n):

        def body(j: int) -> None:
            time.sleep(nap)
            X[j] = X[j] + 1.0

        engine.async_for(0, 16, body, name="inc")


def test_checkpoint_policy_every_n_and_automatic() -> None:
    rec = _Captured(3, 0.0)
    engine.run(_loop, {"n": 8}, recorder=rec)
    assert rec.steps == [0, 3, 6]
    # a checkpoint far dearer than an invocation: after the first, at most BUDGET of the time
    slow = _Captured(None, 0.05)
    engine.run(_loop, {"n": 12}, recorder=slow)
    assert slow.steps == [0]
    # an invocation of ~960 ms and a checkpoint of well under 14 ms (half the budget):
    # every invocation (generous, so that a loaded machine's pauses cannot flip it)
    assert BUDGET / 2 * 0.96 > 0.014
    cheap = _Captured(None, 0.0)
    engine.run(_loop, {"n": 4, "nap": 0.06}, recorder=cheap)
    assert cheap.steps == [0, 1, 2, 3]


def test_automatic_policy_holds_checkpoint_bytes_per_body() -> None:
    # a checkpoint of 40 kB after loops of 16 bodies: at BYTES_PER_BODY it may come back
    # only after thousands of invocations, however cheap it is to take
    big = _Captured(None, 0.0, nbytes=FREE_BYTES + 10_000)
    engine.run(_loop, {"n": 6}, recorder=big)
    assert big.steps == [0]
    assert math.ceil(10_000 / (BYTES_PER_BODY * 16)) > 6
    # one of FREE_BYTES is left to the time budget: every invocation when it is cheap
    # (invocations of ~480 ms: half the time budget is 7 ms, far above a bare checkpoint)
    small = _Captured(None, 0.0, nbytes=FREE_BYTES)
    engine.run(_loop, {"n": 3, "nap": 0.03}, recorder=small)
    assert small.steps == [0, 1, 2]


def test_plain_encoding_is_bitwise_and_refuses_objects() -> None:
    v = [1, -0.0, math.nan, math.inf, "é", (2, [3.5, None, True]), np.float64(0.1), np.int32(7)]
    data, codec = encode_plain(v)
    back = decode_plain(data, codec, "test")
    assert repr(back) == repr(v)
    assert math.copysign(1.0, back[1]) == -1.0 and type(back[6]) is np.float64
    with pytest.raises(NotPlain, match="not plain data"):
        encode_plain([object()])


def test_object_dds_checkpointed_if_plain_else_refused(tmp_path: Path) -> None:
    plain = record(tmp_path / "p.sqlite", f"{TT_APPS}:objects", "--checkpoint-every", "1")
    run = tracer.open(plain).run()
    state = run.checkpoint_state("obj", 2)
    slots, vals = state.rows["X"]
    assert vals[list(slots).index(3)] == (3, 1.0, "s", [3, -0.0])
    rc, out, err = cli("single", str(plain), "--from", "obj:2", "--json")
    assert rc == 0 and json.loads(out)["identical"], err
    trace = tmp_path / "b.sqlite"
    rc, out, err = cli(
        "run", f"{TT_APPS}:objects", "-p", "plain=false", "--checkpoint-every", "1",
        "--trace", str(trace),
    )  # fmt: skip
    assert rc == 0, err
    notes = [ln for ln in err.splitlines() if "not checkpointed" in ln]
    assert notes == ["note: DDS 'X' is not checkpointed: it holds a Box object, not plain data"], (
        err
    )
    cps = tracer.open(trace).run().checkpoints()
    assert cps and all(c.refused == (("X", "it holds a Box object, not plain data"),) for c in cps)
    assert set(tracer.open(trace).run().checkpoint_state("obj", 1).rows) == {"Y"}


@pytest.mark.parametrize("boxed_from", [0, 2])
def test_from_never_starts_at_a_checkpoint_that_leaves_out_a_written_dds(
    tmp_path: Path, boxed_from: int
) -> None:
    """A checkpoint without a DDS the bodies wrote (objects that are not plain data) is no
    state to restart from: the DDS would keep its value from before the skipped bodies.
    Every ``--from`` starts at the latest checkpoint that holds every written DDS (or at
    the beginning), says which one it passed over, and is identical."""
    trace = record(
        tmp_path / "b.sqlite", f"{TT_APPS}:objects", "-p", "plain=false", "-p", "epochs=4",
        "-p", f"boxed_from={boxed_from}", "--checkpoint-every", "1",
    )  # fmt: skip
    cps = tracer.open(trace).run().checkpoints()
    assert [bool(c.refused) for c in cps] == [k >= boxed_from for k in range(4)]
    for target in range(4):
        rc, out, err = cli("single", str(trace), "--from", f"obj:{target}", "--json")
        assert rc == 0, err
        res = json.loads(out)
        assert res["identical"] and res["complete"], (target, res)
        usable = [k for k in range(min(target, boxed_from))]
        want = {"op": "obj", "invocation": usable[-1], "step": usable[-1]} if usable else None
        assert res["from"] == want, (target, res["from"])
        passed = target > boxed_from  # a checkpoint after obj#boxed_from-1 was passed over
        notes = [ln for ln in err.splitlines() if ln.startswith("note: the checkpoint at")]
        assert len(notes) == int(passed), err
        if passed:
            assert f"at obj#{target - 1} leaves out DDS 'X' (it holds a Box object" in notes[0]


@pytest.mark.parametrize("element", ["T[1]", "V[0]", "W[1]"])
def test_history_says_not_written_only_where_the_value_did_not_change(
    tmp_path: Path, element: str
) -> None:
    """No single body writes a relaxed element (merged at round end) or a ``sync_for``
    row (aggregated): ``history`` said ``not written`` next to a value that changed.  On
    every line, ``not written`` holds exactly where the value is the one before it, and a
    change no body made says how it was made."""
    trace = record(
        tmp_path / "m.sqlite", f"{TT_APPS}:merged", "--threads", "2", "--checkpoint-every", "1"
    )
    rc, out, err = cli("history", str(trace), element)
    assert rc == 0, err
    lines = [ln for ln in out.splitlines() if ln.startswith("  ")]
    rc, js, err = cli("history", str(trace), element, "--json")
    assert rc == 0, err
    entries = json.loads(js)["history"]
    assert len(lines) == len(entries) == 6
    prev = None
    for line, e in zip(lines, entries, strict=True):
        same = prev is not None and e["value"] == prev
        if e["writer"] is None and prev is not None:
            assert ("not written" in line) == same, (element, line, prev)
        if "changed by" in line:
            kind = {"T": "relaxed deltas", "V": "aggregation of the minibatches"}[element[0]]
            assert kind in line, line
        prev = e["value"]
    assert any("changed by" in ln for ln in lines) == (element != "W[1]"), lines


@settings(
    max_examples=5,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    nodes=st.integers(1, 3),
    threads=st.integers(1, 2),
    writers=st.sets(st.integers(0, 7), min_size=1, max_size=4),
)
@example(nodes=2, threads=1, writers={1, 6})  # one writer on each node
@example(nodes=1, threads=2, writers={0})  # one writer, on a thread's copy
def test_history_names_a_writer_only_where_its_write_is_the_value(
    tmp_path_factory: pytest.TempPathFactory, nodes: int, threads: int, writers: set[int]
) -> None:
    """Bodies on several nodes or threads add to one relaxed count: the value after the
    invocation is the round-end merge of their deltas, not what any one body left on its
    node's copy.  ``history`` named the last body that changed the copy (``T[0] = 66,
    last written by index 1 on node 1``, where that body's copy held 2) instead of
    saying the merge made it; on two threads a body's change to its thread's copy was not
    seen at all (``changed by the round-end merge``, and ``watch`` named no body).  A
    writer is named exactly when every writing body ran on one node and thread (then the
    last of them left the value shown)."""
    from replay._job import run_here

    trace = tmp_path_factory.mktemp("counted") / "t.sqlite"
    spec = {
        "app": f"{TT_APPS}:counted",
        "params": [f"writers={','.join(map(str, sorted(writers)))}"],
        "nodes": nodes,
        "threads": threads,
        "trace": str(trace),
        "checkpoint_every": 1,
    }
    run_here(spec)
    with tracer.open(trace) as store:
        plan = store.run().plan("count", 0)
    assert len(plan.rounds) == 1, plan.rounds  # one round: one merge of every delta
    ran = {
        (node, int(t.thread))
        for node, tasks in enumerate(plan.rounds[0])
        for t in tasks
        if writers & set(np.asarray(t.indices).tolist())
    }
    rc, out, err = cli("history", str(trace), "T[0]", "--json")
    assert rc == 0, err
    entries = json.loads(out)["history"]
    total = sum(2**j for j in writers)
    assert [e["value"] for e in entries] == [total, 2 * total], entries
    for e in entries:
        if len(ran) > 1:
            assert e["writer"] is None, (ran, e)
        else:
            assert e["writer"] is not None and e["writer"]["index"] in writers, (ran, e)
    # each body is watched as it sees the count (its thread's copy): any writer's makes it
    rc, out, err = cli("watch", str(trace), "T[0] >= 1", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert (doc["op"], doc["invocation"]) == ("count", 0) and doc["index"] in writers, doc


@settings(
    max_examples=2,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(nodes=st.integers(1, 2), actions=st.text("bsdn", min_size=2, max_size=5))
@example(nodes=1, actions="bdsn")
@example(nodes=2, actions="dbdd")
def test_history_says_how_each_element_changed_whatever_its_dds(
    tmp_path_factory: pytest.TempPathFactory, nodes: int, actions: str
) -> None:
    """An element of a numeric dvector, an object dvector and a map, written by a body,
    by the driver between loops, or by nobody.  ``history`` said ``not written`` next to
    every object element, whose values it did not compare, and next to a value the
    driver had changed.  Now each line says what changed it: the body, the driver, or
    ``not written`` exactly where the value is the one on the line before."""
    from replay._job import run_here

    trace = tmp_path_factory.mktemp("changes") / "t.sqlite"
    spec = {
        "app": f"{TT_APPS}:changes",
        "params": [f"actions={actions}"],
        "nodes": nodes,
        "trace": str(trace),
        "checkpoint_every": 1,
    }
    run_here(spec)
    want = {
        "b": "last written by index 1 on node",
        "s": "not written",
        "n": "not written",
        "d": "changed by the driver before the invocation",
    }
    for element in ("X[1]", "O[1]", "M[1]"):
        rc, out, err = cli("history", str(trace), element)
        assert rc == 0, err
        lines = [ln for ln in out.splitlines() if ln.startswith("  touch#")]
        assert len(lines) == len(actions), out
        for e, (act, line) in enumerate(zip(actions, lines, strict=True)):
            # the first line has none before it: the driver's value is where it starts
            expect = want["n"] if (e, act) == (0, "d") else want[act]
            assert expect in line, (element, actions, line)


def test_a_serial_fallback_is_checkpointed_and_seen_body_by_body(tmp_path: Path) -> None:
    """An invocation that ran as a serial fallback (both plans failed: every node ran
    every body on its replica).  Its checkpoint held no DDS (the fallback's plan records
    no writes), so ``single --from b:1`` restored the initial values and diverged, and a
    resume from it computed from them; and its bodies ran outside the hooks that see a
    body, so ``history`` said ``not written`` next to ``X[11]``'s new value, ``watch``
    named no body and ``--break`` in it was never reached.  Now the checkpoint holds
    every DDS and the hooks see each body."""
    trace = record(tmp_path / "f.sqlite", f"{TT_APPS}:fallback", "--checkpoint-every", "1")
    with tracer.open(trace) as store:
        assert store.run().plan("b", 0).strategy == "replicated"  # the premise
    rc, out, err = cli("single", str(trace), "--from", "b:1", "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["identical"] and res["from"]["invocation"] == 0, res
    rc, out, err = cli("history", str(trace), "X[11]")
    assert rc == 0, err
    lines = [ln for ln in out.splitlines() if ln.startswith("  b#")]
    assert all("last written by index 1 on node 0" in ln for ln in lines), lines
    rc, out, err = cli("watch", str(trace), "X[11] > 0")
    assert rc == 0, err
    assert "X[11] > 0 first holds after b#0, index 1 on node 0" in out, out
    doc = json.loads(cli("watch", str(trace), "X[11] > 0", "--json")[1])
    assert doc["serial_fallback"] is True and doc["index"] == 1, doc
    proc = run_cli(["single", str(trace), "--break", "b:0:3"], timeout=TIMEOUT, input="p j\nc\n")
    assert proc.returncode == 0, proc.stderr
    assert "stopped in b#0 index 3 on node 0" in proc.stdout and "(Pdb) 3" in proc.stdout


# ---------------------------------------------------------------- replay --from
@pytest.mark.parametrize(
    "name,op",
    [("sgd1", "sgd"), ("mlr1", "mlr"), pytest.param("sgd2", "sgd", marks=pytest.mark.mpi)],
)
def test_single_from_restores_bitwise(traces: dict[str, Path], name: str, op: str) -> None:
    rc, out, err = cli("single", str(traces[name]), "--from", f"{op}:4", "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["identical"] and res["complete"], res
    assert res["from"] == {"op": op, "invocation": 2, "step": 2}
    n_dds = len({d.dds for d in tracer.open(traces[name]).run().digests()})
    assert res["checked"]["digests"] == 2 * n_dds  # invocations 3 and 4 only
    rc, out, err = cli("single", str(traces[name]), "--from", f"{op}:0", "--json")
    assert rc == 0 and json.loads(out)["from"] is None  # nothing earlier: from the start


def test_a_verdict_from_a_checkpoint_says_what_it_skipped(traces: dict[str, Path]) -> None:
    """A replay from a checkpoint skips the loop invocations up to it and serves the
    collective values there, so objectives logged before it come from the trace's own
    values: they are not counted as checked, and the verdict says how many were not.
    (With --allow-changed-code an edit that changes only skipped invocations read as
    ``identical: ... 4 objective value(s) match``.)"""
    name, op = "mlr1", "mlr"  # one of the module's traces (SGDMF's replays take longer)
    objectives = tracer.open(traces[name]).run().objectives()  # each logged once an epoch
    total = sum(len(v) for v in objectives.values())
    for point in range(1, 5):
        rc, out, err = cli("single", str(traces[name]), "--from", f"{op}:{point}", "--json")
        assert rc == 0, err
        res = json.loads(out)
        start = res["from"]
        skipped = 0 if start is None else start["step"] + 1
        assert res.get("skipped", 0) == skipped, (point, res)
        served = res.get("served_objectives", 0)
        assert res["checked"]["objectives"] + served == total, (point, res)
        assert served == (0 if start is None else start["invocation"] * len(objectives)), res
    rc, out, err = cli("single", str(traces[name]), "--from", f"{op}:4")
    assert rc == 0, err
    assert f"identical after the checkpoint at {op}#2: " in out, out
    served = 2 * len(objectives)
    assert f"the 3 loop invocation(s) up to it were skipped (the {served} objective value(s)" in out


@pytest.mark.mpi
@pytest.mark.parametrize("name,op", [("sgd2", "sgd"), ("mlr2", "mlr")])
def test_cluster_from_under_mpiexec(traces: dict[str, Path], name: str, op: str) -> None:
    rc, out, err = cli("cluster", str(traces[name]), "--from", f"{op}:3", "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["identical"] and res["from"] == {"op": op, "invocation": 2, "step": 2}, res


@pytest.mark.mpi
@pytest.mark.parametrize(
    "name,prefix,mode",
    [("sgdb2", "", "single"), ("sgdb2", "", "cluster"), ("sgdx2", "x3:", "cluster")],
)
def test_a_trace_of_an_older_hash_replays_with_its_own_hash(
    traces: dict[str, Path], mode: str, name: str, prefix: str
) -> None:
    # replay, --from (the restored checkpoint's digests) and history digest with the hash
    # the trace's digests were made with (blake2b-128, xxh3-128); the default xxh3-chunks
    # here would differ at every digest
    digests = [d.digest for d in tracer.open(traces[name]).run().digests()]
    assert digests and all(d.startswith(prefix) and len(d) == len(prefix) + 32 for d in digests)
    assert prefix or all(":" not in d for d in digests)
    assert all(d.digest.startswith("xc:") for d in tracer.open(traces["sgd2"]).run().digests())
    for extra in ([], ["--from", "sgd:3"]):
        rc, out, err = cli(mode, str(traces[name]), *extra, "--json")
        assert rc == 0, err
        res = json.loads(out)
        assert res["identical"] and res["complete"] and res["checked"]["digests"] > 0, res
    rc, out, err = cli("history", str(traces[name]), "W[1]", "--json")
    assert rc == 0, err


def test_digests_of_two_hashes_are_never_compared() -> None:
    from engine.lowlevel import DigestKindError, check_same_digest_kind

    check_same_digest_kind("x3:" + "0" * 32, "x3:" + "1" * 32)
    check_same_digest_kind("xc:" + "0" * 32, "xc:" + "1" * 32)
    check_same_digest_kind("0" * 32, "1" * 32)
    with pytest.raises(DigestKindError, match="blake2b-128 but this run computed xxh3-128"):
        check_same_digest_kind("0" * 32, "x3:" + "0" * 32)
    with pytest.raises(DigestKindError, match="xxh3-128 but this run computed xxh3-chunks"):
        check_same_digest_kind("x3:" + "0" * 32, "xc:" + "0" * 32)


def test_a_damaged_checkpoint_is_named(traces: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(traces["sgd1"].read_bytes())
    con = sqlite3.connect(bad)
    rid, count = con.execute(
        "select id, count from checkpoint_block where invocation = 2 and dds = 'W'"
    ).fetchone()
    data, codec = encode(np.zeros(count * 4))
    con.execute(
        'update checkpoint_block set "values" = ?, values_codec = ? where id = ?',
        (data, codec, rid),
    )
    con.commit()
    con.close()
    # the chain covers checkpoints: the edit is refused before anything runs
    rc, out, err = cli("single", str(bad), "--from", "sgd:3", "--json")
    assert rc == 2 and "table checkpoint_block node 0 invocation sgd:2" in err, err
    # re-sealed by an editor of the unkeyed chain: the restored digest still tells
    reseal(bad)
    rc, out, err = cli("single", str(bad), "--from", "sgd:3", "--json")
    assert rc == 3, err
    diff = json.loads(out)["first_difference"]
    assert diff["what"] == "checkpoint" and diff["event"] == "checkpoint of W"


def test_break_works_with_from(traces: dict[str, Path]) -> None:
    proc = run_cli(
        ["single", str(traces["sgd1"]), "--from", "sgd:3", "--break", "sgd:3:7"],
        timeout=TIMEOUT,
        input="p j\nc\n",
    )
    assert proc.returncode == 0, proc.stderr
    assert "stopped in sgd#3 index 7 on node 0" in proc.stdout
    assert "(Pdb) 7" in proc.stdout


# ---------------------------------------------------------------- history
def _ratings() -> list:
    from apps.sgdmf._app import data_path, parse_line

    lines = data_path(synthetic=True, ratings=5000).read_text().splitlines()
    return [r for r in map(parse_line, lines) if r is not None]


@pytest.mark.parametrize("name", ["sgd1", pytest.param("sgd2", marks=pytest.mark.mpi)])
def test_history_of_an_sgdmf_row(traces: dict[str, Path], name: str) -> None:
    rc, out, err = cli("history", str(traces[name]), "W[17]", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert set(doc) == {"element", "history"} and doc["element"] == "W[17]"
    hist = doc["history"]
    assert [(e["op"], e["invocation"]) for e in hist] == [("sgd", k) for k in range(5)]
    run = tracer.open(traces[name]).run()
    for cp in run.checkpoints():  # values agree with the checkpoints, bit for bit
        slots, vals = run.checkpoint_state("sgd", cp.invocation).rows["W"]
        assert hist[cp.invocation]["value"] == vals[list(slots).index(17)].tolist()
    ratings = _ratings()
    plan = run.plan("sgd", 0)
    for e in hist:
        w = e["writer"]
        assert set(e) == {"op", "invocation", "value", "writer"}
        assert set(w) == {"index", "node", "thread", "round"}
        assert ratings[w["index"]].user == 17  # the body that wrote it rated as user 17
        task = [t for t in plan.rounds[w["round"]][w["node"]] if w["index"] in t.indices]
        assert task and task[0].thread == w["thread"]
    assert len({tuple(e["value"]) for e in hist}) == 5


def test_history_between_and_mlr(traces: dict[str, Path]) -> None:
    rc, out, err = cli(
        "history", str(traces["mlr1"]), "W[3]", "--between", "mlr:3", "mlr:4", "--json"
    )
    assert rc == 0, err
    hist = json.loads(out)["history"]
    assert [(e["op"], e["invocation"]) for e in hist] == [("mlr", 3), ("mlr", 4)]
    assert all(len(e["value"]) == 65 and e["writer"] is None for e in hist)  # sync_for
    run = tracer.open(traces["mlr1"]).run()
    slots, vals = run.checkpoint_state("mlr", 4).rows["W"]
    assert hist[1]["value"] == vals[list(slots).index(3)].tolist()
    rc, out, err = cli("history", str(traces["sgd1"]), "H[3]")
    assert rc == 0 and "H[3] after each invocation:" in out and "sgd#4" in out, err


# ---------------------------------------------------------------- watch
def _max_abs(run, op: str, inv: int, dds: str) -> float:
    return float(np.abs(run.checkpoint_state(op, inv).rows[dds][1]).max())


@pytest.mark.mpi
def test_watch_finds_the_invocation_and_the_body(traces: dict[str, Path]) -> None:
    run = tracer.open(traces["sgd2"]).run()
    lo, hi = _max_abs(run, "sgd", 0, "H"), _max_abs(run, "sgd", 4, "H")
    assert hi > lo
    t = (lo + hi) / 2
    rc, out, err = cli("watch", str(traces["sgd2"]), f"abs(H).max() > {t!r}", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["found"] and doc["op"] == "sgd" and 1 <= doc["invocation"] <= 4, doc
    assert doc["index"] is not None and doc["node"] in (0, 1)
    assert any(max(abs(x) for x in v) > t for v in doc["values"].values()), doc
    # piped, with plain progress lines as often as they come: each phase is named
    every = {"STRADS_REPLAY_PROGRESS_EVERY": "1e-9"}
    proc = tcli.invoke(["watch", str(traces["sgd2"]), f"abs(H).max() > {t!r}"], env=every)
    err = proc.stderr
    assert proc.returncode == 0 and "\x1b" not in err, err
    start = f"{doc['from']['op']}#{doc['from']['invocation']}"  # checkpoints at 0, 2, 4
    assert f"replay: watch: fast-forward to the checkpoint after {start}" in err, err
    ratings = _ratings()
    r = ratings[doc["index"]]
    assert set(doc["values"]) <= {f"H[{r.item}]"}
    # the offered command stops in that body (a real process: pdb reads stdin)
    cmd = doc["break"].split()
    assert cmd[:3] == ["replay", "single", str(traces["sgd2"])]
    proc = run_cli(cmd[1:], timeout=TIMEOUT, input="c\n")
    assert proc.returncode == 0, proc.stderr
    assert f"stopped in sgd#{doc['invocation']} index {doc['index']}" in proc.stdout
    rc, out, err = cli("watch", str(traces["sgd1"]), "np.isnan(W).any()", "--json")
    assert rc == 0 and json.loads(out)["found"] is False, err


def test_watch_mlr(traces: dict[str, Path]) -> None:
    run = tracer.open(traces["mlr1"]).run()
    t = (_max_abs(run, "mlr", 0, "W") + _max_abs(run, "mlr", 4, "W")) / 2
    rc, out, err = cli("watch", str(traces["mlr1"]), f"np.abs(W).max() > {t!r}")
    assert rc == 0, err
    assert "first holds after mlr#" in out


# ---------------------------------------------------------------- bad input
@pytest.mark.filterwarnings("ignore::replay._environment.ReplayEnvironmentWarning")
@pytest.mark.parametrize(
    "args,message",
    [
        (["history", "{sgd1}", "Q[1]"], "no DDS named 'Q'"),
        (["history", "{sgd1}", "W[300]"], "index out of range"),
        (["history", "{sgd1}", "W17"], "expected an element as DDS[INDEX]"),
        (["history", "{sgd1}", "W[1]", "--between", "sgd:1", "sgd:9"], "sgd#9 does not exist"),
        (["history", "{sgd1}", "W[1]", "--between", "sgd:3", "sgd:1"], "give the earlier"),
        (["single", "{sgd1}", "--from", "sgd:5"], "sgd#5 does not exist"),
        pytest.param(
            ["cluster", "{sgd2}", "--from", "nope:1"], "no operator 'nope'", marks=pytest.mark.mpi
        ),
        (["single", "{sgd1}", "--from", "sgd"], "expects OP:INVOCATION"),
        (["watch", "{sgd1}", "np.isnan(W"], "does not parse"),
        (["watch", "{sgd1}", "W > 1"], "not one truth value"),
        (["watch", "{sgd1}", "A.max() > 1"], "neither np nor a DDS of the run"),
        (["watch", "{sgd1}", "__import__('os')"], "neither np nor a DDS of the run"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    traces: dict[str, Path], args: list[str], message: str
) -> None:
    from click.testing import CliRunner

    from replay._cli import cli as group

    argv = [a.format_map(traces) for a in args]  # records only the trace named
    # in-process (the same code path as the console script, which other tests run)
    res = CliRunner().invoke(group, argv)
    rc, out, err = res.exit_code, res.stdout, res.stderr
    assert rc == 2, (rc, out, err)
    lines = [ln for ln in err.splitlines() if ln.startswith("replay: error")]
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err
    if message not in ("index out of range", "not one truth value"):  # known only by replay
        assert "replaying run" not in out, out  # refused before it says it replays anything


def test_history_and_watch_need_checkpoints(tmp_path: Path) -> None:
    none = record(tmp_path / "n.sqlite", "sgdmf", *SGD, "--no-checkpoints")
    for args in (["history", str(none), "W[1]"], ["watch", str(none), "np.isnan(W).any()"]):
        rc, out, err = cli(*args)
        assert rc == 2 and "no checkpoints" in err and "Traceback" not in err


# ---------------------------------------------------------------- README
def test_readme_time_travel_commands_run_as_written(tmp_path: Path) -> None:
    import re
    import shlex

    from tests.conftest import ROOT

    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Time travel") : text.index("## Benchmarks")]
    lines = re.findall(r"```bash\n(.*?)\n```", section, re.S)[0].splitlines()
    outputs = []
    for line in lines:
        argv = shlex.split(line)
        assert argv[0] == "replay"
        if "--break" in argv or "--until" in argv:  # pdb reads stdin: a real process
            proc = run_cli(argv[1:], cwd=tmp_path, timeout=TIMEOUT, input="c\n")
        else:
            proc = tcli.invoke(argv[1:], cwd=tmp_path, input="c\n")
        assert proc.returncode == 0, (line, proc.stderr)
        outputs.append(proc.stdout)
    # the watch line finds the body the last line stops in, as the README says
    assert f"stop there with: {lines[-1]}" in outputs[-2]
    assert "stopped in sgd#4 index 6693 on node 0" in outputs[-1]
