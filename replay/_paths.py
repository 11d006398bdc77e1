"""Checks on the paths the CLI reads and writes, made before anything is opened.

A FIFO named ``x.sqlite`` blocks the first ``open()`` forever, so input paths are
looked at with ``os.stat`` only (the tracer does the same for every trace it opens).
An output path never replaces a trace that is being read, and never replaces any
existing file unless the user says ``--force``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

from tracer import special_kind

from ._errors import UsageError


def refuse_special(path: str | os.PathLike[str], role: str = "trace") -> None:
    """Raise :class:`UsageError` if ``path`` is a FIFO, socket or device."""
    kind = special_kind(path)
    if kind is not None:
        raise UsageError(f"{os.fspath(path)} is {kind}, not a {role} file; pass a regular file")


def _same(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _is_sqlite(path: str | os.PathLike[str]) -> bool:
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # stat first: never open a FIFO
            return False
        with open(path, "rb") as fh:
            return fh.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


def check_output(
    path: str | os.PathLike[str],
    *,
    force: bool = False,
    reading: Iterable[str | os.PathLike[str]] = (),
    option: str = "-o",
) -> None:
    """Refuse to write ``path`` onto a file being read, or onto any existing file
    (including a FIFO or device, where a write would block) unless ``force``."""
    shown = os.fspath(path)
    for src in reading:
        if _same(path, src):
            raise UsageError(
                f"{option} {shown} is the trace being read; writing there would destroy it: "
                "pass another output path"
            )
    if os.path.isdir(path):
        raise UsageError(f"{option} {shown} is a directory; pass a file path")
    if _is_sqlite(path):
        raise UsageError(
            f"{option} {shown} is a trace store; it is never overwritten, even with --force: "
            "pass another output path"
        )
    if os.path.lexists(path) and not force:
        kind = special_kind(path)
        what = f"is {kind}" if kind else "already exists"
        raise UsageError(f"{option} {shown} {what}; pass --force to overwrite it")


__all__ = ["check_output", "refuse_special", "special_kind"]
