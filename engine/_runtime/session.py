"""The session: one run of a driver program on a cluster.

A session owns the cluster, the registry of DDS, per-operator state (plans and
reconnaissance sets), the run's outcome (objectives and digests) and the recorder.
Exactly one session is current per process; operators find it through
:func:`current`.  Outside :func:`run`, a default one-node session is created on
first use so that the API works interactively.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash
from numpy.random.bit_generator import ISeedSequence

from .._data import digest as _digest
from .._data.values import stable_text
from .._errors import (
    DriverDivergenceError,
    DriverStepsDivergedError,
    DriverWritesDivergedError,
    NotSeenError,
    ReplicaMismatchError,
    SessionError,
    _shown,
)
from .._files import tracking_inputs
from .._machines.tape import Tape, emit
from .control import DebugHooks, ScheduleSource
from .transport import Cluster, InProcessCluster, MpiCluster

if TYPE_CHECKING:
    from .._data import dds as _dds
    from .._machines.schedule import Schedule

#: A digest phase is named (a spinner on a terminal) only when it is expected to take a
#: person-noticeable time: the previous invocation's digests took this many seconds ...
DIGEST_PHASE_S = 1.0
#: ... or the DDS to hash hold at least this many bytes (xxh3 hashes a few GB/s, so a
#: small model's digests take microseconds and must not flash a spinner per invocation).
DIGEST_PHASE_BYTES = 256 * 2**20

#: Per-thread state of running bodies: ``index`` (the loop index), ``op_key`` (for
#: ``rng()``), ``gcode`` (guard code of the running task) and ``held`` (element ids
#: whose locks a lock-split body holds); ``inspecting`` is set while a debugger
#: evaluates a command in a stopped body (:func:`inspecting`).
_tls = threading.local()


@contextlib.contextmanager
def inspecting() -> Iterator[None]:
    """Accesses in this block on this thread are a debugger's, not the stopped body's:
    one that leaves what the body may touch raises :class:`NotSeenError` instead of
    being counted against the body (no re-plan, no violation, no recorded miss)."""
    before = getattr(_tls, "inspecting", False)
    _tls.inspecting = True
    try:
        yield
    finally:
        _tls.inspecting = before


def not_seen(desc: Callable[[], str], write: bool, reason: str) -> NotSeenError | None:
    """The error for a debugger's access outside the stopped body's reach (``reason``
    says why; ``desc()`` names the element, called only then), or None when no debugger
    is evaluating on this thread."""
    if not getattr(_tls, "inspecting", False):
        return None
    what = "write" if write else "show"
    return NotSeenError(
        f"{desc()} is not what this body {'writes' if write else 'reads'} here: {reason}; "
        f"this node's copy may be out of date, so the debugger does not {what} it"
    )


def driver_only(what: str) -> None:
    """Refuse ``what`` (a collective or driver operation) inside a running loop body: every
    rank must run it once, in the same order, and a body runs on one node, maybe twice
    (reconnaissance), maybe never (a replay from a checkpoint)."""
    if getattr(_tls, "op_key", None) is not None:
        raise SessionError(
            f"{what} was called inside a loop body (index {getattr(_tls, 'index', '?')}); it "
            "is an operation of the driver, which every rank runs once in the same order: "
            "call it before or after the loop"
        )


class Recorder:
    """The narrow interface through which the engine reports to a tracer.

    One recorder serves every node hosted by this process (one per MPI rank, all P
    in an in-process cluster); each call names its node.  Calls for one node arrive
    in that node's program order.  ``invocation_done`` is the commit point: a tracer
    makes everything reported for that node and invocation durable there.  The base
    class records nothing; ``tracer`` provides the real one.
    """

    def plan_made(self, op: str, plan: Any) -> None:
        """A plan (``engine.Plan``) was built for operator ``op``; identical on every node."""

    def schedule_done(self, sched: Schedule) -> None:
        """What happened in one invocation on this process's nodes, as one schedule value
        (``engine.lowlevel.Schedule``: the grant log, the message log, SSP visibility, the
        Hybrid mutex order, the aggregation arrival order, and their ``timeline``),
        given once per invocation before its ``invocation_done`` calls.  By default it
        makes the per-event calls below, in the order the events happened."""
        emit(sched, self)

    def lock_grants(
        self,
        op: str,
        invocation: int,
        node: int,
        round: int,
        bodies: int,
        grants: int,
        positions: np.ndarray,
        threads: np.ndarray,
        elements: Sequence[str] = (),
    ) -> None:
        """Lock grants of one node in one round: ``bodies`` locked bodies took ``grants``
        element locks; their ticket order deviates from the predicted one (the last
        thread keeps going, see ``engine._machines.grants``) at ``positions``, where ``threads``
        took over.  Every lock's grant order is the ticket order restricted to it.
        ``elements`` names, per hand-over, the element lock it took over (``W[943]``,
        see ``engine._machines.grants.handover_elements``)."""

    def index_order(
        self, op: str, invocation: int, node: int, round: int, thread: int, indices: np.ndarray
    ) -> None:
        """A thread ran indices in an order that deviates from the plan (not called when
        the plan was followed, so a plan-following run records nothing here)."""

    def message_received(self, node: int, channel: str, source: int, seq: int, nbytes: int) -> None:
        """A message from ``source`` (its ``seq``-th on this channel) arrived at ``node``."""

    def aggregation_order(
        self, op: str, invocation: int, node: int, clock: int, sources: np.ndarray
    ) -> None:
        """Owner ``node`` aggregated the deltas of ``clock`` of a ``sync_for``; ``sources``
        (int64) are the nodes whose deltas it took, in arrival order.  The sum itself
        always runs in node order, so this order never changes the result."""

    def ssp_visibility(
        self, op: str, invocation: int, node: int, clock: int, applied: np.ndarray
    ) -> None:
        """Before running ``clock`` of an SSP ``sync_for``, ``node`` had applied the updates
        of owner q for every clock up to ``applied[q]`` (int64 per node, -1: none)."""

    def body_order(
        self,
        op: str,
        invocation: int,
        node: int,
        clock: int,
        threads: np.ndarray,
        minibatches: np.ndarray,
    ) -> None:
        """In a Hybrid ``sync_for`` with several threads, the order in which ``node``'s
        threads took the node mutex in ``clock``: parallel int64 arrays of (thread,
        minibatch), in grant order."""

    def invocation_done(self, op: str, invocation: int, node: int, info: dict[str, Any]) -> None:
        """A node finished one operator invocation.  ``info`` holds ``bodies`` (int),
        ``rounds`` (int), ``seconds`` (float), ``round_seconds`` (list of float),
        ``thread_times`` (``async_for``: (round, thread, start, end) of each thread's
        task groups, seconds from the node's start of the round), ``phases`` (list of
        (kind, wall-clock start, seconds) of the invocation's ``reconnaissance``,
        ``planning`` and ``digests``, for timelines) and, on the lowest local node only,
        ``digests`` (list of (dds name, hex digest))."""

    def objective(self, name: str, iteration: int, value: float) -> None:
        """The driver logged an objective value (called once per process)."""

    def close(self, status: str, error: str | None = None) -> None:
        """The run ended: ``status`` is ``finished`` or ``failed`` (``error``: traceback)."""

    # ------------------------------------------------------------ time travel
    #: Checkpoint policy (see ``engine._runtime.checkpoint``): 0 never, N every N-th
    #: loop invocation, None chosen so that checkpoints cost <= 3% of run time.  The
    #: base recorder stores nothing, so it asks for no checkpoint.
    checkpoint_every: int | None = 0

    def checkpoint(
        self,
        op: str,
        invocation: int,
        node: int,
        step: int,
        blocks: Sequence[Any],
        counters: dict[str, Any],
        refused: Sequence[tuple[str, str]] = (),
    ) -> int:
        """Store ``node``'s checkpoint at the end of invocation ``invocation`` of ``op``
        (the ``step``-th loop invocation of the run, from 0).  ``blocks`` holds one
        ``engine._runtime.checkpoint.Rows`` per DDS written by a loop body (the rows
        ``node`` owns); ``counters`` its message counters; ``refused`` (dds, why) the DDS
        left out.  Returns the bytes stored."""
        return 0

    def collective_value(self, k: int, kind: str, value: Any) -> None:
        """The driver received ``value`` from its ``k``-th collective operator call
        (``kind``: ``reduce`` or ``gather``); called once per run (lowest node)."""


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
    digest_times: list[float] = field(default_factory=list)
    objective_times: dict[str, list[float]] = field(default_factory=dict)
    value: Any = None
    orders: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)
    #: the outcome in program order: ("digest", op, invocation, dds) and
    #: ("objective", name, iteration) entries (dual tests report the earliest difference)
    outcome_log: list[tuple[Any, ...]] = field(default_factory=list)
    #: what the program declared relaxed or stale that this run (test or checked mode)
    #: ran exactly instead, in the order met: ``{"kind": "relaxed", "name": DDS}`` and
    #: ``{"kind": "ssp", "name": OP, "staleness": S}`` (a dual verdict says it did not
    #: test them as declared)
    ran_exact: list[dict[str, Any]] = field(default_factory=list)


_current: Session | None = None


def _h64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


#: Driver writes to DDS kept, per driver operation, to name the first that differs between
#: MPI ranks; beyond these they are only hashed and counted (memory vs. precision).
WRITES_KEPT = 64


class _DriverWrites:
    """The driver's writes to DDS since its last operation (under MPI).

    Each rank applies a driver write to every replica it holds, the owner's and the
    others' alike (SPMD: every rank makes the same write), so a value taken from one rank's
    Python state gives the nodes different copies of the element, which no digest of the
    owners' rows sees.  So the writes are hashed, and the hash goes with the step check of
    the next driver operation."""

    __slots__ = ("hasher", "count", "kept")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.hasher = xxhash.xxh3_64()
        self.count = 0
        self.kept: list[tuple[str, str, str]] = []  # (element, hash of the value, shown)

    def add(self, element: str, data: bytes, shown: Callable[[], str]) -> None:
        self.hasher.update(b"%d:%s%d:" % (len(element), element.encode(), len(data)))
        self.hasher.update(data)
        self.count += 1
        if len(self.kept) < WRITES_KEPT:
            self.kept.append((element, xxhash.xxh3_64_hexdigest(data), shown()))

    def summary(self) -> tuple[int, str]:
        return self.count, self.hasher.hexdigest()


def _writes_error(
    step: str, counts: list[int], kept: list[list[tuple[str, str, str]]]
) -> DriverWritesDivergedError:
    """Which driver writes (before ``step``) differ between the ranks: the first of the
    kept ones that does, else their numbers, else (past the kept ones) the fact."""
    for k in range(max(len(w) for w in kept)):
        seen = [w[k] if k < len(w) else None for w in kept]
        if len({None if e is None else e[:2] for e in seen}) > 1:
            texts = ["nothing" if e is None else f"{e[0]} = {e[2]}" for e in seen]
            return DriverWritesDivergedError(step, f"its DDS write {k + 1}", "was", texts)
    if len(set(counts)) > 1:
        return DriverWritesDivergedError(step, "its DDS writes", "were", [str(n) for n in counts])
    return DriverWritesDivergedError(
        step,
        f"its last {counts[0] - WRITES_KEPT} of {counts[0]} DDS writes",
        "differed",
        [f"(the first {WRITES_KEPT} agree)"] * len(counts),
    )


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
        phases: Callable[[str], None] | None = None,
        digests: bool = True,
        schedules: ScheduleSource | None = None,
        hooks: DebugHooks | None = None,
        warn: Callable[[str], None] | None = None,
        digest: str | None = None,
    ) -> None:
        self.cluster = cluster
        self.schedules = schedules or ScheduleSource()
        self.hooks = hooks or DebugHooks()
        self.seed = int(seed)
        #: (op_key, seed, exact_seeds, Philox key) of the last body generator (body_rng)
        self._rng_key: tuple[int, int, bool, np.ndarray] | None = None
        self.checked = checked
        self.recorder = recorder or Recorder()
        self.progress = progress
        #: told the name of each long phase as it starts (planning, a kernel's first
        #: compile, a checkpoint), so a person watching sees what the run is doing
        self.phases = phases
        self.warn = warn or _stderr
        #: (operator, outcome) pairs of the plan guard already reported on stderr
        self.noted: set[tuple[str, str]] = set()
        #: operators whose bodies asked ``ap.reconnaissance()`` (the guard's notes say so)
        self.recon_asked: set[str] = set()
        #: test mode (dual tests): no relaxation, no staleness, every order kept
        self.test_mode = False
        #: ``ap.reduce`` folds numbers exactly per node (``engine._data.exact``); False:
        #: in index order over gathered values, as runs recorded before it did
        self.exact_reduce = True
        #: ``async_for`` routes coalesce each pair of nodes' rows into as few messages as
        #: their deadlines allow (``engine._machines.routing.coalesce``); False: one
        #: message per round and pair, as runs recorded before it did
        self.coalesce = True
        #: ``async_for`` rotations move the space with the fewest elements, cut in id
        #: order, and routed rows that would need a message of their own ride the
        #: chain of each node's most used destination when that adds at most
        #: ``routing.RELAY_BYTES`` (``engine._machines.planner._rotation_blocks``,
        #: ``routing.relay``); False: as runs did before 2026-12-07
        self.ring = True
        #: every seed has streams of its own (:func:`philox_key`); False: seeds from
        #: 2**53 share low bits' streams, as runs recorded before 2026-12-07 did
        self.exact_seeds = True
        #: (kind, name) -> what test or checked mode ran exactly (``RunResult.ran_exact``)
        self.ran_exact: dict[tuple[str, str], dict[str, Any]] = {}
        self.want_digests = digests
        #: the hash of this run's DDS digests: as asked, else the one of the trace that
        #: the schedules or hooks replay (see ``engine._data.digest``), else the default
        self.digest_kind = _digest.resolve(
            digest or getattr(hooks, "digest_kind", None) or getattr(schedules, "digest_kind", None)
        )
        self.dds: list[_dds._DDS] = []
        self._names: set[str] = set()
        self.ops: dict[str, Any] = {}
        self.invocations: dict[str, int] = {}
        self.objectives: dict[str, list[float]] = {}
        self.digests: list[dict[str, Any]] = []
        self.outcome_log: list[tuple[Any, ...]] = []
        self.planner: dict[str, dict[str, Any]] = {}
        self.op_times: dict[str, list[float]] = {}
        #: seconds each invocation's digests took, from the moment every rank had arrived
        #: (``digest_started``, set after the first collective of the digest)
        self.digest_times: list[float] = []
        self.digest_started = 0.0
        #: the phases of the running invocation as (kind, wall-clock start, seconds):
        #: ``reconnaissance``, ``planning``, ``digests``; handed to the recorder with the
        #: invocation (``take_phases``) so that a timeline can draw them
        self.phase_times: list[tuple[str, float, float]] = []
        #: when each objective value was logged, in seconds since the session began (the
        #: differences give a loop's time per iteration without its start-up)
        self.objective_times: dict[str, list[float]] = {}
        self.started = time.perf_counter()
        #: dual tests: keep every invocation's serialization order in ``orders``
        self.capture_orders = False
        self.orders: dict[tuple[str, int], np.ndarray] = {}
        self.current_node = cluster.local_nodes[0]
        #: time travel (``engine._runtime.checkpoint``): the DDS some loop body wrote, by
        #: name; loop invocations so far; collective calls so far; the checkpoint
        #: policy's state; the invocation a fast-forward restores at (None: none)
        self.body_written: dict[str, _dds._DDS] = {}
        self.steps = 0
        self.collectives = 0
        self.checkpoint_state: dict[str, Any] = {}
        self.fast_forward = self.hooks.fast_forward()
        #: called once when the run ends, however it ends (process-wide state to drop)
        self.on_end: list[Callable[[], None]] = []
        self._driver_rng_count = 0
        self._writes = _DriverWrites()
        self.mode = "driver"
        #: the events of the running attempt at an invocation (``None`` between them)
        self.tape: Tape | None = None
        cluster.bind = self.bind
        cluster.on_message = self._on_message

    def announce(self, phase: str) -> None:
        """A long phase starts (see ``phases``); on node 0's process only, as progress is."""
        if self.phases is not None and 0 in self.cluster.local_nodes:
            self.phases(phase)

    def phase_done(self, kind: str, started: float, seconds: float) -> None:
        """Keep the wall-clock ``started`` and length of a phase of the running invocation."""
        self.phase_times.append((kind, started, seconds))

    def take_phases(self) -> list[tuple[str, float, float]]:
        """The phases kept since the last call (for ``invocation_done``'s ``phases``)."""
        out, self.phase_times = self.phase_times, []
        return out

    def _on_message(self, node: int, channel: str, source: int, seq: int, nbytes: int) -> None:
        if self.tape is not None:  # inside an invocation: part of its schedule value
            self.tape.message_received(node, channel, source, seq, nbytes)
        else:
            self.recorder.message_received(node, channel, source, seq, nbytes)

    def new_tape(self) -> Tape:
        """A tape for the next attempt at an invocation (keeps nothing when no recorder
        listens)."""
        return Tape(active=type(self.recorder) is not Recorder)

    # ------------------------------------------------------------ registry
    def register(self, dds: _dds._DDS, name: str | None) -> int:
        driver_only(f"creating a {dds.kind}")
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
            d._bind(node)

    def set_mode(self, mode: str, dds: list[_dds._DDS] | None = None) -> None:
        """Switch every DDS (or the given ones) to ``mode``."""
        self.mode = mode
        for d in self.dds if dds is None else dds:
            d._set_mode(mode)

    # ------------------------------------------------------------ randomness
    def init_rng(self, name: str) -> np.random.Generator:
        key = philox_key(self.seed, _h64(name), exact_seeds=self.exact_seeds)
        return np.random.Generator(_philox(key, 0))

    def body_rng(self, op_key: int, index: int) -> np.random.Generator:
        """The stream of body ``index`` of invocation ``op_key``: Philox with the key
        :func:`philox_key` gives, at counter ``(index, 0, 0, 0)`` (``index`` modulo
        2**64, as numpy wraps a negative one), made without the OS entropy draw numpy's
        constructor makes and then ignores (54 -> 16 us a body)."""
        return np.random.Generator(_philox(self.rng_key(op_key), index & _U64))

    def rng_key(self, op_key: int) -> np.ndarray:
        """The Philox key (two uint64) of every body stream of invocation ``op_key``, as
        :meth:`body_rng` gives it (compiled kernels draw the same streams from it)."""
        made = self._rng_key
        if made is None or made[:3] != (op_key, self.seed, self.exact_seeds):
            key = philox_key(self.seed, op_key, exact_seeds=self.exact_seeds)
            made = self._rng_key = (op_key, self.seed, self.exact_seeds, key)
        return made[3]

    def op_key(self, op: str, invocation: int) -> int:
        return _h64(f"{op}#{invocation}")

    # ------------------------------------------------------------ outcome
    def next_invocation(self, op: str) -> int:
        inv = self.invocations.get(op, 0)
        self.invocations[op] = inv + 1
        return inv

    def digests_of(self, dds: list[_dds._DDS]) -> list[str]:
        """Digests of ``dds`` (collective).  A cached digest is reused only when no process
        has bumped that DDS's version since it was computed."""
        stale = [not d._digest_fresh() for d in dds]
        if self.cluster.is_mpi:
            every = self.cluster.allgather(stale)
            stale = [any(flags[k] for flags in every) for k in range(len(dds))]
        self.digest_started = time.perf_counter()  # every rank is here: no more waiting
        out: list[str | None] = [None] * len(dds)
        # the numeric ones in one go: under MPI one Gatherv and one bcast for all of them
        batch = [k for k, d in enumerate(dds) if stale[k] and d._numeric]
        if batch:
            versions = [dds[k]._version for k in batch]
            texts = self.cluster.owned_digests(
                [(dds[k], dds[k]._full_digest_head()) for k in batch], self.digest_kind
            )
            for k, version, text in zip(batch, versions, texts, strict=True):
                dds[k]._digest = (version, text)
                out[k] = text
        return [
            got if got is not None else d._compute_digest() if s else d._digest[1]  # type: ignore[index]
            for d, s, got in zip(dds, stale, out, strict=True)
        ]

    def note_exact(self, kind: str, name: str, **info: Any) -> None:
        """Test or checked mode runs ``name`` exactly though the program declared it
        ``kind`` (``"relaxed"``, ``"ssp"``): keep it for the verdict, tell the hooks."""
        key = (kind, name)
        if key in self.ran_exact:
            return
        entry = {"kind": kind, "name": name, **info}
        self.ran_exact[key] = entry
        self.hooks.ran_exact(entry)

    def check_replicas(self, op: str, invocation: int) -> None:
        """Test and checked mode: every node's replica of every row must equal its
        owner's after each invocation, except the dirty rows away from their homes
        (``engine._data.dds``: only the home and the node that wrote the last value are
        sure to hold it, and the next reader fetches them or makes the DDS whole); raise
        :class:`ReplicaMismatchError` otherwise."""
        if not (self.checked or self.test_mode):
            return
        for d in self.dds:
            owners = self.cluster.gather_owned(d)
            bad = self.cluster.run_on_nodes(functools.partial(_differs, d, owners=owners))
            for node, found in enumerate(bad):
                if found is not None:
                    slot, mine = found
                    owner = d.owner(d.key_of(slot))
                    raise ReplicaMismatchError(
                        op,
                        invocation,
                        d.name,
                        d._desc(d.key_of(slot)),
                        node,
                        owner,
                        _shown(mine, 80),
                        _shown(owners[slot], 80),
                    )

    def record_digests(self, op: str, invocation: int) -> list[tuple[str, str]]:
        if not self.want_digests:
            return []
        if self._digests_long():
            self.announce(f"digests after {op}#{invocation}")
        wall, t0 = time.time(), time.perf_counter()
        out = list(zip([d.name for d in self.dds], self.digests_of(self.dds), strict=True))
        # from the moment every rank has arrived: a rank that finished its loop early
        # waits for the others at the first collective after it, digest or not
        self.digest_times.append(time.perf_counter() - self.digest_started)
        # the phase starts there too: waiting for slower ranks belongs to the invocation
        self.phase_done("digests", wall + (self.digest_started - t0), self.digest_times[-1])
        for name, dig in out:
            self.digests.append({"op": op, "invocation": invocation, "dds": name, "digest": dig})
            self.outcome_log.append(("digest", op, invocation, name))
        return out

    def _digests_long(self) -> bool:
        """Whether the coming digests deserve a phase name: the last ones were slow, or
        the numeric DDS whose cached digest is stale hold many bytes (one process's view;
        only node 0's process announces)."""
        if self.phases is None or 0 not in self.cluster.local_nodes:
            return False
        if self.digest_times and self.digest_times[-1] >= DIGEST_PHASE_S:
            return True
        size = 0
        for d in self.dds:
            if d._numeric and not d._digest_fresh():
                size += len(d) * d.row_nbytes()
        return size >= DIGEST_PHASE_BYTES

    def log_objective(self, name: str, value: float) -> None:
        value = float(value)
        vals = self.objectives.setdefault(name, [])
        self._check_spmd(name, len(vals), value)
        vals.append(value)
        self.objective_times.setdefault(name, []).append(time.perf_counter() - self.started)
        self.outcome_log.append(("objective", name, len(vals) - 1))
        self.recorder.objective(name, len(vals) - 1, value)
        if self.progress is not None:
            self.progress(f"iter {len(vals) - 1:>3}  {name} = {float(value):.6g}")

    def _check_spmd(self, name: str, iteration: int, value: float) -> None:
        """Every driver process must log the same bits (one small allgather under MPI)."""
        bits = self.agree(
            f"ap.log_objective({name!r}) iteration {iteration}", struct.pack("<d", value)
        )
        if len(set(bits)) > 1:  # bitwise: NaN equals NaN, 0.0 differs from -0.0
            values = [struct.unpack("<d", b)[0] for b in bits]
            raise DriverDivergenceError(name, iteration, values)

    def agree(self, step: str, value: Any = None) -> list[Any]:
        """Under MPI, the first message of every driver operation: all ranks must be at
        the same ``step`` (else :class:`DriverStepsDivergedError` on every rank, where a
        divergent driver would otherwise wait forever for a peer at another operation);
        returns every rank's ``value`` (one small allgather; in one process, ``[value]``)."""
        if not self.cluster.is_mpi:
            return [value]
        got = self.cluster.allgather((step, self._writes.summary(), value))
        steps = [s for s, _, _ in got]
        if any(s != step for s in steps):
            raise DriverStepsDivergedError(steps)
        if any(w != got[0][1] for _, w, _ in got):  # every rank sees this: all go on here
            counts = [w[0] for _, w, _ in got]
            raise _writes_error(step, counts, self.cluster.allgather(self._writes.kept))
        self._writes.reset()
        return [v for _, _, v in got]

    def note_write(self, element: str, data: bytes, shown: Callable[[], str]) -> None:
        """A driver write of ``data`` (the value's bytes) to ``element`` (``X[3]``),
        compared across MPI ranks at the next driver operation (see ``_DriverWrites``)."""
        if self.cluster.is_mpi:
            self._writes.add(element, data, shown)


