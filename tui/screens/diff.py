"""Two runs side by side and the first event where their per-node logs differ."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Footer, Header, Static
from textual.worker import get_current_worker

from .. import _format as fmt
from .._model import NodeDiff, first_difference
from .._repo import BrowseError, RunRef, RunView
from .._rundiff import setup_differences
from ._base import BrowserScreen


class _Cancelled(Exception):
    """The diff screen was closed while comparing."""


def _side(label: str, view: RunView) -> Text:
    info = view.info
    text = Text()
    text.append(f"{label} {fmt.text(info.app or '?', 40)}", style="bold")
    text.append(f"  {fmt.short_id(info.run_id)}\n")
    text.append(f"{fmt.short_path(view.ref.path, 36)}\n", style="dim")
    text.append(f"{info.status}  {info.ranks}×{info.threads}  {fmt.duration(info.duration)}\n")
    for name, values in view.objectives().items():
        if values:
            text.append(f"{fmt.text(name, 40)} {values[-1]:.6g}  ")
    text.rstrip()
    return text


class DiffScreen(BrowserScreen):
    """Compares the event logs of two runs node by node, stopping at the first difference."""

    VIEW_NAME = "diff"
    BINDINGS = [
        Binding("a", "open('a')", "Open A"),
        Binding("b", "open('b')", "Open B"),
    ]

    def __init__(self, a: RunRef, b: RunRef) -> None:
        super().__init__()
        self.refs = {"a": a, "b": b}
        self.results: list[NodeDiff] = []
        #: how B was set up differently from A (parameters, versions, plans), in words
        self.setup: list[str] = []
        self.done = False

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="diff-heads")
        yield Static(id="diff-status")
        with VerticalScroll(id="diff-box"):
            yield Static(id="diff-body")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "Diff"
        try:
            va, vb = self.repo.run(self.refs["a"]), self.repo.run(self.refs["b"])
            heads = Table.grid(expand=True, padding=(0, 1))
            heads.add_column(ratio=1)
            heads.add_column(ratio=1)
            heads.add_row(_side("A", va), _side("B", vb))
            self.query_one("#diff-heads", Static).update(heads)
            nodes = sorted(set(va.nodes()) | set(vb.nodes()))
            self.setup = setup_differences(va.info, vb.info, va.operators(), vb.operators())
        except BrowseError as exc:
            self._status(Text(str(exc), style="bold red"))
            self.show_error(str(exc))
            return
        self.query_one("#diff-box").focus()
        self.query_one("#diff-body", Static).update(self._body())
        self._status(Text("comparing…", style="dim"))
        self._compare(va, vb, nodes)

    def _status(self, text: Text) -> None:
        self.query_one("#diff-status", Static).update(text)

    @work(thread=True, exclusive=True, group="diff", exit_on_error=False)
    def _compare(self, va: RunView, vb: RunView, nodes: list[int]) -> None:
        worker = get_current_worker()

        def tick(n: int, node: int = 0) -> None:
            if worker.is_cancelled:
                raise _Cancelled
            msg = Text(f"comparing node {node}: {fmt.count(n)} events equal so far", style="dim")
            self.deliver(self._status, msg)

        try:
            for node in nodes:
                res = first_difference(
                    node, va.events(node), vb.events(node), tick=lambda n, p=node: tick(n, p)
                )
                self.deliver(self._add, res)
        except _Cancelled:
            return
        except BrowseError as exc:
            self.deliver(self._failed, str(exc))
            return
        # anything else a hostile trace makes the comparison raise: said, not a view
        # that shows "comparing…" for ever (a worker's error is otherwise silent)
        except Exception as exc:  # noqa: BLE001
            self.deliver(self._failed, f"cannot compare the logs: {fmt.text(exc, 200)}")
            return
        self.deliver(self._finish)

    def _failed(self, message: str) -> None:
        self._status(Text(message, style="bold red"))
        self.show_error(message)

    def _add(self, res: NodeDiff) -> None:
        self.results.append(res)
        self.query_one("#diff-body", Static).update(self._body())

    def _finish(self) -> None:
        self.done = True
        diffs = [r for r in self.results if r.first is not None]
        if not diffs:
            total = sum(r.compared for r in self.results)
            self._status(Text(f"identical: {fmt.count(total)} events on every node", "green"))
            return
        first = min(diffs, key=lambda r: (r.first, r.node))
        msg = Text("first difference: ", style="bold red")
        msg.append(f"node {first.node}, event {first.first}: ")
        msg.append(
            "A " + (fmt.event_words(first.a) if first.a is not None else "has no more events")
        )
        msg.append(" / ")
        msg.append(
            "B " + (fmt.event_words(first.b) if first.b is not None else "has no more events")
        )
        msg.append(f"; {len(diffs)} of {len(self.results)} node(s) differ", style="dim")
        self._status(msg)

    def _body(self) -> Group:
        setup = Text()
        if self.setup:  # why the logs may differ, before where they do
            setup.append("set up differently (A vs B):", "bold")
            for line in self.setup:
                setup.append("\n  " + line, "yellow")
        else:
            setup.append(
                "set up alike: same program, parameters, shape, seed, code, versions, plans",
                "green",
            )
        grid = Table.grid(expand=True, padding=(0, 1))
        grid.add_column(ratio=1, overflow="fold")
        grid.add_column(ratio=1, overflow="fold")
        for r in self.results:
            if r.first is None:
                grid.add_row(
                    Text(f"node {r.node}: same {fmt.count(r.compared)} events", "green"), ""
                )
                continue
            grid.add_row(Text(f"node {r.node}: differs at event {r.first}", "bold red"), "")
            for x, y in r.before:
                grid.add_row(Text(fmt.event_line(x), "dim"), Text(fmt.event_line(y), "dim"))
            a = fmt.event_line(r.a) if r.a is not None else "(log ends)"
            b = fmt.event_line(r.b) if r.b is not None else "(log ends)"
            grid.add_row(Text("A " + a, "bold yellow"), Text("B " + b, "bold yellow"))
        return Group(setup, grid)

    def action_open(self, side: str) -> None:
        """Open the overview of run A or B."""
        self.browser.open_run(self.refs[side])


__all__ = ["DiffScreen"]
