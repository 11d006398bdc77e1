"""Every view driven by keyboard through Textual's pilot at 80×24, asserting on the screen."""

from __future__ import annotations

import asyncio
import re
import shutil
import sqlite3
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from textual.widgets import DataTable
from tui_helpers import (
    EPOCH,
    add_verdicts,
    record_sync,
    screen_text,
    wait_for,
    wait_text,
    write_synthetic,
)

import tracer
from tui import BrowserApp, _model
from tui._repo import RunView
from tui.screens import (
    DiffScreen,
    HelpScreen,
    OrdersScreen,
    OverviewScreen,
    RunsScreen,
    TimelineScreen,
    VerdictsScreen,
)
from tui.widgets import ArrayTable, ListTable, TimelineView

SIZE = (80, 24)


def drive(
    app: BrowserApp, script: Callable[[Any], Awaitable[None]], size: tuple[int, int] = SIZE
) -> None:
    """Run ``app`` headless (at 80×24 unless told) and hand its pilot to ``script``."""

    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await script(pilot)

    asyncio.run(main())


def test_runs_list_shows_runs_verdicts_and_unreadable_files(synth_dir: Path) -> None:
    async def script(pilot: Any) -> None:
        text = await wait_text(pilot, "3 trace file(s), 2 run(s), 1 unreadable")
        assert isinstance(pilot.app.screen, RunsScreen)
        assert "synth" in text and "2×2" in text and "finished" in text
        assert "clu✓ fwd✗" in text
        assert "unreadable" in text and "run run-a" in text
        await pilot.press("down", "down")
        text = await wait_text(pilot, "broken.sqlite", "unreadable:", "not a replay trace")
        await pilot.press("enter")  # an unreadable trace cannot be opened, and nothing crashes
        await pilot.pause()
        assert isinstance(pilot.app.screen, RunsScreen)
        await pilot.press("r")
        await wait_text(pilot, "2 run(s)")

    drive(BrowserApp([synth_dir]), script)


@pytest.mark.parametrize("width", [80, 140])
def test_runs_table_fits_the_width_shows_files_newest_first_and_honours_home_end(
    tmp_path: Path, width: int, in_utc: None
) -> None:
    for name, minutes in (("a", 0), ("zz-newest", 20), ("m", 10)):
        write_synthetic(tmp_path / f"{name}.sqlite", f"run-{name}", start=EPOCH + 60 * minutes)

    async def script(pilot: Any) -> None:
        text = await wait_text(pilot, "3 run(s)")
        table = pilot.app.screen.query_one("#runs", DataTable)
        rows = [line for line in text.splitlines() if "finished" in line]  # top to bottom
        assert len(rows) == 3
        assert any("verdicts" in line for line in text.splitlines() if " started " in line)
        assert "11-14 22:33:20" in rows[0] and "11-14 22:13:20" in rows[2]  # newest first
        files = [r.split()[0] for r in rows]
        # the other columns are as wide as their cells, which leaves room at 80 for
        # whole names (a long app name would leave less: see the 80-column test below)
        assert files == ["zz-newest.sqlite", "m.sqlite", "a.sqlite"]
        assert "run run-zz-newest" in text
        await pilot.press("end")
        assert table.cursor_row == 2
        await wait_text(pilot, "run run-a")
        await pilot.press("home")
        assert table.cursor_row == 0
        await wait_text(pilot, "run run-zz-newest")

    drive(BrowserApp([tmp_path]), script, size=(width, 24))


def test_enter_opens_the_run_overview(synth_dir: Path) -> None:
    async def script(pilot: Any) -> None:
        await pilot.press("enter")
        text = await wait_text(pilot, "operator", "rotation")
        assert isinstance(pilot.app.screen, OverviewScreen)
        assert "run run-a" in text and "2 ranks × 2 threads" in text and "seed 7" in text
        assert "params lr=0.5 n=48" in text
        for cell in ("sgd", "96", "16ms", "48"):
            assert cell in text
        assert "loss: 2 iteration(s), last 5" in text
        assert "⠉" in text or "⣀" in text  # the braille curve
        await pilot.press("escape")
        await wait_text(pilot, "Runs")
        assert isinstance(pilot.app.screen, RunsScreen)

    drive(BrowserApp([synth_dir]), script)


def test_timeline_zooms_scrolls_and_steps_invocations(synth_dir: Path) -> None:
    async def script(pilot: Any) -> None:
        await pilot.press("enter", "t")
        text = await wait_text(pilot, "n1 t1", "sgd invocation 0 of 2")
        assert isinstance(pilot.app.screen, TimelineScreen)
        assert "r0" in text and "r1" in text and "▓" in text and "█" in text
        view = pilot.app.screen.query_one(TimelineView)
        await pilot.press("plus")
        await wait_text(pilot, "zoom ×2")
        await pilot.press("plus", "right", "right")
        await wait_text(pilot, "zoom ×4")
        assert view.scroll_offset.x > 0
        await pilot.press("0")
        await wait_text(pilot, "zoom ×1")
        await pilot.press("right_square_bracket")
        await wait_text(pilot, "sgd invocation 1 of 2")
        await pilot.press("enter")  # the orders of this invocation
        text = await wait_text(pilot, "invocation 1 of 0..1", "20 row(s)")
        assert isinstance(pilot.app.screen, OrdersScreen)

    drive(BrowserApp([synth_dir]), script)


