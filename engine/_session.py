"""The session: one run of a driver program on a cluster.

A session owns the cluster, the registry of DDS, per-operator state (plans and
reconnaissance sets), the run's outcome (objectives and digests) and the recorder.
Exactly one session is current per process; operators find it through
:func:`current`.  Outside :func:`run`, a default one-node session is created on
first use so that the API works interactively.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _dds
from ._errors import SessionError
from ._runtime import Cluster, InProcessCluster, MpiCluster


class Recorder:
    """The narrow interface through which the engine reports to a tracer.

    The base class records nothing; ``tracer`` provides real recorders.
    """

    def plan_made(self, op: str, plan: Any) -> None:
        """A plan was built for operator ``op``."""

    def invocation_done(self, op: str, invocation: int, node: int, info: dict[str, Any]) -> None:
        """A node finished one operator invocation (orders, digests, timings in ``info``)."""

    def message_received(self, node: int, channel: str, source: int, seq: int, nbytes: int) -> None:
        """A message arrived at ``node``."""

    def objective(self, name: str, iteration: int, value: float) -> None:
        """The driver logged an objective value."""

    def close(self, status: str, error: str | None = None) -> None:
        """The run ended with ``status`` (finished, failed)."""


@dataclass
class RunResult:
    """The outcome of :func:`run`."""

    ranks: int
    threads: int
    seed: int
    objectives: dict[str, list[float]]
    digests: list[dict[str, Any]]
    planner: dict[str, dict[str, Any]]
    wall_s: float
    op_times: dict[str, list[float]] = field(default_factory=dict)
    value: Any = None


_tls = threading.local()
_current: Session | None = None


def _h64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


class Session:
    """State of one run on one process (which may host several nodes)."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        seed: int = 0,
        checked: bool = False,
        recorder: Recorder | None = None,
        progress: Callable[[str], None] | None = None,
        digests: bool = True,
    ) -> None:
        self.cluster = cluster
        self.seed = int(seed)
        self.checked = checked
        self.recorder = recorder or Recorder()
        self.progress = progress
        self.want_digests = digests
        self.dds: list[_dds._DDS] = []
        self._names: set[str] = set()
        self.ops: dict[str, Any] = {}
        self.invocations: dict[str, int] = {}
        self.objectives: dict[str, list[float]] = {}
        self.digests: list[dict[str, Any]] = []
        self.planner: dict[str, dict[str, Any]] = {}
        self.op_times: dict[str, list[float]] = {}
        self.current_node = cluster.local_nodes[0]
        self._driver_rng_count = 0
        self.mode = "driver"
        cluster.bind = self.bind

    # ------------------------------------------------------------ registry
    def register(self, dds: _dds._DDS, name: str | None) -> int:
        if name is None:
            name = f"{dds.kind}{len(self.dds)}"
        if name in self._names:
            raise SessionError(
                f"a DDS named {name!r} already exists in this run; pick another name"
            )
        self._names.add(name)
        dds._name = name
        self.dds.append(dds)
        return len(self.dds) - 1

    def bind(self, node: int) -> None:
        """Point every DDS at ``node``'s replica."""
        self.current_node = node
        for d in self.dds:
            d._buf = d._bufs[node]

    def set_mode(self, mode: str, dds: list[_dds._DDS] | None = None) -> None:
        """Switch every DDS (or the given ones) to ``mode``."""
        self.mode = mode
        for d in self.dds if dds is None else dds:
            _dds.set_mode(d, mode)

    # ------------------------------------------------------------ randomness
    def init_rng(self, name: str) -> np.random.Generator:
        return np.random.Generator(np.random.Philox(key=[self.seed & (2**64 - 1), _h64(name)]))

    def body_rng(self, op_key: int, index: int) -> np.random.Generator:
        return np.random.Generator(
            np.random.Philox(key=[self.seed & (2**64 - 1), op_key], counter=[index, 0, 0, 0])
        )

    def op_key(self, op: str, invocation: int) -> int:
        return _h64(f"{op}#{invocation}")

    # ------------------------------------------------------------ outcome
    def next_invocation(self, op: str) -> int:
        inv = self.invocations.get(op, 0)
        self.invocations[op] = inv + 1
        return inv

    def record_digests(self, op: str, invocation: int) -> None:
        if not self.want_digests:
            return
        for d in self.dds:
            self.digests.append(
                {"op": op, "invocation": invocation, "dds": d.name, "digest": d.digest()}
            )

    def log_objective(self, name: str, value: float) -> None:
        vals = self.objectives.setdefault(name, [])
        vals.append(float(value))
        self.recorder.objective(name, len(vals) - 1, float(value))
        if self.progress is not None:
            self.progress(f"iter {len(vals) - 1:>3}  {name} = {float(value):.6g}")


def current() -> Session:
    """The current session (a one-node in-process session is created on first use)."""
    global _current
    if _current is None:
        _current = Session(InProcessCluster(1, 1))
    return _current


def rng() -> np.random.Generator:
    """A generator for the running loop body, seeded by (seed, operator, invocation, index).

    The same index gets the same numbers on any node, thread, replay or serial run.
    Outside a loop body it draws from a per-run driver stream (identical on every rank).
    """
    sess = current()
    key = getattr(_tls, "op_key", None)
    if key is not None:
        return sess.body_rng(key, _tls.index)
    sess._driver_rng_count += 1
    return sess.body_rng(_h64("driver"), sess._driver_rng_count)


def log_objective(name: str, value: float) -> None:
    """Log an objective value for this iteration; it becomes part of the run's outcome."""
    current().log_objective(name, value)


def run(
    fn: Callable[..., Any],
    params: dict[str, Any] | None = None,
    *,
    nodes: int = 1,
    threads: int = 1,
    seed: int = 0,
    checked: bool = False,
    comm: Any = None,
    recorder: Recorder | None = None,
    progress: Callable[[str], None] | None = None,
) -> RunResult:
    """Run the driver ``fn(**params)`` on a fresh cluster and return its outcome.

    With ``comm`` (an MPI communicator) every rank hosts one node; otherwise an
    in-process cluster of ``nodes`` nodes is used.
    """
    global _current
    if _current is not None and getattr(_current, "_running", False):
        raise SessionError("engine.run() cannot be nested inside another run")
    cluster: Cluster = (
        MpiCluster(comm, threads) if comm is not None else InProcessCluster(nodes, threads)
    )
    sess = Session(cluster, seed=seed, checked=checked, recorder=recorder, progress=progress)
    prev = _current
    _current = sess
    sess._running = True  # type: ignore[attr-defined]
    t0 = time.perf_counter()
    try:
        value = fn(**(params or {}))
        wall = time.perf_counter() - t0
    finally:
        sess._running = False  # type: ignore[attr-defined]
        cluster.close()
        _current = prev
    return RunResult(
        ranks=cluster.size,
        threads=threads,
        seed=seed,
        objectives=sess.objectives,
        digests=sess.digests,
        planner=sess.planner,
        wall_s=wall,
        op_times=sess.op_times,
        value=value,
    )


__all__ = ["Recorder", "RunResult", "Session", "current", "log_objective", "rng", "run"]
