"""The key bindings of the view underneath, as a modal list (``?``)."""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.dom import DOMNode
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

#: Keys every table and scrolling view understands.
NAVIGATION = "↑ ↓ j k PgUp PgDn Home End move · ← → scroll · Tab next widget"


def _own_bindings(node: DOMNode) -> list[Binding]:
    """Bindings the browser's own classes declare on ``node`` (subclass first)."""
    out: list[Binding] = []
    for cls in type(node).__mro__:
        if cls.__module__.startswith("tui."):
            out += [b for b in cls.__dict__.get("BINDINGS", []) if isinstance(b, Binding)]
    return out


class HelpScreen(ModalScreen[None]):
    """Lists the bindings of ``screen`` and of the app; any of escape, ``?`` closes it."""

    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("question_mark", "close", "Close", key_display="?"),
    ]

    def __init__(self, screen: Screen) -> None:
        super().__init__()
        self.under = screen

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Static(self._table(), id="help-keys")
            yield Static(NAVIGATION, id="help-nav")

    def _table(self) -> Table:
        title = getattr(self.under, "VIEW_NAME", type(self.under).__name__)
        table = Table(title=f"Keys: {title}", show_header=False, box=None, expand=True)
        table.add_column("key", style="bold", no_wrap=True, width=8)
        table.add_column("action", ratio=1)
        seen: set[tuple[str, str]] = set()
        for binding in _own_bindings(self.under) + _own_bindings(self.app):
            action = binding.action.split("(", 1)[0]
            if self.under.check_action(action, ()) is False and action == "back":
                continue
            row = (self.app.get_key_display(binding), binding.description)
            if binding.description and row not in seen:
                seen.add(row)
                table.add_row(*row)
        return table

    def action_close(self) -> None:
        """Close the help."""
        self.dismiss(None)


__all__ = ["HelpScreen"]
