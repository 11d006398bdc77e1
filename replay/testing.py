"""Discrepancy-free dual tests: prove a parallel program equal to its serial version.

*Forward*: a serial run (one node, one thread, a plain loop over a given order —
the identity or a seeded permutation) gives ``Strace`` and ``Sbaseout``; a parallel
run in test mode plans wavefront rounds equivalent to ``Strace`` and its outcome
must equal ``Sbaseout`` exactly.  *Backward*: a parallel run in test mode gives
``Ptrace`` and ``Pbaseout``; a serial run executes the bodies in ``Ptrace`` order and
must give ``Pbaseout`` exactly.  The outcome is every per-invocation DDS digest and
every logged objective.

For ``sync_for`` the serial side runs the synchronous semantics of the same P × T
workers one worker at a time (``replay._syncref``: written from the definition, not
from the engine's code), with aggregation in node, thread order and Hybrid bodies in
the recorded order; test mode turns SSP staleness off.

>>> from replay import testing
>>> result = testing.forward(train, {"epochs": 2}, nodes=3, threads=2)  # doctest: +SKIP
>>> assert result.passed, result.report()                                # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import engine
from engine._dds import SLOT_BITS, SLOT_MASK
from engine._planner import serial_plan, wavefront_plan

#: Errors of a test-mode run that are a dual test's FAIL verdict, not a crash: the
#: program is not deterministic, or a replica missed a write.
_VERDICTS = (engine.DivergenceError, engine.ReplicaMismatchError)


@dataclass
class Outcome:
    """What a run produced: digests per invocation, objectives, loop-index orders."""

    digests: list[dict[str, Any]]
    objectives: dict[str, list[float]]
    orders: dict[tuple[str, int], np.ndarray]
    sync_ops: set[str] = field(default_factory=set)
    body_orders: BodyOrders = field(default_factory=dict)
    bodies: int = 0


@dataclass
class DualResult:
    """The verdict of one direction; ``divergence`` locates the first difference."""

    direction: str
    passed: bool
    divergence: dict[str, Any] | None
    bodies: int = 0

    def report(self) -> str:
        """One paragraph saying what diverged where, with both values."""
        if self.passed:
            return f"{self.direction}: PASS ({self.bodies} bodies compared)"
        d = self.divergence or {}
        where = ", ".join(
            f"{k} {d[k]}"
            for k in ("iteration", "op", "invocation", "index", "dds", "element")
            if d.get(k) is not None
        )
        if d.get("what") == "replica":
            return (
                f"{self.direction}: FAIL at {where}: node {d.get('node')}'s replica is "
                f"{d.get('replica')} but its owner, node {d.get('owner')}, has "
                f"{d.get('owner_value')} (a write did not reach every replica)"
            )
        return (
            f"{self.direction}: FAIL at {where}: serial gave {d.get('serial')}, "
            f"parallel gave {d.get('parallel')}"
        )

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (``{"passed", "divergence"}``)."""
        return {"passed": self.passed, "divergence": self.divergence}


