"""A virtual table over numpy columns: only the rows on screen are ever formatted."""

from __future__ import annotations

import textwrap

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from .._model import RowTable

#: Gutter marks: the cursor row and a row that matches the current search.
CURSOR_MARK, MATCH_MARK = "▸", "◆"


class ArrayTable(ScrollView, can_focus=True):
    """Scrollable rows of a :class:`RowTable`, with a cursor and search matches."""

    DEFAULT_CSS = """
    ArrayTable { height: 1fr; }
    ArrayTable > .array-table--header { text-style: bold; background: $panel; }
    ArrayTable > .array-table--cursor { background: $accent 40%; }
    ArrayTable:focus > .array-table--cursor { background: $accent; color: $text; }
    ArrayTable > .array-table--match { color: $warning; text-style: bold; }
    ArrayTable > .array-table--marked { color: $error; }
    ArrayTable > .array-table--odd { background: $boost; }
    ArrayTable > .array-table--note { color: $text-muted; text-style: italic; }
    """
    COMPONENT_CLASSES = {
        "array-table--header",
        "array-table--cursor",
        "array-table--match",
        "array-table--marked",
        "array-table--odd",
        "array-table--note",
    }
    BINDINGS = [
        Binding("up", "move(-1)", "Up", show=False),
        Binding("down", "move(1)", "Down", show=False),
        Binding("k", "move(-1)", "Up", show=False),
        Binding("j", "move(1)", "Down", show=False),
        Binding("left", "scroll_column(-1)", "Scroll left", show=False),
        Binding("right", "scroll_column(1)", "Scroll right", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "jump(0)", "First", show=False),
        Binding("end", "jump(-1)", "Last", show=False),
    ]

    cursor: reactive[int] = reactive(0, always_update=True)

    class CursorMoved(Message):
        """The cursor moved to row ``row``."""

        def __init__(self, table: ArrayTable, row: int) -> None:
            super().__init__()
            self.table = table
            self.row = row

    def __init__(
        self, *, name: str | None = None, id: str | None = None, classes: str | None = None
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.table: RowTable | None = None
        self.note = "loading…"
        self.matches = np.empty(0, np.int64)
        #: cursor moves typed while loading (None: not loading), replayed when rows arrive
        self.pending: list[tuple[str, int]] | None = None

    # ------------------------------------------------------------ data
    def wait(self, note: str = "loading…") -> None:
        """Show ``note`` until :meth:`show` brings rows; cursor keys typed meanwhile are
        kept and applied to those rows."""
        self.show(None, note)
        self.pending = []

    def show(self, table: RowTable | None, note: str = "") -> bool:
        """Display ``table`` (None: only ``note``), cursor on the first row, then apply the
        cursor keys typed while it loaded; True when there were any."""
        pending, self.pending = self.pending, None
        self.table = table
        self.note = note
        self.matches = np.empty(0, np.int64)
        rows = len(table) if table is not None else 0
        self.virtual_size = Size(self._row_width(), rows + 1)
        self.scroll_to(y=0, animate=False, immediate=True)
        self.cursor = 0
        for action, arg in pending or ():
            getattr(self, f"action_{action}")(arg)
        self.refresh()
        return bool(pending)

    def set_matches(self, rows: np.ndarray) -> None:
        """Mark ``rows`` (sorted row numbers) as search matches."""
        self.matches = rows
        self.refresh()

    @property
    def row_count(self) -> int:
        """Rows in the table."""
        return len(self.table) if self.table is not None else 0

    def row_text(self, row: int) -> str:
        """Row ``row`` as it is drawn, without the gutter."""
        assert self.table is not None
        return self._format(self.table.cells(row))

    # ------------------------------------------------------------ cursor
    def watch_cursor(self, row: int) -> None:
        visible = max(1, self.size.height - 1)
        top = round(self.scroll_offset.y)
        if row < top:
            self.scroll_to(y=row, animate=False, immediate=True)
        elif row >= top + visible:
            self.scroll_to(y=row - visible + 1, animate=False, immediate=True)
        self.refresh()
        self.post_message(self.CursorMoved(self, row))

    def go_to(self, row: int) -> None:
        """Put the cursor on ``row`` (clamped) and scroll it into view."""
        self.cursor = max(0, min(row, self.row_count - 1))

    def _held(self, action: str, arg: int) -> bool:
        """Keep a cursor move typed while loading; True when kept."""
        if self.pending is None:
            return False
        self.pending.append((action, arg))
        return True

    def action_move(self, delta: int) -> None:
        if not self._held("move", delta):
            self.go_to(self.cursor + delta)

    def action_page(self, pages: int) -> None:
        if not self._held("page", pages):
            self.go_to(self.cursor + pages * max(1, self.size.height - 2))

    def action_jump(self, row: int) -> None:
        if not self._held("jump", row):
            self.go_to(row if row >= 0 else self.row_count - 1)

    def action_scroll_column(self, step: int) -> None:
        """Scroll sideways to the start of the next (``step`` 1) or previous column."""
        starts, x = [], 0
        for col in self.table.columns if self.table is not None else ():
            starts.append(x)
            x += col.width + 1
        now = round(self.scroll_offset.x)
        if step > 0:
            target = next((s for s in starts if s > now), now)
        else:
            target = next((s for s in reversed(starts) if s < now), 0)
        self.scroll_to(x=min(target, self.max_scroll_x), animate=False, immediate=True)

    # ------------------------------------------------------------ drawing
    def _row_width(self) -> int:
        if self.table is None:
            return 1
        return 2 + sum(c.width + 1 for c in self.table.columns)

    def _format(self, cells: list[str]) -> str:
        assert self.table is not None
        out = []
        for col, text in zip(self.table.columns, cells, strict=True):
            text = text if len(text) <= col.width else text[: col.width - 1] + "…"
            out.append(text.ljust(col.width) if col.left else text.rjust(col.width))
        return " ".join(out)

    def _is_match(self, row: int) -> bool:
        k = int(np.searchsorted(self.matches, row))
        return k < len(self.matches) and int(self.matches[k]) == row

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self.rich_style
        x = round(self.scroll_offset.x)  # the gutter stays; the columns scroll sideways
        if y == 0:
            head = (
                "  " + self._format([c.name for c in self.table.columns])[x:] if self.table else ""
            )
            style = base + self.get_component_rich_style("array-table--header")
            return self._strip(head, style, width)
        row = round(self.scroll_offset.y) + y - 1
        table = self.table
        if table is None or len(table) == 0:
            lines = textwrap.wrap(self.note, max(10, width - 3)) or [""]
            if y - 1 < len(lines):
                style = base + self.get_component_rich_style("array-table--note")
                return self._strip("  " + lines[y - 1], style, width)
            return self._strip("", base, width)
        if row >= len(table):
            return self._strip("", base, width)
        style = base
        if table.group is not None and int(table.group[row]) % 2:
            style += self.get_component_rich_style("array-table--odd")
        if table.marked is not None and bool(table.marked[row]):
            style += self.get_component_rich_style("array-table--marked")
        match = self._is_match(row)
        if match:
            style += self.get_component_rich_style("array-table--match")
        if row == self.cursor:
            style += self.get_component_rich_style("array-table--cursor")
        mark = CURSOR_MARK if row == self.cursor else MATCH_MARK if match else " "
        return self._strip(f"{mark} {self.row_text(row)[x:]}", style, width)

    @staticmethod
    def _strip(text: str, style: Style, width: int) -> Strip:
        return Strip([Segment(text[:width].ljust(width), style)], width)


__all__ = ["CURSOR_MARK", "MATCH_MARK", "ArrayTable"]
