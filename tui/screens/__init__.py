"""One screen class per view of the browser."""

from __future__ import annotations

from .diff import DiffScreen as DiffScreen
from .help import HelpScreen as HelpScreen
from .orders import OrdersScreen as OrdersScreen
from .overview import OverviewScreen as OverviewScreen
from .runs import RunsScreen as RunsScreen
from .timeline import TimelineScreen as TimelineScreen
from .verdicts import VerdictsScreen as VerdictsScreen

__all__ = [
    "DiffScreen",
    "HelpScreen",
    "OrdersScreen",
    "OverviewScreen",
    "RunsScreen",
    "TimelineScreen",
    "VerdictsScreen",
]
