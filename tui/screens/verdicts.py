"""Replay and dual-test verdicts of a run; a failure's divergence is highlighted."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Footer, Header, Static

from .. import _format as fmt
from .._repo import BrowseError, RunRef
from .._verdict import (
    divergence_of,
    divergence_target,
    explain,
    flatten,
    is_highlighted,
    not_tested,
)
from ..widgets import ListTable
from ._base import BrowserScreen

#: Detail values the pane lists at most: a stored detail is the trace's JSON, and one of
#: 20,000 keys took the view a minute per redraw (a row each, laid out every time).
DETAIL_ROWS = 200


class VerdictsScreen(BrowserScreen):
    """Lists verdicts; g jumps to the divergence of the one under the cursor."""

    VIEW_NAME = "verdicts"
    BINDINGS = [
        Binding("g", "goto", "Go to divergence"),
        Binding("enter", "goto", "Go to divergence", priority=True, show=False),
    ]

    def __init__(self, ref: RunRef) -> None:
        super().__init__()
        self.ref = ref
        self.verdicts: list = []

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="verdict-summary")
        yield ListTable(id="verdicts", cursor_type="row")
        with VerticalScroll(id="verdict-box"):
            yield Static(id="verdict-detail")
        yield Footer()

    def on_mount(self) -> None:
        self.title = f"Verdicts of {fmt.short_id(self.ref.run_id)}"
        table = self.query_one("#verdicts", DataTable)
        for label, width in (("#", 3), ("kind", 13), ("result", 6), ("when", 19), ("where", 20)):
            table.add_column(label, width=width, key=label)
        try:
            self.verdicts = self.repo.run(self.ref).verdicts()
        except BrowseError as exc:
            self.query_one("#verdict-summary", Static).update(Text(str(exc), style="bold red"))
            self.show_error(str(exc))
            return
        failed = sum(1 for v in self.verdicts if not v.passed and v.error is None)
        summary = f"{len(self.verdicts)} verdict(s), {failed} failed"
        unreadable = sum(1 for v in self.verdicts if v.error is not None)
        if unreadable:
            summary += f", {unreadable} unreadable"
        if not self.verdicts:
            summary = "no verdicts yet: run 'replay cluster', 'replay single' or 'replay dual'"
        self.query_one("#verdict-summary", Static).update(summary)
        for k, v in enumerate(self.verdicts):
            if v.error is not None:  # one bad row is shown as such; the others stay readable
                bad = Text(f"unreadable verdict: {fmt.text(v.error, 240)}", style="bold red")
                table.add_row(str(k + 1), "?", Text("?", style="bold red"), "", bad, key=str(k))
                continue
            result = Text("pass", style="green") if v.passed else Text("FAIL", style="bold red")
            t = divergence_target(v.detail)
            where = " ".join(
                s
                for s in (
                    f"{t.op}#{t.invocation}" if t.op is not None else "",
                    f"n{t.node}" if t.node is not None else "",
                    f"j={t.index}" if t.index is not None else "",
                )
                if s
            )
            table.add_row(str(k + 1), v.kind, result, fmt.when(v.created_at), where, key=str(k))
        table.focus()
        self._detail()

    def _current(self):  # noqa: ANN202 - a VerdictInfo or None
        table = self.query_one("#verdicts", DataTable)
        k = table.cursor_row
        return self.verdicts[k] if 0 <= k < len(self.verdicts) else None

    def _detail(self) -> None:
        v = self._current()
        box = self.query_one("#verdict-detail", Static)
        if v is None:
            box.update("")
            return
        # numbered within this run as the table numbers them, not by the store's row id
        # (which counts the verdicts of every run in the file)
        nth = f"{self.query_one('#verdicts', DataTable).cursor_row + 1} of {len(self.verdicts)}"
        if v.error is not None:
            box.update(
                Text(f"unreadable verdict {nth}: {fmt.text(v.error, 240)}", style="bold red")
            )
            return
        head = Text(f"{v.kind} verdict {nth}: ")
        head.append("passed" if v.passed else "FAILED", style="green" if v.passed else "bold red")
        parts: list[Text | Table] = [head]
        untested = not_tested(v.detail)
        if untested:  # what a pass does not cover, before anything else
            parts.append(Text(f"not tested: {fmt.text(untested, 240)}", style="bold yellow"))
        why = explain(v.detail, self.ref.path, self.ref.run_id if self._shared_file() else None)
        shown: set[str] = set()
        if why is not None:
            main = Table.grid(padding=(0, 2))
            main.add_column(no_wrap=True, style="bold")
            main.add_column()
            # every text below is the stored detail's: escaped and cut (fmt.text)
            main.add_row("what", Text(fmt.text(why.what, 200), style="bold yellow"))
            main.add_row("where", Text(fmt.text(why.where, 200), style="bold yellow"))
            main.add_row("expected", self._value(why.expected_label, why.expected))
            main.add_row("got", self._value(why.got_label, why.got))
            if why.command is not None:
                main.add_row("stop there", Text(fmt.text(why.command, 240), style="bold cyan"))
            parts.append(main)
            # the keys of the divergence the lines above said; everything else follows
            sub = next((k for k in ("first_difference", "divergence") if k in v.detail), "")
            shown = {f"{sub}.{k}" if sub else k for k in why.shown}
            if why.command is not None:
                shown.add("stop")  # the stored stop is in the command, or superseded by it
        rest = [
            (k, val)
            for k, val in flatten(v.detail)
            if k not in shown and not (untested and k.startswith("not_tested"))
        ]
        if rest:
            grid = Table.grid(padding=(0, 2))
            grid.add_column(no_wrap=True)
            grid.add_column()
            more = len(rest) - DETAIL_ROWS
            for key, value in rest[:DETAIL_ROWS]:
                hot = is_highlighted(key) and why is None
                style = "bold yellow" if hot and not v.passed else "bold" if hot else "dim"
                grid.add_row(
                    Text(fmt.text(key, 60), style=style), Text(fmt.scalar(value, 200), style=style)
                )
            parts += [Text("details", style="dim underline"), grid]
            if more > 0:
                parts.append(Text(f"… and {fmt.count(more)} more detail value(s)", style="dim"))
        if not v.passed and divergence_target(v.detail).op is not None:
            parts.append(Text("g: show this place in the orders view", style="italic dim"))
        box.update(Group(*parts))

    @staticmethod
    def _value(label: str, value: object) -> Text:
        text = Text(fmt.scalar(value, 200), style="bold")
        text.append(f"  ({label})", style="dim")
        return text

    def _shared_file(self) -> bool:
        """True when the trace file holds more than this run (commands then name it)."""
        return any(e.path == self.ref.path and len(e.runs) > 1 for e in self.repo.entries())

    def on_data_table_row_highlighted(self, _: DataTable.RowHighlighted) -> None:
        self._detail()

    def action_goto(self) -> None:
        """Open the orders view at the divergence of the verdict under the cursor."""
        v = self._current()
        if v is None:
            return
        t = divergence_target(v.detail)
        if t.op is None:
            what = "names no divergence" if divergence_of(v.detail) is None else "names no operator"
            self.notify(f"this verdict {what} to go to", severity="warning")
            return
        self.browser.open_orders(
            self.ref,
            op=t.op,
            invocation=t.invocation,
            node=t.node,
            tab=t.tab,
            search=t.index,
            highlight=t.where,
            last=t.last,
        )


__all__ = ["VerdictsScreen"]
