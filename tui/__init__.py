"""The terminal trace browser (Textual): ``replay browse`` or ``python -m tui``."""

from __future__ import annotations

from ._cli import register as register
from .app import BrowserApp as BrowserApp

__all__ = ["BrowserApp", "register"]
