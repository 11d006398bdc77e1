"""Chaos: the free parts of a schedule, drawn from a seed instead of left to chance.

Why it is built this way: a normal run leaves lock-grant orders, thread dispatch,
message arrivals, SSP visibility and Hybrid mutex orders to whatever the machine does,
so a bug that needs a rare interleaving stays rare.  A :class:`Chaos` value in an
invocation's :class:`~engine._machines.schedule.Schedule` makes each of those choices
at random *within what the engine allows* (where the plan's tasks run among equally good placements, which thread of a
lock-split round runs on,
at every body start, body end and access to an element the group writes, see
:mod:`~engine._machines.baton`; any arrival order; any visibility inside the staleness
bound), from a numpy generator keyed by (chaos seed, run number, operator, invocation,
choice, node, round ...).  The key never involves Python's ``hash()``, the wall clock or thread timing, so the same seed
and run number give the same schedule in any process, and since the run is recorded as
usual, every explored run replays bit for bit.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

#: The choice a generator is drawn for (part of its key, so the choices are independent).
LOCKS, DISPATCH, MESSAGES, VISIBILITY, MUTEX, PLACEMENT, FAULT = range(7)


def text_key(text: str) -> int:
    """A stable 64-bit key of a name (blake2b; never Python's salted ``hash()``)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def _merge_turns(rng: np.random.Generator, lengths: np.ndarray) -> np.ndarray:
    """A uniformly random merge of sequences of ``lengths``: the sequence of every turn."""
    return rng.permutation(np.repeat(np.arange(len(lengths), dtype=np.int64), lengths))


@dataclass(frozen=True)
class Chaos:
    """The seed of one chaos run: ``seed`` (the exploration's) and ``run`` (its number)."""

    seed: int
    run: int

    def __post_init__(self) -> None:
        if self.seed < 0 or self.run < 0:
            raise ValueError(f"chaos seed and run must be >= 0, got {self.seed}, {self.run}")

    def rng(self, op: str, invocation: int, choice: int, *keys: int) -> np.random.Generator:
        """The generator of one choice; ``keys`` (node, round, ...) may be -1."""
        return np.random.default_rng(
            [self.seed, self.run, text_key(op), invocation + 1, choice, *(k + 1 for k in keys)]
        )

    def dispatch(self, op: str, invocation: int, node: int, round: int, threads: int) -> list[int]:
        """The order in which a node-round's ``threads`` thread groups are started."""
        rng = self.rng(op, invocation, DISPATCH, node, round)
        return [int(k) for k in rng.permutation(threads)]

    def placement(
        self, op: str, invocation: int, nodes: int, threads: int, rounds: int
    ) -> tuple[list[int], dict[tuple[int, int], list[int]]]:
        """A random one of a plan's equally good placements, as the arguments of
        :func:`~engine._machines.planner.placed`: where each node's work goes, and per
        (round, node) a renaming of the thread labels."""
        rng = self.rng(op, invocation, PLACEMENT)
        where = [int(k) for k in rng.permutation(nodes)]
        rename: dict[tuple[int, int], list[int]] = {}
        if threads > 1:
            for r in range(rounds):
                for p in range(nodes):
                    rename[(r, p)] = [int(k) for k in rng.permutation(threads)]
        return where, rename

    def interleave(
        self, op: str, invocation: int, node: int, clock: int, seqs: dict[int, list[int]]
    ) -> list[tuple[int, int]]:
        """A random Hybrid mutex order of one node-clock: a merge of the threads'
        minibatch sequences ``seqs`` (thread -> minibatches in its own order), as
        (thread, minibatch) grants."""
        threads = sorted(seqs)
        lengths = np.asarray([len(seqs[t]) for t in threads], dtype=np.int64)
        turns = _merge_turns(self.rng(op, invocation, MUTEX, node, clock), lengths)
        at = dict.fromkeys(threads, 0)
        out = []
        for k in turns.tolist():
            t = threads[k]
            out.append((t, int(seqs[t][at[t]])))
            at[t] += 1
        return out

    def visibility(
        self, op: str, invocation: int, node: int, nodes: int, staleness: int
    ) -> ChaosVisibility:
        """A random SSP visibility script for ``node`` (see :class:`ChaosVisibility`)."""
        return ChaosVisibility(self, op, invocation, node, nodes, staleness)


class ChaosVisibility:
    """An SSP visibility script drawn from a chaos seed: before clock ``c`` the node has
    applied, per other owner, the updates up to a clock drawn from
    ``[c - staleness - 1, c - 1]`` and never below what it applied before; its own entry
    is ``c - 1``.  Why the own entry is fixed: an owner aggregates (and so publishes) its
    rows only up to its own entry, so independently drawn own entries can wait on each
    other forever; with every own entry at ``c - 1`` each owner publishes clock ``c - 1``
    as soon as the deltas are in, every vector is reachable, and what varies is which
    of the other owners' updates each clock reads.  Called with increasing clocks by the
    ``SspClock``; each clock's vector depends only on the seed and the ones before it."""

    def __init__(
        self, chaos: Chaos, op: str, invocation: int, node: int, nodes: int, staleness: int
    ) -> None:
        self.chaos, self.op, self.invocation = chaos, op, invocation
        self.node, self.nodes, self.staleness = node, nodes, staleness
        self._caps: list[tuple[int, ...]] = []

    def __call__(self, clock: int) -> tuple[int, ...]:
        while len(self._caps) <= clock:
            c = len(self._caps)
            prev = self._caps[-1] if self._caps else (-1,) * self.nodes
            rng = self.chaos.rng(self.op, self.invocation, VISIBILITY, self.node, c)
            cap = []
            for q in range(self.nodes):
                if q == self.node:
                    cap.append(c - 1)
                    continue
                lo = max(prev[q], c - self.staleness - 1)
                cap.append(int(rng.integers(lo, c)) if lo < c else lo)
            self._caps.append(tuple(cap))
        return self._caps[clock]


__all__ = [
    "DISPATCH",
    "FAULT",
    "LOCKS",
    "MESSAGES",
    "MUTEX",
    "PLACEMENT",
    "VISIBILITY",
    "Chaos",
    "ChaosVisibility",
]
