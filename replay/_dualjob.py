"""The parallel side of a dual test as an MPI job: the program runs where it runs.

An in-process cluster shares every Python object between its nodes; under
``mpiexec`` each rank has its own interpreter, so a program that keeps per-process
Python state (a module-level list the driver fills on one rank only, a cache built
from the process's environment) can pass in-process and still compute something
else on a cluster.  :class:`MpiSide` therefore runs the parallel side of a dual test
with :func:`replay._job.launch` — the path of ``replay run --ranks N``, with its
timeouts, rank-death and error reporting — while the serial side stays in the
calling process.

What crosses the process boundary is data only, never a pickle, and never a file (the
ranks may run on other hosts: ``_wire`` carries it):

* parent → ranks: the spec (app target, parameter values, controller kind, Hybrid body
  orders) with ``orders_npz``, the base64 of an npz file (one int64 array per
  invocation, keyed by ``orders``);
* rank 0 → parent: the result (digests, objectives, the outcome log, body orders, body
  count) with ``out_npz`` (the run's own orders, or the snapshot of one DDS when the
  job stops after an invocation to localise a divergence; Python-object elements
  travel as their ``repr``).

Ranks run :func:`dual_here`; a rank that diverges from the orders it was given
reports it and aborts the job so that no rank waits forever.
"""

from __future__ import annotations

import base64
import inspect
import io
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import engine

from ._chaosctl import ChaosController, labels
from ._dualctl import (
    BodyOrders,
    Capture,
    Outcome,
    Replayed,
    Steering,
    Tap,
    Wavefront,
    comparable,
    outcome_of,
)
from ._errors import UsageError
from ._progress import current_stage, phase_reporter, reporting, route_ticks


