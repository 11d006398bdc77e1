"""Time travel in the browser: one DDS element's value after every invocation and the loop
body that last wrote it, computed by ``replay history --json`` in a subprocess.

Computing a history replays the recorded program, so it never happens on its own: only
when the user asks for an element, in a child process the view kills when it is left.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, Header, Input, Label, ProgressBar, Static

import tracer
from replay._progress import TICK, TICKS_ENV, parse_phase, parse_tick

from .. import _format as fmt
from .._model import Column, RowTable
from .._repo import RunRef
from ..widgets.plot import BraillePlot
from ..widgets.table import ArrayTable
from ._base import BrowserScreen

#: The project root, put on the child's ``PYTHONPATH`` so it imports this ``replay``.
ROOT = Path(__file__).resolve().parents[2]
#: Seconds between redraws of the bar and its line while a history is computed.
REFRESH_S = 0.25
#: Missing writer (an element not written in that invocation, or by a ``sync_for``).
NONE = -1

COLUMNS = (
    Column("op", 6, left=True),
    Column("inv", 4),
    Column("value", 26, left=True),
    Column("index", 7, missing=NONE),
    Column("node", 4, missing=NONE),
    Column("thread", 6, missing=NONE),
    Column("round", 5, missing=NONE),
)


def short_value(v: Any) -> str:
    """A value as the table shows it: floats to 6 digits, a row's first 3 components."""
    if isinstance(v, list):
        head = ", ".join(short_value(x) for x in v[:3])
        return f"[{head}{', …' if len(v) > 3 else ''}]"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v) if isinstance(v, int | str) and not isinstance(v, bool) else fmt.scalar(v)


def magnitude(v: Any) -> float:
    """What the plot draws: a number itself, the Euclidean norm of a row (NaN otherwise)."""
    try:
        if isinstance(v, list):
            return float(np.linalg.norm(np.asarray(v, dtype=np.float64)))
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def history_table(history: list[dict[str, Any]]) -> RowTable:
    """The rows of ``replay history --json``'s ``history``, one per invocation."""

    def writer(e: dict[str, Any], key: str) -> int:
        w = e.get("writer")
        return NONE if w is None else int(w[key])

    arrays = (
        np.array([str(e["op"]) for e in history], dtype=str),
        np.array([int(e["invocation"]) for e in history], dtype=np.int64),
        np.array([short_value(e["value"]) for e in history], dtype=str),
        *(
            np.array([writer(e, k) for e in history], dtype=np.int64)
            for k in ("index", "node", "thread", "round")
        ),
    )
    return RowTable(COLUMNS, arrays, search="index")


def history_command(target: str, run_id: str, element: str) -> list[str]:
    """The ``replay history`` command the view runs for ``element`` of a run."""
    return [sys.executable, "-m", "replay", "history", target, element, "--run", run_id, "--json"]


def child_target(target: str) -> tuple[str, dict[str, str]]:
    """The TRACE argument for the child and what to add to its environment: a PostgreSQL
    URL's password goes in ``PGPASSWORD`` (which libpq reads), never on a command line
    that ``ps`` shows to every user."""
    if not tracer.is_url(target):
        return target, {}
    from sqlalchemy.engine import URL, make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(target)
    except ArgumentError:
        return target, {}
    if not url.password or not url.drivername.startswith("postgresql"):
        return target, {}
    bare = URL.create(url.drivername, url.username, None, url.host, url.port, url.database)
    shown = bare.update_query_dict(dict(url.query)).render_as_string(hide_password=False)
    return shown, {"PGPASSWORD": str(url.password)}


def _signature(target: str) -> tuple[int, int] | None:
    """(mtime, size) of a trace file, None for a database URL (never cached)."""
    try:
        st = os.stat(target)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


#: Histories computed in this process, keyed by (trace, run id, element, file signature):
#: a trace written since gets a new key, so nothing shown is stale.
_CACHE: dict[tuple[str, str, str, tuple[int, int]], dict[str, Any]] = {}
_CACHE_LOCK = threading.Lock()


