"""Run under mpiexec: generated programs' parallel sides on MPI ranks, serial sides in-process.

``mpiexec -n P python tests/replay/mpi_dual.py CASES`` where ``CASES`` holds one
:class:`replay.strategies.Case` repr per line (the case's ``nodes`` is replaced by P).
For each case, both directions of the dual test run with the parallel side on the
ranks (``engine.run(comm=MPI.COMM_WORLD, test_mode=True)``) and the serial side in
this process, exactly as :mod:`replay.testing` runs them in-process.  Rank 0 prints
one JSON list: per case ``{"case", "digests", "forward", "backward"}``; a direction is
``null`` when the outcomes agree, else the first difference.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

import engine
from engine.lowlevel import MutexLog, Schedule
from replay import strategies as rs
from replay.testing import OrderSource

Orders = Callable[[str, int, int, int], np.ndarray]
BodyOrders = dict[tuple[str, int, int, int], list[tuple[int, int]]]


class BodyOrderLog(engine.Recorder):
    """Keeps the order in which Hybrid sync_for bodies took their node's mutex."""

    def __init__(self) -> None:
        self.orders: BodyOrders = {}

    def body_order(
        self,
        op: str,
        invocation: int,
        node: int,
        clock: int,
        threads: np.ndarray,
        minibatches: np.ndarray,
    ) -> None:
        pairs = list(zip(threads.tolist(), minibatches.tolist(), strict=True))
        self.orders[(op, invocation, node, clock)] = pairs


class Follow(engine.ScheduleSource):
    """Hybrid bodies take the node mutex in given orders (on one thread when ``serial``)."""

    def __init__(self, body_orders: BodyOrders | None, serial: bool) -> None:
        self.body_orders = body_orders or {}
        self.serial = serial

    threads = 0

    def order(self, op: str, invocation: int, start: int, stop: int) -> np.ndarray | None:
        return None

    def schedule(self, op: str, invocation: int, kind: str, nodes: int, span: Any = None) -> Any:
        if kind == "async_for":
            order = self.order(op, invocation, *span) if span else None
            if order is None:
                return None
            return Schedule(
                op, invocation, serial=self.serial, order=order, order_threads=self.threads
            )
        mine = {
            (node, clock): order
            for (o, inv, node, clock), order in self.body_orders.items()
            if (o, inv) == (op, invocation)
        }
        if kind != "sync_for" or not mine:
            return None
        return Schedule(op, invocation, mutex=MutexLog.build(mine), serial=self.serial)


class SerialOrders(Follow):
    """Every async_for invocation is one plain loop on node 0, in a given order."""

    def __init__(self, orders: Orders, body_orders: BodyOrders | None = None) -> None:
        super().__init__(body_orders, serial=True)
        self.orders = orders

    def order(self, op: str, invocation: int, start: int, stop: int) -> np.ndarray | None:
        return self.orders(op, invocation, start, stop - start)


class Wavefront(Follow):
    """Every async_for invocation runs wavefront levels of a recorded serial order."""

    def __init__(
        self, orders: dict[tuple[str, int], np.ndarray], threads: int, body_orders: BodyOrders
    ) -> None:
        super().__init__(body_orders, serial=False)
        self.orders = orders
        self.threads = threads

    def order(self, op: str, invocation: int, start: int, stop: int) -> np.ndarray | None:
        return self.orders[(op, invocation)]


def outcome(res: engine.RunResult) -> tuple[list[tuple[str, int, str, str]], Any]:
    """Digests and objectives, in comparable form."""
    digests = [(d["op"], d["invocation"], d["dds"], d["digest"]) for d in res.digests]
    return digests, res.objectives


def first_difference(serial: engine.RunResult, parallel: engine.RunResult) -> Any:
    """None when both outcomes agree, else the first differing digest (or the objectives)."""
    (sd, so), (pd, po) = outcome(serial), outcome(parallel)
    for a, b in zip(sd, pd, strict=False):
        if a != b:
            return {"serial": a, "parallel": b}
    if len(sd) != len(pd):
        return {"serial": len(sd), "parallel": len(pd), "what": "invocation count"}
    return None if so == po else {"serial": so, "parallel": po, "what": "objectives"}


def run_case(case: rs.Case, comm: Any) -> dict[str, Any]:
    """Both directions of ``case`` with the parallel side on ``comm``'s ranks."""
    P, T, seed = comm.Get_size(), case.shape.threads, case.seed
    fn = rs.build(case.program)
    sync = case.program.uses_sync
    # serial sides of sync_for keep the synchronous semantics (same nodes and threads)
    s_nodes, s_threads = (P, T) if sync else (1, 1)

    def serial(
        orders: Orders, body_orders: BodyOrders | None = None
    ) -> tuple[engine.RunResult, BodyOrders]:
        log = BodyOrderLog()
        res = engine.run(
            fn,
            nodes=s_nodes,
            threads=s_threads,
            seed=seed,
            recorder=log,
            schedules=SerialOrders(orders, body_orders),
            test_mode=True,
        )
        return res, log.orders

    # forward: every rank computes the (deterministic) serial side itself
    s, s_bodies = serial(OrderSource(case.order.kind, case.order.seed))
    p = engine.run(
        fn,
        comm=comm,
        threads=T,
        seed=seed,
        schedules=Wavefront(s.orders, T, s_bodies),
        test_mode=True,
    )
    forward = first_difference(s, p)
    # backward: the ranks' recorded orders, replayed serially
    log = BodyOrderLog()
    p = engine.run(fn, comm=comm, threads=T, seed=seed, recorder=log, test_mode=True)
    p_bodies: BodyOrders = {}
    for part in comm.allgather(log.orders):  # each rank logged its own node
        p_bodies.update(part)
    backward = None
    if comm.Get_rank() == 0:
        s, _ = serial(lambda op, inv, start, n: p.orders[(op, inv)], p_bodies)
        backward = first_difference(s, p)
    return {"case": repr(case), "digests": len(p.digests), "forward": forward, "backward": backward}


def case(comm: Any, path: str) -> list[dict[str, Any]]:
    """Both directions of every case in the file ``path`` (rank 0's results are whole)."""
    namespace = {name: getattr(rs, name) for name in rs.__all__}
    with open(path) as f:
        cases = [eval(line, namespace) for line in f if line.strip()]  # noqa: S307 - test input
    # JSON-ready, as main prints it
    return list(json.loads(json.dumps([run_case(c, comm) for c in cases], default=str)))


def main() -> int:
    comm = MPI.COMM_WORLD
    out = case(comm, sys.argv[1])
    if comm.Get_rank() == 0:
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