class _NoEntropy(ISeedSequence):
    """A seed sequence of zeros: a Philox made from it draws nothing from the OS (numpy's
    own ``SeedSequence()`` would, for a key :meth:`Session.body_rng` then replaces)."""

    def generate_state(self, n_words: int, dtype: Any = np.uint32) -> np.ndarray:
        return np.zeros(n_words, dtype=dtype)


_NO_ENTROPY = _NoEntropy()
_NO_BUFFER = np.zeros(4, dtype=np.uint64)  # copied into each generator's state
_U64 = 2**64 - 1


def philox_key(seed: int, op_key: int, *, exact_seeds: bool = True) -> np.ndarray:
    """The Philox key (two uint64) of the streams of run seed ``seed`` (0 to 2**64 - 1)
    and op key ``op_key`` (a 64-bit hash of an operator's invocation, or of a name).

    Runs have always keyed them with numpy's ``Philox(key=[seed, op_key])``.  numpy makes
    a float64 array of that list when a value does not fit an int64, which rounds an op
    key above 2**63 to 53 bits (hashes: harmless, and every recorded stream has it) but
    also a seed of 2**53 or more, so that nearby seeds shared streams, and a value within
    2**10 of 2**64 becomes 2**64, whose cast to uint64 depends on the CPU.  With
    ``exact_seeds`` (runs recorded since 2026-12-07) the key is numpy's wherever numpy's
    keeps the seed and is well defined, so every such stream keeps its bits, and
    ``[seed, op_key]`` exactly otherwise: the key's first word is always the seed.
    Without it (a replay of an older trace) it is numpy's, whatever this CPU makes of it.
    """
    if not exact_seeds:
        with np.errstate(invalid="ignore"):  # the cast of 2**64: the old run's CPU decided
            return np.random.Philox(key=[seed & _U64, op_key]).state["state"]["key"]
    if op_key >= 2**63 and seed < 2**53 and float(op_key) < 2.0**64:
        op_key = int(float(op_key))  # numpy's rounding (both round half to even)
    return np.array([seed, op_key], dtype=np.uint64)


