"""A row-cursor ``DataTable`` where Home and End move the cursor to the first and last row,
and j and k move it down and up as the arrow keys do."""

from __future__ import annotations

from textual.binding import Binding
from textual.widgets import DataTable


class ListTable(DataTable[object]):
    """``DataTable`` whose Home/End jump the cursor (the stock ones only scroll sideways)
    and whose j/k move it like ↓/↑."""

    BINDINGS = [
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
        Binding("home", "first_row", "First", show=False),
        Binding("end", "last_row", "Last", show=False),
    ]

    def action_first_row(self) -> None:
        """Put the cursor on the first row."""
        if self.row_count:
            self.move_cursor(row=0)

    def action_last_row(self) -> None:
        """Put the cursor on the last row."""
        if self.row_count:
            self.move_cursor(row=self.row_count - 1)


__all__ = ["ListTable"]
