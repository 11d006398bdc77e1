"""Token scheduling for rotation-shaped loops (SGDMF): column blocks handed to free nodes.

A rotation (``planner``) runs P rounds of P (user block, item block) pairs; a node that
drew a light pair waits for the ring.  Here node ``p`` keeps user block ``p`` (balanced by
access counts beforehand) and the item space is cut into more, smaller blocks, the
*tokens*.  Whenever a node is free it takes, among the tokens no other node holds and
that it has not yet processed with its user block, the one with the most work for it
(the bodies of that (user block, token) pair; ties: lowest token); it gives the token
back when it is done.  A token is held by one node at a time, and a node holds one
token at a time, so two bodies that run at once never share a user or an item.

The hand-out is simulated here, with body counts as time, instead of happening at run
time: the result is a pure function of the block of every body, so every node computes
the same schedule, replay remakes it from the reconnaissance sets, and nothing about it
needs recording beyond the plan.  It becomes an ordinary plan (``planner``): each task
(node, token) goes to the round given by its depth in the dependency DAG (a node's
tasks in order, and each token's holders in order), so nodes have empty slots in some
rounds, routed write-back carries exactly the token hand-offs, and its critical path
(``makespan``) measures the schedule.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

#: Tokens per node: more tokens let free nodes find work sooner, but each hand-off is a
#: message and a round of the plan (about ``TOKENS_PER_NODE`` x P rounds).
TOKENS_PER_NODE = 4


def hand_out(work: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Simulate the hand-out of ``work[p, t]`` (bodies of node ``p`` with token ``t``).

    Returns the tasks that have work, in the order they started: ``(node, token,
    level, start)``, where ``level`` is the task's depth in the dependency DAG and
    ``start`` its start time (it ends ``work[node, token]`` later).  Deterministic:
    simultaneous events are handled in node order."""
    work = np.asarray(work, dtype=np.int64)
    nodes, n_tokens = work.shape
    left = work.copy()  # work still to do per (node, token); 0 once done (or none)
    held = np.zeros(n_tokens, dtype=bool)
    pending = (left > 0).sum(axis=1)
    # depth of the latest task of each node and of each token (-1: none yet)
    node_level = np.full(nodes, -1, dtype=np.int64)
    token_level = np.full(n_tokens, -1, dtype=np.int64)
    out_node: list[int] = []
    out_token: list[int] = []
    out_level: list[int] = []
    out_start: list[int] = []
    running: list[tuple[int, int, int]] = []  # (finish time, node, token)
    free = [p for p in range(nodes) if pending[p]]
    waiting: list[int] = []  # free nodes whose remaining tokens are all held
    now = 0
    while True:
        for p in free:  # ascending node order
            cand = np.where(held, 0, left[p])
            t = int(np.argmax(cand))
            if cand[t] <= 0:
                waiting.append(p)  # everything it still needs is held elsewhere
                continue
            held[t] = True
            level = max(node_level[p], token_level[t]) + 1
            node_level[p] = token_level[t] = level
            out_node.append(p)
            out_token.append(t)
            out_level.append(int(level))
            out_start.append(now)
            heapq.heappush(running, (now + int(left[p, t]), p, t))
            left[p, t] = 0
            pending[p] -= 1
        if not running:
            break
        now = running[0][0]
        finished, released = [], []
        while running and running[0][0] == now:
            _, p, t = heapq.heappop(running)
            held[t] = False
            finished.append(p)
            released.append(t)
        # a waiting node can only take a token released now (the others are still held)
        woken: list[int] = []
        if waiting:
            needs = np.asarray(left[np.ix_(waiting, released)] > 0)
            wake = [bool(needs[k].any()) for k in range(len(waiting))]
            woken = [p for p, w in zip(waiting, wake, strict=True) if w]
            waiting = [p for p, w in zip(waiting, wake, strict=True) if not w]
        free = sorted(woken + [p for p in finished if pending[p]])
    return (
        np.array(out_node, dtype=np.int64),
        np.array(out_token, dtype=np.int64),
        np.array(out_level, dtype=np.int64),
        np.array(out_start, dtype=np.int64),
    )


@dataclass(frozen=True)
class Handout:
    """The simulated hand-out over bodies: task ``k`` is node ``node[k]`` with token
    ``token[k]`` from time ``start[k]`` to ``finish[k]``, on the bodies ``bodies(k)``;
    tasks are numbered in the order they started."""

    node: np.ndarray
    token: np.ndarray
    level: np.ndarray
    start: np.ndarray
    finish: np.ndarray
    nodes: int
    _order: np.ndarray
    _bounds: np.ndarray
    _cell: np.ndarray

    def bodies(self, k: int) -> np.ndarray:
        """Positions of task ``k``'s bodies, ascending."""
        c = int(self._cell[k])
        return self._order[self._bounds[c] : self._bounds[c + 1]]

    def rounds(self, level: np.ndarray) -> list[list[list[np.ndarray]]]:
        """Rounds of per-node groups with task ``k`` in round ``level[k]``."""
        n_rounds = int(level.max()) + 1 if len(level) else 0
        out: list[list[list[np.ndarray]]] = [
            [[] for _ in range(self.nodes)] for _ in range(n_rounds)
        ]
        for k, (p, lv) in enumerate(zip(self.node.tolist(), level.tolist(), strict=True)):
            out[lv][p].append(self.bodies(k))
        return out


def hand_out_bodies(
    node_of: np.ndarray, token_of: np.ndarray, nodes: int, n_tokens: int
) -> Handout:
    """:func:`hand_out` of bodies whose user block is ``node_of`` and token ``token_of``."""
    key = node_of * n_tokens + token_of
    work = np.bincount(key, minlength=nodes * n_tokens).reshape(nodes, n_tokens)
    node, token, level, start = hand_out(work)
    order = np.argsort(key, kind="stable")  # bodies of each (node, token), ascending
    bounds = np.searchsorted(key[order], np.arange(nodes * n_tokens + 1))
    finish = start + work[node, token]
    return Handout(node, token, level, start, finish, nodes, order, bounds, node * n_tokens + token)


__all__ = ["TOKENS_PER_NODE", "Handout", "hand_out", "hand_out_bodies"]
