"""A row-cursor ``DataTable`` where Home and End move the cursor to the first and last row,
j and k move it down and up as the arrow keys do, and ← → scroll a column at a time; a
text cell is shown as text."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.binding import Binding
from textual.widgets import DataTable

from .. import _format as fmt


def shown(cell: Any) -> Any:
    """A cell as the table should show it: text as plain text.  ``DataTable`` reads a
    ``str`` cell as Rich markup, and the cells name what a trace holds (its app,
    operators, DDS, errors: hostile text): ``[/bold]`` in an operator's name stopped the
    browser with a MarkupError, and ``[on red]`` would restyle the row.  Control
    characters are escaped as the CLI does, and a cell is cut to :data:`fmt.TEXT_CHARS`
    (a 100,000-character name made its column that wide) (:func:`fmt.text`)."""
    if isinstance(cell, str):
        return Text(fmt.text(cell))
    if isinstance(cell, Text):  # styled by us; its text may still come from the trace
        safe = fmt.text(cell.plain)
        if safe != cell.plain:
            return Text(safe, style=cell.style)
    return cell


class ListTable(DataTable[object]):
    """``DataTable`` whose Home/End jump the cursor (the stock ones only scroll sideways)
    and whose j/k move it like ↓/↑."""

    BINDINGS = [
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
        Binding("left", "scroll_column(-1)", "Scroll left", show=False),
        Binding("right", "scroll_column(1)", "Scroll right", show=False),
        Binding("home", "first_row", "First", show=False),
        Binding("end", "last_row", "Last", show=False),
    ]

    def add_row(self, *cells: Any, **kwargs: Any) -> Any:
        """Add a row; text cells are shown as text (:func:`shown`)."""
        return super().add_row(*(shown(c) for c in cells), **kwargs)

    def update_cell(self, row_key: Any, column_key: Any, value: Any, **kwargs: Any) -> None:
        """Change a cell; text is shown as text (:func:`shown`)."""
        super().update_cell(row_key, column_key, shown(value), **kwargs)

    def action_first_row(self) -> None:
        """Put the cursor on the first row."""
        if self.row_count:
            self.move_cursor(row=0)

    def action_scroll_column(self, step: int) -> None:
        """Scroll sideways to the start of the next (``step`` 1) or previous column; with
        a cell or column cursor, move the cursor instead (the stock ← →)."""
        if self.cursor_type in ("cell", "column"):
            (self.action_cursor_right if step > 0 else self.action_cursor_left)()
            return
        starts, x = [], 0
        for column in self.ordered_columns:
            starts.append(x)
            x += column.get_render_width(self)
        now = round(self.scroll_x)
        if step > 0:
            target = next((s for s in starts if s > now), now)
        else:
            target = next((s for s in reversed(starts) if s < now), 0)
        self.scroll_to(x=min(target, self.max_scroll_x), animate=False, immediate=True)

    def action_last_row(self) -> None:
        """Put the cursor on the last row."""
        if self.row_count:
            self.move_cursor(row=self.row_count - 1)


__all__ = ["ListTable", "shown"]