def _h(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


class OrderSource:
    """The serial order of each invocation: ``identity`` or a seeded ``random`` permutation."""

    def __init__(self, kind: str = "identity", seed: int = 0) -> None:
        if kind not in ("identity", "random"):
            raise ValueError(f"order must be 'identity' or 'random', got {kind!r}")
        self.kind = kind
        self.seed = seed

    def __call__(self, op: str, invocation: int, start: int, n: int) -> np.ndarray:
        idx = np.arange(start, start + n, dtype=np.int64)
        if self.kind == "identity":
            return idx
        rng = np.random.default_rng([self.seed & (2**63 - 1), _h(op), invocation])
        return rng.permutation(idx)


BodyOrders = dict[tuple[str, int, int, int], list[tuple[int, int]]]


class _Capture(engine.Recorder):
    """Keeps the Hybrid body orders of a run (and forwards everything to ``tee``)."""

    def __init__(self, tee: engine.Recorder | None) -> None:
        self.tee = tee or engine.Recorder()
        self.body_orders: BodyOrders = {}

    def body_order(self, op, invocation, node, clock, threads, minibatches) -> None:  # noqa: ANN001
        pairs = list(zip(threads.tolist(), minibatches.tolist(), strict=True))
        self.body_orders[(op, invocation, node, clock)] = pairs
        self.tee.body_order(op, invocation, node, clock, threads, minibatches)

    def __getattribute__(self, name: str) -> Any:
        own = ("tee", "body_orders", "body_order", "__class__", "__dict__")
        if name in own or name.startswith("__"):
            return object.__getattribute__(self, name)
        return getattr(object.__getattribute__(self, "tee"), name)


class _Hybrid(engine.Controller):
    """Makes Hybrid sync_for bodies take the node mutex in recorded orders."""

    body_orders: BodyOrders | None = None
    serial = False

    def hybrid_order(self, op: str, invocation: int, node: int, clock: int) -> Any:
        if self.body_orders is None:
            return None
        return self.body_orders.get((op, invocation, node, clock))

    def hybrid_serial(self, op: str, invocation: int, node: int, clock: int) -> bool:
        return self.serial and self.hybrid_order(op, invocation, node, clock) is not None


class _Serial(_Hybrid):
    """Every async_for invocation is one plain loop on node 0 in a given order."""

    def __init__(
        self,
        orders: Callable[[str, int, int, int], np.ndarray],
        body_orders: BodyOrders | None = None,
        sync_shape: tuple[int, int] = (1, 1),
    ) -> None:
        self.orders = orders
        self.body_orders = body_orders
        self.serial = True
        self.sync_shape = sync_shape

    def sync_executor(self) -> Any:
        from ._syncref import reference_sync_for

        return reference_sync_for(*self.sync_shape, self.body_orders or {})

    def plan_override(self, op: str, invocation: int, sets: Any, nodes: int) -> Any:
        return serial_plan(sets, self.orders(op, invocation, sets.start, sets.n), nodes)


class _Wavefront(_Hybrid):
    """Every async_for invocation runs wavefront levels of a recorded serial order."""

    def __init__(
        self,
        orders: dict[tuple[str, int], np.ndarray],
        threads: int,
        body_orders: BodyOrders | None = None,
    ) -> None:
        self.orders = orders
        self.threads = threads
        self.body_orders = body_orders

    def plan_override(self, op: str, invocation: int, sets: Any, nodes: int) -> Any:
        order = self.orders.get((op, invocation))
        if order is None:
            raise _not_in_trace(op, invocation, "serial")
        return wavefront_plan(sets, order, nodes, self.threads)


def _not_in_trace(op: str, invocation: int, side: str) -> engine.DivergenceError:
    """The other side's trace has no such invocation: the program is not deterministic."""
    return engine.DivergenceError(
        node=-1,
        op=op,
        invocation=invocation,
        event="order",
        what="trace",
        expected=f"no such invocation in the {side} trace",
        actual="the program ran it",
    )


class _Tap(engine.Controller):
    """Wraps another controller; after invocation (op, inv) snapshots every DDS and stops."""

    class Stop(Exception):
        """Raised to end the run once the snapshot is taken."""

    def __init__(self, inner: engine.Controller, op: str, invocation: int) -> None:
        self.inner = inner
        self.target = (op, invocation)
        self.snapshot: dict[str, np.ndarray] = {}
        self.sets: Any = None

    def plan_override(self, op: str, invocation: int, sets: Any, nodes: int) -> Any:
        return self.inner.plan_override(op, invocation, sets, nodes)

    def hybrid_order(self, op: str, invocation: int, node: int, clock: int) -> Any:
        return self.inner.hybrid_order(op, invocation, node, clock)

    def sync_executor(self) -> Any:
        return self.inner.sync_executor()

    def hybrid_serial(self, op: str, invocation: int, node: int, clock: int) -> bool:
        return self.inner.hybrid_serial(op, invocation, node, clock)

    def after_invocation(self, op: str, invocation: int) -> None:
        if (op, invocation) != self.target:
            return
        sess = engine.current()
        self.snapshot = {d.name: d.gather() for d in sess.dds}
        st = sess.ops.get(op)
        self.sets = None if st is None else (st.sets, [d.name for d in sess.dds])
        raise _Tap.Stop()


def _run(
    fn: Callable[..., Any],
    params: dict[str, Any],
    *,
    nodes: int,
    threads: int,
    seed: int,
    controller: engine.Controller | None = None,
    recorder: engine.Recorder | None = None,
) -> Outcome:
    capture = _Capture(recorder)
    res = engine.run(
        fn,
        params,
        nodes=nodes,
        threads=threads,
        seed=seed,
        controller=controller,
        recorder=capture,
        test_mode=True,
    )
    sync_ops = {op for op, info in res.planner.items() if "staleness" in info}
    bodies = sum(
        int(info.get("bodies", 0)) * len(res.op_times.get(op, []))
        for op, info in res.planner.items()
    )
    return Outcome(res.digests, res.objectives, res.orders, sync_ops, capture.body_orders, bodies)


def _first_difference(serial: Outcome, parallel: Outcome) -> dict[str, Any] | None:
    for k, (a, b) in enumerate(zip(serial.digests, parallel.digests, strict=False)):
        if (a["op"], a["invocation"], a["dds"]) != (b["op"], b["invocation"], b["dds"]):
            return {
                "op": b["op"],
                "invocation": b["invocation"],
                "event": k,
                "what": "operator sequence",
                "serial": f"{a['op']}#{a['invocation']}",
                "parallel": f"{b['op']}#{b['invocation']}",
            }
        if a["digest"] != b["digest"]:
            return {
                "op": a["op"],
                "invocation": a["invocation"],
                "dds": a["dds"],
                "what": "digest",
                "serial": a["digest"],
                "parallel": b["digest"],
            }
    if len(serial.digests) != len(parallel.digests):
        return {
            "what": "invocation count",
            "serial": len(serial.digests),
            "parallel": len(parallel.digests),
        }
    for name in sorted(set(serial.objectives) | set(parallel.objectives)):
        a, b = serial.objectives.get(name, []), parallel.objectives.get(name, [])
        for it, (x, y) in enumerate(zip(a, b, strict=False)):
            if x != y:
                return {
                    "what": "objective",
                    "objective": name,
                    "iteration": it,
                    "serial": x,
                    "parallel": y,
                }
        if len(a) != len(b):
            return {
                "what": "objective count",
                "objective": name,
                "serial": len(a),
                "parallel": len(b),
            }
    return None


def _localise(
    diff: dict[str, Any],
    fn: Callable[..., Any],
    params: dict[str, Any],
    serial_cfg: dict[str, Any],
    parallel_cfg: dict[str, Any],
    serial_order: Callable[[str, int, int, int], np.ndarray] | None,
) -> dict[str, Any]:
    """Re-run both sides up to the diverging invocation; name the element and loop index."""
    if diff.get("what") != "digest":
        return diff
    op, inv, dds = diff["op"], diff["invocation"], diff["dds"]
    diff["iteration"] = inv
    taps = []
    for cfg in (serial_cfg, parallel_cfg):
        tap = _Tap(cfg["controller"], op, inv)
        try:
            engine.run(
                fn,
                params,
                nodes=cfg["nodes"],
                threads=cfg["threads"],
                seed=cfg["seed"],
                controller=tap,
                test_mode=True,
            )
        except _Tap.Stop:
            pass
        taps.append(tap)
    a, b = taps[0].snapshot.get(dds), taps[1].snapshot.get(dds)
    if a is None or b is None or a.shape != b.shape:
        return diff
    neq = (
        (a != b)
        if a.dtype != object
        else np.array([repr(x) != repr(y) for x, y in zip(a, b, strict=True)])
    )
    if neq.ndim > 1:
        neq = neq.reshape(len(neq), -1).any(axis=1)
    bad = np.flatnonzero(neq)
    if not len(bad):
        return diff
    slot = int(bad[0])
    diff["element"] = slot
    diff["serial"] = _show(a[slot])
    diff["parallel"] = _show(b[slot])
    if taps[0].sets is not None and serial_order is not None:
        sets, names = taps[0].sets
        gid = (names.index(dds) << SLOT_BITS) | (slot & SLOT_MASK)
        order = serial_order(op, inv, sets.start, sets.n)
        writers = [j for j in order.tolist() if gid in sets.writes_of(j - sets.start)]
        if writers:
            diff["index"] = writers[0]
    return diff


def _show(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return [float(x) for x in np.ravel(v)][:8]
    if isinstance(v, np.generic):
        return v.item()
    return repr(v)


def forward(
    fn: Callable[..., Any],
    params: dict[str, Any] | None = None,
    *,
    nodes: int = 2,
    threads: int = 1,
    seed: int = 0,
    order: str = "identity",
    order_seed: int = 0,
    recorder: engine.Recorder | None = None,
) -> DualResult:
    """Serial run over a given order, then a parallel run planned from its trace.

    ``recorder`` (optional) records the parallel run into a trace store.
    """
    params = dict(params or {})
    orders = OrderSource(order, order_seed)
    serial = _Serial(orders, sync_shape=(nodes, threads))
    s_cfg = {"nodes": 1, "threads": 1, "seed": seed, "controller": serial}
    s = _run(fn, params, **s_cfg)
    serial.body_orders = s.body_orders  # localisation re-runs follow the same choices
    p_cfg = {
        "nodes": nodes,
        "threads": threads,
        "seed": seed,
        "controller": _Wavefront(s.orders, threads, s.body_orders),
    }
    try:
        p = _run(fn, params, **p_cfg, recorder=recorder)
    except _VERDICTS as exc:
        return DualResult("forward", False, exc.as_dict())
    diff = _first_difference(s, p)
    if diff is not None:
        diff = _localise(diff, fn, params, s_cfg, p_cfg, orders)
    return DualResult("forward", diff is None, diff, s.bodies)


def backward(
    fn: Callable[..., Any],
    params: dict[str, Any] | None = None,
    *,
    nodes: int = 2,
    threads: int = 1,
    seed: int = 0,
    recorder: engine.Recorder | None = None,
) -> DualResult:
    """Parallel run in test mode, then a serial run over its loop-index orders.

    ``recorder`` (optional) records the parallel run (``Ptrace``) into a trace store.
    """
    params = dict(params or {})
    p_cfg = {"nodes": nodes, "threads": threads, "seed": seed, "controller": None}
    try:
        p = _run(fn, params, **p_cfg, recorder=recorder)
    except engine.ReplicaMismatchError as exc:
        return DualResult("backward", False, exc.as_dict())

    def recorded(op: str, invocation: int, start: int, n: int) -> np.ndarray:
        got = p.orders.get((op, invocation))
        if got is None:
            raise _not_in_trace(op, invocation, "parallel")
        return got

    s_cfg = {
        "nodes": 1,
        "threads": 1,
        "seed": seed,
        "controller": _Serial(recorded, p.body_orders, sync_shape=(nodes, threads)),
    }
    try:
        s = _run(fn, params, **s_cfg)
    except _VERDICTS as exc:
        return DualResult("backward", False, exc.as_dict())
    diff = _first_difference(s, p)
    if diff is not None:
        p_cfg["controller"] = _Replay(p.orders, p.body_orders)
        diff = _localise(diff, fn, params, s_cfg, p_cfg, recorded)
    return DualResult("backward", diff is None, diff, p.bodies)


class _Replay(_Hybrid):
    """Re-runs the parallel side with its own recorded serialization orders (for
    localisation: the first run's thread interleavings are not repeatable)."""

    def __init__(
        self, orders: dict[tuple[str, int], np.ndarray], body_orders: BodyOrders | None
    ) -> None:
        self.orders = orders
        self.body_orders = body_orders

    def plan_override(self, op: str, invocation: int, sets: Any, nodes: int) -> Any:
        order = self.orders.get((op, invocation))
        return None if order is None else wavefront_plan(sets, order, nodes, 1)


def dual(
    fn: Callable[..., Any],
    params: dict[str, Any] | None = None,
    *,
    nodes: int = 2,
    threads: int = 1,
    seed: int = 0,
    order: str = "identity",
    order_seed: int = 0,
    direction: str = "both",
    recorder: engine.Recorder | None = None,
) -> dict[str, DualResult]:
    """Run the forward and/or backward test; returns {direction: result}.

    ``recorder`` records one parallel run: the backward one when it runs, else the
    forward one.
    """
    if direction not in ("forward", "backward", "both"):
        raise ValueError(f"direction must be forward, backward or both, got {direction!r}")
    out: dict[str, DualResult] = {}
    if direction in ("forward", "both"):
        out["forward"] = forward(
            fn,
            params,
            nodes=nodes,
            threads=threads,
            seed=seed,
            order=order,
            order_seed=order_seed,
            recorder=recorder if direction == "forward" else None,
        )
    if direction in ("backward", "both"):
        out["backward"] = backward(
            fn, params, nodes=nodes, threads=threads, seed=seed, recorder=recorder
        )
    return out


def assert_dual(fn: Callable[..., Any], params: dict[str, Any] | None = None, **kw: Any) -> None:
    """``dual(...)`` that raises AssertionError with the divergence report on failure."""
    results = dual(fn, params, **kw)
    failed = [r.report() for r in results.values() if not r.passed]
    if failed:
        raise AssertionError("\n".join(failed))


__all__ = ["DualResult", "OrderSource", "Outcome", "assert_dual", "backward", "dual", "forward"]
