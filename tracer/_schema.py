"""The trace store schema (SQLAlchemy 2.0 declarative); ORM classes never leave ``tracer``.

One row per run; plans once per operator; per (run, op, invocation, node) one
``invocation`` row (the commit marker) plus at most one bulk block per kind (and
message channel), whose arrays are codec blobs (see ``_codec``).  Sequence numbers
are per node: single events keep theirs in a ``seq`` column; a block of recorder
calls keeps each call's first seq in its ``calls`` array, a message block an array.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

#: Version of this schema; a reader refuses traces with another one (2: the hash chain,
#: ``chain_link`` and ``invocation.n_digests``; 3: the ``interrupted`` run status, NaN
#: objectives, and lock grants stored as deviations from a predicted ticket order
#: instead of raw (lock, thread, index) triples; 4: the element each lock hand-over took
#: over, ``lock_grant_block.elements``, and each thread's task-group times,
#: ``invocation.thread_times``; 5: time travel, the ``checkpoint``, ``checkpoint_block``
#: and ``collective_value`` tables; 6: ``run.continues``, the crashed run a resumed run
#: continues, and ``run.labels``, a JSON object of plain values such as a chaos run's seed).
SCHEMA_VERSION = 6
#: Identifies a trace store among SQLite files (kept in ``schema_info.app_id``).
APP_ID = "strads-replay-trace"

#: The integer fields of a run row and the inclusive range each may hold.  The one
#: source of these bounds: ``start_run`` refuses to write a value outside them, every
#: reader refuses to read one, and the CLI refuses the option before anything starts,
#: so a run that records is always a run that can be read back.  The rank and thread
#: bounds are far above any machine this replays on (``--max-ranks`` guards that).
RUN_LIMITS: dict[str, tuple[int, int]] = {
    "ranks": (1, 4096),
    "threads": (1, 1024),
    "seed": (0, 2**63 - 1),
}
#: Values of ``run.status``.
RUN_STATUSES = ("running", "finished", "failed", "crashed", "interrupted")
#: Values of ``verdict.kind``.
VERDICT_KINDS = ("cluster", "single", "dual-forward", "dual-backward")

_NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base with a naming convention for constraints and indexes."""

    metadata = MetaData(naming_convention=_NAMING)
    # 64-bit everywhere (seqs and counts outgrow 32 bits); SQLite needs INTEGER for rowid ids
    type_annotation_map = {int: BigInteger().with_variant(Integer, "sqlite")}


def _run_fk() -> Mapped[str]:
    return mapped_column(String(64), ForeignKey("run.run_id", ondelete="CASCADE"))


class SchemaInfo(Base):
    """One row: which application wrote this database and with which schema version."""

    __tablename__ = "schema_info"
    app_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[int] = mapped_column()
    created_at: Mapped[float] = mapped_column(Float)


#: Key of the run's environment record (hash seed, BLAS threads) inside the JSON of
#: ``run.versions``: kept there so that adding it needed no schema version bump.
ENVIRONMENT_KEY = "_environment"


class Run(Base):
    """Metadata and status of one recorded run."""

    __tablename__ = "run"
    __table_args__ = (CheckConstraint(f"status IN {RUN_STATUSES!r}", name="status"),)
    run_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    app: Mapped[str] = mapped_column(String(200), default="")
    target: Mapped[str] = mapped_column(Text, default="")
    params: Mapped[str] = mapped_column(Text, default="{}")
    code_digest: Mapped[str] = mapped_column(String(128), default="")
    ranks: Mapped[int] = mapped_column(default=1)
    threads: Mapped[int] = mapped_column(default=1)
    seed: Mapped[int] = mapped_column(default=0)
    versions: Mapped[str] = mapped_column(Text, default="{}")
    started_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    status: Mapped[str] = mapped_column(String(16), default="running")
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    end_node: Mapped[int | None] = mapped_column(nullable=True)
    end_seq: Mapped[int | None] = mapped_column(nullable=True)
    continues: Mapped[str | None] = mapped_column(String(64), nullable=True)
    labels: Mapped[str] = mapped_column(Text, default="{}")


