"""The run overview: metadata, parameters, per-operator table and objective curves."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Header, Static

from .. import _format as fmt
from .._repo import BrowseError, RunRef, RunView
from ..widgets import ListTable
from ..widgets.plot import BraillePlot
from ._base import BrowserScreen

#: Columns of the operator table: (label, width).
OP_COLUMNS = (
    ("operator", 10),
    ("inv", 4),
    ("bodies", 9),
    ("rounds", 6),
    ("strategy", 10),
    ("time", 6),
    ("grants", 8),
    ("msgs", 6),
)


#: The widest the operator column gets (a longer name is cut; ← → scroll the table).
OP_WIDTH_MAX = 32


class OverviewScreen(BrowserScreen):
    """One run at a glance; the operator under the cursor is what t and o open."""

    VIEW_NAME = "run overview"
    BINDINGS = [
        Binding("enter", "timeline", "Timeline", priority=True, show=False),
        Binding("t", "timeline", "Timeline"),
        Binding("o", "orders", "Orders"),
        Binding("v", "verdicts", "Verdicts"),
        Binding("c", "curve", "Next curve"),
        Binding("h", "history", "Element history", show=False),
    ]

    def __init__(self, ref: RunRef) -> None:
        super().__init__()
        self.ref = ref
        self.view: RunView | None = None
        self.ops: list[str] = []
        self.curve = 0

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="meta")
        yield ListTable(id="ops", cursor_type="row")
        yield BraillePlot(id="plot")
        yield Footer()

    def on_mount(self) -> None:
        self.title = f"Run {fmt.short_id(self.ref.run_id)}"
        table = self.query_one("#ops", DataTable)
        try:
            self.view = self.repo.run(self.ref)
            longest = max(map(len, self.view.operators()), default=0)
            self._columns(table, longest)
            self._fill(self.view)
        except BrowseError as exc:
            if not table.columns:
                self._columns(table, 0)
            self.query_one("#meta", Static).update(Text(str(exc), style="bold red"))
            self.show_error(str(exc))
        table.focus()

    @staticmethod
    def _columns(table: DataTable, longest: int) -> None:
        """The operator column as wide as the longest name, up to OP_WIDTH_MAX."""
        for label, width in OP_COLUMNS:
            if label == "operator":
                width = min(max(width, longest), OP_WIDTH_MAX)
            table.add_column(label, width=width, key=label)

    def _fill(self, view: RunView) -> None:
        info = view.info
        meta = Text()
        meta.append(fmt.text(info.app or "?", 60), style="bold")
        meta.append(f"  {fmt.text(info.target, 60)}  run {fmt.text(info.run_id, 64)}\n")
        meta.append(info.status, style="green" if info.status == "finished" else "bold red")
        meta.append(f"  {fmt.when(info.started_at)}  took {fmt.duration(info.duration)}")
        meta.append(f"  {info.ranks} ranks × {info.threads} threads  seed {info.seed}\n")
        params = " ".join(f"{k}={v}" for k, v in sorted(info.params.items())) or "(none)"
        meta.append("params ", style="dim")
        meta.append(fmt.text(params, 240) + "\n")
        meta.append("store ", style="dim")
        meta.append(f"{fmt.size(view.store_bytes())}  code {info.code_digest[:12] or '-'}")
        verdicts = view.verdicts()
        if verdicts:
            meta.append("  verdicts ", style="dim")
            meta.append(fmt.verdict_summary(verdicts))
        if info.error:
            meta.append("\n" + fmt.text(fmt.last_line(info.error), 240), style="red")
        self.query_one("#meta", Static).update(meta)
        table = self.query_one("#ops", DataTable)
        ops = view.operators()
        self.ops = list(ops)
        for op, s in ops.items():
            table.add_row(
                op,
                str(s.invocations),
                fmt.count(s.bodies),
                str(s.rounds),
                s.strategy or "-",
                fmt.duration(view.op_seconds(op)),
                fmt.count(s.lock_grants),
                fmt.count(s.messages),
                key=op,
            )
        self._fit_ops()
        self._plot()

    def _fit_ops(self) -> None:
        """The operators table tall enough for its header, up to five rows and, when its
        columns are wider than the screen, the horizontal scrollbar (which would hide
        the last row: a long operator name made the only row disappear at 80 columns)."""
        table = self.query_one("#ops", DataTable)
        wide = sum(c.get_render_width(table) for c in table.columns.values())
        room = self.app.size.width - 2  # the table's margin: one column on each side
        rows = min(table.row_count, 5)
        table.styles.height = rows + 1 + (1 if wide > room else 0)

    def on_resize(self) -> None:
        if self.view is not None:
            self._fit_ops()

    def _plot(self) -> None:
        assert self.view is not None
        curves = self.view.objectives()
        plot = self.query_one("#plot", BraillePlot)
        if not curves:
            plot.plot("objectives", [])
            return
        names = list(curves)
        self.curve %= len(names)
        name = names[self.curve]
        values = curves[name]
        title = f"{fmt.text(name, 60)}: {len(values)} iteration(s), last {values[-1]:.6g}"
        if len(names) > 1:
            title += f"  [{self.curve + 1}/{len(names)}, c: next]"
        plot.plot(title, values)

    # ------------------------------------------------------------ actions
    def _op(self) -> str | None:
        table = self.query_one("#ops", DataTable)
        if not self.ops:
            self.notify("this run has no operators", severity="warning")
            return None
        return self.ops[max(0, min(table.cursor_row, len(self.ops) - 1))]

    def action_history(self) -> None:
        """Ask for an element such as W[17] and show its value per invocation."""
        self.browser.ask_history(self.ref)

    def action_timeline(self) -> None:
        """Open the timeline of the operator under the cursor."""
        op = self._op()
        if op is not None:
            self.browser.open_timeline(self.ref, op)

    def action_orders(self) -> None:
        """Open the orders of the operator under the cursor."""
        op = self._op()
        if op is not None:
            self.browser.open_orders(self.ref, op=op)

    def action_verdicts(self) -> None:
        """Open this run's verdicts."""
        self.browser.open_verdicts(self.ref)

    def action_curve(self) -> None:
        """Plot the next objective."""
        if self.view is not None:
            self.curve += 1
            self._plot()


__all__ = ["OverviewScreen"]
