"""One screen class per view of the browser."""

from __future__ import annotations

from .diff import DiffScreen as DiffScreen
from .help import HelpScreen as HelpScreen
from .history import ElementPrompt as ElementPrompt
from .history import HistoryScreen as HistoryScreen
from .orders import OrdersScreen as OrdersScreen
from .overview import OverviewScreen as OverviewScreen
from .runs import RunsScreen as RunsScreen
from .timeline import TimelineScreen as TimelineScreen
from .verdicts import VerdictsScreen as VerdictsScreen

__all__ = [
    "DiffScreen",
    "ElementPrompt",
    "HelpScreen",
    "HistoryScreen",
    "OrdersScreen",
    "OverviewScreen",
    "RunsScreen",
    "TimelineScreen",
    "VerdictsScreen",
]