@dataclass
class Progress:
    """How far a history computation is, as its child reports it: written by the thread
    that reads the child, read by the screen's timer without a lock (each field is
    replaced whole; a frame that mixes two ticks is redrawn right :data:`REFRESH_S` later)."""

    done: int = 0
    total: int | None = None
    #: the phase under way (fast-forward, planning, ...) until the next tick
    phase: str = ""
    #: monotonic times of the first and the latest tick (the rate counts from the first,
    #: not from the start: a fast-forward comes before any invocation is counted)
    first_tick: float | None = None
    first_done: int = 0
    last_tick: float = 0.0

    def line(self, line: str, now: float) -> None:
        """Take one protocol line of the child (others are ignored)."""
        phase = parse_phase(line)
        if phase is not None:
            self.phase = phase
            return
        tick = parse_tick(line)
        if tick is None:
            return
        done, total, _ = tick
        if self.first_tick is None:
            self.first_tick, self.first_done = now, done
        self.phase = ""
        self.done, self.total, self.last_tick = done, total, now

    def rate(self) -> float | None:
        """Invocations per second from the first tick to the latest (None: too early)."""
        if self.first_tick is None or self.last_tick <= self.first_tick:
            return None
        if self.done <= self.first_done:
            return None
        return (self.done - self.first_done) / (self.last_tick - self.first_tick)

    def eta(self, now: float) -> float | None:
        """Seconds left at that rate, counted from the latest tick (None: unknown total
        or rate)."""
        rate = self.rate()
        if rate is None or self.total is None:
            return None
        return max(max(self.total - self.done, 0) / rate - (now - self.last_tick), 0.0)


def clock(seconds: float) -> str:
    """``H:MM:SS`` of a number of seconds."""
    m, s = divmod(int(seconds + 0.5), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}"


def run_history(
    target: str,
    run_id: str,
    element: str,
    started: list[Any],
    progress: Progress | None = None,
) -> dict[str, Any]:
    """``{"element", "history"}``, or ``{"error": one line}``; the child process is put in
    ``started`` so that the caller can kill it, and its progress lines go to ``progress``."""
    sig = _signature(target)
    key = None if sig is None else (target, run_id, element, sig)
    if key is not None:
        with _CACHE_LOCK:
            if key in _CACHE:
                return _CACHE[key]
    arg, extra = child_target(target)
    env = dict(os.environ) | extra
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env[TICKS_ENV] = "1"  # its progress as protocol lines on stderr, read below
    try:
        proc = subprocess.Popen(
            history_command(arg, run_id, element),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
        )
    except OSError as exc:
        return {"error": f"cannot start replay: {exc}"}
    started.append(proc)
    err_lines: list[str] = []

    def read_stderr() -> None:
        assert proc.stderr is not None
        with contextlib.suppress(ValueError):  # closed by run_history after its wait
            for ln in proc.stderr:
                ln = ln.rstrip("\n")
                if ln.startswith(TICK):
                    if progress is not None:
                        progress.line(ln, time.monotonic())
                else:
                    err_lines.append(ln)

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    assert proc.stdout is not None and proc.stderr is not None
    out = proc.stdout.read()
    proc.stdout.close()
    proc.wait()
    reader.join(timeout=5)
    if not reader.is_alive():  # else a grandchild still holds it: the reader closes it
        proc.stderr.close()
    err = "\n".join(err_lines)
    if proc.returncode < 0:
        return {"error": "stopped"}
    doc: Any = None
    try:
        doc = json.loads(out) if out.strip() else None
    except json.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        lines = [ln for ln in err.splitlines() if ln.strip()]
        return {"error": lines[-1] if lines else f"replay history exited {proc.returncode}"}
    if "error" in doc:
        e = doc["error"]
        return {"error": str(e.get("message", e) if isinstance(e, dict) else e)}
    if proc.returncode == 0 and key is not None:
        with _CACHE_LOCK:
            _CACHE[key] = doc
    return doc


