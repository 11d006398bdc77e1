"""The element-history view (issue 16 item 6): opened from the orders view by typing an
element, it shows what ``replay history --json`` computes, and says in one line why not."""

from __future__ import annotations

import asyncio
import gc
import json
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Input
from tui_helpers import wait_for, wait_text

import tracer
from tests import cli as tcli
from tui import BrowserApp
from tui._repo import RunRef
from tui.screens import ElementPrompt, HistoryScreen, OrdersScreen
from tui.screens.history import child_target, history_table, magnitude
from tui.widgets import ArrayTable, BraillePlot

SGD = ["-p", "synthetic=true", "-p", "synthetic_ratings=5000", "-p", "rank=2", "-p", "epochs=3"]
TIMEOUT = 120


def record(path: Path, *args: str) -> Path:
    """A one-rank run recorded in this process (``--timeout`` bounds it)."""
    proc = tcli.invoke(["run", "sgdmf", *SGD, *args, "--trace", path, "--json", "--timeout", "100"])
    assert proc.returncode == 0, proc.stderr
    return path


@pytest.fixture(scope="module")
def tt_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small SGDMF run with a checkpoint after every invocation."""
    return record(tmp_path_factory.mktemp("ttui") / "tt.sqlite", "--checkpoint-every", "1")


def drive(app: BrowserApp, script: Any) -> None:
    async def main() -> None:
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            await script(pilot)

    asyncio.run(asyncio.wait_for(main(), TIMEOUT))


async def open_history(pilot: Any, element: str) -> None:
    """From the runs list: overview, orders, ``h``, type ``element``, enter."""
    await wait_text(pilot, "1 run(s)")
    await pilot.press("enter")
    await wait_text(pilot, "Timeline")
    await pilot.press("o")
    await wait_for(pilot, lambda t: "row(s)" in t or "no lock" in t, what="orders loaded")
    assert isinstance(pilot.app.screen, OrdersScreen)
    await pilot.press("h")
    await pilot.pause()
    assert isinstance(pilot.app.screen, ElementPrompt)
    await pilot.press(*element, "enter")
    await pilot.pause()
    assert isinstance(pilot.app.screen, HistoryScreen)


# The history view computes its answer with a `replay history` child process: the tests
# that open it on a recorded run start a replay command (the layer scan cannot see it).
@pytest.mark.e2e
def test_typed_element_shows_the_history_of_replay_history(tt_trace: Path, cli: Any) -> None:
    proc = cli("history", tt_trace, "W[3]", "--json")
    assert proc.returncode == 0, proc.stderr
    expected = json.loads(proc.stdout)["history"]
    assert len(expected) == 3

    async def script(pilot: Any) -> None:
        await open_history(pilot, "W[3]")
        text = await wait_text(pilot, "replaying…")  # progress first
        text = await wait_text(pilot, "3 invocation(s), computed in", timeout=TIMEOUT)
        screen = pilot.app.screen
        table = screen.query_one("#history", ArrayTable).table
        assert table is not None and len(table) == len(expected)
        for k, e in enumerate(expected):
            w = e["writer"]
            assert table.column("op")[k] == e["op"]
            assert table.column("inv")[k] == e["invocation"]
            for key in ("index", "node", "thread", "round"):
                assert table.column(key)[k] == w[key]
            assert table.column("value")[k] == history_table([e]).column("value")[0]
        plot = screen.query_one("#history-plot", BraillePlot)
        assert plot.values == [magnitude(e["value"]) for e in expected]
        assert "‖W[3]‖" in text and "invocation" in text
        assert any(0x2801 <= ord(c) <= 0x28FF for c in text)  # a drawn braille curve
        assert f"{expected[0]['writer']['index']}" in text
        await pilot.press("escape")  # back to the orders view
        await pilot.pause()
        assert isinstance(pilot.app.screen, OrdersScreen)

    drive(BrowserApp([str(tt_trace)]), script)


@pytest.mark.e2e
def test_the_child_reports_its_progress_to_the_view_and_to_nobody_else(
    tt_trace: Path, cli: Any
) -> None:
    """``replay history`` counts the invocations it has done of those asked for; the
    browser's child prints them as protocol lines, which never reach a person."""
    from replay._progress import TICK, TICKS_ENV
    from tui.screens import history as view
    from tui.screens.history import Progress, run_history

    for env in ({}, {TICKS_ENV: "0"}):  # --json alone, or a pipe: no protocol line
        proc = cli("history", tt_trace, "W[3]", "--json", env=env)
        assert proc.returncode == 0 and TICK not in proc.stderr + proc.stdout, proc.stderr
    proc = cli("history", tt_trace, "W[3]")  # not --json, on a pipe: no bar, no line
    assert proc.returncode == 0 and TICK not in proc.stderr + proc.stdout, proc.stderr
    with tracer.open(tt_trace) as trace:
        run_id = trace.run().run_id
    with view._CACHE_LOCK:  # another test of this module may have asked for W[3] first
        view._CACHE.clear()
    progress = Progress()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        doc = run_history(str(tt_trace), run_id, "W[3]", [], progress)
        gc.collect()
    assert len(doc["history"]) == 3, doc
    assert (progress.done, progress.total) == (3, 3)  # all three of the run's invocations
    leaked = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not leaked  # the child's pipes were closed, not left to the collector


