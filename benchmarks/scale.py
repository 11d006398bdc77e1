"""Scale figures of issue 35 on the in-process cluster; prints one JSON object last.

Everything runs in this process on ``engine.run(fn, nodes=P)``, so it needs no MPI and
fits the 2-core machine.  Bytes and messages are the transport's counters
(``engine._runtime.transport.Traffic``: what the in-process cluster moves, counted as the
MPI transport would send it, headers included), read before and after the operator
invocation being measured; nothing is estimated from formulas.

* ``bytes_per_epoch_p64_ml100k``, ``messages_per_epoch_p64``: one steady-state SGDMF
  epoch (the second ``sgd`` invocation), MovieLens-100K, rank 32, P = 64: its fetch
  exchange (the rows the first epoch left at their homes), the routed write-backs and
  the final exchange home;
* ``imbalance_p64_ml100k``, ``imbalance_p64_synthetic``: the planner's imbalance of the
  same epoch planned with ``strategy="tokens"`` (the token planner: the issue's figure),
  on MovieLens-100K and on the synthetic set: the plan's critical path without barriers,
  a node waiting for a message only before the first round that touches its rows (where
  ``Cluster.settle`` completes the receive), over (bodies / P); context ``imbalance``
  gives, for that plan and for ``auto``'s (rotation), also ``exchange_wait`` (a node
  waiting for every message of exchange s-1 before its round s, as before deferred
  receives) and ``barrier`` (every round ending with a barrier: the figure before
  2026-12-06), and the token epoch's traffic;
* ``trace_bytes_per_body_p64``: a recorded synthetic SGDMF at P = 64, the store's growth
  from one epoch to five (file and sidecars) over the bodies of those four epochs;
  context ``trace.per_body_by_table`` splits the growth by table (indexes included);
* ``mem_per_node_p64_over_p1``: what node 0 holds at P = 64 over the same at P = 1, by
  summing buffers (not tracemalloc): its rows of every DDS (numpy bytes; Python-object
  rows by ``sys.getsizeof`` of the object and its fields, and for a sharded dvector the
  dict and the record of which rows each node holds as an MPI rank keeps it: its own
  node's, and of every other node's the rows homed at it), the reconnaissance sets it
  keeps (after
  the invocation that made a plan, those of its own tasks' bodies: ``NodeSets``) and the
  plan it keeps (after that invocation, its own tasks and written ids, every node's body
  count and the whole plan's digest: ``engine._machines.planparts``).  The guard's plan is
  outside the figure (the issue names DDS, data, sets and plan) but not out of sight:
  ``node0_bytes.guard_plan`` sums node 0's armed codes, the touches an MPI rank keeps
  for the fetch (its own and those of its home rows: ``routing.held_touches``) and the
  sharded rows the nodes' tasks need as a rank keeps them (``GuardPlan.shard_needs``);
* ``mlr_messages_per_clock_p64``: ``sync_for`` messages per clock of one MLR epoch
  (digits, minibatch 10, BSP) at P = 64.

``--quick`` uses P = 8 and synthetic data for everything (a smoke test, well under a
minute); the full run takes a few minutes.  Offline, MovieLens-100K falls back to the
synthetic set and ``data`` says so.

Usage: python benchmarks/scale.py [--quick] [--nodes P]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import engine as ap  # noqa: E402
from engine.lowlevel import held_touches, homes, plan_node_bytes  # noqa: E402

#: The targets of issue 35 ("Figures"), by field.
TARGETS = {
    "bytes_per_epoch_p64_ml100k": 14e6,
    "messages_per_epoch_p64": 8192,
    "imbalance_p64_ml100k": 1.05,
    "imbalance_p64_synthetic": 1.10,
    "trace_bytes_per_body_p64": 1.0,
    "mem_per_node_p64_over_p1": 0.1,
    "mlr_messages_per_clock_p64": 1300,
}
#: SGDMF factor rank of every run here.
RANK = 32
#: Epochs the trace figure grows the store by (from a 1-epoch recording): the store grows
#: in SQLite pages, so one epoch of routed write-backs can fit in the pages it already has.
TRACE_EPOCHS = 4


def _traffic() -> dict[str, int]:
    return ap.current().cluster.traffic.snapshot()


def _diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


def _obj_bytes(x: Any) -> int:
    """A Python-object row's size: the object and its fields (one level deep)."""
    n = sys.getsizeof(x)
    if isinstance(x, tuple):
        n += sum(sys.getsizeof(v) for v in x)
    return n


