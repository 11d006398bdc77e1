"""The orders view: lock grants per lock, messages per channel, loop indices per thread."""

from __future__ import annotations

import numpy as np
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Footer, Header, Input, Label, Static, TabbedContent, TabPane

from .. import _format as fmt
from .._model import RowTable
from .._repo import BrowseError, RunRef, RunView
from ..widgets.table import ArrayTable
from ._base import BrowserScreen

#: Tabs: id, title, what the search looks for, and what an empty table means.
TABS = {
    "locks": (
        "1 Lock grants",
        "loop index",
        "no lock hand-overs (no split groups, or grants in the predicted order)",
    ),
    "messages": ("2 Messages", "event number", "no messages received"),
    "index": ("3 Index order", "loop index", "no loop indices"),
    "sync": ("4 Sync", "clock", "no sync_for aggregation, visibility or mutex orders"),
    "outcome": ("5 Outcome", "event number", "no digests recorded for this invocation"),
}


class OrdersScreen(BrowserScreen):
    """Recorded orders of one invocation, filtered by node, operator and invocation."""

    VIEW_NAME = "orders"
    BINDINGS = [
        Binding("1", "tab('locks')", "Locks", show=False),
        Binding("2", "tab('messages')", "Messages", show=False),
        Binding("3", "tab('index')", "Index order", show=False),
        Binding("4", "tab('sync')", "Sync orders", show=False),
        Binding("5", "tab('outcome')", "Outcome digests", show=False),
        Binding("slash", "search", "Find index", key_display="/"),
        Binding("n", "match(1)", "Next match"),
        Binding("N", "match(-1)", "Previous match", key_display="N", show=False),
        Binding(
            "left_square_bracket",
            "invocation(-1)",
            "Previous invocation",
            key_display="[",
            show=False,
        ),
        Binding(
            "right_square_bracket", "invocation(1)", "Next invocation", key_display="]", show=False
        ),
        Binding("less_than_sign", "node(-1)", "Previous node", key_display="<", show=False),
        Binding("greater_than_sign", "node(1)", "Next node", key_display=">", show=False),
        Binding("o", "next_op", "Next operator", show=False),
        Binding("h", "history", "Element history"),
    ]

    def __init__(
        self,
        ref: RunRef,
        *,
        op: str | None = None,
        invocation: int | None = None,
        node: int | None = None,
        tab: str = "locks",
        search: int | None = None,
        highlight: tuple[tuple[str, object], ...] = (),
        last: bool = False,
    ) -> None:
        super().__init__()
        #: the value searched for, per meaning of the search ("loop index", "event number")
        self.searches: dict[str, int] = {} if search is None else {"loop index": search}
        self.ref = ref
        self.op = op
        self.invocation = invocation if invocation is not None else 0
        self.node = node
        self.tab = tab if tab in TABS else "locks"
        self.view: RunView | None = None
        self.loaded: dict[str, tuple[object, ...]] = {}
        #: rows to land on and highlight (column, value pairs; the last such row when
        #: ``last``), on the tab and filters the view opened with only
        self.highlight = highlight
        self.highlight_last = last
        self.highlight_key: tuple[object, ...] | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="filters")
        with TabbedContent(initial=self.tab, id="tabs"):
            for tab, (title, _, _) in TABS.items():
                with TabPane(title, id=tab):
                    yield ArrayTable(id=f"t-{tab}")
        with Horizontal(id="search-bar"):
            yield Label("find", id="search-label")
            yield Input(placeholder="enter: find, escape: cancel", type="integer", id="search")
        yield Static(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "Orders"
        self.query_one("#search-bar").display = False
        try:
            self.view = self.repo.run(self.ref)
            ops = list(self.view.operators())
        except BrowseError as exc:
            self._failed(str(exc))
            return
        if self.op is None or self.op not in ops:
            if self.op is not None:
                self.notify(f"operator {self.op!r} is not in this run", severity="warning")
            self.op = ops[0] if ops else None
        if self.highlight:
            self.highlight_key = self._key(self.tab)
        self.refresh_tab()

    # ------------------------------------------------------------ loading
    def _key(self, tab: str) -> tuple[object, ...]:
        return (tab, self.op, self.invocation, self.node)

    def _table(self, tab: str | None = None) -> ArrayTable:
        return self.query_one(f"#t-{tab or self.tab}", ArrayTable)

    def refresh_tab(self) -> None:
        """Show the filters and (re)load the active tab if its filters changed."""
        self._filters()
        table = self._table()
        table.focus()
        if self.op is None:
            table.show(None, "this run has no operators")
            return
        key = self._key(self.tab)
        if self.loaded.get(self.tab) == key:
            return
        self.loaded[self.tab] = key
        table.wait("loading…")
        self._load(self.tab, self.op, self.invocation, self.node)

    def _load(self, tab: str, op: str, invocation: int, node: int | None) -> None:
        # one exclusive group per tab: a newer load of the same tab supersedes an older
        # one, while loads of other tabs keep running
        self.run_worker(
            lambda: self._read(tab, op, invocation, node),
            thread=True,
            exclusive=True,
            group=f"orders-{tab}",
            exit_on_error=False,
        )

    def _read(self, tab: str, op: str, invocation: int, node: int | None) -> None:
        assert self.view is not None
        load = {
            "locks": self.view.lock_table,
            "messages": self.view.message_table,
            "index": self.view.index_table,
            "sync": self.view.sync_table,
            "outcome": self.view.outcome_table,
        }[tab]
        try:
            table = load(op, invocation, node)
        except BrowseError as exc:
            self.deliver(self._failed, str(exc), (tab, op, invocation, node))
            return
        self.deliver(self._show, (tab, op, invocation, node), table)

    def _show(self, key: tuple[object, ...], table: RowTable) -> None:
        tab = str(key[0])
        if self.loaded.get(tab) != key:
            return  # the filters moved on while this was loading
        typed = self._table(tab).show(table, TABS[tab][2])
        if tab == self.tab:
            self._apply_search(first=not typed)  # keys typed while loading win

    def _failed(self, message: str, key: tuple[object, ...] | None = None) -> None:
        if key is not None:
            self.loaded.pop(str(key[0]), None)
        self._table(str(key[0]) if key is not None else None).show(None, message)
        self.show_error(message)

    def _filters(self) -> None:
        text = Text()
        node = "all" if self.node is None else str(self.node)
        text.append("node ", style="dim")
        text.append(node, style="bold")
        text.append("  op ", style="dim")
        text.append(fmt.text(self.op or "-", 60), style="bold")
        text.append("  invocation ", style="dim")
        text.append(str(self.invocation), style="bold")
        view, op = self.view, self.op
        if view is not None and op is not None:
            invs: list[int] = self.attempt(lambda: view.invocation_numbers(op), [])
            if invs:
                text.append(f" of {invs[0]}..{invs[-1]}", style="dim")
        text.append("  (< > [ ] o)", style="dim")
        self.query_one("#filters", Static).update(text)

    def _status(self) -> None:
        table = self._table()
        text = Text()
        if table.table is not None:
            text.append(f"{fmt.count(table.row_count)} row(s)")
            if table.row_count:
                text.append(f", row {fmt.count(table.cursor + 1)}", style="dim")
        n = len(table.matches)
        if self.search is not None:
            what = TABS[self.tab][1]
            text.append(f"  {what} {self.search}: ", style="dim")
            text.append(f"{n} match(es)" if n else "not found", style="bold yellow")
        elif self._highlighting():
            text.append("  divergence: ", style="dim")
            text.append(f"{n} row(s)" if n else "no recorded row", style="bold yellow")
        if n:
            text.append("  n/N: next/prev", style="dim")
        self.query_one("#status", Static).update(text)

    @on(ArrayTable.CursorMoved)
    def _cursor_moved(self) -> None:
        self._status()

    @on(TabbedContent.TabActivated)
    def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        tab = event.pane.id
        if tab in TABS and tab != self.tab:
            self.tab = tab
            self.refresh_tab()
            self._apply_search(first=True)

    # ------------------------------------------------------------ search
    @property
    def search(self) -> int | None:
        """What the active tab searches for (None: nothing)."""
        return self.searches.get(TABS[self.tab][1])

    def _highlighting(self) -> bool:
        """True while the view shows the tab and filters it was opened on to highlight."""
        return bool(self.highlight) and self.highlight_key == self._key(self.tab)

    def _apply_search(self, *, first: bool) -> None:
        table = self._table()
        if table.table is None or (self.search is None and not self._highlighting()):
            table.set_matches(table.matches[:0])
            self._status()
            return
        last = False
        if self.search is not None:
            matches = table.table.find(self.search)
        else:
            matches = table.table.find_where(self.highlight)
            last = self.highlight_last
        table.set_matches(matches)
        if len(matches) and first:
            table.go_to(int(matches[-1 if last else 0]))
        self._status()

    def action_search(self) -> None:
        """Ask for a loop index (messages: an event number) to find."""
        box = self.query_one("#search", Input)
        self.query_one("#search-label", Label).update(f"find {TABS[self.tab][1]}:")
        box.value = "" if self.search is None else str(self.search)
        self.query_one("#search-bar").display = True
        box.focus()

    @on(Input.Submitted, "#search")
    def _searched(self, event: Input.Submitted) -> None:
        self.query_one("#search-bar").display = False
        value = event.value.strip()
        meaning = TABS[self.tab][1]
        if value.lstrip("-").isdigit():
            self.searches[meaning] = int(value)
        else:
            self.searches.pop(meaning, None)
        self._table().focus()
        self._apply_search(first=True)

    def action_match(self, step: int) -> None:
        """Move to the next (1) or previous (-1) search match, wrapping around."""
        table = self._table()
        m = table.matches
        if not len(m):
            self.notify("no matches: press / to search", severity="warning")
            return
        k = int(np.searchsorted(m, table.cursor, side="right" if step > 0 else "left"))
        k = k if step > 0 else k - 1
        table.go_to(int(m[k % len(m)]))

    def selected_element(self) -> str:
        """The element of the row under the cursor (lock tab), else ''."""
        table = self._table()
        if table.table is None or not table.row_count:
            return ""
        try:
            col = table.table.column("element")
        except KeyError:
            return ""
        return str(col[table.cursor])

    def action_history(self) -> None:
        """Ask for an element (the selected row's, if it names one) and show its value per
        invocation and last writer."""
        self.browser.ask_history(self.ref, self.selected_element())

    def action_back(self) -> None:
        """Close the search box if it is open, else leave the view."""
        bar = self.query_one("#search-bar")
        if bar.display:
            bar.display = False
            self._table().focus()
            return
        super().action_back()

    # ------------------------------------------------------------ filters
    def action_tab(self, tab: str) -> None:
        """Switch to a tab."""
        self.query_one("#tabs", TabbedContent).active = tab

    def action_invocation(self, step: int) -> None:
        """Show the previous or next invocation."""
        if self.view is None or self.op is None:
            return
        view, op = self.view, self.op
        invs: list[int] = self.attempt(lambda: view.invocation_numbers(op), [])
        if not invs:
            return
        k = invs.index(self.invocation) if self.invocation in invs else -1
        self.invocation = invs[max(0, min(k + step, len(invs) - 1))]
        self.refresh_tab()

    def action_node(self, step: int) -> None:
        """Cycle the node filter through all, 0, 1, ..."""
        if self.view is None:
            return
        view = self.view
        nodes: list[int] = self.attempt(view.nodes, [])
        choices: list[int | None] = [None, *nodes]
        k = choices.index(self.node) if self.node in choices else 0
        self.node = choices[(k + step) % len(choices)]
        self.refresh_tab()

    def action_next_op(self) -> None:
        """Show the next operator (its first invocation)."""
        if self.view is None:
            return
        view = self.view
        ops: list[str] = self.attempt(lambda: list(view.operators()), [])
        if ops:
            k = ops.index(self.op) if self.op in ops else -1
            self.op = ops[(k + 1) % len(ops)]
            self.invocation = 0
            self.refresh_tab()


__all__ = ["TABS", "OrdersScreen"]
