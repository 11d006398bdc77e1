"""The trace store schema (SQLAlchemy 2.0 declarative); ORM classes never leave ``tracer``.

One row per run; plans once per operator; per (run, op, invocation, node) one
``invocation`` row (the commit marker) plus at most one bulk block per kind, whose
arrays are codec blobs (see ``_codec``).  Event sequence numbers are per node:
single events keep theirs in a ``seq`` column, bulk blocks keep a delta-coded array.
"""

from __future__ import annotations

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

#: Version of this schema; a reader refuses traces with a larger one.
SCHEMA_VERSION = 1
#: Identifies a trace store among SQLite files (kept in ``schema_info.app_id``).
APP_ID = "strads-replay-trace"

#: Values of ``run.status``.
RUN_STATUSES = ("running", "finished", "failed", "crashed")
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
    seconds: Mapped[float] = mapped_column(Float)
    round_seconds: Mapped[bytes] = mapped_column(LargeBinary)
    round_seconds_codec: Mapped[str] = mapped_column(String(16))
    n_lock_grants: Mapped[int] = mapped_column(default=0)
    n_messages: Mapped[int] = mapped_column(default=0)
    n_deviations: Mapped[int] = mapped_column(default=0)
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
    value: Mapped[float] = mapped_column(Float)
    node: Mapped[int] = mapped_column()
    seq: Mapped[int] = mapped_column()


class _BlockKey:
    """Columns shared by bulk blocks: whose events they are and where their seqs start."""

    id: Mapped[int] = mapped_column(primary_key=True)
    op: Mapped[str] = mapped_column(String(200))
    invocation: Mapped[int] = mapped_column()
    node: Mapped[int] = mapped_column()
    first_seq: Mapped[int] = mapped_column()
    count: Mapped[int] = mapped_column()


class LockGrantBlock(_BlockKey, Base):
    """Lock grants of one node in one invocation: ``calls`` rows are (round, seq, count)."""

    __tablename__ = "lock_grant_block"
    __table_args__ = (
        Index(None, "run", "op", "invocation", "node"),
        Index(None, "run", "node", "first_seq"),
    )
    run: Mapped[str] = _run_fk()
    n_calls: Mapped[int] = mapped_column()
    calls: Mapped[bytes] = mapped_column(LargeBinary)
    calls_codec: Mapped[str] = mapped_column(String(16))
    locks: Mapped[bytes] = mapped_column(LargeBinary)
    locks_codec: Mapped[str] = mapped_column(String(16))
    threads: Mapped[bytes] = mapped_column(LargeBinary)
    threads_codec: Mapped[str] = mapped_column(String(16))
    indices: Mapped[bytes] = mapped_column(LargeBinary)
    indices_codec: Mapped[str] = mapped_column(String(16))


class MessageBlock(_BlockKey, Base):
    """Messages one node received on one channel during one invocation, in arrival order."""

    __tablename__ = "message_block"
    __table_args__ = (
        Index(None, "run", "op", "invocation", "node"),
        Index(None, "run", "node", "first_seq"),
    )
    run: Mapped[str] = _run_fk()
    channel: Mapped[str] = mapped_column(String(64))
    seqs: Mapped[bytes] = mapped_column(LargeBinary)
    seqs_codec: Mapped[str] = mapped_column(String(16))
    sources: Mapped[bytes] = mapped_column(LargeBinary)
    sources_codec: Mapped[str] = mapped_column(String(16))
    source_seqs: Mapped[bytes] = mapped_column(LargeBinary)
    source_seqs_codec: Mapped[str] = mapped_column(String(16))
    nbytes: Mapped[bytes] = mapped_column(LargeBinary)
    nbytes_codec: Mapped[str] = mapped_column(String(16))


class IndexOrderBlock(_BlockKey, Base):
    """Deviations from the plan's index order: ``calls`` rows are (round, thread, seq, length)."""

    __tablename__ = "index_order_block"
    __table_args__ = (
        Index(None, "run", "op", "invocation", "node"),
        Index(None, "run", "node", "first_seq"),
    )
    run: Mapped[str] = _run_fk()
    calls: Mapped[bytes] = mapped_column(LargeBinary)
    calls_codec: Mapped[str] = mapped_column(String(16))
    n_indices: Mapped[int] = mapped_column()
    indices: Mapped[bytes] = mapped_column(LargeBinary)
    indices_codec: Mapped[str] = mapped_column(String(16))


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


#: Bulk tables and their blob columns (what ``store_bytes`` and corruption checks visit).
BLOB_COLUMNS: dict[type[Base], tuple[str, ...]] = {
    OperatorPlan: ("tasks", "task_of", "orders"),
    Invocation: ("round_seconds",),
    LockGrantBlock: ("calls", "locks", "threads", "indices"),
    MessageBlock: ("seqs", "sources", "source_seqs", "nbytes"),
    IndexOrderBlock: ("calls", "indices"),
}

__all__ = [
    "APP_ID",
    "BLOB_COLUMNS",
    "RUN_STATUSES",
    "SCHEMA_VERSION",
    "VERDICT_KINDS",
    "Base",
    "Digest",
    "IndexOrderBlock",
    "Invocation",
    "LockGrantBlock",
    "MessageBlock",
    "Objective",
    "OperatorPlan",
    "Run",
    "SchemaInfo",
    "Verdict",
]
