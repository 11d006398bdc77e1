"""Errors of the ``replay`` package; all derive from :class:`ReplayError`."""

from __future__ import annotations


class ReplayError(Exception):
    """Base class of every error the replay package raises on purpose."""


class UsageError(ReplayError, ValueError):
    """The user asked for something that cannot work (unknown app, bad parameter)."""


class RanksDisagree(UsageError):
    """The MPI ranks compared something they must share (hash seed, app file,
    floating-point paths) and found it differs: every rank raises it alike, so none
    waits for another and they can stop together instead of aborting."""


class LaunchError(ReplayError, RuntimeError):
    """Starting or supervising the MPI job failed (no mpiexec, a rank died, a timeout)."""


__all__ = ["LaunchError", "RanksDisagree", "ReplayError", "UsageError"]
