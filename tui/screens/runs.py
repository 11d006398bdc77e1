"""The runs list: every run of every trace given, with status and verdicts."""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Header, Static

from .. import _format as fmt
from .._repo import RunRow, TraceEntry
from ._base import BrowserScreen

#: Colour of each run status.
STATUS_STYLE = {
    "finished": "green",
    "running": "yellow",
    "failed": "red",
    "crashed": "red",
    "interrupted": "magenta",
}


def _started(t: float) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.localtime(t))


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

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="runs-summary")
        yield DataTable(id="runs", cursor_type="row", zebra_stripes=True)
        yield Static(id="runs-detail")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "Runs"
        table = self.query_one("#runs", DataTable)
        for label, width in (
            (" ", 1),
            ("app", 10),
            ("started", 14),
            ("r×t", 5),
            ("status", 10),
            ("time", 6),
            ("verdicts", 14),
        ):
            table.add_column(label, width=width, key=label)
        self.fill()
        table.focus()

    # ------------------------------------------------------------ content
    def fill(self) -> None:
        """(Re)build the table from the repository."""
        table = self.query_one("#runs", DataTable)
        table.clear()
        entries = self.repo.entries()
        self.rows = []
        for entry in entries:
            self.rows += list(entry.runs)
            if entry.error is not None:
                self.rows.append(entry)
        for k, row in enumerate(self.rows):
            table.add_row(*self._cells(k, row), key=str(k))
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
        if isinstance(row, TraceEntry):
            name = row.path.rsplit("/", 1)[-1]
            return [mark, name, "-", "-", Text("unreadable", style="bold red"), "-", ""]
        info = row.info
        status = Text(info.status, style=STATUS_STYLE.get(info.status, ""))
        return [
            mark,
            info.app or "?",
            _started(info.started_at),
            f"{info.ranks}×{info.threads}",
            status,
            fmt.duration(info.duration),
            fmt.verdict_summary(list(row.verdicts)),
        ]

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
                out.append(f"unreadable: {row.error}", style="red")
            else:
                info = row.info
                out.append(f"{fmt.short_path(row.ref.path, 40)}  run {info.run_id}\n", style="bold")
                out.append(f"{info.target or info.app}  seed {info.seed}  ")
                out.append(f"started {fmt.when(info.started_at)}")
                if info.error:
                    out.append("\n" + info.error.strip().splitlines()[-1], style="red")
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


__all__ = ["RunsScreen"]