class ElementPrompt(ModalScreen[str | None]):
    """Asks for an element such as ``W[17]``; dismisses with the text (None: cancelled)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, value: str = "") -> None:
        super().__init__()
        self.value = value

    def compose(self) -> ComposeResult:
        with Vertical(id="element-box"):
            yield Label("history of element, DDS[INDEX]:", id="element-label", markup=False)
            yield Input(value=self.value, placeholder="W[17]", id="element")

    def on_mount(self) -> None:
        self.query_one("#element", Input).focus()

    @on(Input.Submitted, "#element")
    def _submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        """Close without choosing."""
        self.dismiss(None)


class HistoryScreen(BrowserScreen):
    """An element's value per invocation (braille plot) and its last writer (table)."""

    VIEW_NAME = "element history"
    BINDINGS = [
        Binding("h", "ask", "Other element"),
        Binding("r", "recompute", "Recompute"),
    ]

    def __init__(self, ref: RunRef, element: str) -> None:
        super().__init__()
        self.ref = ref
        self.element = element
        self.doc: dict[str, Any] | None = None
        self.started_at = 0.0
        self.procs: list[Any] = []
        self.progress = Progress()

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="where")
        yield BraillePlot(axis="invocation", empty="no values", id="history-plot")
        yield ArrayTable(id="history")
        yield ProgressBar(id="history-bar", show_eta=False)
        yield Static(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.set_interval(REFRESH_S, self._progress)
        self._start()

    def on_unmount(self) -> None:
        self._stop()

    # ------------------------------------------------------------ computing
    def _stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        self.procs = []

    def _start(self) -> None:
        self._stop()
        self.doc = None
        self.title = f"History of {self.element}"
        self.started_at = time.monotonic()
        where = Text()
        where.append("run ", style="dim")
        where.append(fmt.short_id(self.ref.run_id, 12), style="bold")
        where.append("  element ", style="dim")
        where.append(self.element, style="bold")
        where.append("  after each invocation, replayed from checkpoints", style="dim")
        self.query_one("#where", Static).update(where)
        self.query_one("#history-plot", BraillePlot).plot(self.element, [])
        self.query_one("#history", ArrayTable).wait(f"replaying for {self.element}…")
        progress = self.progress = Progress()
        bar = self.query_one("#history-bar", ProgressBar)
        bar.update(total=None, progress=0)
        bar.display = True
        self._progress()
        target, run_id, element = self.repo.target(self.ref), self.ref.run_id, self.element
        procs: list[Any] = []
        self.procs = procs

        def work() -> None:
            doc = run_history(target, run_id, element, procs, progress)
            self.deliver(self._show, element, procs, doc)

        self.run_worker(work, thread=True, exclusive=True, group="history", exit_on_error=False)

    def _progress(self) -> None:
        """The bar and the line under it: invocations done of those asked for, the rate
        and the time left once known, or the phase under way (every :data:`REFRESH_S`)."""
        if self.doc is not None:
            return
        now = time.monotonic()
        p = self.progress
        bar = self.query_one("#history-bar", ProgressBar)
        bar.update(total=p.total, progress=p.done)
        parts = []
        if p.phase:
            parts.append(p.phase)
        elif p.first_tick is not None:
            parts.append(f"{p.done}/{'?' if p.total is None else p.total} invocations")
            rate, eta = p.rate(), p.eta(now)
            if rate is not None:
                parts.append(f"{rate:.2f}/s")
            if eta is not None:
                parts.append(f"ETA {clock(eta)}")
        parts.append(f"{now - self.started_at:.0f} s")
        text = Text("replaying… ", style="bold yellow")
        text.append(", ".join(parts), style="yellow")
        text.append("  (escape stops it)", style="dim")
        self.query_one("#status", Static).update(text)

    def _show(self, element: str, procs: list[Any], doc: dict[str, Any]) -> None:
        if element != self.element or procs is not self.procs:
            return  # superseded by a newer request
        self.doc = doc
        self.query_one("#history-bar", ProgressBar).display = False
        table = self.query_one("#history", ArrayTable)
        status = self.query_one("#status", Static)
        if "error" in doc:
            table.show(None, "no history (the reason is below)")
            status.update(Text(str(doc["error"]), style="bold red"))
            return
        hist = list(doc["history"])
        values = [magnitude(e["value"]) for e in hist]
        is_row = any(isinstance(e["value"], list) for e in hist)
        title = f"‖{doc['element']}‖ (norm of the row)" if is_row else str(doc["element"])
        self.query_one("#history-plot", BraillePlot).plot(title, values)
        table.show(history_table(hist), "no invocations")
        secs = time.monotonic() - self.started_at
        status.update(
            Text(f"{len(hist)} invocation(s), computed in {secs:.1f} s  (r: recompute)", "dim")
        )
        table.focus()

    # ------------------------------------------------------------ keys
    def action_ask(self) -> None:
        """Ask for another element."""

        def chosen(element: str | None) -> None:
            if element:
                self.element = element
                self._start()

        self.app.push_screen(ElementPrompt(self.element), chosen)

    def action_recompute(self) -> None:
        """Replay again (the cache is keyed by the trace file's time and size)."""
        sig = _signature(self.repo.target(self.ref))
        with _CACHE_LOCK:
            if sig is not None:
                _CACHE.pop((self.repo.target(self.ref), self.ref.run_id, self.element, sig), None)
        self._start()


__all__ = [
    "ElementPrompt",
    "HistoryScreen",
    "Progress",
    "history_command",
    "history_table",
    "magnitude",
    "run_history",
]
