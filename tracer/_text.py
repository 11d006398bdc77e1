"""Text read from a trace, made safe to show on a terminal."""

from __future__ import annotations

import re

#: Characters a terminal acts on instead of showing: C0 and C1 controls (escape
#: sequences retitle, recolour or clear the terminal; a carriage return or newline
#: rewrites or splits a line) and the invisible direction marks and overrides.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` with each control character written as its escape (``\\x1b``).

    Names and messages read from a trace are hostile (an app name, an operator, a
    recorded error): printed raw, ``replay ls`` let a trace set the terminal's title and
    colours, and a newline split ``replay verify``'s one error line in two.
    """

    def escape(m: re.Match[str]) -> str:
        if lines and m.group() == "\n":  # ``lines``: a block of several lines
            return "\n"
        code = ord(m.group())
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"

    return _CONTROLS.sub(escape, text)


__all__ = ["printable"]