def test_lock_rows_name_the_element_and_fit_an_80_column_terminal(synth_dir: Path) -> None:
    """Each hand-over row names the element lock taken over (``X[index % 3]`` in the
    synthetic trace) and the loop index and thread it came from, worked out from the
    plan; the rows fit 80 columns and ``/`` finds a loop index among them."""

    async def script(pilot: Any) -> None:
        await pilot.press("enter", "o")
        text = await wait_text(pilot, "20 row(s)", "element")
        table = pilot.app.screen.query_one("#t-locks", ArrayTable)
        assert table.table is not None
        index = table.table.column("index")
        element = table.table.column("element")
        assert (index >= 0).all()
        assert element.tolist() == [f"X[{j % 3}]" for j in index.tolist()]
        before, thread = table.table.column("from"), table.table.column("thread")
        assert ((before != thread) & (before >= 0)).all()  # another thread handed over
        first = table.row_text(0).split()
        assert first[-2:] == [str(index[0]), f"X[{index[0] % 3}]"]
        assert f"X[{index[0] % 3}]" in text  # on screen, not cut
        head = next(line for line in text.splitlines() if "element" in line)
        assert head.split() == [c.name for c in table.table.columns]
        assert len(table.row_text(0)) + 2 <= 80
        await pilot.press("slash", *str(index[3]), "enter")
        await wait_text(pilot, f"loop index {index[3]}: 1 match(es)")
        assert table.row_text(table.cursor).split()[-1] == element[3]

    drive(BrowserApp([synth_dir]), script)


def test_long_element_names_are_cut_to_the_column() -> None:
    g = tracer.LockGrantArrays(
        *(np.array([v]) for v in (5, 0, 4, 4)),
        np.array([0, 2]),
        np.array([1, 2]),
        np.array([1, 0]),
        np.array(["W[943]", "embedding_table_of_words[1234567]"], dtype=object),
    )
    table = _model.lock_table([(0, g)])
    col = table.columns[-1]
    assert col.name == "element" and col.width == _model.MAX_ELEMENT_WIDTH
    assert table.cells(0)[-1] == "W[943]" and table.cells(1)[-2] == "-"  # no plan: no index
    widget = ArrayTable()
    widget.table = table
    assert widget.row_text(1).endswith("embedding_table_of_…")


def test_timeline_bars_come_from_each_threads_recorded_times(synth_dir: Path) -> None:
    """Thread t ran from 0.5 t ms to 4 - t ms of each 4 ms round (synthetic trace), so
    thread 1's bars start later and end sooner than thread 0's."""

    async def script(pilot: Any) -> None:
        await pilot.press("enter", "t")
        await wait_text(pilot, "from recorded per-thread times", "n1 t1")
        timeline = pilot.app.screen.query_one(TimelineView).timeline
        assert timeline is not None and timeline.thread_timed
        lanes = {(lane.node, lane.thread): lane for lane in timeline.lanes}
        t0, t1 = lanes[(0, 0)], lanes[(0, 1)]
        assert t0.start[0] == pytest.approx(0.0) and t0.end[0] == pytest.approx(0.004)
        assert t1.start[0] == pytest.approx(0.0005) and t1.end[0] == pytest.approx(0.003)
        assert t1.start[1] == pytest.approx(0.0045)  # round 1 starts at 4 ms
        text = screen_text(pilot.app)
        bars = {
            line.split("│")[0].strip(): line.split("│")[1]
            for line in text.splitlines()
            if line.startswith("n0 t")
        }
        assert bars["n0 t0"] != bars["n0 t1"]
        assert bars["n0 t1"].index("▌") > bars["n0 t0"].index("▌")  # starts later

    drive(BrowserApp([synth_dir]), script)


def test_orders_tabs_filters_and_search(synth_dir: Path) -> None:
    async def script(pilot: Any) -> None:
        await pilot.press("enter", "o")
        text = await wait_text(pilot, "20 row(s)")  # node 0's hand-overs: 10 per round
        assert isinstance(pilot.app.screen, OrdersScreen)
        assert "node all  op sgd  invocation 0" in text and "Lock grants" in text
        await pilot.press("greater_than_sign")  # node 0
        await wait_text(pilot, "node 0  op sgd")
        await pilot.press("2")
        text = await wait_text(pilot, "src seq", "2 row(s)")
        assert "rows" in text
        await pilot.press("3", "right_square_bracket", "greater_than_sign")  # inv 1, node 1
        text = await wait_text(pilot, "node 1  op sgd  invocation 1", "deviated")
        await pilot.press("slash")
        await pilot.press(*"20", "enter")
        text = await wait_text(pilot, "loop index 20: 1 match(es)")
        table = pilot.app.screen.query_one("#t-index", ArrayTable)
        assert table.row_text(table.cursor).split()[5:] == ["20", "deviated"]
        assert "▸" in text
        await pilot.press("home", "n")
        assert table.row_text(table.cursor).split()[5] == "20"
        await pilot.press("slash", *"999", "enter")
        await wait_text(pilot, "loop index 999: not found")
        await pilot.press("slash", "escape")  # escape closes the search box, not the view
        assert isinstance(pilot.app.screen, OrdersScreen)
        await pilot.press("less_than_sign", "less_than_sign")
        await wait_text(pilot, "node all")
        await pilot.press("escape")
        assert isinstance(pilot.app.screen, OverviewScreen)

    drive(BrowserApp([synth_dir]), script)


def test_verdicts_highlight_the_divergence_and_jump_to_it(synth_dir: Path) -> None:
    async def script(pilot: Any) -> None:
        await pilot.press("v")
        text = await wait_text(pilot, "2 verdict(s), 1 failed")
        assert isinstance(pilot.app.screen, VerdictsScreen)
        assert "pass" in text and "FAIL" in text and "sgd#1 n1 j=40" in text
        await pilot.press("down")
        text = await wait_text(pilot, "dual-forward verdict 2 of 2: FAILED")
        assert "where       sgd invocation 1, node 1, loop index 40, element W[3]" in text
        assert "expected    0.25" in text and "got         0.5" in text
        assert "replay single" in text and "--break sgd:1:40@1" in text.replace("\n", "")
        assert "note" in text and "first differing element" in text  # the rest, listed
        await pilot.press("g")
        text = await wait_text(pilot, "loop index 40: 1 match(es)")
        screen = pilot.app.screen
        assert isinstance(screen, OrdersScreen)
        assert (screen.tab, screen.op, screen.invocation, screen.node) == ("index", "sgd", 1, 1)
        table = screen.query_one("#t-index", ArrayTable)
        assert table.row_text(table.cursor).split()[5] == "40"
        assert "node 1  op sgd  invocation 1" in text

    drive(BrowserApp([synth_dir]), script)


