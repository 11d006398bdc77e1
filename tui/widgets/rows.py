"""A row-cursor ``DataTable`` where Home and End move the cursor to the first and last row."""

from __future__ import annotations

from textual.binding import Binding
from textual.widgets import DataTable


class ListTable(DataTable[object]):
    """``DataTable`` whose Home/End jump the cursor (the stock ones only scroll sideways)."""

    BINDINGS = [
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