# ====================================================================== wire format
def _npz(**arrays: Any) -> str:
    """The base64 of an npz file holding ``arrays``."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return base64.b64encode(buf.getvalue()).decode()


def _unnpz(text: str) -> Any:
    return np.load(io.BytesIO(base64.b64decode(text)), allow_pickle=False)


def _write_orders(orders: dict[tuple[str, int], np.ndarray]) -> tuple[str, list[list[Any]]]:
    """``orders`` as (base64 npz, one array per invocation; the key index)."""
    keys = sorted(orders)
    arrays: dict[str, Any] = {
        f"o{k}": np.asarray(orders[key], dtype=np.int64) for k, key in enumerate(keys)
    }
    return _npz(**arrays), [[op, inv] for op, inv in keys]


def _read_orders(text: str, index: list[list[Any]]) -> dict[tuple[str, int], np.ndarray]:
    if not index:
        return {}
    with _unnpz(text) as z:
        return {(op, int(inv)): z[f"o{k}"] for k, (op, inv) in enumerate(index)}


def _body_orders_json(body_orders: BodyOrders | None) -> list[list[Any]]:
    return [
        [op, inv, node, clock, [[int(t), int(m)] for t, m in pairs]]
        for (op, inv, node, clock), pairs in sorted((body_orders or {}).items())
    ]


def _body_orders_of(rows: list[list[Any]]) -> BodyOrders:
    return {
        (op, int(inv), int(node), int(clock)): [(int(t), int(m)) for t, m in pairs]
        for op, inv, node, clock, pairs in rows
    }


# ====================================================================== function targets
def importable_target(fn: Callable[..., Any] | str) -> str:
    """``module:function`` or ``path/to/file.py:function`` naming ``fn`` for a fresh process.

    Raises :class:`UsageError` when a worker could not import it (a lambda, a nested
    function, a method).
    """
    if isinstance(fn, str):
        return fn
    name = getattr(fn, "__qualname__", None) or repr(fn)
    mod_name = getattr(fn, "__module__", None)
    module = sys.modules.get(mod_name or "")
    if (
        mod_name is None
        or "." in name
        or "<" in name
        or module is None
        or getattr(module, name, None) is not fn
    ):
        raise UsageError(
            f"parallel='mpi' needs a driver the MPI ranks can import, and {name!r} "
            f"(module {mod_name!r}) is not a module-level function of an importable module; "
            "define it at module level, pass 'path/to/file.py:function', "
            "or use parallel='in-process'"
        )
    if mod_name == "__main__" or mod_name.startswith("replay_user_"):
        path = inspect.getsourcefile(fn)
        if not path:
            raise UsageError(f"parallel='mpi': cannot find the source file of {name!r}")
        return f"{Path(path).resolve()}:{name}"
    return f"{mod_name}:{name}"


# ====================================================================== parent side
class MpiSide:
    """Runs the parallel side of a dual test on ``ranks`` MPI ranks (see module doc)."""

    def __init__(
        self,
        app: str,
        params: dict[str, Any],
        *,
        ranks: int,
        threads: int,
        seed: int,
        timeout: float | None = None,
        out: Callable[[str], None] | None = None,
    ) -> None:
        try:
            json.dumps(params)
        except TypeError as exc:
            raise UsageError(
                f"parallel='mpi' sends the parameters to the ranks as JSON, and {params!r} "
                f"is not JSON ({exc}); use numbers, strings and booleans"
            ) from None
        self.app, self.params = app, params
        self.ranks, self.threads, self.seed = ranks, threads, seed
        self.timeout = timeout
        self.out = out or (lambda line: print(line, file=sys.stderr))

    def _job(
        self,
        controller: Steering | None,
        extra: dict[str, Any],
        read: Callable[[dict[str, Any]], Any],
    ) -> Any:
        from ._job import launch

        orders: dict[tuple[str, int], np.ndarray] = {}
        kind = None
        if isinstance(controller, ChaosController):  # chaos mode: every rank draws alike
            c = controller.chaos
            kind = "chaos"
            extra = dict(extra, chaos=[c.seed, c.run], labels=labels(c.seed, c.run))
        elif isinstance(controller, Wavefront):
            kind, orders = "wavefront", controller.orders
        elif isinstance(controller, Replayed):
            kind, orders = "replay", controller.orders
        elif controller is not None:
            raise TypeError(f"the MPI side cannot ship controller {controller!r}")
        packed, index = _write_orders(orders)
        spec = {
            "kind": "dual",
            "app": self.app,
            "values": self.params,
            "threads": self.threads,
            "seed": self.seed,
            "sys_path": [p for p in sys.path if p],
            "controller": kind,
            "orders": index,
            "orders_npz": packed,
            "body_orders": _body_orders_json(getattr(controller, "body_orders", None)),
            **extra,
        }
        out = self.out
        st = current_stage()
        if st is not None:  # rank 0 ticks on stdout; the ticks go where this stage's go
            spec["progress"] = {"what": st.what, "total": st.total}
            out = route_ticks(st.say, self.out)
        res = launch(spec, self.ranks, timeout=self.timeout, out=out)
        if "divergence" in res:
            raise engine.DivergenceError(**res["divergence"])
        if "replica" in res:
            d = res["replica"]
            raise engine.ReplicaMismatchError(
                d["op"],
                d["invocation"],
                d["dds"],
                d["element"],
                d["node"],
                d["owner"],
                d["replica"],
                d["owner_value"],
            )
        return read(res)

    def run(self, controller: Steering | None, trace: tuple[str, str] | None = None) -> Outcome:
        """One test-mode run; ``trace`` (path, run id) records it into a trace store."""
        extra = {} if trace is None else {"trace": trace[0], "run_id": trace[1]}

        def read(res: dict[str, Any]) -> Outcome:
            return Outcome(
                digests=res["digests"],
                objectives=res["objectives"],
                orders=_read_orders(res.get("out_npz", ""), res["orders"]),
                sync_ops=set(res["sync_ops"]),
                body_orders=_body_orders_of(res["body_orders"]),
                bodies=res["bodies"],
                log=[tuple(e) for e in res["log"]],
                ran_exact=res.get("ran_exact", []),
                fallbacks=[str(x) for x in res.get("fallbacks", [])],
            )

        return self._job(controller, extra, read)

    def snapshot(
        self, controller: Steering | None, op: str, invocation: int, dds: str
    ) -> np.ndarray | None:
        """DDS ``dds`` right after invocation (op, invocation), in comparable form."""

        def read(res: dict[str, Any]) -> np.ndarray | None:
            if not res.get("snapshot"):
                return None
            with _unnpz(res["out_npz"]) as z:
                snap: np.ndarray = z["snapshot"]
                return snap

        return self._job(controller, {"stop": [op, invocation, dds]}, read)


# ====================================================================== rank side
def dual_here(spec: dict[str, Any], comm: Any) -> dict[str, Any]:
    """One rank of a dual-test job; rank 0's return value is the job's result."""
    from ._apps import resolve
    from ._job import _recorder, recording

    for p in reversed(spec.get("sys_path", [])):
        if p not in sys.path:
            sys.path.insert(0, p)
    app = resolve(spec["app"])
    params = dict(spec.get("values", {}))
    orders = _read_orders(spec.get("orders_npz", ""), spec["orders"])
    body_orders = _body_orders_of(spec["body_orders"])
    controller: Steering | None = None
    if spec["controller"] == "wavefront":
        controller = Wavefront(orders, spec["threads"], body_orders)
    elif spec["controller"] == "replay":
        controller = Replayed(orders, body_orders)
    elif spec["controller"] == "chaos":
        controller = ChaosController(*spec["chaos"])
    stop = spec.get("stop")
    if stop:
        controller = Tap(controller, stop[0], int(stop[1]))
    recorder = _recorder(spec, app, params, comm) if spec.get("trace") else None
    ticks = spec.get("progress") if comm.Get_rank() == 0 else None
    with reporting(
        None if not ticks else lambda line: print(line, flush=True),
        **(ticks or {}),
    ):
        capture = Capture(recorder)  # its ticker takes the stage current now
        phases = phase_reporter()
    try:
        with recording(recorder):
            res = engine.run(
                app.fn,
                params,
                comm=comm,
                threads=spec["threads"],
                seed=spec["seed"],
                schedules=controller,
                hooks=controller,
                recorder=capture,
                test_mode=True,
                phases=phases,
            )
    except engine.DivergenceError as exc:
        return {"divergence": exc.as_dict()}
    except engine.ReplicaMismatchError as exc:  # raised on every rank alike
        return {"replica": exc.as_dict()}
    except Tap.Stop:
        assert isinstance(controller, Tap) and stop is not None  # only a Tap stops
        snap = controller.snapshot.get(stop[2])
        if comm.Get_rank() == 0 and snap is not None:
            return {"snapshot": True, "out_npz": _npz(snapshot=comparable(snap))}
        return {"snapshot": snap is not None}
    if stop:  # the program never reached (op, invocation)
        return {"snapshot": False}
    body = {}
    for part in comm.allgather(capture.body_orders):  # each rank logged its own node
        body.update(part)
    out = outcome_of(res, body)
    index: list[list[Any]] = []
    packed = ""
    if comm.Get_rank() == 0:
        packed, index = _write_orders(out.orders)
    return {
        "out_npz": packed,
        "digests": out.digests,
        "objectives": out.objectives,
        "log": [list(e) for e in out.log],
        "orders": index,
        "sync_ops": sorted(out.sync_ops),
        "body_orders": _body_orders_json(out.body_orders),
        "bodies": out.bodies,
        "ran_exact": out.ran_exact,
        "fallbacks": capture.fallbacks,
    }


__all__ = ["MpiSide", "dual_here", "importable_target"]