def _homed(d: Any, rows: np.ndarray, node: int) -> int:
    """Bytes of the ``rows`` of ``d`` whose home is ``node``."""
    return int(rows[homes(d, rows) == node].nbytes) if len(rows) else 0


def _node_bytes(sess: Any, node: int) -> dict[str, int]:
    """What ``node`` holds, by summing buffers (see the module docstring)."""
    dds = 0
    for d in sess.dds:
        buf = d._bufs[node]
        if isinstance(buf, np.ndarray) and buf.dtype != object:
            dds += buf.nbytes
        elif isinstance(buf, dict):  # a sharded dvector: the rows this node holds
            dds += sys.getsizeof(buf) + sum(_obj_bytes(v) for v in buf.values())
            # and the record of which rows each node holds, as an MPI rank keeps it: its
            # own node's, and of every other node's the rows homed at it (what it sends)
            dds += sum(
                held.nbytes if p == node else _homed(d, held, node)
                for c in d._cache.values()
                for p, held in enumerate(c)
            )
        else:  # Python-object rows: a list (or object array) of them
            dds += sys.getsizeof(buf) + sum(_obj_bytes(v) for v in list(buf))
    sets = plan = guard = 0
    for st in sess.ops.values():
        s = getattr(st, "sets", None)
        if s is not None:  # after its first invocation a node keeps its own bodies' sets
            sets += s.nbytes(node) if hasattr(s, "parts") else s.nbytes()
        p = getattr(st, "plan", None)
        if p is not None:
            plan += plan_node_bytes(p, node)  # its own tasks once it has run the plan
        gp = getattr(st, "guard_plan", None)
        if gp is not None:  # outside the figure (see the module docstring), said beside it
            guard += sum(s.nbytes for per in gp.arms for _, s, _ in per.get(node, []))
            # the touches an MPI rank keeps (its own and those of its home rows), and
            # the sharded rows every node's tasks need (every rank keeps all of them)
            t = held_touches(gp._touches, [node], gp._home)
            guard += sum(getattr(t, k).nbytes for k in ("node", "gid", "first", "written"))
            guard += t.first_write.nbytes
            guard += sum(
                a.nbytes if p == node else _homed(d, a, node)
                for d, per in gp.shard_needs.items()
                for p, a in enumerate(per)
            )
    total = dds + sets + plan
    return {"dds": dds, "recon_sets": sets, "plan": plan, "total": total, "guard_plan": guard}


def _imbalances(sess: Any) -> dict[str, float]:
    plan = sess.ops["sgd"].plan
    return {
        "strategy": plan.strategy,
        "critical_path": round(plan.imbalance, 4),  # receives at first use (settle)
        "exchange_wait": round(plan.exchange_imbalance, 4),
        "barrier": round(plan.barrier_imbalance, 4),
    }


def sgdmf_epoch(
    synthetic: bool = False, memory: bool = False, strategy: str = "auto"
) -> dict[str, Any]:
    """The second of two SGDMF epochs (``sgd`` invocations): its traffic (the fetch
    exchange included), imbalance and node 0's memory."""
    from apps.sgdmf._app import build, epoch

    A, W, H = build(RANK, 0.1, synthetic)
    # a steady-state epoch: the second invocation, whose fetch exchange brings each node
    # the rows the first one left at their homes (the first's write-back is not counted)
    epoch(A, W, H, 0.02, 0.05, strategy=strategy)
    before = _traffic()
    epoch(A, W, H, 0.02, 0.05, strategy=strategy)
    sess = ap.current()
    out: dict[str, Any] = {
        "traffic": _diff(_traffic(), before),
        "imbalance": sess.planner["sgd"]["imbalance"],
        "imbalances": _imbalances(sess),
        "rounds": sess.planner["sgd"]["rounds"],
        "bodies": len(A),
        "model_bytes": W.row_nbytes() * len(W) + H.row_nbytes() * len(H),
    }
    if memory:
        out["node0_bytes"] = _node_bytes(sess, 0)
    return out