@pytest.mark.e2e
@pytest.mark.parametrize(
    "element,message",
    [("Q[1]", "no DDS named 'Q'"), ("W[100000]", "index out of range"), ("W17", "DDS[INDEX]")],
)
def test_bad_element_is_one_line_in_the_view(tt_trace: Path, element: str, message: str) -> None:
    async def script(pilot: Any) -> None:
        await open_history(pilot, element)
        text = await wait_text(pilot, message, timeout=TIMEOUT)
        assert "Traceback" not in text and "no history (the reason is below)" in text
        screen = pilot.app.screen
        assert isinstance(screen, HistoryScreen)
        assert screen.query_one("#history", ArrayTable).table is None

    drive(BrowserApp([str(tt_trace)]), script)


@pytest.mark.e2e
def test_trace_without_checkpoints_is_a_message(tmp_path: Path) -> None:
    path = record(tmp_path / "none.sqlite", "--no-checkpoints")

    async def script(pilot: Any) -> None:
        await wait_text(pilot, "1 run(s)")
        await pilot.press("enter")
        await wait_text(pilot, "Timeline")
        await pilot.press("h")  # from the overview too
        await pilot.pause()
        assert isinstance(pilot.app.screen, ElementPrompt)
        await pilot.press(*"W[3]", "enter")
        text = await wait_text(pilot, "no checkpoints", timeout=TIMEOUT)
        assert "Traceback" not in text
        assert isinstance(pilot.app.screen, HistoryScreen)

    drive(BrowserApp([str(path)]), script)


def test_rows_without_a_writer_and_scalar_values() -> None:
    """A ``sync_for`` element has no single writer (``-``); a scalar is plotted as is, a
    row as its norm, a value that is not numeric as a gap."""
    hist = [
        {"op": "mean", "invocation": 0, "value": 0.5, "writer": None},
        {"op": "mean", "invocation": 1, "value": [3.0, 4.0], "writer": None},
    ]
    table = history_table(hist)
    assert table.cells(0) == ["mean", "0", "0.5", "-", "-", "-", "-"]
    assert table.cells(1)[2] == "[3, 4]"
    assert [magnitude(e["value"]) for e in hist] == [0.5, 5.0]
    assert magnitude("text") != magnitude("text")  # NaN


@pytest.mark.e2e  # the history view starts a 'replay history' process
def test_h_on_a_lock_row_offers_its_element(synth_dir: Path) -> None:
    """On the lock tab, ``h`` pre-fills the prompt with the element of the row under the
    cursor; escape cancels; a run whose program cannot be replayed is one line."""

    async def script(pilot: Any) -> None:
        await pilot.press("enter", "o")
        await wait_text(pilot, "20 row(s)", "element")
        orders = pilot.app.screen
        table = orders.query_one("#t-locks", ArrayTable)
        assert table.table is not None
        await pilot.press("down", "down", "h")
        await pilot.pause()
        prompt = pilot.app.screen
        assert isinstance(prompt, ElementPrompt)
        element = str(table.table.column("element")[2])
        assert prompt.query_one("#element", Input).value == element
        await pilot.press("escape")
        await pilot.pause()
        assert pilot.app.screen is orders
        await pilot.press("h", "enter")
        await pilot.pause()
        screen = pilot.app.screen
        assert isinstance(screen, HistoryScreen) and screen.element == element
        text = await wait_for(
            pilot, lambda _: screen.doc is not None, timeout=TIMEOUT, what="an answer"
        )
        assert screen.doc is not None and "error" in screen.doc, screen.doc
        assert "is not the code the trace was recorded with" in screen.doc["error"]
        assert " ".join(screen.doc["error"].split()) in " ".join(text.split())
        assert "Traceback" not in text
        assert screen.query_one("#history", ArrayTable).table is None

    drive(BrowserApp([synth_dir / "a.sqlite"]), script)


