"""The runs list: every run of every trace given, with status and verdicts (a crashed
run and the run that resumed it are one line, marked ↻)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from rich.cells import cell_len
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.events import Resize
from textual.widgets import DataTable, Footer, Header, Static

import tracer

from .. import _format as fmt
from .._repo import RunRow, TraceEntry
from ..widgets import ListTable
from ._base import BrowserScreen

#: Colour of each run status.
STATUS_STYLE = {
    "finished": "green",
    "running": "yellow",
    "failed": "red",
    "crashed": "red",
    "interrupted": "magenta",
}


#: Columns after the file: (label, the most cells it takes).  Each is as wide as its
#: widest cell up to that; the file column takes what is left, from FILE_MIN up to its
#: longest name (the rest of a wide terminal stays free rather than padding file names).
#: When the columns need more than the terminal has, the table scrolls sideways (← →)
#: instead of cutting a column.
COLUMNS = (
    ("app", 32),
    ("started", 14),
    ("r×t", 9),
    ("status", 16),
    ("time", 8),
    ("verdicts", 40),
)
#: The narrowest file column (the full path is in the detail line below the table).
FILE_MIN = 8
#: Cells each column takes beyond its width (DataTable's padding of one on each side),
#: plus a scroll bar's width kept free.
PAD, SCROLLBAR = 2, 2


def _started(t: float) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.localtime(t))


def _app_cell(app: str) -> str:
    """The app as the list names it: a file-based app (``/home/u/train.py:main``) by its
    file and function, the directory being in the detail line."""
    return Path(app).name if "/" in app else app or "?"


def _file_cell(path: str, width: int) -> str:
    """The file's name; without its suffix when too wide, then cut from the left (the
    directory and whole name are in the detail line)."""
    name = Path(path).name
    stem = Path(path).stem
    if len(name) <= width:
        return name
    return stem if len(stem) <= width else "…" + stem[-(width - 1) :]


def fold_resumed(rows: list[RunRow]) -> list[RunRow]:
    """A crashed run and the run that resumed it (``continues``, same trace) as one row:
    the resumed one, carrying the runs it continues in ``earlier``."""
    by_id = {(r.ref.path, r.ref.run_id): r for r in rows}
    resumed = {(r.ref.path, r.info.continues) for r in rows if r.info.continues}
    out = []
    for r in rows:
        if (r.ref.path, r.ref.run_id) in resumed:
            continue  # shown in the line of the run that resumed it
        chain: list[tracer.RunInfo] = []
        prev = by_id.get((r.ref.path, r.info.continues or ""))
        while prev is not None and len(chain) < len(rows):
            chain.insert(0, prev.info)
            prev = by_id.get((r.ref.path, prev.info.continues or ""))
        out.append(dataclasses.replace(r, earlier=tuple(chain)) if chain else r)
    return out


def _newest_first(row: RunRow | TraceEntry) -> tuple[int, float, str, str]:
    """Runs by start time, newest first (ties by file and run id); unreadable files last."""
    if isinstance(row, TraceEntry):
        return (1, 0.0, row.path, "")
    return (0, -(row.info.started_at or 0.0), row.ref.path, row.ref.run_id)


def chaos_groups(rows: list[RunRow]) -> dict[str, tuple[int, int, list[int]]]:
    """Per chaos run id: (its outcome group, 1-based, in order of first run; the number of
    groups; the run numbers in its group), over the runs of one trace and chaos seed."""
    explorations: dict[tuple[str, object], list[RunRow]] = {}
    for r in rows:
        if r.outcome is not None:
            explorations.setdefault((r.ref.path, r.info.labels.get("chaos_seed")), []).append(r)
    out: dict[str, tuple[int, int, list[int]]] = {}
    for runs in explorations.values():
        runs = sorted(runs, key=lambda r: (_chaos_run(r), r.info.started_at or 0.0))
        groups: dict[str, list[int]] = {}
        for r in runs:
            groups.setdefault(r.outcome or "", []).append(_chaos_run(r))
        order = list(groups)
        for r in runs:
            g = r.outcome or ""
            out[r.ref.run_id] = (order.index(g) + 1, len(order), groups[g])
    return out


def _chaos_run(row: RunRow) -> int:
    run = row.info.labels.get("chaos_run")
    return run if isinstance(run, int) else -1


def _path(row: RunRow | TraceEntry) -> str:
    return row.path if isinstance(row, TraceEntry) else row.ref.path


def _chaos_cell(row: RunRow) -> str:
    """``run K`` for run K of a chaos exploration (numbered as ``replay chaos`` numbers
    them), else empty."""
    k = _chaos_run(row)
    return f"run {k}" if k >= 0 else ""


def _grouped(rows: list[RunRow | TraceEntry]) -> list[RunRow | TraceEntry]:
    """Newest first, with the runs of one chaos exploration together, grouped by outcome
    (the group of its first run first), at the place of the exploration's newest run."""
    rows = sorted(rows, key=_newest_first)
    runs = [r for r in rows if isinstance(r, RunRow)]
    groups = chaos_groups(runs)
    out: list[RunRow | TraceEntry] = []
    placed: set[tuple[str, object]] = set()
    for row in rows:
        if not isinstance(row, RunRow) or row.ref.run_id not in groups:
            out.append(row)
            continue
        key = (row.ref.path, row.info.labels.get("chaos_seed"))
        if key in placed:
            continue
        placed.add(key)
        mates: list[RunRow] = [
            r
            for r in runs
            if isinstance(r, RunRow)
            and r.ref.run_id in groups
            and (r.ref.path, r.info.labels.get("chaos_seed")) == key
        ]
        mates.sort(key=lambda r: (groups[r.ref.run_id][0], _chaos_run(r)))
        out += mates
    return out


