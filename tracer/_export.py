"""Export a run as Chrome trace-event JSON (opens in Perfetto and chrome://tracing).

One process per node, one thread track per worker thread, one complete (``X``) slice
per round and thread.  A round lasts what the node measured (``round_seconds``); a
thread's slice is scaled by its share of the round's bodies in the plan, so the
busiest thread fills the round and stragglers are visible.  Times are microseconds
from the start of the run.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from ._read import Trace
from ._run import RunTrace


def _thread_loads(plan: Any, rnd: int, node: int) -> dict[int, tuple[int, int, bool]]:
    """Per thread of ``node`` in round ``rnd``: (bodies, tasks, any task locked)."""
    out: dict[int, tuple[int, int, bool]] = {}
    if plan is None or rnd >= len(plan.rounds) or node >= len(plan.rounds[rnd]):
        return out
    for t in plan.rounds[rnd][node]:
        b, n, lk = out.get(t.thread, (0, 0, False))
        out[t.thread] = (b + len(t.indices), n + 1, lk or t.locked)
    return out


def chrome_events(run: RunTrace) -> list[dict[str, Any]]:
    """The trace events of one run (metadata first, then slices in time order per track)."""
    invs = run.invocations()
    t0 = run.info.started_at
    starts: dict[tuple[str, int], float] = {}
    for i in invs:
        key = (i.op, i.invocation)
        starts[key] = min(starts.get(key, float("inf")), i.committed_at - i.seconds)
    plans: dict[tuple[str, int], Any] = {}
    track_end: dict[int, float] = defaultdict(float)
    events: list[dict[str, Any]] = []
    threads_seen: dict[int, set[int]] = defaultdict(set)
    for i in sorted(invs, key=lambda i: (starts[(i.op, i.invocation)], i.node)):
        if (i.op, i.invocation) not in plans:
            try:
                plans[(i.op, i.invocation)] = run.plan(i.op, i.invocation)
            except KeyError:
                plans[(i.op, i.invocation)] = None
        plan = plans[(i.op, i.invocation)]
        at = max((starts[(i.op, i.invocation)] - t0) * 1e6, track_end[i.node])
        round_us = [s * 1e6 for s in i.round_seconds] or [i.seconds * 1e6]
        for r, dur in enumerate(round_us):
            loads = _thread_loads(plan, r, i.node) or {0: (0, 0, False)}
            busiest = max(b for b, _, _ in loads.values()) or 1
            for thread, (bodies, tasks, locked) in sorted(loads.items()):
                threads_seen[i.node].add(thread)
                share = bodies / busiest if bodies else 1.0
                events.append(
                    {
                        "name": f"{i.op}#{i.invocation} round {r}",
                        "cat": "round",
                        "ph": "X",
                        "ts": round(at, 3),
                        "dur": round(max(dur * share, 0.0), 3),
                        "pid": int(i.node),
                        "tid": int(thread),
                        "args": {
                            "op": i.op,
                            "invocation": i.invocation,
                            "round": r,
                            "bodies": bodies,
                            "tasks": tasks,
                            "locked": locked,
                        },
                    }
                )
            at += dur
        track_end[i.node] = at
    meta: list[dict[str, Any]] = []
    for node in sorted(threads_seen):
        meta.append(_meta("process_name", node, 0, f"node {node}"))
        meta.append(
            {
                "name": "process_sort_index",
                "ph": "M",
                "pid": node,
                "tid": 0,
                "args": {"sort_index": node},
            }
        )
        for thread in sorted(threads_seen[node]):
            meta.append(_meta("thread_name", node, thread, f"thread {thread}"))
    return meta + events


def _meta(name: str, pid: int, tid: int, value: str) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": {"name": value}}


def export_chrome(trace: Trace | RunTrace, run_id: str | None, path: str | os.PathLike[str]) -> int:
    """Write run ``run_id`` (None: the latest) of ``trace`` to ``path``; returns the event count."""
    run = trace if isinstance(trace, RunTrace) else trace.run(run_id)
    doc = {
        "traceEvents": chrome_events(run),
        "displayTimeUnit": "ms",
        "otherData": {"run_id": run.run_id, "app": run.info.app, "status": run.info.status},
    }
    out = Path(os.fspath(path))
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, out)
    return len(doc["traceEvents"])


__all__ = ["chrome_events", "export_chrome"]
