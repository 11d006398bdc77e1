"""The timeline: rounds and task groups of one invocation, per node and thread."""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, Header, Static

from .. import _format as fmt
from .._model import Timeline
from .._repo import BrowseError, RunRef, RunView
from ..widgets.timeline import LOCKED, START, TASK, TimelineView
from ._base import BrowserScreen

#: Zoom step of + and -.
ZOOM_STEP = 2.0


class TimelineScreen(BrowserScreen):
    """Task groups over time; + and - zoom, arrows scroll, [ and ] change invocation."""

    VIEW_NAME = "timeline"
    BINDINGS = [
        Binding("plus,equals_sign", "zoom(2.0)", "Zoom in", key_display="+"),
        Binding("minus", "zoom(0.5)", "Zoom out", key_display="-"),
        Binding("0", "fit", "Fit"),
        Binding("left_square_bracket", "step(-1)", "Prev inv", key_display="["),
        Binding("right_square_bracket", "step(1)", "Next inv", key_display="]"),
        Binding("o", "next_op", "Next operator", show=False),
        Binding("enter", "orders", "Orders of this invocation", show=False),
    ]

    def __init__(self, ref: RunRef, op: str, invocation: int = 0) -> None:
        super().__init__()
        self.ref = ref
        self.op = op
        self.invocation = invocation
        self.view: RunView | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="where")
        yield TimelineView(id="timeline")
        yield Static(id="legend")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "Timeline"
        legend = Text()
        legend.append(f"{TASK} task group  {LOCKED} under locks  {START} group starts")
        legend.append("  colour: round", style="dim")
        self.query_one("#legend", Static).update(legend)
        try:
            self.view = self.repo.run(self.ref)
        except BrowseError as exc:
            self._failed(str(exc))
            return
        self.query_one(TimelineView).focus()
        self.load()

    def _header(self, tl: Timeline | None = None) -> None:
        assert self.view is not None
        view, op = self.view, self.op
        invs: list[int] = self.attempt(lambda: view.invocation_numbers(op), [])
        text = Text()
        text.append(fmt.text(self.op, 60), style="bold")
        text.append(f" invocation {self.invocation}")
        text.append(f" of {len(invs)}" if invs else " (none completed)", style="dim")
        if tl is not None:
            widget = self.query_one(TimelineView)
            how = "from recorded round times" if tl.unit == "s" else "from body counts"
            how = "from recorded per-thread times" if tl.thread_timed else how
            how = how if tl.planned else "no plan: rounds only"
            text.append(f"  zoom ×{widget.zoom_level:.0f}  {how}", style="dim")
        self.query_one("#where", Static).update(text)

    def load(self) -> None:
        """Load and draw the current invocation."""
        self.query_one(TimelineView).show(None, "loading…")
        self._header()
        self._load(self.op, self.invocation)

    @work(thread=True, exclusive=True, group="timeline", exit_on_error=False)
    def _load(self, op: str, invocation: int) -> None:
        assert self.view is not None
        try:
            tl = self.view.timeline(op, invocation)
        except BrowseError as exc:
            self.deliver(self._failed, str(exc))
            return
        self.deliver(self._show, tl)

    def _show(self, tl: Timeline) -> None:
        if (tl.op, tl.invocation) != (self.op, self.invocation):
            return
        self.query_one(TimelineView).show(tl, "no task groups in this invocation")
        self._header(tl)

    def _failed(self, message: str) -> None:
        self.query_one(TimelineView).show(None, message)
        self.show_error(message)

    # ------------------------------------------------------------ actions
    def action_zoom(self, factor: float) -> None:
        """Zoom in (factor > 1) or out around the middle of the view."""
        self.query_one(TimelineView).zoom(factor)
        self._header(self.query_one(TimelineView).timeline)

    def action_fit(self) -> None:
        """Fit the invocation to the width."""
        self.query_one(TimelineView).zoom_fit()
        self._header(self.query_one(TimelineView).timeline)

    def action_step(self, delta: int) -> None:
        """Show the previous or next invocation of the operator."""
        if self.view is None:
            return
        view, op = self.view, self.op
        invs: list[int] = self.attempt(lambda: view.invocation_numbers(op), [])
        if not invs:
            return
        k = invs.index(self.invocation) if self.invocation in invs else 0
        self.invocation = invs[max(0, min(k + delta, len(invs) - 1))]
        self.load()

    def action_next_op(self) -> None:
        """Show the first invocation of the next operator."""
        if self.view is None:
            return
        view = self.view
        ops: list[str] = self.attempt(lambda: list(view.operators()), [])
        if ops:
            self.op = ops[(ops.index(self.op) + 1) % len(ops)] if self.op in ops else ops[0]
            self.invocation = 0
            self.load()

    def action_orders(self) -> None:
        """Open the orders of this invocation."""
        self.browser.open_orders(self.ref, op=self.op, invocation=self.invocation)


__all__ = ["TimelineScreen"]
