"""Helpers of the browser tests: building real and synthetic traces, reading the screen."""

from __future__ import annotations

import asyncio
import io
import itertools
import sqlite3
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
from rich.console import Console

import engine as ap
import tracer
from engine import lowlevel
from engine._machines.planner import Plan, Task

#: Fixed wall-clock start of synthetic traces (2023-11-14 22:13:20 UTC).
EPOCH = 1_700_000_000.0


# ============================================================= traces from the engine
def hot_program(epochs: int = 3, n: int = 30) -> Callable[[], None]:
    """Bodies that all hit three rows, so split groups take locks; logs one objective."""

    def program() -> None:
        X = ap.dvector(n, shape=(2,), init=ap.init.normal(0, 1), name="X")

        def body(j: int) -> None:
            X[j % 3] = X[j % 3] * 0.9 + j

        for _ in range(epochs):
            ap.async_for(0, n, body, name="hot")
            ap.log_objective("norm", float(abs(X.gather()).sum()))

    return program


def record_engine(
    path: Path, *, run_id: str | None = None, nodes: int = 2, threads: int = 3, epochs: int = 3
) -> str:
    """Record an in-process engine run of :func:`hot_program` into ``path``; its run id."""
    run_id = run_id or uuid.uuid4().hex
    meta = {
        "app": "hot",
        "target": "tests:hot",
        "params": {"epochs": epochs},
        "ranks": nodes,
        "threads": threads,
        "seed": 0,
        "versions": {},
        "code_digest": "0",
    }
    tracer.start_run(str(path), run_id, meta)
    rec = tracer.TraceRecorder(str(path), run_id, nodes=list(range(nodes)), is_primary=True)
    ap.run(hot_program(epochs), nodes=nodes, threads=threads, recorder=rec)
    rec.close("finished")
    return run_id


def sync_program(epochs: int = 3) -> Callable[[], None]:
    """A data-parallel mean under SSP: aggregation and visibility orders, no plan."""

    def program() -> None:
        xs = ap.dvector(40, shape=(1,), data=[[float(i)] for i in range(40)], name="xs")
        w = ap.dvector(1, shape=(1,), name="w")

        def body(batch: Any) -> None:
            w[0] += 0.1 * (batch.values.mean(axis=0) - w[0])

        for _ in range(epochs):
            ap.sync_for(xs, 4, body, sync="ssp", name="mean")
            ap.log_objective("w", float(w.gather()[0][0]))

    return program


def record_sync(path: Path, *, nodes: int = 2, threads: int = 2) -> str:
    """Record an in-process run of :func:`sync_program` into ``path``; its run id."""
    run_id = uuid.uuid4().hex
    tracer.start_run(str(path), run_id, {"app": "mean", "ranks": nodes, "threads": threads})
    rec = tracer.TraceRecorder(str(path), run_id, nodes=list(range(nodes)), is_primary=True)
    ap.run(sync_program(), nodes=nodes, threads=threads, recorder=rec)
    rec.close("finished")
    return run_id


# ============================================================= synthetic traces
def _clock(start: float = EPOCH) -> Callable[[], float]:
    ticks = itertools.count()
    return lambda: start + 0.25 * next(ticks)


def synthetic_plan(n: int, nodes: int, threads: int, rounds: int, locked_node: int | None) -> Plan:
    """Contiguous blocks: round r, node p, thread t gets one block; ``locked_node`` locks."""
    per = n // (rounds * nodes * threads)
    plan_rounds: list[list[list[Task]]] = []
    k = 0
    for _ in range(rounds):
        per_node = []
        for p in range(nodes):
            tasks = []
            for t in range(threads):
                idx = np.arange(k, k + per, dtype=np.int64)
                k += len(idx)
                tasks.append(Task(t, idx, locked=p == locked_node))
            per_node.append(tasks)
        plan_rounds.append(per_node)
    if k < n:  # the remainder goes to the last task
        last = plan_rounds[-1][-1][-1]
        last.indices = np.concatenate([last.indices, np.arange(k, n, dtype=np.int64)])
    return Plan("rotation", 0, n, nodes, threads, plan_rounds, imbalance=1.0)


