"""A row-cursor ``DataTable`` where Home and End move the cursor to the first and last row,
j and k move it down and up as the arrow keys do, and ← → scroll a column at a time."""

from __future__ import annotations

from textual.binding import Binding
from textual.widgets import DataTable


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


__all__ = ["ListTable"]
