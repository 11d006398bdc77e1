"""Errors raised by the execution engine; all derive from :class:`EngineError`."""

from __future__ import annotations


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class ClosureRuleError(EngineError, TypeError):
    """A loop body assigns to a captured variable that is not a DDS."""


class AccessOutsideReconError(EngineError, RuntimeError):
    """In checked mode, a body touched an element outside its reconnaissance sets."""


class DataFormatError(EngineError, ValueError):
    """A line of an input file could not be parsed."""


class DDSError(EngineError, KeyError):
    """Misuse of a distributed data structure (unknown key, bad shape, wrong mode)."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else ""


class SessionError(EngineError, RuntimeError):
    """An operator was used outside a session or with a session in the wrong state."""


class BodyError(EngineError, RuntimeError):
    """A loop body raised; carries the operator, invocation and index that failed."""

    def __init__(self, op: str, invocation: int, index: int, node: int, cause: BaseException):
        self.op = op
        self.invocation = invocation
        self.index = index
        self.node = node
        self.cause = cause
        super().__init__(
            f"{op}#{invocation} index {index} on node {node} raised {type(cause).__name__}: {cause}"
        )


class InputFileError(EngineError, FileNotFoundError):
    """An input file does not exist or cannot be read."""