def write_synthetic(
    path: Path,
    run_id: str,
    *,
    n: int = 48,
    nodes: int = 2,
    threads: int = 2,
    rounds: int = 2,
    invocations: int = 2,
    message_order: tuple[int, ...] = (0, 1),
    deviate: bool = True,
    app: str = "synth",
    start: float = EPOCH,
) -> None:
    """Write a deterministic trace with the recorder alone (no engine, fixed clock).

    Node 0 runs its tasks under locks (lock = ``X[index % 3]``), its threads taking
    tickets in turn, one body each (so every change of thread but the last is a
    hand-over); every node receives ``len(message_order)`` messages per invocation from
    the next node, in ``message_order`` of their source sequence numbers, and node 1
    thread 1 runs its first round of invocation 1 backwards when ``deviate``.  Thread
    ``t`` ran from 0.5 t ms to 4 - t ms of each 4 ms round.
    """
    with mock.patch("time.time", _clock(start)):
        meta = {
            "app": app,
            "target": f"tests:{app}",
            "params": {"n": n, "lr": 0.5},
            "ranks": nodes,
            "threads": threads,
            "seed": 7,
            "versions": {"python": "3"},
            "code_digest": "c0ffee",
        }
        tracer.start_run(str(path), run_id, meta)
        rec = tracer.TraceRecorder(str(path), run_id, nodes=list(range(nodes)), is_primary=True)
        plan = synthetic_plan(n, nodes, threads, rounds, locked_node=0)
        rec.plan_made("sgd", plan)
        for inv in range(invocations):
            for p in range(nodes):
                for r, per_node in enumerate(plan.rounds):
                    locked = [t for t in per_node[p] if t.locked]
                    if locked:
                        seqs = {t.thread: t.indices for t in locked}
                        lengths = [len(seqs.get(t, ())) for t in range(threads)]
                        turns = np.array(
                            [t for k in range(max(lengths)) for t in seqs if k < len(seqs[t])]
                        )
                        pos, thr = lowlevel.encode_grant_order(turns, lengths)
                        ran = lowlevel.merge_grant_order(turns, seqs)
                        names = [f"X[{int(ran[q]) % 3}]" for q in pos.tolist()]
                        n_locked = len(turns)
                        rec.lock_grants("sgd", inv, p, r, n_locked, 2 * n_locked, pos, thr, names)
                    if deviate and inv == 1 and p == 1 and r == 0:
                        task = per_node[p][1]
                        rec.index_order("sgd", inv, p, r, task.thread, task.indices[::-1])
                for s in message_order:
                    rec.message_received(p, "rows", (p + 1) % nodes, inv * 10 + s, 64)
                info = {
                    "bodies": int(sum(len(t.indices) for rnd in plan.rounds for t in rnd[p])),
                    "rounds": rounds,
                    "seconds": 0.004 * rounds,
                    "round_seconds": [0.004] * rounds,
                    "thread_times": [
                        (r, t, 0.0005 * t, 0.004 - 0.001 * t)
                        for r in range(rounds)
                        for t in range(threads)
                    ],
                }
                if p == 0:
                    info["digests"] = [("W", f"{inv:02d}" * 16)]
                rec.invocation_done("sgd", inv, p, info)
            rec.objective("loss", inv, 10.0 / (inv + 1))
        rec.close("finished")
    # the run's wall time shown on screen, whatever number of clock reads writing took
    # (neither time is under the hash chain)
    with sqlite3.connect(path) as db:
        db.execute(
            "UPDATE run SET started_at = ?, ended_at = ? WHERE run_id = ?",
            (start, start + 2.0, run_id),
        )
    db.close()


def add_verdicts(path: Path, run_id: str) -> None:
    """A passed cluster replay and a failed forward dual test naming a divergence."""
    with mock.patch("time.time", _clock()):
        with tracer.open_writable(str(path)) as trace:
            trace.add_verdict(run_id, "cluster", True, {"identical": True})
            trace.add_verdict(
                run_id,
                "dual-forward",
                False,
                {
                    "divergence": {
                        "iteration": 1,
                        "op": "sgd",
                        "invocation": 1,
                        "node": 1,
                        "index": 40,
                        "element": "W[3]",
                        "expected": 0.25,
                        "actual": 0.5,
                    },
                    "note": "first differing element",
                },
            )


# ============================================================= the screen as text
def screen_text(app: Any) -> str:
    """What the terminal shows right now, as plain text lines (colours dropped)."""
    width, height = app.size
    console = Console(
        width=width,
        height=height,
        file=io.StringIO(),
        record=True,
        force_terminal=True,
        color_system=None,
        legacy_windows=False,
    )
    # the same composition export_screenshot() renders, as text instead of SVG
    update = app.screen._compositor.render_update(full=True, screen_stack=app._background_screens)
    console.print(update)
    return "\n".join(line.rstrip() for line in console.export_text(styles=False).splitlines())


async def wait_for(
    pilot: Any, predicate: Callable[[str], bool], timeout: float = 10.0, what: str = ""
) -> str:
    """Let the app run until ``predicate(screen text)`` holds; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        await pilot.pause()
        text = screen_text(pilot.app)
        if predicate(text):
            return text
        if time.monotonic() > deadline:
            raise AssertionError(f"screen never showed {what or predicate}:\n{text}")
        await asyncio.sleep(0.02)


async def wait_text(pilot: Any, *needles: str, timeout: float = 10.0) -> str:
    """Let the app run until every one of ``needles`` is on screen."""
    return await wait_for(
        pilot, lambda t: all(n in t for n in needles), timeout, what=repr(needles)
    )
