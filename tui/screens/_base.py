"""What every view of the browser shares: the repository, going back, error display."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from textual.binding import Binding
from textual.screen import Screen

from .._repo import BrowseError

if TYPE_CHECKING:
    from .._repo import Repository
    from ..app import BrowserApp


T = TypeVar("T")


class BrowserScreen(Screen[None]):
    """A view of the browser; ``escape`` returns to the view it was opened from."""

    BINDINGS = [Binding("escape", "back", "Back")]

    @property
    def browser(self) -> BrowserApp:
        """The running browser app."""
        return cast("BrowserApp", self.app)

    @property
    def repo(self) -> Repository:
        """The read-only trace repository (the only way a view reads traces)."""
        return self.browser.repo

    def action_back(self) -> None:
        """Close this view (the runs list, at the bottom, stays)."""
        if len(self.app.screen_stack) > 2:
            self.app.pop_screen()

    def show_error(self, message: str) -> None:
        """Tell the user a read failed, without leaving the view."""
        self.notify(message, title="cannot read trace", severity="error", timeout=8)

    def attempt(self, read: Callable[[], T], default: T) -> T:
        """``read()``, or ``default`` after showing why the read failed."""
        try:
            return read()
        except BrowseError as exc:
            self.show_error(str(exc))
            return default

    def deliver(self, callback: Callable[..., Any], *args: Any) -> None:
        """From a worker thread: run ``callback(*args)`` on the UI thread if still shown."""

        def run() -> None:
            if self.is_mounted:
                callback(*args)

        try:
            self.app.call_from_thread(run)
        except RuntimeError:  # the app is shutting down; nobody is left to show it
            pass


__all__ = ["BrowserScreen"]
