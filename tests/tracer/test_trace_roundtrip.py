"""Every event type survives recorder -> store -> ``tracer.open`` unchanged."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import tracer
from engine._machines.planner import Plan, Task
from tracer import (
    DeltasAggregated,
    DigestRecorded,
    IndexOrderDeviated,
    InvocationCompleted,
    LockGranted,
    MessageReceived,
    MutexGranted,
    ObjectiveLogged,
    PlanMade,
    RunEnded,
    UpdatesApplied,
)
from tracer._invset import MAX_SECONDS

NODES = (0, 1, 2)
names = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=12)
i64 = st.integers(-(2**63), 2**63 - 1)
small = st.integers(0, 2**31)
floats = st.floats(allow_nan=False)
#: An invocation's time as a clock measures it (the store keeps 0..MAX_SECONDS, and a
#: reader refuses any other: a NaN stopped the export and the browser).
durations = st.floats(0, MAX_SECONDS)


@st.composite
def plans(draw: Any) -> Plan:
    n = draw(st.integers(0, 30))
    nodes, threads = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    perm = draw(st.permutations(range(n)))
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=5)))
    rounds: list[list[list[Task]]] = []
    for lo, hi in zip([0, *cuts], [*cuts, n], strict=True):
        per_node: list[list[Task]] = [[] for _ in range(nodes)]
        if hi > lo:
            p = draw(st.integers(0, nodes - 1))
            t = Task(draw(st.integers(0, threads - 1)), np.array(perm[lo:hi], dtype=np.int64))
            per_node[p].append(t)
        rounds.append(per_node)
    return Plan(draw(names), draw(st.integers(0, 99)), n, nodes, threads, rounds)


steps = st.one_of(
    st.tuples(
        st.just("msg"), st.sampled_from(NODES), names | st.just("routed"), small, small, small
    ),
    st.tuples(
        st.just("locks"),
        st.sampled_from(NODES),
        small,
        small,
        small,
        st.lists(st.tuples(i64, st.integers(0, 64)), max_size=20),
    ),
    st.tuples(st.just("order"), st.sampled_from(NODES), small, small, st.lists(i64, max_size=10)),
    st.tuples(
        st.just("done"),
        st.sampled_from(NODES),
        small,
        small,
        durations,
        st.lists(floats, max_size=4),
        st.lists(st.tuples(names, names), max_size=3),
    ),
    st.tuples(st.just("agg"), st.sampled_from(NODES), small, st.lists(small, max_size=4)),
    st.tuples(st.just("vis"), st.sampled_from(NODES), small, st.lists(i64, max_size=4)),
    st.tuples(
        st.just("mutex"),
        st.sampled_from(NODES),
        small,
        st.lists(st.tuples(st.integers(0, 64), small), max_size=12),
    ),
    st.tuples(st.just("obj"), names, i64, floats),
    st.tuples(st.just("plan"), names, plans()),
)


def replay_steps(rec: tracer.TraceRecorder, script: list[tuple], end: tuple) -> list[Any]:
    """Make the recorder calls of ``script`` and return the events they must produce."""
    seq = dict.fromkeys(NODES, 0)
    inv = dict.fromkeys(NODES, 0)
    plan_no: dict[str, int] = {}
    out: list[Any] = []

    def take(node: int, k: int = 1) -> int:
        s = seq[node]
        seq[node] += k
        return s

    for step in script:
        kind = step[0]
        if kind == "msg":
            _, node, chan, src, sseq, nb = step
            rec.message_received(node, chan, src, sseq, nb)
            if chan != "routed":  # schema 7 counts routed arrivals, they are no events
                out.append(MessageReceived(node, take(node), chan, src, sseq, nb))
        elif kind == "locks":
            _, node, rnd, bodies, grants, devs = step
            arr = np.array(devs, dtype=np.int64).reshape(-1, 2)
            names = [f"W[{p * 7 + t}]" for p, t in devs]  # one element per hand-over
            rec.lock_grants("op", inv[node], node, rnd, bodies, grants, arr[:, 0], arr[:, 1], names)
            flat = tuple(v for pair in devs for v in pair)
            ev = LockGranted(node, take(node), "op", inv[node], rnd, bodies, grants, flat)
            out.append(dataclasses.replace(ev, elements=tuple(names)))
        elif kind == "order":
            _, node, rnd, thread, idx = step
            rec.index_order("op", inv[node], node, rnd, thread, np.array(idx, dtype=np.int64))
            out.append(
                IndexOrderDeviated(node, take(node), "op", inv[node], rnd, thread, tuple(idx))
            )
        elif kind == "agg":
            _, node, clock, sources = step
            rec.aggregation_order("op", inv[node], node, clock, np.array(sources, dtype=np.int64))
            out.append(DeltasAggregated(node, take(node), "op", inv[node], clock, tuple(sources)))
        elif kind == "vis":
            _, node, clock, applied = step
            rec.ssp_visibility("op", inv[node], node, clock, np.array(applied, dtype=np.int64))
            out.append(UpdatesApplied(node, take(node), "op", inv[node], clock, tuple(applied)))
        elif kind == "mutex":
            _, node, clock, grants = step
            arr = np.array(grants, dtype=np.int64).reshape(-1, 2)
            rec.body_order("op", inv[node], node, clock, arr[:, 0], arr[:, 1])
            s = take(node, len(grants))
            for k, (thread, mb) in enumerate(grants):
                out.append(MutexGranted(node, s + k, "op", inv[node], clock, thread, mb))
        elif kind == "done":
            _, node, bodies, rounds, secs, rsecs, digs = step
            info = {"bodies": bodies, "rounds": rounds, "seconds": secs, "round_seconds": rsecs}
            info["digests"] = digs
            rec.invocation_done("op", inv[node], node, info)
            for dds, dig in digs:
                out.append(DigestRecorded(node, take(node), "op", inv[node], dds, dig))
            out.append(InvocationCompleted(node, take(node), "op", inv[node], bodies, rounds, secs))
            inv[node] += 1
        elif kind == "obj":
            _, name, it, value = step
            rec.objective(name, it, value)
            out.append(ObjectiveLogged(0, take(0), name, it, value))
        else:
            _, op, plan = step
            rec.plan_made(op, plan)
            no = plan_no[op] = plan_no.get(op, -1) + 1
            out.append(PlanMade(0, take(0), op, no, plan.strategy, len(plan.rounds), plan.n))
    rec.close(*end)
    out.append(RunEnded(0, take(0), end[0], end[1]))
    return sorted(out, key=lambda e: (e.node, e.seq))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(steps, max_size=25),
    st.sampled_from([("finished", None), ("failed", "Traceback (most recent call last): ...")]),
)
def test_every_event_round_trips_through_the_store(script: list[tuple], end: tuple) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.sqlite"
        rec = tracer.TraceRecorder(path, "r", NODES, True)
        expected = replay_steps(rec, script, end)
        with tracer.open(path) as trace:
            run = trace.run("r")
            got = list(run.events())
            assert got == expected
            for cls in tracer.EVENT_TYPES:  # the kind filter agrees with the full stream
                assert list(run.events(kinds=[cls])) == [e for e in expected if type(e) is cls]
            assert run.info.status == end[0] and run.info.error == end[1]


def test_a_script_with_every_event_type(tmp_path: Path) -> None:
    plan = Plan(
        "rotation", 0, 4, 2, 1, [[[Task(0, np.array([0, 2]))], [Task(0, np.array([3, 1]))]]]
    )
    script = [
        ("plan", "op", plan),
        ("locks", 1, 0, 2, 3, [(1, 2)]),
        ("msg", 1, "rows", 0, 0, 64),
        ("order", 1, 0, 2, [3, 1]),
        ("msg", 0, "rows", 1, 0, 64),
        ("agg", 0, 0, [1, 2]),
        ("done", 0, 2, 1, 0.5, [0.5], [("W", "ab" * 16)]),
        ("done", 1, 2, 1, 0.5, [0.5], []),
        ("vis", 2, 0, [0, -1, 0]),
        ("mutex", 2, 0, [(1, 4), (0, 5)]),
        ("done", 2, 9, 1, 0.25, [0.25], []),
        ("obj", "rmse", 0, 1.25),
    ]
    rec = tracer.TraceRecorder(tmp_path / "t.sqlite", "r", NODES, True)
    expected = replay_steps(rec, script, ("finished", None))
    with tracer.open(tmp_path / "t.sqlite") as trace:
        run = trace.run()
        got = list(run.events())
        assert got == expected
        assert {type(e) for e in got} == set(tracer.EVENT_TYPES)
        assert list(run.events(node=1, op="op", invocation=0)) == [
            e for e in expected if e.node == 1 and not isinstance(e, PlanMade | RunEnded)
        ]
        stored = run.plan("op")
        assert [[t.indices.tolist() for t in ts] for ts in stored.rounds[0]] == [[[0, 2]], [[3, 1]]]
        g = run.lock_grants("op", 0, 1)
        assert (g.seq.tolist(), g.bodies.tolist(), g.grants.tolist()) == ([0], [2], [3])
        assert [a.tolist() for a in g.deviations(0)] == [[1], [2]]
        assert g.element.tolist() == ["W[9]"]
        m = run.messages(1)
        assert (m.channel.tolist(), m.source.tolist(), m.seq.tolist()) == (["rows"], [0], [1])
        assert run.objectives() == {"rmse": [1.25]}
        assert run.digests() == [e for e in expected if isinstance(e, DigestRecorded)]
        ops = run.operators()["op"]
        assert (ops.invocations, ops.bodies, ops.lock_grants, ops.messages, ops.deviations) == (
            1,
            13,
            3,
            2,
            1,
        )
        assert (ops.aggregations, ops.visibility, ops.mutex_grants) == (1, 1, 2)
        mg = run.mutex_grants("op", 0, 2)
        assert (mg.thread.tolist(), mg.minibatch.tolist(), mg.clock.tolist()) == (
            [1, 0],
            [4, 5],
            [0, 0],
        )
        assert run.aggregations() == [e for e in expected if isinstance(e, DeltasAggregated)]
        assert run.visibility(node=2) == [e for e in expected if isinstance(e, UpdatesApplied)]