def _replay_verdicts(path: Path) -> None:
    """A failed single-node replay whose digest of W differed after sgd#1 on node 0, and a
    failed cluster replay whose lock grants of sgd#0 round 1 on node 0 formed a cycle."""
    with tracer.open_writable(str(path)) as trace:
        first = {"node": 0, "op": "sgd", "invocation": 1, "event": "digest of W"}
        first |= {"what": "outcome", "expected": "01" * 16, "actual": "ff" * 16}
        trace.add_verdict("run-r", "single", False, {"first_difference": first, "wall_s": 1.5})
        lock = {"node": 0, "op": "sgd", "invocation": 0, "event": "round 1", "what": "lock"}
        lock |= {"expected": "grant orders consistent with the plan", "actual": "a cycle"}
        trace.add_verdict("run-r", "cluster", False, {"first_difference": lock})


def test_verdict_detail_is_explained_and_g_lands_on_the_diverging_event(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"
    write_synthetic(path, "run-r")
    _replay_verdicts(path)

    async def script(pilot: Any) -> None:
        await pilot.press("v")
        text = await wait_text(pilot, "single verdict 1 of 2: FAILED")
        for line in (
            "what        outcome: digest of W differs",
            "where       sgd invocation 1, node 0",
            f"expected    {'01' * 16}  (the trace expected)",
            f"got         {'ff' * 16}  (the program did)",
            f"stop there  replay single {path} --until sgd:0",
            "wall_s",
        ):
            assert line in text, line
        assert "first_difference.event" not in text  # said above, not dumped again
        await pilot.press("g")  # the digest of W that node 0 recorded after sgd#1
        text = await wait_text(pilot, "divergence: 1 row(s)")
        screen = pilot.app.screen
        assert isinstance(screen, OrdersScreen)
        assert (screen.tab, screen.op, screen.invocation, screen.node) == ("outcome", "sgd", 1, 0)
        table = screen.query_one("#t-outcome", ArrayTable)
        assert table.row_text(table.cursor).split()[2:] == ["W", "01" * 16]
        assert list(table.matches) == [table.cursor]  # highlighted
        assert "▸" in text and "5 Outcome" in text
        await pilot.press("escape", "down")
        text = await wait_text(pilot, "cluster verdict 2 of 2: FAILED", "lock: round 1")
        assert "stop there" not in text  # no loop index, no invocation before it
        await pilot.press("g")  # the first lock grant of round 1 on node 0
        await wait_text(pilot, "divergence: 10 row(s)")
        screen = pilot.app.screen
        assert (screen.tab, screen.invocation, screen.node) == ("locks", 0, 0)
        locks = screen.query_one("#t-locks", ArrayTable)
        assert locks.table is not None
        rounds = locks.table.column("round")
        assert rounds[locks.cursor] == 1 and (rounds[: locks.cursor] == 0).all()
        assert list(locks.matches) == list(np.flatnonzero(rounds == 1))

    drive(BrowserApp([path]), script, size=(140, 40))


def test_a_stop_the_replay_stored_is_shown_and_a_forged_one_is_not(tmp_path: Path) -> None:
    """At a run's first invocation the browser cannot work out a stop from the verdict
    alone; the CLI stores the one it printed (``stop``), and the browser shows it as the
    command.  The trace is data: a stored stop that is not one option and one word is
    not offered as a command."""
    path = tmp_path / "r.sqlite"
    write_synthetic(path, "run-r")
    first = {"node": 1, "op": "sgd", "invocation": 0, "event": "digest of W"}
    first |= {"what": "outcome", "expected": "01" * 16, "actual": "ff" * 16}
    with tracer.open_writable(str(path)) as trace:
        for stop in ("--break sgd:0:3@1", "--until sgd:0; rm -rf ~"):
            trace.add_verdict("run-r", "single", False, {"first_difference": first, "stop": stop})

    async def script(pilot: Any) -> None:
        await pilot.press("v")
        text = await wait_text(pilot, "single verdict 1 of 2: FAILED")
        assert f"stop there  replay single {path} --break sgd:0:3@1" in text, text
        assert text.count("--break sgd:0:3@1") == 1, text  # not again among the details
        await pilot.press("down")
        text = await wait_text(pilot, "single verdict 2 of 2: FAILED")
        assert "stop there" not in text and "rm -rf" in text  # shown as data, not advice

    drive(BrowserApp([path]), script, size=(140, 40))


def test_cursor_keys_typed_while_the_orders_reload_are_kept(
    synth_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    real = RunView.lock_table

    def slow(self: RunView, op: str, invocation: int, node: int | None = None) -> Any:
        if invocation == 1:
            assert gate.wait(20), "the test never let the load finish"
        return real(self, op, invocation, node)

    monkeypatch.setattr(RunView, "lock_table", slow)

    async def script(pilot: Any) -> None:
        await pilot.press("enter", "o")
        await wait_text(pilot, "20 row(s)")
        await pilot.press("right_square_bracket")  # invocation 1: reloads, held at the gate
        await wait_text(pilot, "invocation 1", "loading…")
        await pilot.press("end", "up", "up")  # typed while it loads
        gate.set()
        await wait_text(pilot, "20 row(s), row 18")
        table = pilot.app.screen.query_one("#t-locks", ArrayTable)
        assert table.cursor == 17

    drive(BrowserApp([synth_dir]), script)


def test_diff_of_two_marked_runs_names_the_first_difference(synth_dir: Path) -> None:
    async def script(pilot: Any) -> None:
        await pilot.press("d")  # nothing marked yet: a warning, no diff
        await pilot.pause()
        assert isinstance(pilot.app.screen, RunsScreen)
        await pilot.press("space", "down", "space")
        await wait_text(pilot, "marked for diff: 2")
        await pilot.press("d")
        text = await wait_text(pilot, "first difference:")
        assert isinstance(pilot.app.screen, DiffScreen)
        assert "A synth  run-a" in text and "B synth  run-b" in text
        # node 0's events: its plan, one lock-grant event per locked round, then messages
        assert "node 0: differs at event 3" in text
        # the status line says what differs, in words, not only where
        assert "first difference: node 1, event 0: A message 0 of node 0 on rows" in text
        assert "A event 3: message 0 of node 1 on rows" in text
        assert "B event 3: message 1 of node 1 on rows" in text
        # the context before it, in words: node 0's locked rounds
        assert "event 2: sgd invocation 0 round 1: 12" in text  # (the row wraps at 80)
        assert "locked bodies, 24 lock grants, 10" in text and "hand-over(s)" in text
        assert "node 1: differs at event 0" in text

    drive(BrowserApp([synth_dir]), script)


def test_two_trace_paths_open_on_the_diff(synth_dir: Path) -> None:
    async def script(pilot: Any) -> None:
        await wait_text(pilot, "first difference:")
        assert isinstance(pilot.app.screen, DiffScreen)
        await pilot.press("escape")
        assert isinstance(pilot.app.screen, RunsScreen)

    drive(BrowserApp([synth_dir / "a.sqlite", synth_dir / "b.sqlite"], diff=True), script)


def test_identical_runs_diff_as_identical(engine_trace: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy.sqlite"
    shutil.copyfile(engine_trace, copy)

    async def script(pilot: Any) -> None:
        await wait_text(pilot, "identical:", "events on every node")

    drive(BrowserApp([engine_trace, copy], diff=True), script)


def test_help_lists_the_keys_of_the_current_view(synth_dir: Path) -> None:
    async def script(pilot: Any) -> None:
        await pilot.press("question_mark")
        text = await wait_text(pilot, "Keys: runs")
        assert isinstance(pilot.app.screen, HelpScreen)
        for line in ("Open", "Mark", "Diff", "Quit", "Help"):
            assert line in text
        assert "Back" not in text  # the runs list has nothing to go back to
        await pilot.press("escape", "enter", "o")
        await wait_text(pilot, "row(s)")
        await pilot.press("question_mark")
        text = await wait_text(pilot, "Keys: orders")
        for line in ("Find index", "Next match", "Next invocation", "Next node", "Back"):
            assert line in text
        await pilot.press("question_mark")
        assert isinstance(pilot.app.screen, OrdersScreen)
        await pilot.press("q")
        await pilot.pause()
        assert not pilot.app.is_running

    drive(BrowserApp([synth_dir]), script)


def test_real_engine_trace_in_every_view(engine_trace: Path) -> None:
    async def script(pilot: Any) -> None:
        text = await wait_text(pilot, "hot", "2×3")
        await pilot.press("enter")
        text = await wait_text(pilot, "operator", "norm: 3 iteration(s)")
        assert "hot" in text and "90" in text
        await pilot.press("t")
        await wait_text(pilot, "n1 t2", "from recorded per-thread times")
        await pilot.press("escape", "o")
        text = await wait_text(pilot, "Lock grants")  # hand-overs, if any, one per row
        locks = pilot.app.screen.query_one("#t-locks", ArrayTable)
        await wait_for(pilot, lambda _text: locks.table is not None)
        assert locks.table is not None
        index, element = locks.table.column("index"), locks.table.column("element")
        assert element.tolist() == [f"X[{j % 3}]" for j in index.tolist()]  # its one lock
        await pilot.press("3")
        await wait_text(pilot, "plan")
        await pilot.press("2")
        await wait_text(pilot, "src seq")
        await pilot.press("escape", "v")
        await wait_text(pilot, "no verdicts yet")

    drive(BrowserApp([engine_trace]), script)


def test_sync_for_run_has_a_rounds_timeline_and_sync_orders(sync_trace: Path) -> None:
    async def script(pilot: Any) -> None:
        await wait_text(pilot, "mean")
        await pilot.press("enter", "t", "]")
        # invocation 1: the first one also pays for reconnaissance.  Labels of rounds
        # that recorded wall times make narrow are left out at the fitted zoom, so the
        # rounds are counted on the widget, not read off the screen
        text = await wait_text(pilot, "invocation 1 of", "no plan: rounds only", "r0")
        assert "n0     │" in text and "n1     │" in text
        timeline = pilot.app.screen.query_one(TimelineView).timeline
        assert timeline is not None and len(timeline.round_starts) >= 3
        await pilot.press("escape", "o", "4")
        text = await wait_text(pilot, "deltas aggregated", "updates applied")
        assert "clock" in text
        await pilot.press("slash", "2", "enter")
        await wait_text(pilot, "clock 2:", "match(es)")
        await pilot.press("3")
        await wait_text(pilot, "no loop-index order")
        await pilot.press("2")
        await wait_text(pilot, "sync_for")

    drive(BrowserApp([sync_trace]), script)


def test_damaged_trace_is_refused_on_open_and_listed_as_unreadable(
    synth_dir: Path, tmp_path: Path
) -> None:
    """Damage is found when the trace is opened (its hash chain), not later in a view:
    the trace is listed as unreadable, with the first bad block, and nothing crashes."""
    import shutil
    import sqlite3

    gone = tmp_path / "gone.sqlite"  # tables dropped
    shutil.copyfile(synth_dir / "a.sqlite", gone)
    with sqlite3.connect(gone) as conn:
        tables = [r[0] for r in conn.execute("select name from sqlite_master where type='table'")]
        for name in tables:
            if name not in ("run", "schema_info", "verdict", "invocation"):
                conn.execute(f"drop table {name}")
    edited = tmp_path / "edited.sqlite"  # one row altered
    shutil.copyfile(synth_dir / "a.sqlite", edited)
    with sqlite3.connect(edited) as conn:
        conn.execute("update invocation_set set strategy = 'x' where id = 1")

    async def script(pilot: Any) -> None:
        await wait_text(pilot, "2 trace file(s), 0 run(s), 2 unreadable")
        text = await wait_text(pilot, "edited.sqlite", "unreadable:")
        await pilot.press("down")
        text = await wait_text(pilot, "is damaged")
        assert "table invocation_set node" in text or "gone.sqlite" in text
        await pilot.press("enter")  # cannot be opened, and nothing crashes
        await pilot.pause()
        assert pilot.app.is_running and screen_text(pilot.app)

    drive(BrowserApp([tmp_path]), script)


def test_empty_directory_explains_what_to_do(tmp_path: Path) -> None:
    async def script(pilot: Any) -> None:
        await wait_for(pilot, lambda t: "no trace files in" in t and "replay run" in t)

    drive(BrowserApp([tmp_path]), script)


@pytest.mark.parametrize("keys", [("enter", "c"), ("enter", "t", "minus", "left")])
def test_keys_that_do_nothing_here_do_not_crash(synth_dir: Path, keys: tuple[str, ...]) -> None:
    async def script(pilot: Any) -> None:
        await pilot.press(*keys)
        await pilot.pause()
        assert pilot.app.is_running

    drive(BrowserApp([synth_dir]), script)


def test_a_bad_verdict_row_shows_as_unreadable_in_its_row(synth_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "a.sqlite"
    shutil.copyfile(synth_dir / "a.sqlite", path)
    with sqlite3.connect(path) as con:
        con.execute("UPDATE verdict SET created_at = 'never' WHERE id = 1")
    con.close()

    async def script(pilot: Any) -> None:
        text = await wait_text(pilot, "1 trace file(s), 1 run(s)")
        assert "fwd✗ ?1" in text
        await pilot.press("v")
        text = await wait_text(pilot, "2 verdict(s), 1 failed, 1 unreadable")
        assert "unreadable verdict" in text and "FAIL" in text

    drive(BrowserApp([path]), script)


def test_params_stored_as_a_list_make_the_trace_unreadable_not_a_crash(
    synth_dir: Path, tmp_path: Path
) -> None:
    path = tmp_path / "a.sqlite"
    shutil.copyfile(synth_dir / "a.sqlite", path)
    with sqlite3.connect(path) as con:
        con.execute("UPDATE run SET params = '[1, 2]'")
    con.close()

    async def script(pilot: Any) -> None:
        await wait_text(pilot, "1 unreadable")
        text = await wait_text(pilot, "column params is not a JSON object")
        assert "Traceback" not in text
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(pilot.app.screen, RunsScreen)

    drive(BrowserApp([path]), script)


def test_a_dual_verdict_shows_what_it_did_not_test(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from replay._cli import cli

    app = f"{Path(__file__).parents[1] / 'replay' / 'verdict_apps.py'}:capacity"
    trace = tmp_path / "c.sqlite"
    res = CliRunner().invoke(cli, ["dual", app, "--in-process", "--trace", str(trace)])
    assert res.exit_code == 0, res.output

    async def script(pilot: Any) -> None:
        await pilot.press("v")
        await wait_text(pilot, "2 verdict(s), 0 failed")
        text = await wait_text(pilot, "not tested:")
        assert "relaxed DDS 'claims' tested exact" in text.replace("\n", " ")

    drive(BrowserApp([tmp_path]), script, size=(140, 40))


def test_a_replay_verdict_from_a_checkpoint_shows_what_it_skipped(tmp_path: Path) -> None:
    """A replay from a checkpoint passes without running the invocations up to it: its
    stored verdict must not read as a whole replay's."""
    from click.testing import CliRunner

    from replay._cli import cli

    app = f"{Path(__file__).parents[1] / 'replay' / 'tt_apps.py'}:objects"
    trace = tmp_path / "o.sqlite"
    runner = CliRunner()
    res = runner.invoke(cli, ["run", app, "--checkpoint-every", "1", "--trace", str(trace)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(cli, ["single", str(trace), "--from", "obj:2"])
    assert res.exit_code == 0, res.output

    async def script(pilot: Any) -> None:
        await pilot.press("v")
        await wait_text(pilot, "1 verdict(s), 0 failed")
        text = await wait_text(pilot, "not tested:")
        flat = " ".join(text.split())
        assert "the 2 loop invocation(s) up to the checkpoint at obj#1 were skipped" in flat

    drive(BrowserApp([tmp_path]), script, size=(140, 40))


def test_reload_finds_trace_files_created_after_start_up(tmp_path: Path) -> None:
    write_synthetic(tmp_path / "a.sqlite", "run-a")

    async def script(pilot: Any) -> None:
        text = await wait_text(pilot, "1 trace file(s), 1 run(s)")
        assert "late" not in text
        write_synthetic(tmp_path / "late.sqlite", "run-late", start=EPOCH + 600)
        await pilot.press("r")
        text = await wait_text(pilot, "2 trace file(s), 2 run(s)")
        rows = [line for line in text.splitlines() if "finished" in line]
        assert rows[0].split()[0] == "late.sqlite"  # the newest run, on top
        assert "run run-late" in text  # the cursor is on it: its detail line shows

    drive(BrowserApp([tmp_path]), script)


def test_j_and_k_move_the_cursor_in_every_list_and_the_help_says_so(synth_dir: Path) -> None:
    async def script(pilot: Any) -> None:
        await wait_text(pilot, "run run-a")  # the runs list
        await pilot.press("j")
        await wait_text(pilot, "run run-b")
        await pilot.press("k")
        await wait_text(pilot, "run run-a")
        await pilot.press("question_mark")
        text = await wait_text(pilot, "Keys: runs")
        assert "↑ ↓ j k" in text
        await pilot.press("escape", "v")  # the verdicts list
        await wait_text(pilot, "cluster verdict")
        await pilot.press("j")
        await wait_text(pilot, "dual-forward verdict")
        await pilot.press("k")
        await wait_text(pilot, "cluster verdict")
        await pilot.press("escape", "enter")  # the operators of the overview
        await wait_text(pilot, "operator")
        assert isinstance(pilot.app.screen.query_one("#ops"), ListTable)
        await pilot.press("o")  # an order table
        await wait_text(pilot, "20 row(s), row 1")
        await pilot.press("j", "j")
        await wait_text(pilot, "20 row(s), row 3")
        await pilot.press("k")
        await wait_text(pilot, "20 row(s), row 2")

    drive(BrowserApp([synth_dir]), script)


def test_sync_orders_are_said_in_words_not_class_names(sync_trace: Path) -> None:
    """Each ``sync_for`` order row says what happened and the order it recorded in words:
    no event class name (``DeltasAggregated``) and no ``field=(0 1)`` dump."""

    async def script(pilot: Any) -> None:
        await wait_text(pilot, "mean")
        await pilot.press("enter", "o", "4")
        text = await wait_text(pilot, "deltas aggregated", "updates applied")
        table = pilot.app.screen.query_one("#t-sync", ArrayTable)
        assert table.table is not None
        rows = [table.row_text(k).rstrip() for k in range(table.row_count)]
        aggregated = [r for r in rows if "deltas aggregated" in r]
        assert aggregated and all(
            r.endswith(("from nodes 0, 1 (in this order)", "from nodes 1, 0 (in this order)"))
            for r in aggregated
        )
        applied = [r.split("updates applied", 1)[1].strip() for r in rows if "applied" in r]
        assert "none yet" in applied
        assert any(a.startswith("node 0: ") and ", node 1: " in a for a in applied), applied
        for line in text.splitlines() + rows:
            assert not re.search(r"[a-z][A-Z]", line), line  # no CamelCase class name
            assert "=" not in line and "sources" not in line, line

    drive(BrowserApp([sync_trace]), script)


def test_verdicts_are_numbered_from_one_within_the_run(tmp_path: Path, in_utc: None) -> None:
    """Two runs in one file, two verdicts each: the second run's verdicts are stored as
    rows 3 and 4, yet its view numbers them 1 and 2 of 2."""
    path = tmp_path / "two.sqlite"
    write_synthetic(path, "run-old")
    add_verdicts(path, "run-old")
    write_synthetic(path, "run-new", start=EPOCH + 600)
    add_verdicts(path, "run-new")

    async def script(pilot: Any) -> None:
        await wait_text(pilot, "1 trace file(s), 2 run(s)", "run run-new")  # newest first
        await pilot.press("v")
        text = await wait_text(pilot, "2 verdict(s), 1 failed", "cluster verdict 1 of 2: passed")
        lines = text.splitlines()
        head = next(k for k, line in enumerate(lines) if line.split()[:2] == ["#", "kind"])
        assert [line.split()[:2] for line in lines[head + 1 : head + 3]] == [
            ["1", "cluster"],
            ["2", "dual-forward"],
        ]
        assert "#3" not in text and "#4" not in text
        await pilot.press("j")
        await wait_text(pilot, "dual-forward verdict 2 of 2: FAILED")

    drive(BrowserApp([path]), script)


def test_diff_says_how_the_runs_were_set_up_differently_first_in_words(
    tmp_path: Path,
) -> None:
    """Run B had n=24 where A had n=48: the diff says so (and that the plan covers fewer
    bodies) before the per-node rows, and the rows are sentences, not ``12b 24g``."""
    write_synthetic(tmp_path / "a.sqlite", "run-a", n=48)
    write_synthetic(tmp_path / "b.sqlite", "run-b", n=24)

    async def script(pilot: Any) -> None:
        text = await wait_text(pilot, "first difference:", "node 1: differs")
        assert isinstance(pilot.app.screen, DiffScreen)
        lines = text.splitlines()
        at = {
            key: next(k for k, line in enumerate(lines) if key in line)
            for key in (
                "set up differently (A vs B):",
                "parameters differ: n 48 vs 24",
                "plan of sgd differs:",
                "node 0: differs at event",
            )
        }
        assert list(at.values()) == sorted(at.values()), at  # set-up first, then the logs
        assert "plan of sgd differs: 96 vs 48 bodies" in text  # over both invocations
        assert "lr" not in lines[at["parameters differ: n 48 vs 24"]]  # the same in both
        assert not re.search(r"\b\d+[bgr]\b|switch|\bmsg\b|#\d", text), text

    drive(
        BrowserApp([tmp_path / "a.sqlite", tmp_path / "b.sqlite"], diff=True), script, size=(80, 40)
    )


def _wide_runs(root: Path) -> str:
    """A run with a long app name and verdicts of all four kinds, next to a plain one;
    the verdicts cell it gets."""
    write_synthetic(root / "a.sqlite", "run-a", app="workloads/matrix_factorisation.py:train")
    with tracer.open_writable(str(root / "a.sqlite")) as trace:
        for kind, passed in (("cluster", True), ("single", True), ("dual-forward", False)):
            trace.add_verdict("run-a", kind, passed, {})
        trace.add_verdict("run-a", "dual-backward", True, {})
    write_synthetic(root / "plain.sqlite", "run-plain", start=EPOCH - 60)
    return "clu✓ one✓ fwd✗ bwd✓"


def test_at_80_columns_every_runs_column_is_whole_and_arrows_scroll_to_it(
    tmp_path: Path,
) -> None:
    verdicts = _wide_runs(tmp_path)

    async def script(pilot: Any) -> None:
        text = await wait_text(pilot, "2 run(s)")
        table = pilot.app.screen.query_one("#runs", DataTable)
        assert verdicts not in text  # more than 80 columns' worth: the rest is to the right
        row = next(line for line in text.splitlines() if "a.sqlite" in line)
        assert "matrix_factorisation.py:train" in row  # the app whole, not "workloa…"
        seen = [text]
        for _ in range(len(table.columns)):
            await pilot.press("right")
            seen.append(await wait_for(pilot, lambda t: True))
        assert table.scroll_x == table.max_scroll_x > 0
        assert verdicts in seen[-1]  # the verdicts column whole, scrolled into view
        header = "started r×t status time verdicts".split()
        assert all(any(label in s.split() for s in seen) for label in header)
        for _ in range(len(table.columns)):
            await pilot.press("left")
        text = await wait_for(pilot, lambda t: True)
        assert table.scroll_x == 0 and "file" in text.split()

    drive(BrowserApp([tmp_path]), script, size=(80, 24))


def test_at_160_columns_the_file_column_is_as_wide_as_its_names(tmp_path: Path) -> None:
    verdicts = _wide_runs(tmp_path)

    async def script(pilot: Any) -> None:
        text = await wait_text(pilot, "2 run(s)")
        table = pilot.app.screen.query_one("#runs", DataTable)
        assert table.max_scroll_x == 0  # everything fits: nothing to scroll to
        head = next(line for line in text.splitlines() if " started " in line)
        assert head.index("app") - head.index("file") == len("plain.sqlite") + 2
        row = next(line for line in text.splitlines() if "a.sqlite" in line)
        assert "matrix_factorisation.py:train" in row and verdicts in row
        assert row.index("matrix_factorisation") - row.index("a.sqlite") == len("plain.sqlite") + 2

    drive(BrowserApp([tmp_path]), script, size=(160, 48))


def test_arrows_scroll_an_order_table_wider_than_80_columns(tmp_path: Path) -> None:
    """Three nodes' SSP visibility makes the sync order rows wider than 80 columns: → shows
    their ends, which were cut, and ← brings back the node column."""
    path = tmp_path / "mean3.sqlite"
    record_sync(path, nodes=3, threads=1)

    async def script(pilot: Any) -> None:
        await wait_text(pilot, "mean")
        await pilot.press("enter", "o", "4")
        text = await wait_text(pilot, "updates applied")
        table = pilot.app.screen.query_one("#t-sync", ArrayTable)
        assert table.table is not None
        rows = [table.row_text(k).rstrip() for k in range(table.row_count)]
        widest = max(rows, key=len)
        assert len(widest) + 2 > 80 and widest not in text
        for _ in range(len(table.table.columns)):
            await pilot.press("right")
        text = await wait_for(pilot, lambda t: True)
        assert table.scroll_offset.x > 0
        tail = widest[-30:]
        assert tail in text
        for _ in range(len(table.table.columns)):
            await pilot.press("left")
        text = await wait_for(pilot, lambda t: True)
        assert table.scroll_offset.x == 0 and "node" in text.split()

    drive(BrowserApp([path]), script, size=(80, 24))


def test_verdict_details_say_yes_and_no_not_python_booleans(synth_dir: Path) -> None:
    async def script(pilot: Any) -> None:
        await pilot.press("v")
        text = await wait_text(pilot, "cluster verdict 1 of 2: passed", "identical")
        line = next(line for line in text.splitlines() if "identical" in line)
        assert line.split() == ["identical", "yes"]
        assert "True" not in text and "None" not in text

    drive(BrowserApp([synth_dir]), script)


HOSTILE = """\
import numpy as np
import engine as ap


def train() -> None:
    X = ap.dvector(4, shape=(), data=np.ones(4), name={dds!r})
    for _ in range(2):
        ap.async_for(0, 4, lambda j: X.__setitem__(j, X[j] + 1.0), name={op!r})
    ap.log_objective({obj!r}, 1.0)
"""


@pytest.mark.parametrize(
    "op, dds, obj",
    [
        ("op[/bold]", "X[/]", "loss[/]"),  # markup that does not parse: the browser stopped
        ("[on red]op", "[link=file:///etc]X", "[b]loss"),  # markup that restyles
        ("op\x1b]0;owned\x07", "X\x1b[2J", "loss\u202e"),  # a terminal's control sequences
    ],
)
def test_names_read_from_a_trace_are_shown_as_text(
    tmp_path: Path, cli: Any, op: str, dds: str, obj: str
) -> None:
    """An operator, DDS or objective name is the trace's text: the browser shows it as
    written (control characters escaped), never as Rich markup, in every view."""
    prog = tmp_path / "hostile.py"
    prog.write_text(HOSTILE.format(op=op, dds=dds, obj=obj))
    trace = tmp_path / "t.sqlite"
    proc = cli("run", f"{prog}:train", "--trace", trace)
    assert proc.returncode == 0, proc.stderr
    shown = tracer.printable(op)

    async def script(pilot: Any) -> None:
        await wait_text(pilot, "1 run(s)")
        await pilot.press("enter")
        text = await wait_text(pilot, shown[:8])
        assert isinstance(pilot.app.screen, OverviewScreen), text
        for key in ("o", "escape", "t", "escape", "v", "escape"):
            await pilot.press(key)
            await pilot.pause()
        for view in ("o", "escape", "t", "escape", "escape"):
            await pilot.press(view)
            await pilot.pause()
            text = screen_text(pilot.app)
            assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text, text

    drive(BrowserApp([tmp_path]), script, size=(120, 30))


@pytest.mark.parametrize(
    "detail",
    [
        {"divergence": {"op": "sgd", "invocation": 0, "node": 0, "index": float("inf")}},
        {
            "divergence": {
                "op": "sgd",
                "invocation": 1,
                "what": "lock",
                "event": "round " + "9" * 5000,
            }
        },
        {
            "divergence": {
                "op": "[bold]sgd\x1b[2J",
                "invocation": 0,
                "what": "[red]x\x1b]0;t\x07",
                "expected": "[/]",
                "actual": "\x1b[31m" + "A" * 100_000,
            },
            "[b]k\x1b": "[/]\x1b[2J",
        },
    ],
    ids=["infinite-index", "5000-digit-round", "markup-escapes-100k"],
)
def test_a_hostile_verdict_detail_is_shown_as_bounded_text(
    tmp_path: Path, detail: dict[str, Any]
) -> None:
    """A stored verdict's detail is the trace's JSON: an Infinity index (OverflowError)
    or a 5,000-digit round (int() refuses it) stopped the browser on the verdicts view,
    and its texts reached the terminal with their escape sequences, whole."""
    write_synthetic(tmp_path / "a.sqlite", "run-a")
    with tracer.open_writable(str(tmp_path / "a.sqlite")) as trace:
        trace.add_verdict("run-a", "cluster", False, detail)

    async def script(pilot: Any) -> None:
        await wait_text(pilot, "1 run(s)")
        await pilot.press("v")
        text = await wait_text(pilot, "1 verdict(s), 1 failed", "FAILED")
        assert "\x1b" not in text and "A" * 200 not in text, text
        await pilot.press("g")  # to the orders view, or a note that there is no place
        await pilot.pause()
        text = screen_text(pilot.app)
        assert "\x1b" not in text, text

    drive(BrowserApp([tmp_path]), script)


LONG_NAMES = """\
import numpy as np
import engine as ap


def train() -> None:
    X = ap.dvector(4, shape=(), data=np.ones(4), name="X" * 5000)
    for _ in range(2):
        ap.async_for(0, 4, lambda j: X.__setitem__(j, X[j] + 1.0), name="op" + "Z" * 100_000)
    ap.log_objective("loss" + "L" * 50_000, 1.0)
"""


def test_a_100k_character_name_leaves_each_view_its_table(tmp_path: Path, cli: Any) -> None:
    """An operator name of 100,000 characters filled the timeline's and the orders'
    screens with their one-line header (no lane, no table left), and a recorded error of
    blank lines stopped the runs list and the overview with an IndexError."""
    prog = tmp_path / "long.py"
    prog.write_text(LONG_NAMES)
    trace = tmp_path / "t.sqlite"
    assert cli("run", f"{prog}:train", "--trace", trace).returncode == 0
    with sqlite3.connect(trace) as con:  # the error is not under the hash chain
        con.execute("UPDATE run SET status = 'failed', error = ' \n \n'")
    con.close()

    async def script(pilot: Any) -> None:
        await wait_text(pilot, "1 run(s)", "failed")
        await pilot.press("enter")
        await wait_text(pilot, "params", "loss")
        await pilot.press("t")
        text = await wait_text(pilot, "n0 t0", "invocation 0 of 2")
        assert text.count("Z" * 40) == 1, text
        await pilot.press("escape", "o")
        text = await wait_text(pilot, "1 Lock grants", "row(s)")
        assert text.count("Z" * 40) == 1, text

    drive(BrowserApp([tmp_path]), script)


NAN_OBJECTIVE = """\
import numpy as np
import engine as ap


def train(nan: bool = False) -> None:
    X = ap.dvector(4, shape=(), data=np.ones(4), name="X\\x1b[2J" + "Y" * 5000)
    ap.async_for(0, 4, lambda j: X.__setitem__(j, X[j] + 1.0), name="op\\x1b]0;t\\x07" + "Z" * 100_000)
    ap.log_objective("loss", float("nan") if nan else 1.0)
"""


def test_the_diff_of_a_nan_objective_and_hostile_names_finishes(tmp_path: Path, cli: Any) -> None:
    """A NaN objective is read back as None: formatting it raised in the diff's worker,
    whose errors are silent, so the diff said 'comparing…' for ever; its event lines
    printed operator and DDS names raw and whole (escape sequences, 100,000 characters
    folded over the screen)."""
    prog = tmp_path / "nan.py"
    prog.write_text(NAN_OBJECTIVE)
    for name, nan in (("a", "false"), ("b", "true")):
        res = cli(
            "run", f"{prog}:train", "-p", f"nan={nan}", "--trace", tmp_path / f"{name}.sqlite"
        )
        assert res.returncode == 0, res.stderr

    async def script(pilot: Any) -> None:
        text = await wait_text(pilot, "first difference: node 0, event 3", "nan")
        assert "\x1b" not in text and "Z" * 200 not in text, text

    drive(BrowserApp([tmp_path / "a.sqlite", tmp_path / "b.sqlite"], diff=True), script)


def test_a_run_id_is_shown_escaped_in_view_titles(tmp_path: Path) -> None:
    """A run id is the trace's text too: view titles (``Run …``, ``Verdicts of …``) and
    the history view printed its first characters raw, escape sequences included."""
    run_id = "\x1b[2J\x1b]0;t\x07[b]run"
    write_synthetic(tmp_path / "a.sqlite", run_id)

    async def script(pilot: Any) -> None:
        await wait_text(pilot, "1 run(s)")
        await pilot.press("enter")
        text = await wait_text(pilot, "operator", "Run \\x1b[2J")
        assert "\x1b" not in text, text
        await pilot.press("v")
        text = await wait_text(pilot, "Verdicts of \\x1b[2J")
        assert "\x1b" not in text and "\x07" not in text, text

    drive(BrowserApp([tmp_path]), script)


def test_a_verdict_detail_of_many_values_is_listed_in_part(tmp_path: Path) -> None:
    """A stored detail of 20,000 keys was laid out a row each on every redraw: the
    verdicts view took about a minute to show, and as long again for each key."""
    write_synthetic(tmp_path / "a.sqlite", "run-a")
    with tracer.open_writable(str(tmp_path / "a.sqlite")) as trace:
        trace.add_verdict("run-a", "cluster", False, {f"k{i}": i for i in range(20_000)})

    async def script(pilot: Any) -> None:
        await wait_text(pilot, "1 run(s)")
        await pilot.press("v")
        await wait_text(pilot, "FAILED", "k0", timeout=5)
        await pilot.press("tab", "end")  # to the detail pane, and its end
        await wait_text(pilot, "… and 19,800 more detail value(s)", timeout=5)

    drive(BrowserApp([tmp_path]), script)


WIDE_OPERATOR = """\
import numpy as np
import engine as ap


def train(name: str) -> None:
    X = ap.dvector(4, shape=(), data=np.ones(4), name="X")
    ap.async_for(0, 4, lambda j: X.__setitem__(j, X[j] + 1.0), name=name)
"""


@pytest.mark.parametrize("length", [8, 20, 32])
def test_the_overview_shows_its_operator_row_whatever_the_name_length(
    tmp_path: Path, cli: Any, length: int
) -> None:
    """At 80 columns an operator name of 15 or more characters made the operators table
    wider than the screen; its horizontal scrollbar took the table's last line, so the
    run's only operator row showed as blank.  The table now makes room for it."""
    prog = tmp_path / "wide.py"
    prog.write_text(WIDE_OPERATOR)
    name = ("abcdefghij" * 4)[:length]
    trace = tmp_path / "t.sqlite"
    assert cli("run", f"{prog}:train", "-p", f"name={name}", "--trace", trace).returncode == 0

    async def script(pilot: Any) -> None:
        await wait_text(pilot, "1 run(s)")
        await pilot.press("enter")
        text = await wait_text(pilot, "params")
        # the operator's row: its name, then 1 invocation of 4 bodies
        row = [ln for ln in text.splitlines() if ln.startswith("  " + name)]
        assert row and row[0].split()[1:3] == ["1", "4"], text

    drive(BrowserApp([tmp_path]), script)