def _philox(key: np.ndarray, counter: int) -> np.random.Philox:
    """``Philox(key=key, counter=[counter, 0, 0, 0])`` with an empty buffer, made
    without drawing OS entropy."""
    bg = np.random.Philox(_NO_ENTROPY)  # type: ignore[arg-type]  # an ISeedSequence
    bg.state = {
        "bit_generator": "Philox",
        "state": {"counter": np.array([counter, 0, 0, 0], dtype=np.uint64), "key": key},
        "buffer": _NO_BUFFER,
        "buffer_pos": 4,  # the buffer is empty: the first draw computes a block
        "has_uint32": 0,
        "uinteger": 0,
    }
    return bg


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _differs(d: _dds._DDS, node: int, owners: Any) -> tuple[int, Any] | None:
    """The first slot where ``node``'s replica differs from the owners' content (dirty
    slots that ``node`` is neither the home of nor the writer of the last value of are
    not compared)."""
    buf = d._bufs[node]
    if type(buf) is dict:  # a sharded dvector: the rows the node holds are compared
        mine: Any = [buf.get(k, v) for k, v in enumerate(owners)]
    else:
        mine = d.rows(node, np.arange(len(d), dtype=np.int64))
    if d._dirty is not None and d._holder is not None:
        skip = np.setdiff1d(d._dirty[d._holder != node], d.owned(node), assume_unique=True)
        if d._numeric:
            mine = mine.copy()
            mine[skip] = owners[skip]
        else:
            for s in skip.tolist():
                mine[s] = owners[s]

    if d._numeric:
        # bitwise, so that NaN equals NaN and 0.0 differs from -0.0
        a = np.ascontiguousarray(mine).view(np.uint8).reshape(len(mine), -1)
        b = np.ascontiguousarray(owners).view(np.uint8).reshape(len(owners), -1)
        bad = np.flatnonzero((a != b).any(axis=1))
        return None if not len(bad) else (int(bad[0]), mine[int(bad[0])])
    for k, (a, b) in enumerate(zip(mine, owners, strict=True)):
        # one object is one text (nothing runs between the two calls to change it)
        if a is not b and stable_text(a) != stable_text(b):
            return k, a
    return None


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
    driver_only("ap.log_objective")
    current().log_objective(name, value)