def mlr_epoch() -> dict[str, Any]:
    """One MLR epoch (``mlr`` invocation, BSP): its traffic and clocks."""
    from apps.mlr._app import train

    train(epochs=1)
    sess = ap.current()
    return {"clocks": sess.planner["mlr"]["rounds"], "digests": sess.digests[-1:]}


def _mlr(nodes: int) -> dict[str, Any]:
    before: dict[str, int] = {}

    def fn() -> dict[str, Any]:
        before.update(_traffic())
        out = mlr_epoch()
        out["traffic"] = _diff(_traffic(), before)
        return out

    return ap.run(fn, nodes=nodes).value


def _store_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def _table_bytes(path: Path) -> dict[str, int]:
    """Bytes of each table of an SQLite store, its indexes included (``dbstat`` pages);
    empty where this SQLite lacks ``dbstat``."""
    import sqlite3

    con = sqlite3.connect(path)
    try:
        names = dict(con.execute("SELECT name, tbl_name FROM sqlite_schema"))
        got: dict[str, int] = {}
        for name, size in con.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name"):
            table = names.get(name, name)
            got[table] = got.get(table, 0) + int(size)
        return got
    except sqlite3.Error:
        return {}
    finally:
        con.close()


def trace_bytes(nodes: int, epochs: int) -> tuple[int, dict[str, int]]:
    """Bytes of the store of a synthetic SGDMF run of ``epochs`` recorded at ``nodes``,
    and per table (with its indexes)."""
    import tracer
    from apps.sgdmf._app import train

    with tempfile.TemporaryDirectory(prefix="scale-trace-") as tmp:
        path = Path(tmp) / "trace.sqlite"
        run_id = f"scale-{nodes}-{epochs}"
        tracer.start_run(str(path), run_id, {"app": "sgdmf", "ranks": nodes})
        rec = tracer.TraceRecorder(str(path), run_id, nodes=list(range(nodes)), is_primary=True)
        params = {"epochs": epochs, "rank": RANK, "synthetic": True}
        ap.run(train, params, nodes=nodes, recorder=rec)
        rec.close("finished")
        return _store_bytes(path), _table_bytes(path)


