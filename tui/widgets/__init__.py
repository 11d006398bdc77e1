"""Widgets shared by the browser's screens."""

from __future__ import annotations

from .plot import BraillePlot as BraillePlot
from .rows import ListTable as ListTable
from .table import ArrayTable as ArrayTable
from .timeline import TimelineView as TimelineView

__all__ = ["ArrayTable", "BraillePlot", "ListTable", "TimelineView"]