class OperatorPlan(Base):
    """A plan of one operator, in force from ``first_invocation`` on (see ``_plans``)."""

    __tablename__ = "operator_plan"
    __table_args__ = (UniqueConstraint("run", "op", "plan_no"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    run: Mapped[str] = _run_fk()
    op: Mapped[str] = mapped_column(String(200))
    plan_no: Mapped[int] = mapped_column()
    first_invocation: Mapped[int] = mapped_column()
    node: Mapped[int] = mapped_column()
    seq: Mapped[int] = mapped_column()
    strategy: Mapped[str] = mapped_column(String(32))
    start: Mapped[int] = mapped_column()
    n: Mapped[int] = mapped_column()
    nodes: Mapped[int] = mapped_column()
    threads: Mapped[int] = mapped_column()
    rounds: Mapped[int] = mapped_column()
    n_tasks: Mapped[int] = mapped_column()
    n_explicit: Mapped[int] = mapped_column()
    imbalance: Mapped[float] = mapped_column(Float)
    node_imbalance: Mapped[float] = mapped_column(Float)
    tasks: Mapped[bytes] = mapped_column(LargeBinary)
    tasks_codec: Mapped[str] = mapped_column(String(16))
    task_of: Mapped[bytes] = mapped_column(LargeBinary)
    task_of_codec: Mapped[str] = mapped_column(String(16))
    orders: Mapped[bytes] = mapped_column(LargeBinary)
    orders_codec: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[float] = mapped_column(Float)


class Invocation(Base):
    """One node finished one operator invocation; written last in that commit."""

    __tablename__ = "invocation"
    __table_args__ = (
        UniqueConstraint("run", "op", "invocation", "node"),
        Index(None, "run", "node", "seq"),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    run: Mapped[str] = _run_fk()
    op: Mapped[str] = mapped_column(String(200))
    invocation: Mapped[int] = mapped_column()
    node: Mapped[int] = mapped_column()
    seq: Mapped[int] = mapped_column()
    first_seq: Mapped[int] = mapped_column()
    bodies: Mapped[int] = mapped_column()
    rounds: Mapped[int] = mapped_column()
    #: ``sync_for``'s mode (bsp, ssp, hybrid); empty for ``async_for`` (its plan says)
    strategy: Mapped[str] = mapped_column(String(32), default="")
    seconds: Mapped[float] = mapped_column(Float)
    round_seconds: Mapped[bytes] = mapped_column(LargeBinary)
    round_seconds_codec: Mapped[str] = mapped_column(String(16))
    #: ``async_for``: (round, thread, start, end) per thread that ran task groups in a
    #: round, flattened; start and end in whole µs from the node's start of that round
    thread_times: Mapped[bytes] = mapped_column(LargeBinary)
    thread_times_codec: Mapped[str] = mapped_column(String(16))
    n_lock_grants: Mapped[int] = mapped_column(default=0)
    n_messages: Mapped[int] = mapped_column(default=0)
    n_deviations: Mapped[int] = mapped_column(default=0)
    n_aggregations: Mapped[int] = mapped_column(default=0)
    n_visibility: Mapped[int] = mapped_column(default=0)
    n_mutex_grants: Mapped[int] = mapped_column(default=0)
    n_digests: Mapped[int] = mapped_column(default=0)
    blob_bytes: Mapped[int] = mapped_column(default=0)
    committed_at: Mapped[float] = mapped_column(Float)


class Digest(Base):
    """Digest of one DDS after one operator invocation."""

    __tablename__ = "digest"
    __table_args__ = (Index(None, "run", "op", "invocation"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    run: Mapped[str] = _run_fk()
    op: Mapped[str] = mapped_column(String(200))
    invocation: Mapped[int] = mapped_column()
    node: Mapped[int] = mapped_column()
    seq: Mapped[int] = mapped_column()
    dds: Mapped[str] = mapped_column(String(200))
    digest: Mapped[str] = mapped_column(String(128))


class Objective(Base):
    """One logged objective value."""

    __tablename__ = "objective"
    __table_args__ = (Index(None, "run", "name", "iteration"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    run: Mapped[str] = _run_fk()
    name: Mapped[str] = mapped_column(String(200))
    iteration: Mapped[int] = mapped_column()
    #: NULL is NaN: SQLite stores a NaN REAL as NULL (a diverging loss must still record)
    value: Mapped[float | None] = mapped_column(Float, nullable=True)
    node: Mapped[int] = mapped_column()
    seq: Mapped[int] = mapped_column()


def _blob() -> Mapped[bytes]:
    return mapped_column(LargeBinary)


def _codec() -> Mapped[str]:
    return mapped_column(String(16))


def _block_indexes() -> tuple[Index, Index]:
    return Index(None, "run", "op", "invocation", "node"), Index(None, "run", "node", "first_seq")


class _BlockKey:
    """Columns of every bulk block: whose events it holds and where their seqs start."""

    id: Mapped[int] = mapped_column(primary_key=True)
    op: Mapped[str] = mapped_column(String(200))
    invocation: Mapped[int] = mapped_column()
    node: Mapped[int] = mapped_column()
    first_seq: Mapped[int] = mapped_column()
    count: Mapped[int] = mapped_column()  # events in the block


class _CallBlock(_BlockKey):
    """A block of recorder calls: ``calls`` rows are (header..., seq, length) and the
    value arrays are the calls' arrays concatenated (``n_values`` entries each)."""

    n_calls: Mapped[int] = mapped_column()
    n_values: Mapped[int] = mapped_column()
    calls: Mapped[bytes] = _blob()
    calls_codec: Mapped[str] = _codec()


class LockGrantBlock(_CallBlock, Base):
    """Lock grants of one node in one invocation, one call (event) per round: calls are
    (round, bodies, grants, seq, length); ``deviations`` holds each round's (position,
    thread) pairs, flattened, where the ticket order left its prediction (``engine``'s
    ``_grants`` module says how the prediction and the per-lock orders follow);
    ``elements`` names the element lock each of them took over (``W[943]``), as UTF-8
    lines in the same order (a u8 codec blob)."""

    __tablename__ = "lock_grant_block"
    __table_args__ = _block_indexes()
    run: Mapped[str] = _run_fk()
    deviations: Mapped[bytes] = _blob()
    deviations_codec: Mapped[str] = _codec()
    elements: Mapped[bytes] = _blob()
    elements_codec: Mapped[str] = _codec()


class IndexOrderBlock(_CallBlock, Base):
    """Deviations from the plan's index order; calls are (round, thread, seq, length)."""

    __tablename__ = "index_order_block"
    __table_args__ = _block_indexes()
    run: Mapped[str] = _run_fk()
    indices: Mapped[bytes] = _blob()
    indices_codec: Mapped[str] = _codec()


class AggregationBlock(_CallBlock, Base):
    """``sync_for`` owners' delta arrival orders; calls are (clock, seq, length)."""

    __tablename__ = "aggregation_block"
    __table_args__ = _block_indexes()
    run: Mapped[str] = _run_fk()
    sources: Mapped[bytes] = _blob()
    sources_codec: Mapped[str] = _codec()


class VisibilityBlock(_CallBlock, Base):
    """SSP ``sync_for``: updates applied before each clock; calls are (clock, seq, nodes)."""

    __tablename__ = "visibility_block"
    __table_args__ = _block_indexes()
    run: Mapped[str] = _run_fk()
    applied: Mapped[bytes] = _blob()
    applied_codec: Mapped[str] = _codec()


class MutexGrantBlock(_CallBlock, Base):
    """Hybrid ``sync_for``: node-mutex grants in order; calls are (clock, seq, count)."""

    __tablename__ = "mutex_grant_block"
    __table_args__ = _block_indexes()
    run: Mapped[str] = _run_fk()
    threads: Mapped[bytes] = _blob()
    threads_codec: Mapped[str] = _codec()
    minibatches: Mapped[bytes] = _blob()
    minibatches_codec: Mapped[str] = _codec()


class MessageBlock(_BlockKey, Base):
    """Messages one node received on one channel during one invocation, in arrival order."""

    __tablename__ = "message_block"
    __table_args__ = _block_indexes()
    run: Mapped[str] = _run_fk()
    channel: Mapped[str] = mapped_column(String(64))
    seqs: Mapped[bytes] = _blob()
    seqs_codec: Mapped[str] = _codec()
    sources: Mapped[bytes] = _blob()
    sources_codec: Mapped[str] = _codec()
    source_seqs: Mapped[bytes] = _blob()
    source_seqs_codec: Mapped[str] = _codec()
    nbytes: Mapped[bytes] = _blob()
    nbytes_codec: Mapped[str] = _codec()


@dataclass(frozen=True)
class CallBlockSpec:
    """How a call block is laid out: header fields, value arrays, events per value or call."""

    header: tuple[str, ...]
    values: tuple[str, ...]
    per_value: bool
    counter: str  # the ``invocation`` column that counts its events

    @property
    def width(self) -> int:
        """Columns of one ``calls`` row: the header, then seq and length."""
        return len(self.header) + 2


#: Every call-block table and its layout.
CALL_BLOCKS: dict[Any, CallBlockSpec] = {
    LockGrantBlock: CallBlockSpec(
        ("round", "bodies", "grants"), ("deviations",), False, "n_lock_grants"
    ),
    IndexOrderBlock: CallBlockSpec(("round", "thread"), ("indices",), False, "n_deviations"),
    AggregationBlock: CallBlockSpec(("clock",), ("sources",), False, "n_aggregations"),
    VisibilityBlock: CallBlockSpec(("clock",), ("applied",), False, "n_visibility"),
    MutexGrantBlock: CallBlockSpec(("clock",), ("threads", "minibatches"), True, "n_mutex_grants"),
}


class ChainLink(Base):
    """One link of a node's hash chain (see ``_chain``): it covers every chained row of
    ``node`` whose sequence number lies in [``first_seq``, ``end_seq``)."""

    __tablename__ = "chain_link"
    __table_args__ = (UniqueConstraint("run", "node", "link_no"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    run: Mapped[str] = _run_fk()
    node: Mapped[int] = mapped_column()
    link_no: Mapped[int] = mapped_column()
    first_seq: Mapped[int] = mapped_column()
    end_seq: Mapped[int] = mapped_column()
    op: Mapped[str] = mapped_column(String(200))
    invocation: Mapped[int] = mapped_column()
    n_rows: Mapped[int] = mapped_column()
    manifest: Mapped[bytes] = mapped_column(LargeBinary)  # (table, seq, digest) per row
    keyed: Mapped[int] = mapped_column()  # 1: an HMAC under REPLAY_TRACE_KEY (never stored)
    link: Mapped[bytes] = mapped_column(LargeBinary)


class Checkpoint(Base):
    """One node's checkpoint at the end of an invocation (time travel): a marker written
    after its blocks have committed, so a checkpoint with a row here is whole for that
    node.  ``step`` is the invocation's place among the run's loop invocations.
    Not chained: a restored checkpoint is checked against the invocation's digests."""

    __tablename__ = "checkpoint"
    __table_args__ = (
        UniqueConstraint("run", "op", "invocation", "node"),
        Index(None, "run", "step"),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    run: Mapped[str] = _run_fk()
    op: Mapped[str] = mapped_column(String(200))
    invocation: Mapped[int] = mapped_column()
    node: Mapped[int] = mapped_column()
    step: Mapped[int] = mapped_column()
    counters: Mapped[str] = mapped_column(Text, default="{}")  # JSON: message counters
    refused: Mapped[str] = mapped_column(Text, default="[]")  # JSON: [dds, why] left out
    nbytes: Mapped[int] = mapped_column()
    seconds: Mapped[float] = mapped_column(Float, default=0.0)  # encoding and writing it
    created_at: Mapped[float] = mapped_column(Float)


class CheckpointBlock(Base):
    """The rows one node owns of one DDS in one checkpoint: ``slots`` and ``values`` are
    codec blobs; ``kind`` ``array`` (values flattened, ``dtype`` and row ``shape``) or
    ``plain`` (a tagged-JSON text of plain data, see ``_plain``, as u8)."""

    __tablename__ = "checkpoint_block"
    __table_args__ = (Index(None, "run", "op", "invocation"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    run: Mapped[str] = _run_fk()
    op: Mapped[str] = mapped_column(String(200))
    invocation: Mapped[int] = mapped_column()
    node: Mapped[int] = mapped_column()
    dds: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(16))
    dtype: Mapped[str] = mapped_column(String(16))
    shape: Mapped[str] = mapped_column(Text, default="[]")
    length: Mapped[int] = mapped_column()
    count: Mapped[int] = mapped_column()
    slots: Mapped[bytes] = _blob()
    slots_codec: Mapped[str] = _codec()
    values: Mapped[bytes] = _blob()
    values_codec: Mapped[str] = _codec()


class CollectiveValue(Base):
    """The value the driver got from its ``k``-th collective call (``reduce``,
    ``gather``), served to a driver that fast-forwards to a checkpoint.  ``encoding``:
    ``array`` (``dtype``, ``shape``), ``plain`` (tagged JSON as u8) or ``refused``
    (``detail`` says why; such a value cannot be served)."""

    __tablename__ = "collective_value"
    __table_args__ = (UniqueConstraint("run", "k"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    run: Mapped[str] = _run_fk()
    k: Mapped[int] = mapped_column()
    kind: Mapped[str] = mapped_column(String(16))
    encoding: Mapped[str] = mapped_column(String(16))
    dtype: Mapped[str] = mapped_column(String(16), default="")
    shape: Mapped[str] = mapped_column(Text, default="[]")
    detail: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[bytes] = _blob()
    data_codec: Mapped[str] = _codec()


#: Time-travel tables and their blob columns: reported as checkpoint bytes, apart from
#: the trace's own bytes (they do not count against the bytes-per-body budget).
CHECKPOINT_BLOB_COLUMNS: dict[Any, tuple[str, ...]] = {
    CheckpointBlock: ("slots", "values"),
    CollectiveValue: ("data",),
}


class Verdict(Base):
    """Result of a replay or dual test of a run, written by ``replay``."""

    __tablename__ = "verdict"
    __table_args__ = (
        CheckConstraint(f"kind IN {VERDICT_KINDS!r}", name="kind"),
        Index(None, "run", "created_at"),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    run: Mapped[str] = _run_fk()
    kind: Mapped[str] = mapped_column(String(32))
    passed: Mapped[bool] = mapped_column()
    detail: Mapped[str] = mapped_column(Text, default="{}")
    created_at: Mapped[float] = mapped_column(Float)


#: Values of ``phase.kind``.
PHASE_KINDS = ("reconnaissance", "planning", "digests")


class Phase(Base):
    """How long one node spent in a phase of an invocation outside its rounds
    (``PHASE_KINDS``), written with the invocation; for timelines only.
    Added without a schema version bump: a reader that does not know this table never
    reads it, and a trace written before it exports without these slices.  Not chained:
    nothing replays from it, and an exporter takes its values as untrusted."""

    __tablename__ = "phase"
    __table_args__ = (Index(None, "run", "node"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    run: Mapped[str] = _run_fk()
    op: Mapped[str] = mapped_column(String(200))
    invocation: Mapped[int] = mapped_column()
    node: Mapped[int] = mapped_column()
    kind: Mapped[str] = mapped_column(String(32))
    started_at: Mapped[float] = mapped_column(Float)  # wall clock, as ``run.started_at``
    seconds: Mapped[float] = mapped_column(Float)


#: Bulk tables and their blob columns (what ``store_bytes`` and corruption checks visit).
BLOB_COLUMNS: dict[Any, tuple[str, ...]] = {
    OperatorPlan: ("tasks", "task_of", "orders"),
    Invocation: ("round_seconds", "thread_times"),
    MessageBlock: ("seqs", "sources", "source_seqs", "nbytes"),
    **{model: ("calls", *spec.values) for model, spec in CALL_BLOCKS.items()},
    LockGrantBlock: ("calls", *CALL_BLOCKS[LockGrantBlock].values, "elements"),
}

__all__ = [
    "APP_ID",
    "BLOB_COLUMNS",
    "CALL_BLOCKS",
    "CHECKPOINT_BLOB_COLUMNS",
    "RUN_STATUSES",
    "SCHEMA_VERSION",
    "VERDICT_KINDS",
    "AggregationBlock",
    "Base",
    "CallBlockSpec",
    "ChainLink",
    "Checkpoint",
    "CheckpointBlock",
    "CollectiveValue",
    "Digest",
    "IndexOrderBlock",
    "Invocation",
    "LockGrantBlock",
    "MessageBlock",
    "MutexGrantBlock",
    "Objective",
    "OperatorPlan",
    "PHASE_KINDS",
    "Phase",
    "Run",
    "SchemaInfo",
    "Verdict",
    "VisibilityBlock",
]
