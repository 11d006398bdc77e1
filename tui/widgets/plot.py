"""A line plot drawn with braille dots (2×4 per cell), for objective curves."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from rich.text import Text
from textual.widget import Widget

#: Braille dot bit for (row within cell 0..3, column within cell 0..1).
_DOTS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))
#: Width of the y-axis labels.
LABEL_WIDTH = 9


def _label(v: float) -> str:
    return f"{v:.4g}"[:LABEL_WIDTH].rjust(LABEL_WIDTH)


def braille_lines(values: Sequence[float], width: int, height: int) -> list[str]:
    """``values`` as a polyline on a ``width``×``height`` grid of braille characters.

    Points are spread evenly over the width (first on the left edge, last on the
    right) and scaled between the finite minimum (bottom) and maximum (top).
    """
    w, h = max(1, width) * 2, max(1, height) * 4
    grid = np.zeros((h, w), dtype=bool)
    vals = np.asarray(values, dtype=np.float64)
    finite = vals[np.isfinite(vals)]
    if len(finite):
        lo, hi = float(finite.min()), float(finite.max())
        n = len(vals)
        xs = [0.0] if n == 1 else [k * (w - 1) / (n - 1) for k in range(n)]
        ys = [
            None
            if not math.isfinite(v)
            else (h - 1) / 2
            if hi == lo
            else (h - 1) * (1 - (v - lo) / (hi - lo))
            for v in vals.tolist()
        ]
        prev: tuple[float, float] | None = None
        for x, y in zip(xs, ys, strict=True):
            if y is None:
                prev = None
                continue
            if prev is None:
                grid[round(y), round(x)] = True
            else:
                steps = int(max(abs(x - prev[0]), abs(y - prev[1]))) + 1
                for s in range(steps + 1):
                    f = s / steps
                    py, px = prev[1] + (y - prev[1]) * f, prev[0] + (x - prev[0]) * f
                    grid[round(py), round(px)] = True
            prev = (x, y)
    lines = []
    for r in range(0, h, 4):
        chars = []
        for c in range(0, w, 2):
            bits = 0
            for dr in range(4):
                for dc in range(2):
                    if grid[r + dr, c + dc]:
                        bits |= _DOTS[dr][dc]
            chars.append(chr(0x2800 + bits))
        lines.append("".join(chars))
    return lines


class BraillePlot(Widget):
    """One named series per iteration, with its range on the y axis."""

    DEFAULT_CSS = """
    BraillePlot { height: 1fr; min-height: 5; }
    """

    def __init__(
        self,
        *,
        axis: str = "iteration",
        empty: str = "no objective values recorded",
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.title = ""
        self.values: list[float] = []
        #: the name of the x axis, and what an empty plot says
        self.axis = axis
        self.empty = empty

    def plot(self, title: str, values: Sequence[float]) -> None:
        """Draw ``values`` (one per iteration) under ``title``."""
        self.title = title
        self.values = [float(v) for v in values]
        self.refresh()

    def render(self) -> Text:
        width, height = self.size.width, self.size.height
        out = Text(no_wrap=True, overflow="crop")
        out.append(self.title[:width] + "\n", style="bold")
        if not self.values:
            out.append(f"  {self.empty}", style="italic")
            return out
        plot_w, plot_h = max(2, width - LABEL_WIDTH - 2), max(1, height - 3)
        finite = [v for v in self.values if math.isfinite(v)]
        lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
        for k, line in enumerate(braille_lines(self.values, plot_w, plot_h)):
            label = _label(hi) if k == 0 else _label(lo) if k == plot_h - 1 else " " * LABEL_WIDTH
            out.append(label + " ┤", style="dim")
            out.append(line + "\n", style="bold green")
        out.append(" " * LABEL_WIDTH + " └" + "─" * plot_w + "\n", style="dim")
        last = str(len(self.values) - 1)
        axis = "0" + self.axis.center(max(0, plot_w - 1 - len(last)))[: plot_w - 1 - len(last)]
        out.append(" " * (LABEL_WIDTH + 2) + axis + last, style="dim")
        return out


__all__ = ["BraillePlot", "braille_lines"]
