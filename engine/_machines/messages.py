"""The message-order machine: which source each receive of an invocation takes.

Why it exists: before write-backs were routed (2026-11-29), a node received its peers'
write-backs with wildcard receives, so the arrival order was a real source of
non-determinism, and traces of that time log it.  Routed receives name their source, so
no engine receive consults this machine any more: it stays for the logs of those traces
(read, shown and verified) until the schedule redesign stores one schedule value.  A :class:`MessageLog` holds, per
node and channel, the sources of one invocation's messages in arrival order; it is part of
the invocation's :class:`~engine._machines.schedule.Schedule`.  :class:`MessageOrder` is the
pure machine the transport consults: before a receive it answers the source the receive
must take (``None``: any), after it is told what arrived.  Following a log, it makes the
run take the logged sources; with no log (a free run) it lets anything arrive and keeps
the arrivals, which :meth:`MessageOrder.log` returns as the same kind of value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .._errors import DivergenceError, ScheduleExhausted

_EMPTY = np.empty(0, dtype=np.int64)


@dataclass(frozen=True)
class MessageLog:
    """Row ``k`` is ``(node[k], channel[k])``; its sources, in arrival order, are
    ``sources[ptr[k]:ptr[k+1]]``."""

    node: np.ndarray = field(default_factory=lambda: _EMPTY)
    channel: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=str))
    ptr: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    sources: np.ndarray = field(default_factory=lambda: _EMPTY)
    #: per message (aligned with ``sources``), what a run recorded: the sender's sequence
    #: number and the payload bytes (empty where not known; not needed to follow the log)
    seq: np.ndarray = field(default_factory=lambda: _EMPTY)
    nbytes: np.ndarray = field(default_factory=lambda: _EMPTY)

    @classmethod
    def build(cls, rows: Mapping[tuple[int, str], Iterable[int] | np.ndarray]) -> MessageLog:
        """From ``{(node, channel): sources in arrival order}``."""
        keys = sorted(rows)
        parts = [
            np.asarray(list(rows[k]) if not isinstance(rows[k], np.ndarray) else rows[k])
            for k in keys
        ]
        lens = [len(p) for p in parts]
        return cls(
            node=np.asarray([k[0] for k in keys], dtype=np.int64),
            channel=np.asarray([k[1] for k in keys], dtype=str),
            ptr=np.concatenate(([0], np.cumsum(lens, dtype=np.int64))).astype(np.int64),
            sources=np.concatenate(parts).astype(np.int64) if parts else _EMPTY,
        )

    @cached_property
    def _row(self) -> dict[tuple[int, str], int]:
        return {
            (int(n), str(c)): k
            for k, (n, c) in enumerate(zip(self.node.tolist(), self.channel.tolist(), strict=True))
        }

    def of(self, node: int, channel: str) -> np.ndarray:
        """The sources ``node`` received on ``channel``, in arrival order (empty: none)."""
        k = self._row.get((node, channel))
        if k is None:
            return _EMPTY
        return self.sources[int(self.ptr[k]) : int(self.ptr[k + 1])]


class MessageOrder:
    """Feeds each receive of one invocation its source.

    ``log`` is the invocation's :class:`MessageLog` to follow, or ``None`` for a free run.
    ``partial``: the run being followed stopped inside this invocation, so a receive past
    the end of its log means the trace is exhausted (:class:`ScheduleExhausted`), not that
    this run diverged.
    """

    def __init__(
        self,
        log: MessageLog | None = None,
        *,
        op: str = "",
        invocation: int = -1,
        partial: bool = False,
    ) -> None:
        self.follow = log
        self.op, self.invocation, self.partial = op, invocation, partial
        self._seen: dict[tuple[int, str], list[int]] = {}

    def expect(self, node: int, channel: str) -> int | None:
        """The source the next receive of ``node`` on ``channel`` must take (None: any)."""
        if self.follow is None:
            return None
        want = self.follow.of(node, channel)
        k = len(self._seen.get((node, channel), ()))
        if k < len(want):
            return int(want[k])
        if self.partial:
            raise ScheduleExhausted(f"{self.op} invocation {self.invocation}: message {k}")
        raise DivergenceError(
            node=node,
            op=self.op,
            invocation=self.invocation,
            event=f"message {k} on {channel!r}",
            what="message",
            expected=f"only {len(want)} message(s)",
            actual="one more receive",
        )

    def arrived(self, node: int, channel: str, source: int) -> None:
        """A message from ``source`` arrived at ``node`` on ``channel``."""
        self._seen.setdefault((node, channel), []).append(int(source))

    def mark(self) -> dict[tuple[int, str], int]:
        """The receive counts, to :meth:`rewind` to when an attempt is undone."""
        return {k: len(v) for k, v in self._seen.items()}

    def rewind(self, mark: dict[tuple[int, str], int]) -> None:
        """Forget the receives of an undone attempt."""
        self._seen = {k: v[: mark.get(k, 0)] for k, v in self._seen.items() if mark.get(k, 0)}

    def log(self) -> MessageLog:
        """What arrived so far, as a :class:`MessageLog`."""
        return MessageLog.build(self._seen)


__all__ = ["MessageLog", "MessageOrder"]
