"""Errors raised by the example applications."""

from __future__ import annotations


class AppError(Exception):
    """Base class for every error raised by the apps package."""


class DataFormatError(AppError, ValueError):
    """A user's data file is malformed: the message names the file and, for text, the line."""
