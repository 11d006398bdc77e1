"""Checks on the paths the CLI reads and writes, made before anything is opened.

A FIFO named ``x.sqlite`` blocks the first ``open()`` forever, so input paths are
looked at with ``os.stat`` only (the tracer does the same for every trace it opens).
An output path never replaces a trace that is being read, nor anything but a regular
file (the checks are ``engine.lowlevel.check_output_path``, which every writer repeats),
and never an existing file unless the user says ``--force``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from engine import OutputPathError
from engine.lowlevel import check_output_path
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


def check_output(
    path: str | os.PathLike[str],
    *,
    force: bool = False,
    reading: Iterable[str | os.PathLike[str]] = (),
    option: str = "-o",
) -> None:
    """Refuse to write ``path`` onto a file being read, onto anything but an absent or
    regular file (a link, FIFO, device, directory, a trace store or its ``-wal``), into a
    missing directory, or onto an existing file unless ``force``."""
    shown = os.fspath(path)
    for src in reading:
        if _same(path, src):
            raise UsageError(
                f"{option} {shown} is the trace being read; writing there would destroy it: "
                "pass another output path"
            )
    try:
        check_output_path(path, force=force, label=f"{option} {shown}")
    except OutputPathError as exc:
        raise UsageError(str(exc)) from None


__all__ = ["check_output", "refuse_special", "special_kind"]
