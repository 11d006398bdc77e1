"""The terminal trace browser (Textual): ``replay browse`` or ``python -m tui``.

Textual is imported when the browser is first used, not with ``replay``'s commands.
"""

from __future__ import annotations

import typing

from ._cli import register as register

if typing.TYPE_CHECKING:
    from .app import BrowserApp as BrowserApp


def __getattr__(name: str) -> typing.Any:
    if name == "BrowserApp":
        from .app import BrowserApp

        return BrowserApp
    raise AttributeError(f"module 'tui' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = ["BrowserApp", "register"]
