"""The Textual trace browser: ``BrowserApp(paths).run()`` (``replay browse``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from textual.app import App
from textual.binding import Binding

import tracer

from ._repo import Repository, RunRef
from .screens import (
    DiffScreen,
    ElementPrompt,
    HelpScreen,
    HistoryScreen,
    OrdersScreen,
    OverviewScreen,
    RunsScreen,
    TimelineScreen,
    VerdictsScreen,
)

#: Where ``replay browse`` looks when given no path.
DEFAULT_DIR = "traces"


class BrowserApp(App[None]):
    """Browse runs, orders, timelines, verdicts and diffs of trace files by keyboard.

    ``paths`` are trace files or directories (each stands for its ``*.sqlite`` and
    ``*.db`` files).  With ``diff=True`` and two paths, it opens on the diff of the
    latest run of each.
    """

    CSS_PATH = "browser.tcss"
    TITLE = "replay browse"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help", key_display="?"),
    ]

    def __init__(
        self, paths: Sequence[str | os.PathLike[str]] = (DEFAULT_DIR,), *, diff: bool = False
    ) -> None:
        super().__init__()
        self.given = [str(p) for p in paths]
        self.repo = Repository(paths)
        self.start_with_diff = diff

    def on_mount(self) -> None:
        self.push_screen(RunsScreen())
        if self.start_with_diff:
            refs = [self.repo.latest(p) for p in self.given[:2]]
            if len(refs) == 2 and refs[0] is not None and refs[1] is not None:
                self.open_diff(refs[0], refs[1])
            else:
                self.notify(
                    "cannot diff: each of two traces must hold a readable run", severity="error"
                )

    def on_unmount(self) -> None:
        self.repo.close()

    # ------------------------------------------------------------ navigation
    def open_run(self, ref: RunRef) -> None:
        """Show the overview of a run."""
        self.push_screen(OverviewScreen(ref))

    def open_timeline(self, ref: RunRef, op: str, invocation: int = 0) -> None:
        """Show the timeline of one operator invocation."""
        self.push_screen(TimelineScreen(ref, op, invocation))

    def open_orders(
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
        """Show recorded orders, optionally filtered, searched for a loop index, or landed
        on the rows whose columns equal ``highlight`` (the last of them when ``last``)."""
        self.push_screen(
            OrdersScreen(
                ref,
                op=op,
                invocation=invocation,
                node=node,
                tab=tab,
                search=search,
                highlight=highlight,
                last=last,
            )
        )

    def open_history(self, ref: RunRef, element: str) -> None:
        """Show an element's value per invocation and its last writer (this replays the
        run in a ``replay history`` subprocess)."""
        self.push_screen(HistoryScreen(ref, element))

    def ask_history(self, ref: RunRef, element: str = "") -> None:
        """Ask for an element (``element`` pre-filled), then show its history."""

        def chosen(text: str | None) -> None:
            if text:
                self.open_history(ref, text)

        self.push_screen(ElementPrompt(element), chosen)

    def open_verdicts(self, ref: RunRef) -> None:
        """Show the replay and dual-test verdicts of a run."""
        self.push_screen(VerdictsScreen(ref))

    def open_diff(self, a: RunRef, b: RunRef) -> None:
        """Show two runs side by side with the first difference of their logs."""
        self.push_screen(DiffScreen(a, b))

    def action_help(self) -> None:
        """Show the keys of the current view."""
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.screen))


def run_browser(paths: Sequence[str | os.PathLike[str]], *, diff: bool | None = None) -> None:
    """Run the browser in this terminal; ``diff=None`` diffs when given exactly two files."""
    if diff is None:
        diff = len(paths) == 2 and all(tracer.is_url(p) or Path(p).is_file() for p in paths)
    BrowserApp(list(paths) or [DEFAULT_DIR], diff=diff).run()


__all__ = ["DEFAULT_DIR", "BrowserApp", "run_browser"]
