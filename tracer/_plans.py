"""Compact plan storage: a task id per loop index plus a small task table.

A plan lists, per round and node, tasks of (thread, indices, locked).  Storing every
index explicitly would cost more than the 1-byte-per-body budget of a whole trace, so
a plan is stored as:

* ``tasks`` — one row per task in (round, node, position) order:
  ``round, node, thread, locked, explicit, length``;
* ``task_of`` — for each index ``start + k``, the id of the task that runs it
  (narrowed to a byte when there are < 256 tasks, then zlib);
* ``orders`` — positions of the tasks whose order is *not* ascending, delta-coded.

Rotation plans run every block in ascending index order, so they store no orders.
A plan in which an index is missing is still exact; one where an index repeats or
falls outside the range stores every task explicitly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._codec import decode, encode
from ._errors import TraceFormatError

#: Columns of one row of the ``tasks`` array.
TASK_FIELDS = ("round", "node", "thread", "locked", "explicit", "length")
_NF = len(TASK_FIELDS)
#: Integer columns of a plan row and their least valid value.
_PLAN_INTS = (
    ("start", 0),
    ("n", 0),
    ("nodes", 1),
    ("threads", 1),
    ("rounds", 0),
    ("n_tasks", 0),
    ("n_explicit", 0),
)
#: Most (round, node) task lists a decoded plan may have: a damaged ``rounds`` must not make
#: decoding allocate without bound.  Real plans have a few rounds per node.
MAX_ROUND_SLOTS = 1 << 22


def encode_plan(plan: Any) -> dict[str, Any]:
    """Columns of an ``operator_plan`` row (without run/op/seq) for an ``engine.Plan``."""
    start, n = int(plan.start), int(plan.n)
    rows: list[tuple[int, int, int, int, int, int]] = []
    parts: list[np.ndarray] = []
    for r, rnd in enumerate(plan.rounds):
        for p, tasks in enumerate(rnd):
            for t in tasks:
                idx = np.asarray(t.indices, dtype=np.int64).ravel()
                parts.append(idx)
                rows.append((r, p, int(t.thread), int(bool(t.locked)), 0, len(idx)))
    n_tasks = len(rows)
    table = np.array(rows, dtype=np.int64).reshape(n_tasks, _NF)
    flat = np.concatenate(parts) if parts else np.empty(0, np.int64)
    pos = flat - start
    simple = bool(len(pos) == 0 or (pos.min() >= 0 and pos.max() < n))
    task_of = np.full(n if simple else 0, -1, dtype=np.int64)
    if simple and len(pos):
        ids = np.repeat(np.arange(n_tasks, dtype=np.int64), table[:, 5])
        task_of[pos] = ids
        simple = bool(np.count_nonzero(task_of >= 0) == len(pos))  # no index twice
        if not simple:
            task_of = np.empty(0, dtype=np.int64)
    explicit: list[np.ndarray] = []
    for k, idx in enumerate(parts):
        if not simple or (len(idx) > 1 and not bool(np.all(idx[1:] > idx[:-1]))):
            table[k, 4] = 1
            explicit.append(idx - start)
    orders = np.concatenate(explicit) if explicit else np.empty(0, np.int64)
    tasks_b, tasks_c = encode(table.ravel())
    of_b, of_c = encode(task_of)
    ord_b, ord_c = encode(orders, delta=True)
    return {
        "strategy": str(plan.strategy),
        "start": start,
        "n": n,
        "nodes": int(plan.nodes),
        "threads": int(plan.threads),
        "rounds": len(plan.rounds),
        "n_tasks": n_tasks,
        "n_explicit": int(len(orders)),
        "imbalance": float(plan.imbalance),
        "node_imbalance": float(plan.node_imbalance),
        "tasks": tasks_b,
        "tasks_codec": tasks_c,
        "task_of": of_b,
        "task_of_codec": of_c,
        "orders": ord_b,
        "orders_codec": ord_c,
    }


def decode_plan(row: Any, where: str = "operator_plan") -> Any:
    """Rebuild an ``engine.Plan`` (rounds of per-node tasks; no ``writes``) from a row."""
    from engine.lowlevel import Plan, Task

    for col, lo in _PLAN_INTS:
        v = getattr(row, col)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise TraceFormatError(
                f"{where} column {col}: {v!r} is not an integer >= {lo}; the trace is damaged"
            )
    start, n, nodes, threads = int(row.start), int(row.n), int(row.nodes), int(row.threads)
    n_rounds, n_tasks = int(row.rounds), int(row.n_tasks)
    if n_rounds * nodes > MAX_ROUND_SLOTS:
        raise TraceFormatError(
            f"{where}: {n_rounds} rounds x {nodes} nodes is beyond any plan; the trace is damaged"
        )
    table = decode(row.tasks, row.tasks_codec, n_tasks * _NF, f"{where} column tasks")
    table = table.reshape(n_tasks, _NF)
    orders = decode(row.orders, row.orders_codec, int(row.n_explicit), f"{where} column orders")
    task_of = decode(row.task_of, row.task_of_codec, None, f"{where} column task_of")
    lengths = table[:, 5]
    if n_tasks and (
        table[:, 0].min() < 0
        or table[:, 0].max() >= n_rounds
        or table[:, 1].min() < 0
        or table[:, 1].max() >= nodes
        or table[:, 2].min() < 0
        or table[:, 2].max() >= threads
        or lengths.min() < 0
        or np.any(np.diff(table[:, 0]) < 0)
    ):
        raise TraceFormatError(f"{where}: task table is inconsistent; the trace is damaged")
    explicit = table[:, 4].astype(bool)
    if sum(lengths[explicit].tolist()) != len(orders):  # in Python ints: int64 wraps round
        raise TraceFormatError(f"{where}: explicit orders do not match the task table")
    implied: list[np.ndarray] = []
    if len(task_of) not in (0, n) or (len(task_of) == 0 and not explicit.all()):
        raise TraceFormatError(f"{where}: task_of has {len(task_of)} entries for {n} bodies")
    if len(task_of):
        if task_of.max(initial=-1) >= n_tasks or task_of.min(initial=0) < -1:
            raise TraceFormatError(f"{where}: task_of names a task that does not exist")
        counts = np.bincount(task_of[task_of >= 0], minlength=n_tasks)
        if not np.array_equal(counts, lengths):
            raise TraceFormatError(f"{where}: task_of does not match the task lengths")
        by_task = np.argsort(task_of, kind="stable")[np.count_nonzero(task_of < 0) :]
        bounds = np.concatenate(([0], np.cumsum(counts)))
        implied = [by_task[bounds[k] : bounds[k + 1]] for k in range(n_tasks)]
    rounds: list[list[list[Any]]] = [[[] for _ in range(nodes)] for _ in range(n_rounds)]
    cursor = 0
    for k, (r, p, thread, locked, expl, length) in enumerate(table.tolist()):
        if expl:
            pos = orders[cursor : cursor + length]
            cursor += length
        else:
            pos = implied[k]
        rounds[r][p].append(Task(int(thread), pos + start, bool(locked)))
    return Plan(
        strategy=row.strategy,
        start=start,
        n=n,
        nodes=nodes,
        threads=threads,
        rounds=rounds,
        writes=[],
        imbalance=float(row.imbalance),
        node_imbalance=float(row.node_imbalance),
    )


__all__ = ["TASK_FIELDS", "decode_plan", "encode_plan"]