#: What modules above keep about a run's bodies and drop when any run ends: such a cache
#: holds a body's closure, hence the run's DDS, so a process that runs one program after
#: another (a notebook, a test session) kept every earlier run's data alive.
AFTER_RUN: list[Callable[[], None]] = []


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
    schedules: ScheduleSource | None = None,
    hooks: DebugHooks | None = None,
    test_mode: bool = False,
    digest: str | None = None,
    phases: Callable[[str], None] | None = None,
    exact_reduce: bool = True,
    coalesce: bool = True,
    ring: bool = True,
    exact_seeds: bool = True,
) -> RunResult:
    """Run the driver ``fn(**params)`` on a fresh cluster and return its outcome.

    With ``comm`` (an MPI communicator) every rank hosts one node; otherwise an
    in-process cluster of ``nodes`` nodes is used.  ``recorder`` receives the trace
    events; ``schedules`` (replay, the dual tests, chaos) gives each invocation's
    schedule, and ``hooks`` adds breakpoints, per-invocation checks and time travel.
    ``digest`` names the hash of the DDS digests (``"xxh3-128"``, the default, or
    ``"blake2b-128"``); a replay's schedules or hooks give the trace's.  ``phases`` is
    told each long phase as it starts (``"planning sgd"``, ``"compiling kernel sgd"``,
    ``"checkpoint after sgd#3"``).  ``exact_reduce=False`` makes every ``ap.reduce``
    fold in index order over gathered values, as runs did before its exact fold (a replay
    of such a run passes it).  ``coalesce=False`` sends an ``async_for``'s routed rows
    in one message per round and pair of nodes, as runs did before messages were
    coalesced (the same bits either way; a replay of such a run passes it, so that its
    recorded arrivals keep their shape).  ``ring=False`` plans rotations and routes
    rows as runs did before 2026-12-07 (``Session.ring``; a replay of such a run passes
    it, or its plans would differ from the recorded ones).  ``exact_seeds=False`` keys
    the random streams of seeds from 2**53 as runs did before 2026-12-07, when nearby
    such seeds shared streams (:func:`philox_key`; a replay of such a run passes it).
    """
    global _current
    if _current is not None and getattr(_current, "_running", False):
        raise SessionError("engine.run() cannot be nested inside another run")
    if not 0 <= seed <= _U64:  # numpy's own refusal came later and named no parameter
        raise ValueError(f"seed must be an integer from 0 to 2**64 - 1, got {seed}")
    cluster: Cluster = (
        MpiCluster(comm, threads) if comm is not None else InProcessCluster(nodes, threads)
    )
    sess = Session(
        cluster,
        seed=seed,
        checked=checked,
        recorder=recorder,
        progress=progress,
        phases=phases,
        schedules=schedules,
        hooks=hooks,
        digest=digest,
    )
    sess.test_mode = test_mode
    sess.exact_reduce = exact_reduce
    sess.coalesce = coalesce
    sess.ring = ring
    sess.exact_seeds = exact_seeds
    sess.capture_orders = test_mode
    prev = _current
    _current = sess
    sess._running = True  # type: ignore[attr-defined]
    t0 = sess.started = time.perf_counter()  # objective times count from where wall_s does
    try:
        with tracking_inputs():  # what the run reads, no output may replace
            value = fn(**(params or {}))
        wall = time.perf_counter() - t0
    finally:
        sess._running = False  # type: ignore[attr-defined]
        for end in sess.on_end:
            end()
        for forget in AFTER_RUN:
            forget()
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
        digest_times=sess.digest_times,
        objective_times=sess.objective_times,
        value=value,
        orders=sess.orders,
        ran_exact=list(sess.ran_exact.values()),
        outcome_log=sess.outcome_log,
    )


__all__ = ["Recorder", "RunResult", "Session", "current", "log_objective", "rng", "run"]
