"""Checks on the paths the CLI reads and writes, made before anything is opened.

A FIFO named ``x.sqlite`` blocks the first ``open()`` forever, so input paths are
looked at with ``os.stat`` only (the tracer does the same for every trace it opens).
An output path never replaces a trace that is being read, nor anything but a regular
file (the checks are ``engine.lowlevel.check_output_path``, which every writer repeats),
and never an existing file unless the user says ``--force``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import tracer
from engine import OutputPathError
from engine.lowlevel import SQLITE_SIDECARS, check_output_path, check_writable

from ._errors import UsageError


def refuse_special(path: str | os.PathLike[str], role: str = "trace") -> None:
    """Raise :class:`UsageError` if ``path`` is a FIFO, socket or device."""
    kind = tracer.special_kind(path)
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
    missing directory or one this process cannot write in, or onto an existing file
    unless ``force``."""
    shown = os.fspath(path)
    if not shown:  # else the write's rename onto '' failed with a bare [Errno 2] line
        raise UsageError(f"{option} is empty; give the path of the file to write")
    for src in reading:
        if _same(path, src):
            raise UsageError(
                f"{option} {shown} is the trace being read; writing there would destroy it: "
                "pass another output path"
            )
    try:
        check_output_path(path, force=force, label=f"{option} {shown}")
        check_writable(path, label=f"{option} {shown}")
    except OutputPathError as exc:
        raise UsageError(str(exc)) from None


def reserve_trace(path: Path, shown: str) -> Callable[[], None]:
    """Create the new trace file ``path``, empty, failing if anything has that name.

    The creation itself is the check (``O_CREAT|O_EXCL``): of two commands given the same
    new path, exactly one gets it, where an exists-check followed by SQLite's create let
    both record into one file.  Returns a function that removes the file again if it is
    still the empty one made here (the command ended before recording anything).
    """
    if os.path.lexists(path):
        raise UsageError(
            f"trace {shown!r} already exists; pass a new path (a trace is never overwritten)"
        )
    name = os.fspath(path)
    for suffix in SQLITE_SIDECARS:
        if name.endswith(suffix) and os.path.lexists(name[: -len(suffix)]):
            raise UsageError(
                f"trace {shown!r} is SQLite's {suffix} file of {name[: -len(suffix)]}; "
                "pass a new path"
            )
        if os.path.lexists(name + suffix):  # SQLite would read it as the new trace's own
            raise UsageError(
                f"trace {shown!r} has a leftover {name + suffix}; remove it or pass a new path"
            )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        os.close(os.open(path, flags, 0o666))
    except FileExistsError:
        raise UsageError(
            f"trace {shown!r} already exists; pass a new path (a trace is never overwritten)"
        ) from None
    except OSError as exc:
        raise UsageError(f"cannot create trace {shown!r}: {exc.strerror}") from None
    made = os.lstat(path)

    def forget() -> None:
        with contextlib.suppress(OSError):
            st = os.lstat(path)
            unused = st.st_size == 0 and not any(os.path.lexists(name + s) for s in SQLITE_SIDECARS)
            if (st.st_dev, st.st_ino) == (made.st_dev, made.st_ino) and unused:
                os.unlink(path)

    return forget


__all__ = ["check_output", "refuse_special", "reserve_trace"]
