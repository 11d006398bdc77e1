"""Errors of the ``tracer`` package; all derive from :class:`TracerError`."""

from __future__ import annotations


class TracerError(Exception):
    """Base class of every error the tracer raises on purpose."""


class TraceNotFoundError(TracerError, FileNotFoundError):
    """The trace file (or directory of traces) does not exist."""


class TraceFormatError(TracerError, ValueError):
    """The file is not a readable trace: not SQLite, foreign, truncated, newer or corrupt."""


class TraceDamagedError(TraceFormatError):
    """A run's hash chain or cross-references show that rows were lost or altered."""


class RunNotFoundError(TracerError, LookupError):
    """The trace holds no run with the requested id (or no run at all)."""


class TraceWriteError(TracerError, RuntimeError):
    """The trace store could not be written (locked, read-only, disk full)."""

    #: True when the write failed for lack of space (SQLite's SQLITE_FULL, PostgreSQL's
    #: disk_full): the recorder then says so in the run's row, if that still fits.
    disk_full: bool = False


class RunExistsError(TracerError, ValueError):
    """``start_run`` was given a run id that the store already holds."""


class DriverMissingError(TracerError, ImportError):
    """A trace URL names a database driver that is not installed."""


__all__ = [
    "DriverMissingError",
    "RunExistsError",
    "RunNotFoundError",
    "TraceDamagedError",
    "TraceFormatError",
    "TraceNotFoundError",
    "TraceWriteError",
    "TracerError",
]
