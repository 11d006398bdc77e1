"""Errors raised by the example applications."""

from __future__ import annotations


class AppError(Exception):
    """Base class for every error raised by the apps package."""
