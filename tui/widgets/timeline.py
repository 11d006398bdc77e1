"""Task groups of one invocation over time: one lane per (node, thread), zoomable."""

from __future__ import annotations

import textwrap

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from .._model import Lane, Timeline

#: Width of the lane labels (``n0 t1 │``).
LABEL = 8
#: Cell glyphs: a task group, one run under per-element locks, the cell where a group starts.
TASK, LOCKED, START = "█", "▓", "▌"
#: Colours of rounds (cycled); consecutive task groups in a lane alternate brightness.
ROUND_COLOURS = ("green", "blue", "magenta", "cyan", "yellow", "red")
#: Columns between time-axis ticks.
TICK_EVERY = 16


def _fmt_time(t: float, unit: str) -> str:
    if unit != "s":
        return f"{t:.0f}"
    if t == 0:
        return "0"
    if t < 1e-3:
        return f"{t * 1e6:.0f}µs"
    if t < 1.0:
        return f"{t * 1e3:.3g}ms"
    return f"{t:.3g}s"


class TimelineView(ScrollView, can_focus=True):
    """Draws a :class:`Timeline`; ``zoom`` changes columns per time unit."""

    DEFAULT_CSS = """
    TimelineView { height: 1fr; }
    """

    def __init__(
        self, *, name: str | None = None, id: str | None = None, classes: str | None = None
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.timeline: Timeline | None = None
        self.note = "loading…"
        self.scale = 0.0  # columns per time unit; 0 = fit to width
        self.fit = True

    # ------------------------------------------------------------ state
    def show(self, timeline: Timeline | None, note: str = "") -> None:
        """Draw ``timeline`` fitted to the width (None: only ``note``)."""
        self.timeline = timeline
        self.note = note
        self.fit = True
        self._resize()
        self.scroll_to(x=0, y=0, animate=False, immediate=True)
        self.refresh()

    @property
    def plot_width(self) -> int:
        """Columns available for time."""
        return max(1, self.size.width - LABEL)

    def _resize(self) -> None:
        tl = self.timeline
        if tl is None or tl.total <= 0:
            self.scale = 1.0
            self.virtual_size = Size(self.size.width, 3)
            return
        if self.fit:
            self.scale = self.plot_width / tl.total
        cols = max(self.plot_width, int(np.ceil(tl.total * self.scale)))
        self.virtual_size = Size(LABEL + cols, len(tl.lanes) + 2)

    def on_resize(self) -> None:
        self._resize()

    def zoom(self, factor: float) -> None:
        """Zoom by ``factor`` around the middle of the view (factor < 1 zooms out)."""
        tl = self.timeline
        if tl is None or tl.total <= 0:
            return
        middle = (self.scroll_offset.x + self.plot_width / 2) / self.scale
        fitted = self.plot_width / tl.total
        self.scale = max(fitted, min(self.scale * factor, fitted * 2**20))
        self.fit = self.scale == fitted
        self._resize()
        x = max(0.0, middle * self.scale - self.plot_width / 2)
        # the new virtual size bounds scrolling only after the next layout
        self.call_after_refresh(self.scroll_to, x=x, animate=False)
        self.refresh()

    def zoom_fit(self) -> None:
        """Fit the whole invocation into the width."""
        self.fit = True
        self._resize()
        self.scroll_to(x=0, animate=False)
        self.refresh()

    @property
    def zoom_level(self) -> float:
        """How many times the fitted scale is magnified."""
        tl = self.timeline
        if tl is None or tl.total <= 0:
            return 1.0
        return self.scale / (self.plot_width / tl.total)

    # ------------------------------------------------------------ drawing
    def _strip(self, text: str, width: int, style: Style | None = None) -> Strip:
        return Strip([Segment(text[:width].ljust(width), style or self.rich_style)], width)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        tl = self.timeline
        if tl is None or not tl.lanes:
            lines = textwrap.wrap(self.note, max(10, width - 1)) or [""]
            return self._strip(lines[y] if y < len(lines) else "", width, self._dim())
        x0 = round(self.scroll_offset.x)
        if y == 0:
            return self._axis(tl, x0, width)
        if y == 1:
            return self._rounds(tl, x0, width)
        k = round(self.scroll_offset.y) + y - 2
        if k >= len(tl.lanes):
            return self._strip("", width)
        return self._lane(tl.lanes[k], x0, width)

    def _axis(self, tl: Timeline, x0: int, width: int) -> Strip:
        cells = [" "] * self.plot_width
        first = -(-x0 // TICK_EVERY) * TICK_EVERY
        for col in range(first, x0 + self.plot_width, TICK_EVERY):
            label = "╵" + _fmt_time(col / self.scale, tl.unit)
            at = col - x0
            if at + len(label) <= len(cells):
                cells[at : at + len(label)] = label
        unit = "time" if tl.unit == "s" else "bodies"
        return self._strip(unit.ljust(LABEL - 1) + " " + "".join(cells), width, self._dim())

    def _rounds(self, tl: Timeline, x0: int, width: int) -> Strip:
        cells = [" "] * self.plot_width
        free = 0
        starts = [int(s * self.scale) - x0 for s in tl.round_starts]
        for r, at in enumerate(starts):
            label = f"r{r}"
            if at < 0:  # the round already running at the left edge is named there
                nxt = starts[r + 1] if r + 1 < len(starts) else self.plot_width
                if nxt <= len(label):
                    continue
                at = 0
            if at + len(label) > len(cells) or at < free:
                continue
            cells[at : at + len(label)] = label
            free = at + len(label) + 1
        return self._strip("rounds".ljust(LABEL - 1) + " " + "".join(cells), width, self._dim())

    def _dim(self) -> Style:
        return self.rich_style + Style(dim=True)

    def _lane(self, lane: Lane, x0: int, width: int) -> Strip:
        name = f"n{lane.node} t{lane.thread}" if lane.thread >= 0 else f"n{lane.node}"
        label = name[: LABEL - 2].ljust(LABEL - 2) + " │"
        segs = [Segment(label, self._dim())]
        cols = np.arange(x0, x0 + self.plot_width)
        left, right = cols / self.scale, (cols + 1) / self.scale
        first = np.searchsorted(lane.end, left, side="right")
        last = np.searchsorted(lane.start, right, side="left") - 1
        occupied = (first <= last) & (first < len(lane.end))
        base = self.rich_style
        run_text, run_style = "", None
        for c in range(self.plot_width):
            if not occupied[c]:
                ch, style = " ", base
            else:
                s = int(last[c])  # the latest group in this cell
                starts_here = left[c] <= lane.start[s] < right[c]
                ch = START if starts_here else LOCKED if lane.locked[s] else TASK
                colour = ROUND_COLOURS[int(lane.round[s]) % len(ROUND_COLOURS)]
                style = base + Style(color=colour, bold=bool(s % 2))
            if style != run_style and run_text:
                segs.append(Segment(run_text, run_style))
                run_text = ""
            run_text += ch
            run_style = style
        if run_text:
            segs.append(Segment(run_text, run_style))
        return Strip(segs).adjust_cell_length(width, base)


__all__ = ["LABEL", "LOCKED", "START", "TASK", "TimelineView"]