def measure(nodes: int, ml100k: bool) -> dict[str, Any]:
    """Every figure at ``nodes`` nodes (MovieLens-100K where ``ml100k``, else synthetic)."""
    t0 = time.perf_counter()
    timings: dict[str, float] = {}

    def timed(label: str, fn: Any, *args: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        got = fn(*args, **kw)
        timings[label] = round(time.perf_counter() - t, 1)
        return got

    big = timed(
        "sgdmf_big",
        lambda: ap.run(sgdmf_epoch, {"synthetic": not ml100k, "memory": True}, nodes=nodes),
    ).value
    one = timed(
        "sgdmf_p1", lambda: ap.run(sgdmf_epoch, {"synthetic": not ml100k, "memory": True}).value
    )
    syn = timed("sgdmf_synthetic", lambda: ap.run(sgdmf_epoch, {"synthetic": True}, nodes=nodes))
    tokens = {"synthetic": not ml100k, "strategy": "tokens"}
    tok = timed("sgdmf_tokens", lambda: ap.run(sgdmf_epoch, tokens, nodes=nodes)).value
    syn_tokens = {"synthetic": True, "strategy": "tokens"}
    tok_syn = (
        timed("sgdmf_synthetic_tokens", lambda: ap.run(sgdmf_epoch, syn_tokens, nodes=nodes)).value
        if ml100k
        else tok
    )
    mlr = timed("mlr", _mlr, nodes)
    t1, tables1 = timed("trace_1_epoch", trace_bytes, nodes, 1)
    t2, tables2 = timed(f"trace_{1 + TRACE_EPOCHS}_epochs", trace_bytes, nodes, 1 + TRACE_EPOCHS)
    growth = {k: v - tables1.get(k, 0) for k, v in tables2.items()}
    syn_bodies = syn.value["bodies"]
    tr = big["traffic"]
    figures = {
        "bytes_per_epoch_p64_ml100k": tr["sent_bytes"],
        "messages_per_epoch_p64": tr["sent_messages"],
        "imbalance_p64_ml100k": tok["imbalance"],
        "imbalance_p64_synthetic": tok_syn["imbalance"],
        "trace_bytes_per_body_p64": round((t2 - t1) / (TRACE_EPOCHS * syn_bodies), 3),
        "mem_per_node_p64_over_p1": round(
            big["node0_bytes"]["total"] / one["node0_bytes"]["total"], 4
        ),
        "mlr_messages_per_clock_p64": round(mlr["traffic"]["sent_messages"] / mlr["clocks"], 1),
    }
    context = {
        "sgdmf": {
            "rounds": big["rounds"],
            "bodies": big["bodies"],
            "model_bytes": big["model_bytes"],
            "traffic": tr,
            "received_per_node_over_model": round(
                tr["received_bytes"] / nodes / big["model_bytes"], 2
            ),
            "node0_bytes": big["node0_bytes"],
            "node0_bytes_p1": one["node0_bytes"],
        },
        "sgdmf_synthetic": {"traffic": syn.value["traffic"], "rounds": syn.value["rounds"]},
        "sgdmf_tokens": {"traffic": tok["traffic"], "rounds": tok["rounds"]},
        "sgdmf_synthetic_tokens": {
            "traffic": tok_syn["traffic"],
            "rounds": tok_syn["rounds"],
        },
        "imbalance": {
            "ml100k": {"auto": big["imbalances"], "tokens": tok["imbalances"]},
            "synthetic": {"auto": syn.value["imbalances"], "tokens": tok_syn["imbalances"]},
        },
        "mlr": {"clocks": mlr["clocks"], "traffic": mlr["traffic"], "digests": mlr["digests"]},
        "trace": {
            "store_bytes_1_epoch": t1,
            f"store_bytes_{1 + TRACE_EPOCHS}_epochs": t2,
            "bodies_per_epoch": syn_bodies,
            # per table and its indexes: bytes per body of the growth (dbstat pages)
            "per_body_by_table": {
                k: round(v / (TRACE_EPOCHS * syn_bodies), 3)
                for k, v in sorted(growth.items(), key=lambda kv: -kv[1])
                if v
            },
        },
        "seconds": timings,
    }
    context["seconds"]["total"] = round(time.perf_counter() - t0, 1)
    return {"figures": figures, "context": context}


def main() -> None:
    ap_ = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap_.add_argument("--quick", action="store_true", help="P = 8, synthetic data (smoke test)")
    ap_.add_argument("--nodes", type=int, default=None, help="P (default 64, or 8 with --quick)")
    args = ap_.parse_args()
    nodes = args.nodes or (8 if args.quick else 64)
    label = "synthetic"
    if not args.quick:
        try:
            from apps._datasets import movielens_100k

            movielens_100k()
            label = "movielens-100k"
        except Exception as exc:  # noqa: BLE001 - fall back, and say so in the output
            print(f"MovieLens-100K unavailable ({exc}); using synthetic data", file=sys.stderr)
            label = "synthetic (MovieLens-100K unavailable)"
    got = measure(nodes, label == "movielens-100k")
    figures = got["figures"]
    out: dict[str, Any] = {
        "benchmark": "scale",
        "date": date.today().isoformat(),
        "machine": f"{platform.machine()} {platform.python_version()}",
        "nodes": nodes,
        "quick": args.quick,
        "data": label,
        "rank": RANK,
        **figures,
        "targets": TARGETS,
        "met": {k: bool(figures[k] <= TARGETS[k]) for k in TARGETS},
        **got["context"],
    }
    if nodes != 64:
        out["note"] = f"fields named p64 were measured at P = {nodes}"
    print(json.dumps(out, default=_plain))


def _plain(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"not JSON: {type(x).__name__}")


if __name__ == "__main__":
    main()
