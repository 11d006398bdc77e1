"""The repository and the pure views under the screens: tables, timeline, diff, targets."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest

import tracer
from tui._model import (
    first_difference,
    index_table,
    lock_table,
    message_table,
    routed_parts,
    timeline_layout,
)
from tui._repo import BrowseError, Repository, RunRef, expand_paths
from tui._verdict import divergence_target, explain, flatten, is_highlighted, trace_argument


def test_expand_paths_lists_trace_files_of_a_directory(synth_dir: Path) -> None:
    names = [p.name for p in expand_paths([synth_dir])]
    assert names == ["a.sqlite", "b.sqlite", "broken.sqlite"]
    assert expand_paths([synth_dir / "a.sqlite"]) == [synth_dir / "a.sqlite"]


def test_unreadable_trace_is_an_entry_with_an_error(synth_dir: Path) -> None:
    repo = Repository([synth_dir])
    entries = {Path(e.path).name: e for e in repo.entries()}
    assert entries["broken.sqlite"].error and not entries["broken.sqlite"].runs
    assert entries["a.sqlite"].error is None
    assert [r.ref.run_id for r in repo.rows()] == ["run-a", "run-b"]
    assert [Path(e.path).name for e in repo.errors()] == ["broken.sqlite"]
    missing = Repository([synth_dir / "nope.sqlite"]).entries()[0]
    assert missing.error is not None and "nope.sqlite" in missing.error


def test_run_rows_carry_verdicts(synth_dir: Path) -> None:
    rows = {r.ref.run_id: r for r in Repository([synth_dir]).rows()}
    assert [(v.kind, v.passed) for v in rows["run-a"].verdicts] == [
        ("cluster", True),
        ("dual-forward", False),
    ]
    assert rows["run-b"].verdicts == ()


def test_unknown_run_raises_browse_error(synth_dir: Path) -> None:
    repo = Repository([synth_dir])
    with pytest.raises(BrowseError, match="no-such-run"):
        repo.run(RunRef(str(synth_dir / "a.sqlite"), "no-such-run"))
    with pytest.raises(BrowseError, match="broken.sqlite"):
        repo.run(RunRef(str(synth_dir / "broken.sqlite"), "x"))


def test_run_view_caches_and_reports_missing_plans(synth_dir: Path) -> None:
    repo = Repository([synth_dir])
    view = repo.run(RunRef(str(synth_dir / "a.sqlite"), "run-a"))
    assert repo.run(view.ref) is view
    assert view.lock_table("sgd", 0) is view.lock_table("sgd", 0)
    assert view.invocation_numbers("sgd") == [0, 1]
    assert view.op_seconds("sgd") == pytest.approx(0.016)
    with pytest.raises(BrowseError, match="nope"):
        view.plan("nope", 0)


def test_lock_table_lists_hand_overs_per_round_in_order(synth_dir: Path) -> None:
    view = Repository([synth_dir]).run(RunRef(str(synth_dir / "a.sqlite"), "run-a"))
    table = view.lock_table("sgd", 0)
    assert len(table) == 20  # node 0's threads alternate: 10 hand-overs in each round
    rnd, k, where = table.column("round"), table.column("#"), table.column("position")
    assert list(rnd) == sorted(rnd)
    for r in set(rnd.tolist()):
        rows = np.flatnonzero(rnd == r)
        assert list(k[rows]) == list(range(len(rows)))
        assert list(where[rows]) == sorted(where[rows])
    # alternating one body each, a hand-over at position p runs thread t's (p // 2)-th body
    plan = view.plan("sgd", 0)
    thread, index = table.column("thread"), table.column("index")
    for r, p, t, j in zip(rnd, where, thread, index, strict=True):
        mine = [task.indices for task in plan.rounds[r][0] if task.thread == t][0]
        assert j == mine[p // 2]
    assert len(view.lock_table("sgd", 0, node=1)) == 0


def test_message_table_keeps_arrival_order_per_channel(synth_dir: Path) -> None:
    view = Repository([synth_dir]).run(RunRef(str(synth_dir / "b.sqlite"), "run-b"))
    table = view.message_table("sgd", 0, node=0)
    assert list(table.column("src seq")) == [1, 0]  # run B received them out of order
    assert list(table.column("channel")) == ["rows", "rows"]
    assert table.search == "seq"


def test_index_table_applies_recorded_deviations(synth_dir: Path) -> None:
    view = Repository([synth_dir]).run(RunRef(str(synth_dir / "a.sqlite"), "run-a"))
    plain, deviated = view.index_table("sgd", 0, node=1), view.index_table("sgd", 1, node=1)
    assert len(plain) == len(deviated) == 24
    assert plain.marked is not None and not plain.marked.any()
    assert deviated.marked is not None
    rows = np.flatnonzero(deviated.marked)
    assert list(deviated.column("index")[rows]) == [23, 22, 21, 20, 19, 18]
    assert set(deviated.column("thread")[rows]) == {1}
    assert deviated.cells(int(rows[0]))[4] == "-"  # a deviation belongs to no planned task
    assert list(deviated.find(40)) == list(plain.find(40))


def test_index_table_by_hand() -> None:
    from engine._machines.planner import Plan, Task

    def t(thread: int, idx: list[int], locked: bool = False) -> Task:
        return Task(thread, np.array(idx), locked)

    plan = Plan("components", 0, 6, 2, 2, [[[t(0, [0, 1]), t(1, [2])], [t(0, [3, 4, 5])]]])
    dev = tracer.IndexOrderDeviated(1, 0, "op", 0, 0, 0, (5, 3, 4))
    table = index_table(plan, [dev])
    assert [table.cells(i) for i in range(len(table))] == [
        ["0", "0", "0", "0", "0", "0", "plan"],
        ["0", "0", "1", "0", "0", "1", "plan"],
        ["0", "1", "0", "0", "1", "2", "plan"],
        ["1", "0", "0", "0", "-", "5", "deviated"],
        ["1", "0", "1", "0", "-", "3", "deviated"],
        ["1", "0", "2", "0", "-", "4", "deviated"],
    ]
    assert len(index_table(plan, [dev], node=0)) == 3


def test_routed_counts_are_a_row_per_exchange_without_source() -> None:
    """Schema 7 keeps routed write-backs as per-exchange counts: a row per node and
    exchange, its bytes, and ``-`` for the sequence number and source it has not."""
    counts = tracer.RoutedCounts(
        "sgd", 0, 1, np.array([7, 9]), np.array([2, 1]), np.array([512, 256])
    )
    logged = tracer.MessageArrays(
        np.array([3]), np.array(["sync_for.delta"]), np.array([0]), np.array([0]), np.array([8])
    )
    table = message_table([(1, logged), *routed_parts([counts])])
    rows = [table.cells(i) for i in range(len(table))]
    assert [r[1] for r in rows] == ["routed", "routed", "sync_for.delta"]
    assert [(r[3], r[4], r[5], r[6]) for r in rows[:2]] == [
        ("-", "-", "7", "512"),
        ("-", "-", "9", "256"),
    ]
    assert (rows[2][3], rows[2][4]) == ("3", "0")


def test_empty_tables() -> None:
    assert len(lock_table([])) == 0
    assert len(message_table([])) == 0


def test_timeline_uses_recorded_round_seconds(synth_dir: Path) -> None:
    view = Repository([synth_dir]).run(RunRef(str(synth_dir / "a.sqlite"), "run-a"))
    tl = view.timeline("sgd", 0)
    assert tl.unit == "s" and tl.total == pytest.approx(0.008)
    assert tl.round_starts == pytest.approx([0.0, 0.004])
    assert [(lane.node, lane.thread) for lane in tl.lanes] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    lane = tl.lanes[0]
    assert list(lane.round) == [0, 1] and lane.locked.all()
    assert lane.start == pytest.approx([0.0, 0.004]) and lane.end == pytest.approx([0.004, 0.008])


def test_timeline_falls_back_to_body_counts() -> None:
    from engine._machines.planner import Plan, Task

    plan = Plan("x", 0, 5, 1, 2, [[[Task(0, np.arange(3)), Task(1, np.arange(3, 5))]]])
    tl = timeline_layout("x", 0, plan, [])
    assert tl.unit == "bodies" and tl.total == 3
    assert tl.lanes[1].end == pytest.approx([2.0])


def test_first_difference_ignores_timings_and_reports_context() -> None:
    done = tracer.InvocationCompleted
    a = [done(0, k, "op", k, 4, 1, 0.1) for k in range(5)]
    b = [done(0, k, "op", k, 4, 1, 9.9) for k in range(5)]
    same = first_difference(0, a, b)
    assert same.first is None and same.compared == 5
    b[3] = done(0, 3, "op", 3, 5, 1, 0.1)
    diff = first_difference(0, a, b, context=2)
    assert (diff.first, diff.a, diff.b) == (3, a[3], b[3])
    assert diff.before == [(a[1], b[1]), (a[2], b[2])]
    short = first_difference(0, a, a[:2])
    assert short.first == 2 and short.b is None


def test_divergence_target_and_highlighting() -> None:
    detail = {"divergence": {"op": "sgd", "invocation": "3", "index": 17, "expected": 1.0}}
    assert divergence_target(detail) == divergence_target(detail | {"x": 1})
    target = divergence_target(detail)
    assert (target.op, target.invocation, target.node, target.index) == ("sgd", 3, None, 17)
    assert flatten(detail)[0] == ("divergence.op", "sgd")
    assert is_highlighted("divergence.expected") and is_highlighted("element")
    assert is_highlighted("serial_value") and not is_highlighted("note")
    assert divergence_target({}).op is None


#: The detail shapes the three verdict writers store (see tui/_verdict.py).
REPLAY_DIGEST = {
    "first_difference": {
        "node": 0,
        "op": "sgd",
        "invocation": 1,
        "event": "digest of W",
        "what": "outcome",
        "expected": "01" * 16,
        "actual": "ff" * 16,
    },
    "complete": True,
    "checked": {"digests": 3, "objectives": 1},
    "wall_s": 0.5,
}
REPLAY_LOCK = {
    "first_difference": {
        "node": 0,
        "op": "sgd",
        "invocation": 0,
        "event": "round 1",
        "what": "lock",
        "expected": "grant orders consistent with the plan",
        "actual": "a cycle",
    }
}
DUAL_DIGEST = {
    "passed": False,
    "divergence": {
        "op": "sgd",
        "invocation": 2,
        "dds": "W",
        "what": "digest",
        "serial": "aa",
        "parallel": "bb",
        "iteration": 2,
        "element": 943,
        "index": 17,
    },
}


def test_divergence_targets_of_each_writer() -> None:
    t = divergence_target(REPLAY_DIGEST)
    assert (t.op, t.invocation, t.node, t.index) == ("sgd", 1, 0, None)
    assert (t.tab, t.where) == ("outcome", (("dds", "W"),))
    t = divergence_target(REPLAY_LOCK)
    assert (t.tab, t.where, t.node) == ("locks", (("round", 1),), 0)
    msg = {"first_difference": REPLAY_LOCK["first_difference"] | {"what": "message"}}
    msg["first_difference"]["event"] = "message 2 on 'rows'"
    t = divergence_target(msg)
    assert (t.tab, t.where, t.last) == ("messages", (("channel", "rows"),), True)
    tasks = {"first_difference": REPLAY_LOCK["first_difference"] | {"what": "task set"}}
    assert divergence_target(tasks).tab == "index"
    assert divergence_target(tasks).where == (("round", 1),)
    t = divergence_target(DUAL_DIGEST)
    assert (t.tab, t.index, t.node) == ("index", 17, None)
    objective = {"divergence": {"what": "objective", "objective": "rmse", "iteration": 3}}
    assert divergence_target(objective).op is None
    no_node = {"first_difference": REPLAY_DIGEST["first_difference"] | {"node": -1}}
    assert divergence_target(no_node).node is None
    assert divergence_target({"first_difference": None, "complete": True}).op is None


def test_explain_says_what_where_both_values_and_the_command_that_stops_there() -> None:
    why = explain(REPLAY_DIGEST, "traces/a b.sqlite")
    assert why is not None
    assert why.what == "outcome: digest of W differs"
    assert why.where == "sgd invocation 1, node 0"
    assert (why.expected_label, why.expected) == ("the trace expected", "01" * 16)
    assert (why.got_label, why.got) == ("the program did", "ff" * 16)
    # a replay stops at the divergence itself, so the command stops after the one before
    assert why.command == "replay single 'traces/a b.sqlite' --until sgd:0"
    assert "complete" not in why.shown
    why = explain(DUAL_DIGEST, "t.sqlite", "run-7")
    assert why is not None
    assert why.where == "sgd invocation 2, loop index 17, element W[943]"
    assert (why.expected_label, why.got_label) == ("serial run gave", "parallel run gave")
    assert why.command == "replay single t.sqlite --run run-7 --break sgd:2:17"
    lock = explain(REPLAY_LOCK, "t.sqlite")
    assert lock is not None and lock.what == "lock: round 1" and lock.command is None
    with_node = {"divergence": DUAL_DIGEST["divergence"] | {"node": 1}}
    assert explain(with_node, "t.sqlite").command.endswith("--break sgd:2:17@1")  # type: ignore[union-attr]
    assert explain({"identical": True}, "t.sqlite") is None
    url = "postgresql+psycopg://me:secret@db.example/traces"
    assert trace_argument(url) == "postgresql+psycopg://me:***@db.example/traces"
    assert trace_argument(str(Path.cwd() / "traces" / "a.sqlite")) == "traces/a.sqlite"
    assert trace_argument("/elsewhere/a.sqlite") == "/elsewhere/a.sqlite"
    assert explain({"passed": True, "divergence": None}, "t.sqlite") is None


def test_a_bad_verdict_row_is_shown_as_such_not_the_whole_trace(
    synth_dir: Path, tmp_path: Path
) -> None:
    path = tmp_path / "a.sqlite"
    shutil.copyfile(synth_dir / "a.sqlite", path)
    with sqlite3.connect(path) as con:
        con.execute("UPDATE verdict SET detail = '[1, 2]' WHERE id = 1")
    con.close()
    repo = Repository([path])
    assert repo.errors() == []
    (row,) = repo.rows()
    bad, good = row.verdicts
    assert bad.error == (
        "table verdict row 1 column detail: not a JSON object; the trace is damaged"
    )
    assert (good.kind, good.passed, good.error) == ("dual-forward", False, None)
    with pytest.raises(tracer.TraceFormatError, match="row 1 column detail"):
        tracer.open(path).run("run-a").verdicts()