class RunsScreen(BrowserScreen):
    """Lists runs; enter opens one, space marks two for a diff."""

    VIEW_NAME = "runs"
    BINDINGS = [
        Binding("enter", "open", "Open", priority=True),
        Binding("space", "mark", "Mark"),
        Binding("d", "diff", "Diff"),
        Binding("v", "verdicts", "Verdicts"),
        Binding("r", "reload", "Reload"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[RunRow | TraceEntry] = []
        self.marked: list[int] = []
        self.file_width = 0
        #: the columns after the file: :data:`COLUMNS`, after a chaos column if needed
        self.columns: list[tuple[str, int]] = list(COLUMNS)
        self.groups: dict[str, tuple[int, int, list[int]]] = {}

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="runs-summary")
        yield ListTable(id="runs", cursor_type="row", zebra_stripes=True)
        yield Static(id="runs-detail")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "Runs"
        self.fill()
        self.query_one("#runs", DataTable).focus()

    def on_resize(self, event: Resize) -> None:
        if self._file_width(event.size.width) != self.file_width:
            self.fill(reread=False)

    # ------------------------------------------------------------ content
    def _file_width(self, screen_width: int) -> int:
        fixed = 1 + PAD + sum(w + PAD for _, w in self.columns) + PAD + SCROLLBAR
        longest = max((len(Path(_path(r)).name) for r in self.rows), default=0)
        return max(FILE_MIN, min(screen_width - fixed, max(longest, len("file"))))

    def _columns(self, table: DataTable) -> None:
        """Lay the columns out for the rows and this width (see :data:`COLUMNS`)."""
        caps = list(COLUMNS)
        if any(_chaos_run(r) >= 0 for r in self.rows if isinstance(r, RunRow)):
            # runs of one exploration share their file: their number tells them apart
            caps.insert(0, ("chaos", 12))
        fields = [self._fields(row, [label for label, _ in caps]) for row in self.rows]
        self.columns = [
            (label, min(cap, max([cell_len(label)] + [cell_len(str(f[k])) for f in fields])))
            for k, (label, cap) in enumerate(caps)
        ]
        self.file_width = self._file_width(self.size.width or self.app.size.width)
        table.clear(columns=True)
        table.add_column(" ", width=1, key=" ")
        table.add_column("file", width=self.file_width, key="file")
        for label, width in self.columns:
            table.add_column(label, width=width, key=label)

    def fill(self, *, reread: bool = True) -> None:
        """(Re)build the table from the repository (``reread=False``: only re-lay it out
        for a new width, keeping the cursor)."""
        table = self.query_one("#runs", DataTable)
        cursor = table.cursor_row
        entries = self.repo.entries()
        if reread:
            self.rows = []
            for entry in entries:
                self.rows += fold_resumed(list(entry.runs))
                if entry.error is not None:
                    self.rows.append(entry)
            self.rows = _grouped(self.rows)
            self.groups = chaos_groups([r for r in self.rows if isinstance(r, RunRow)])
        self._columns(table)
        for k, row in enumerate(self.rows):
            table.add_row(*self._cells(k, row), key=str(k))
        if not reread and self.rows:
            table.move_cursor(row=min(cursor, len(self.rows) - 1))
        runs = sum(len(e.runs) for e in entries)
        bad = sum(1 for e in entries if e.error is not None)
        summary = f"{len(entries)} trace file(s), {runs} run(s)"
        if bad:
            summary += f", {bad} unreadable"
        if not entries:
            paths = ", ".join(str(p) for p in self.browser.given) or "traces/"
            summary = f"no trace files in {paths}: record one with 'replay run APP --trace PATH'"
        self.query_one("#runs-summary", Static).update(summary)
        self._detail()

    def _cells(self, k: int, row: RunRow | TraceEntry) -> list[str | Text]:
        mark = "●" if k in self.marked else " "
        file = _file_cell(_path(row), self.file_width)
        return [mark, file, *self._fields(row, [label for label, _ in self.columns])]

    @staticmethod
    def _fields(row: RunRow | TraceEntry, labels: list[str]) -> list[str | Text]:
        """The cells of ``row`` after its file, for the columns ``labels``."""
        if isinstance(row, TraceEntry):
            bad: dict[str, str | Text] = {"app": "?", "started": "-", "r×t": "-", "time": "-"}
            bad["status"] = Text("unreadable", style="bold red")
            return [bad.get(label, "") for label in labels]
        info = row.info
        status = Text(info.status, style=STATUS_STYLE.get(info.status, ""))
        first = row.earlier[0] if row.earlier else info
        if row.earlier:
            status.append(" ↻" if len(row.earlier) == 1 else f" ↻{len(row.earlier)}", "cyan")
        cells: dict[str, str | Text] = {
            "chaos": _chaos_cell(row),
            "app": _app_cell(info.app),
            "started": _started(first.started_at),
            "r×t": f"{info.ranks}×{info.threads}",
            "status": status,
            "time": fmt.duration(sum(i.duration for i in row.earlier) + info.duration),
            "verdicts": fmt.verdict_summary(list(row.verdicts)),
        }
        return [cells[label] for label in labels]

    def _current(self) -> int | None:
        table = self.query_one("#runs", DataTable)
        return table.cursor_row if self.rows and 0 <= table.cursor_row < len(self.rows) else None

    def _detail(self) -> None:
        k = self._current()
        out = Text()
        if k is not None:
            row = self.rows[k]
            if isinstance(row, TraceEntry):
                out.append(f"{fmt.short_path(row.path, 76)}\n", style="bold")
                out.append(f"unreadable: {fmt.text(row.error, 240)}", style="red")
            else:
                info = row.info
                path = fmt.short_path(row.ref.path, max(20, self.size.width - 45))
                out.append(f"{path}  run {fmt.text(info.run_id, 64)}\n", style="bold")
                out.append(f"{fmt.text(info.target or info.app)}  seed {info.seed}  ")
                out.append(f"started {fmt.when(info.started_at)}")
                if info.run_id in self.groups:
                    g, n, members = self.groups[info.run_id]
                    runs = ", ".join(map(str, members[:8])) + (" ..." if len(members) > 8 else "")
                    out.append(
                        f"\nchaos seed {fmt.text(info.labels.get('chaos_seed'), 24)} run "
                        f"{fmt.text(info.labels.get('chaos_run'), 24)}: outcome group {g} of {n} "
                        f"(runs {runs})",
                        style="cyan",
                    )
                for e in row.earlier:
                    out.append(
                        f"\nresumes run {fmt.short_id(e.run_id, 12)} ({e.status})", style="cyan"
                    )
                if info.error:
                    out.append("\n" + fmt.text(fmt.last_line(info.error), 240), style="red")
        if self.marked:
            out.append(f"\nmarked for diff: {len(self.marked)} (space: mark, d: diff)", style="dim")
        self.query_one("#runs-detail", Static).update(out)

    def on_data_table_row_highlighted(self, _: DataTable.RowHighlighted) -> None:
        self._detail()

    # ------------------------------------------------------------ actions
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The runs list is the bottom view: there is nothing to go back to."""
        return action != "back"

    def _run_row(self, k: int | None) -> RunRow | None:
        if k is None:
            return None
        row = self.rows[k]
        if isinstance(row, TraceEntry):
            self.show_error(row.error or row.path)
            return None
        return row

    def action_open(self) -> None:
        """Open the run under the cursor."""
        row = self._run_row(self._current())
        if row is not None:
            self.browser.open_run(row.ref)

    def action_verdicts(self) -> None:
        """Show the verdicts of the run under the cursor."""
        row = self._run_row(self._current())
        if row is not None:
            self.browser.open_verdicts(row.ref)

    def action_mark(self) -> None:
        """Mark or unmark the run under the cursor for a diff (at most two)."""
        k = self._current()
        if k is None or self._run_row(k) is None:
            return
        if k in self.marked:
            self.marked.remove(k)
        else:
            self.marked = (self.marked + [k])[-2:]
        table = self.query_one("#runs", DataTable)
        for j in range(len(self.rows)):
            table.update_cell(str(j), " ", "●" if j in self.marked else " ")
        self._detail()

    def action_diff(self) -> None:
        """Diff the two marked runs (or the marked one and the one under the cursor)."""
        picks = list(self.marked)
        k = self._current()
        if len(picks) == 1 and k is not None and k not in picks:
            picks.append(k)
        rows = [self.rows[j] for j in picks]
        if len(picks) != 2 or not all(isinstance(r, RunRow) for r in rows):
            self.notify("mark two runs with space, then press d", severity="warning")
            return
        a, b = (r for r in rows if isinstance(r, RunRow))
        self.browser.open_diff(a.ref, b.ref)

    def action_reload(self) -> None:
        """Re-read the trace files."""
        self.repo.reload()
        self.marked = []
        self.fill()
        self.notify("reloaded")


__all__ = ["RunsScreen", "fold_resumed"]
