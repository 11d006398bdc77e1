"""A node's part of a plan (issue 35: nothing O(n) whole on every node).

A plan lists every node's tasks, round by round: O(bodies) on every node that holds it.
Every node needs the whole plan to build it and, once, to build the guard's plan and the
routes from it; after that a node runs only its own tasks.  :func:`keep_nodes` keeps the
parts of some nodes (an MPI rank's own; in one process every simulated node its own, which
is the whole) with what the rest of the run still reads of the others: each node's body
count and a digest of every node's tasks, which a replay compares with the recorded plan's
(:func:`plan_digest`) where it can no longer compare the tasks themselves.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import numpy as np

from .planner import Plan

_NONE = np.empty(0, dtype=np.int64)


def plan_digest(plan: Plan) -> bytes:
    """A digest of every node's tasks in every round (thread, locked, indices): equal for
    two plans iff replay's task-by-task comparison finds them equal (up to a collision of
    BLAKE2b-256).  A plan that dropped some nodes' tasks gives the digest it took before."""
    if plan.partial:
        assert plan.digest is not None, "a partial plan keeps the digest of the whole"
        return plan.digest
    # one header row per round, per node and per task (kind, then counts or the task's
    # thread, lock and length), and every task's indices in the same order: two buffers
    head: list[tuple[int, int, int, int]] = [(0, len(plan.rounds), 0, 0)]
    parts: list[np.ndarray] = []
    for rnd in plan.rounds:
        head.append((1, len(rnd), 0, 0))
        for tasks in rnd:
            head.append((2, len(tasks), 0, 0))
            for t in tasks:
                head.append((3, t.thread, int(bool(t.locked)), len(t.indices)))
                parts.append(t.indices)
    h = hashlib.blake2b(digest_size=32)
    h.update(np.asarray(head, dtype="<i8").tobytes())
    if parts:
        h.update(np.ascontiguousarray(np.concatenate(parts), dtype="<i8").tobytes())
    return h.digest()


class HeldNodes(list):  # type: ignore[type-arg]
    """One round's per-node lists of a plan that keeps only some nodes' parts: a node's
    own list reads as usual; reading another node's, or walking every node's, raises
    instead of seeing an empty list (which would read as "no tasks there")."""

    def __init__(self, items: list[Any], kept: tuple[int, ...]) -> None:
        super().__init__(items)
        self.kept = kept

    def _refuse(self, what: str) -> ValueError:
        return ValueError(
            f"{what}: this plan holds only the part of node(s) "
            f"{', '.join(map(str, self.kept))} (a rank keeps its own once an invocation has "
            "run the plan); ap.plan_of gathers the whole plan"
        )

    def __getitem__(self, i: Any) -> Any:
        if not isinstance(i, int) or not -len(self) <= i < len(self):
            raise self._refuse(f"node {i!r} of a round")
        if i % len(self) not in self.kept:
            raise self._refuse(f"node {i}'s tasks")
        return super().__getitem__(i)

    def __iter__(self) -> Any:
        raise self._refuse("every node's tasks")

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise self._refuse("a copy of every node's tasks")


def keep_nodes(plan: Plan, nodes: Iterable[int]) -> Plan:
    """``plan`` holding the tasks and written ids of ``nodes`` only (reading another
    node's raises: :class:`HeldNodes`), with every node's body count and the whole plan's
    digest.  The per-round loads
    of the planner's figures are dropped (O(rounds x nodes), read only while planning)."""
    keep = tuple(sorted(set(nodes)))
    if plan.kept is not None and not set(keep) <= set(plan.kept):
        raise ValueError(f"plan holds node(s) {plan.kept}, not {keep}")
    counts = plan.bodies_per_node()
    digest = plan_digest(plan)
    mine = set(keep)
    if len(mine) == plan.nodes:  # every node's part (one process holds every node)
        rounds, writes = plan.rounds, plan.writes
    else:
        rounds = [
            HeldNodes([rnd[q] if q in mine else [] for q in range(len(rnd))], keep)
            for rnd in plan.rounds
        ]
        writes = [
            HeldNodes([per[q] if q in mine else _NONE for q in range(len(per))], keep)
            for per in plan.writes
        ]
    return replace(
        plan, rounds=rounds, writes=writes, kept=keep, counts=counts, digest=digest, loads=None
    )


def whole_plan(plan: Plan, parts: list[dict[int, tuple[list[Any], list[Any]]]]) -> Plan:
    """``plan`` with every node's part again, from ``parts`` (each process's kept nodes:
    per node its task lists and written ids, round by round).  The result must have the
    digest the partial plan took of the whole, or this raises."""
    rounds: list[list[Any]] = [[[] for _ in range(plan.nodes)] for _ in plan.rounds]
    writes: list[list[Any]] = [[_NONE] * plan.nodes for _ in plan.writes]
    seen: set[int] = set()
    for held in parts:
        for q, (tasks, written) in held.items():
            seen.add(q)
            for r, ts in enumerate(tasks):
                rounds[r][q] = ts
            for r, w in enumerate(written):
                writes[r][q] = w
    whole = replace(plan, rounds=rounds, writes=writes, kept=None, counts=None, digest=None)
    if seen != set(range(plan.nodes)) or plan_digest(whole) != plan.digest:
        raise RuntimeError(
            f"the plan's parts gathered from the ranks ({sorted(seen)}) do not "
            "make the plan they were taken from"
        )
    return whole


def own_parts(plan: Plan) -> dict[int, tuple[list[Any], list[Any]]]:
    """The parts of ``plan`` this process holds, for :func:`whole_plan`."""
    nodes = plan.kept if plan.kept is not None else tuple(range(plan.nodes))
    return {q: ([rnd[q] for rnd in plan.rounds], [per[q] for per in plan.writes]) for q in nodes}


def node_bytes(plan: Plan, node: int) -> int:
    """The bytes of ``plan`` that ``node`` holds once it keeps its own part: its tasks'
    indices and written ids, the body counts, the digest, and what else the plan keeps
    whole (a serial order, the planner's loads)."""
    out = sum(t.indices.nbytes for rnd in plan.rounds for t in rnd[node])
    out += sum(per[node].nbytes for per in plan.writes)
    if plan.kept is None:  # every node's parts are held whole
        out = sum(t.indices.nbytes for rnd in plan.rounds for ts in rnd for t in ts)
        out += sum(w.nbytes for per in plan.writes for w in per)
    for extra in (plan.counts, plan.order, plan.loads):
        if extra is not None:
            out += extra.nbytes
    return out + (len(plan.digest) if plan.digest is not None else 0)


__all__ = ["HeldNodes", "keep_nodes", "node_bytes", "own_parts", "plan_digest", "whole_plan"]