@pytest.mark.e2e
def test_recompute_replays_again_and_leaving_kills_the_replay(tt_trace: Path) -> None:
    """``r`` forgets the kept answer and replays again; escape while it replays kills
    the child process, so nothing of the user's program keeps running."""

    async def script(pilot: Any) -> None:
        await open_history(pilot, "W[3]")
        await wait_text(pilot, "invocation(s), computed in", timeout=TIMEOUT)
        screen = pilot.app.screen
        assert isinstance(screen, HistoryScreen)
        await pilot.press("r")
        await wait_text(pilot, "replaying…")
        await wait_for(pilot, lambda _: bool(screen.procs), what="a child process")
        procs = list(screen.procs)
        assert procs[0].poll() is None  # still replaying
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(pilot.app.screen, OrdersScreen)
        assert procs[0].wait(timeout=10) < 0  # killed by a signal, not finished

    drive(BrowserApp([str(tt_trace)]), script)


def test_a_database_password_stays_off_the_command_line() -> None:
    arg, env = child_target("postgresql+psycopg://me:s3cret@db:5432/traces?sslmode=require")
    assert arg == "postgresql+psycopg://me@db:5432/traces?sslmode=require"
    assert env == {"PGPASSWORD": "s3cret"}
    assert child_target("traces/a.sqlite") == ("traces/a.sqlite", {})


def test_a_long_history_shows_its_phase_then_a_bar_with_rate_and_time_left(
    synth_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the child reports reaches the screen: the fast-forward by name, then a bar
    of invocations with the rate and the time left; the bar goes once the answer is in."""
    import threading
    import time

    from textual.widgets import ProgressBar

    from replay._progress import phase_line, tick_line
    from tui.screens import history as hist

    go, finish = threading.Event(), threading.Event()

    def fake(target: str, run_id: str, element: str, started: list, progress: Any) -> dict:
        progress.line(phase_line("fast-forward to the checkpoint after hot#0"), time.monotonic())
        go.wait(TIMEOUT)
        now = time.monotonic()
        progress.line(tick_line(1, 10, "invocations"), now - 3.0)  # one a second since
        progress.line(tick_line(4, 10, "invocations"), now)
        finish.wait(TIMEOUT)
        entry = {"op": "hot", "invocation": 0, "value": 1.5, "writer": None}
        return {"element": element, "history": [entry]}

    monkeypatch.setattr(hist, "run_history", fake)

    async def script(pilot: Any) -> None:
        await wait_text(pilot, "1 run(s)")
        await pilot.app.push_screen(HistoryScreen(RunRef(str(trace), "run-a"), "X[0]"))
        screen = pilot.app.screen
        assert isinstance(screen, HistoryScreen)
        await wait_text(pilot, "replaying… fast-forward to the checkpoint after hot#0")
        go.set()
        text = await wait_text(pilot, "4/10 invocations, 1.00/s, ETA 0:00:0")
        assert re.search(r"ETA 0:00:0[456],", text) and "(escape stops it)" in text, text
        bar = screen.query_one("#history-bar", ProgressBar)
        assert (bar.progress, bar.total, bar.display) == (4, 10, True)
        assert "40%" in text  # the bar itself, drawn
        finish.set()
        text = await wait_text(pilot, "1 invocation(s), computed in")
        assert not bar.display and "40%" not in text and "ETA" not in text

    trace = synth_dir / "a.sqlite"
    drive(BrowserApp([trace]), script)
