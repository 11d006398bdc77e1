"""``python -m tui [TRACE ...|DIR]`` runs the browser."""

from __future__ import annotations

from ._cli import main

main()
