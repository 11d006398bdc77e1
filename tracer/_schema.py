"""The trace store schema (SQLAlchemy Core tables); the tables never leave ``tracer``.

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
    Boolean,
    CheckConstraint,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.sql.schema import SchemaItem
from sqlalchemy.types import TypeEngine

#: Version of this schema; a reader refuses traces with another one (2: the hash chain,
#: ``chain_link`` and ``invocation.n_digests``; 3: the ``interrupted`` run status, NaN
#: objectives, and lock grants stored as deviations from a predicted ticket order
#: instead of raw (lock, thread, index) triples; 4: the element each lock hand-over took
#: over, ``lock_grant_block.elements``, and each thread's task-group times,
#: ``invocation.thread_times``; 5: time travel, the ``checkpoint``, ``checkpoint_block``
#: and ``collective_value`` tables; 6: ``run.continues``, the crashed run a resumed run
#: continues, and ``run.labels``, a JSON object of plain values such as a chaos run's seed;
#: 7: one ``invocation_set`` row, one ``phase_set`` row per phase and one chain link per
#: invocation and recorder, per-node values as arrays, and routed arrivals as per-node
#: per-exchange counts and bytes instead of ``message_block`` rows).  A store holds runs
#: of both layouts: a run's own layout is ``run.versions[SCHEMA_KEY]`` (absent: 6).
SCHEMA_VERSION = 7
#: The oldest schema version this reader still opens (through the legacy reader).
OLDEST_READABLE = 6
#: Key of a run's layout version inside the JSON of ``run.versions`` (covered by the
#: chain's genesis digest, so it cannot be flipped to make a reader misread the run).
SCHEMA_KEY = "_trace_schema"
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
#: Wall-clock times (seconds since 1970) a reader accepts in ``run.started_at``,
#: ``ended_at``, the commit times and ``verdict.created_at``: finite was not enough, as
#: ``replay show`` and the browser stopped on ``time.localtime`` of 1e300 or -1e18 (time_t
#: overflows); up to 2**35 is the year 3058, which every platform's ``localtime`` shows.
WALL_CLOCK = (0.0, float(2**35))
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

#: Every table of the store, with a naming convention for constraints and indexes.
METADATA = MetaData(naming_convention=_NAMING)
# 64-bit everywhere (seqs and counts outgrow 32 bits); SQLite needs INTEGER for rowid ids
_INT: TypeEngine[int] = BigInteger().with_variant(Integer, "sqlite")


_MODELS: dict[str, Model] = {}


class Model:
    """One table of the store: ``Run.run_id`` is its column, ``Run.__table__`` the table.

    Plain Core tables, not ORM classes: nothing reads rows into objects, and importing
    the ORM cost every process that opens a store about 0.15 s of CPU."""

    def __init__(self, name: str, *items: SchemaItem) -> None:
        self.__table__ = Table(name, METADATA, *items)
        self.__tablename__ = name
        _MODELS[name] = self

    def __getattr__(self, name: str) -> Column[Any]:
        if name.startswith("__"):  # not a column; and __table__ before __init__ set it
            raise AttributeError(name)
        try:
            return self.__table__.c[name]
        except KeyError:
            raise AttributeError(f"table {self.__tablename__} has no column {name!r}") from None

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # by name, as the classes these were pickled: a dict keyed by tables (rows a rank
        # hands to the primary) must find the same tables on the other side
        return _model, (self.__tablename__,)

    def __repr__(self) -> str:
        return f"<table {self.__tablename__}>"


def _model(name: str) -> Model:
    """The table ``name`` (what a pickled :class:`Model` becomes again)."""
    found = _MODELS.get(name)
    if found is None:
        raise ValueError(f"no table {name!r} in the trace schema")
    return found


def _id() -> Column[int]:
    return Column("id", _INT, primary_key=True)


def _int(name: str, *, default: int | None = None, null: bool = False) -> Column[int]:
    return Column(name, _INT, nullable=null, default=default)


def _float(name: str, *, default: float | None = None, null: bool = False) -> Column[float]:
    return Column(name, Float, nullable=null, default=default)


def _str(name: str, size: int, *, default: str | None = None, null: bool = False) -> Column[str]:
    return Column(name, String(size), nullable=null, default=default)


def _text(name: str, *, default: str | None = None, null: bool = False) -> Column[str]:
    return Column(name, Text, nullable=null, default=default)


def _blob(name: str) -> Column[bytes]:
    return Column(name, LargeBinary, nullable=False)


def _coded(name: str) -> tuple[Column[bytes], Column[str]]:
    """A codec blob and the column naming its codec (``name_codec``)."""
    return _blob(name), _str(f"{name}_codec", 16)


def _run_fk() -> Column[str]:
    return Column("run", String(64), ForeignKey("run.run_id", ondelete="CASCADE"), nullable=False)


def _op() -> Column[str]:
    return _str("op", 200)


def _per_node_invocation() -> tuple[Column[Any], ...]:
    """The leading columns of a table with rows per (run, op, invocation, node)."""
    return _id(), _run_fk(), _op(), _int("invocation"), _int("node")


#: One row: which application wrote this database and with which schema version.
SchemaInfo = Model(
    "schema_info",
    Column("app_id", String(64), primary_key=True),
    _int("version"),
    _float("created_at"),
)

#: Key of the run's environment record (hash seed, BLAS threads) inside the JSON of
#: ``run.versions``: kept there so that adding it needed no schema version bump.
ENVIRONMENT_KEY = "_environment"

#: Metadata and status of one recorded run.
Run = Model(
    "run",
    Column("run_id", String(64), primary_key=True),
    _str("app", 200, default=""),
    _text("target", default=""),
    _text("params", default="{}"),
    _str("code_digest", 128, default=""),
    _int("ranks", default=1),
    _int("threads", default=1),
    _int("seed", default=0),
    _text("versions", default="{}"),
    _float("started_at"),
    _float("ended_at", null=True),
    _str("status", 16, default="running"),
    _text("error", null=True),
    _int("end_node", null=True),
    _int("end_seq", null=True),
    _str("continues", 64, null=True),
    _text("labels", default="{}"),
    CheckConstraint(f"status IN {RUN_STATUSES!r}", name="status"),
)

#: A plan of one operator, in force from ``first_invocation`` on (see ``_plans``).
OperatorPlan = Model(
    "operator_plan",
    _id(),
    _run_fk(),
    _op(),
    _int("plan_no"),
    _int("first_invocation"),
    _int("node"),
    _int("seq"),
    _str("strategy", 32),
    _int("start"),
    _int("n"),
    _int("nodes"),
    _int("threads"),
    _int("rounds"),
    _int("n_tasks"),
    _int("n_explicit"),
    _float("imbalance"),
    _float("node_imbalance"),
    *_coded("tasks"),
    *_coded("task_of"),
    *_coded("orders"),
    _float("created_at"),
    UniqueConstraint("run", "op", "plan_no"),
)

#: One node finished one operator invocation; written last in that commit.
Invocation = Model(
    "invocation",
    *_per_node_invocation(),
    _int("seq"),
    _int("first_seq"),
    _int("bodies"),
    _int("rounds"),
    # ``sync_for``'s mode (bsp, ssp, hybrid); empty for ``async_for`` (its plan says)
    _str("strategy", 32, default=""),
    _float("seconds"),
    # each round's length: whole µs (an integer codec) since 2026-12-06, f64 seconds before
    *_coded("round_seconds"),
    # ``async_for``: (round, thread, start, end) per thread that ran task groups in a
    # round; start and end in whole µs from the node's start of that round; stored
    # column by column and delta-coded (a ``d`` codec) since 2026-12-06, row by row before
    *_coded("thread_times"),
    _int("n_lock_grants", default=0),
    _int("n_messages", default=0),
    _int("n_deviations", default=0),
    _int("n_aggregations", default=0),
    _int("n_visibility", default=0),
    _int("n_mutex_grants", default=0),
    _int("n_digests", default=0),
    _int("blob_bytes", default=0),
    _float("committed_at"),
    UniqueConstraint("run", "op", "invocation", "node"),
    Index(None, "run", "node", "seq"),
)

#: Schema 7: the nodes of one commit finished one operator invocation (every node one
#: process hosts; under MPI every rank's, which the primary writes); written last in that
#: commit, one row for all of them (``_invset`` says how the arrays are laid out).
#: ``node`` and ``seq`` are the writer's first node and that node's sequence number of
#: the row (what the chain keys it by); every node's own completion seq is in
#: ``counters``.  ``nodes``: the node ids; ``counters``: one column per
#: ``_invset.COUNTERS`` field, a value per node; ``seconds``: each node's wall time of
#: the invocation (f64, as ``invocation.seconds``); ``round_us``: each node's round lengths
#: in whole µs, a node whose count equals the previous node's stored as its difference
#: from that node's (zero on an in-process cluster, whose nodes share each round);
#: ``thread_times``: (node, round, thread, start µs, end µs) rows column by column;
#: ``routed``: (node, exchange, messages, bytes) of the routed write-backs a node got,
#: per sender exchange number, column by column.
InvocationSet = Model(
    "invocation_set",
    _id(),
    _run_fk(),
    _op(),
    _int("invocation"),
    _int("node"),
    _int("seq"),
    _int("n_nodes"),
    _str("strategy", 32, default=""),
    *_coded("nodes"),
    *_coded("counters"),
    *_coded("seconds"),
    *_coded("round_us"),
    *_coded("thread_times"),
    *_coded("routed"),
    _float("committed_at"),
    UniqueConstraint("run", "op", "invocation", "node"),
)

#: Digest of one DDS after one operator invocation.
Digest = Model(
    "digest",
    *_per_node_invocation(),
    _int("seq"),
    _str("dds", 200),
    _str("digest", 128),
    Index(None, "run", "op", "invocation"),
)

#: One logged objective value.
Objective = Model(
    "objective",
    _id(),
    _run_fk(),
    _str("name", 200),
    _int("iteration"),
    # NULL is NaN: SQLite stores a NaN REAL as NULL (a diverging loss must still record)
    _float("value", null=True),
    _int("node"),
    _int("seq"),
    Index(None, "run", "name", "iteration"),
)


def _block(name: str, *own: SchemaItem, calls: bool = True) -> Model:
    """A bulk block table: its own columns, then (``calls``) those of a block of recorder
    calls (``calls`` rows are (header..., seq, length) and the value arrays are the
    calls' arrays concatenated, ``n_values`` entries each), then the key every block has
    (whose events it holds and where their seqs start).  This column order is the one
    traces were written with; the hash chain digests rows in it."""
    call_columns = (_int("n_calls"), _int("n_values"), *_coded("calls")) if calls else ()
    return Model(
        name,
        _run_fk(),
        *own,
        *call_columns,
        _id(),
        _op(),
        _int("invocation"),
        _int("node"),
        _int("first_seq"),
        _int("count"),  # events in the block
        Index(None, "run", "op", "invocation", "node"),
        Index(None, "run", "node", "first_seq"),
    )


#: Lock grants of one node in one invocation, one call (event) per round: calls are
#: (round, bodies, grants, seq, length); ``deviations`` holds each round's (position,
#: thread) pairs, flattened, where the ticket order left its prediction (``engine``'s
#: ``_grants`` module says how the prediction and the per-lock orders follow);
#: ``elements`` names the element lock each of them took over (``W[943]``), as UTF-8
#: lines in the same order (a u8 codec blob).
LockGrantBlock = _block("lock_grant_block", *_coded("deviations"), *_coded("elements"))
#: Deviations from the plan's index order; calls are (round, thread, seq, length).
IndexOrderBlock = _block("index_order_block", *_coded("indices"))
#: ``sync_for`` owners' delta arrival orders; calls are (clock, seq, length).
AggregationBlock = _block("aggregation_block", *_coded("sources"))
#: SSP ``sync_for``: updates applied before each clock; calls are (clock, seq, nodes).
VisibilityBlock = _block("visibility_block", *_coded("applied"))
#: Hybrid ``sync_for``: node-mutex grants in order; calls are (clock, seq, count).
MutexGrantBlock = _block("mutex_grant_block", *_coded("threads"), *_coded("minibatches"))
#: Messages one node received on one channel during one invocation, in arrival order.
MessageBlock = _block(
    "message_block",
    _str("channel", 64),
    *_coded("seqs"),
    *_coded("sources"),
    *_coded("source_seqs"),
    *_coded("nbytes"),
    calls=False,
)


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
CALL_BLOCKS: dict[Model, CallBlockSpec] = {
    LockGrantBlock: CallBlockSpec(
        ("round", "bodies", "grants"), ("deviations",), False, "n_lock_grants"
    ),
    IndexOrderBlock: CallBlockSpec(("round", "thread"), ("indices",), False, "n_deviations"),
    AggregationBlock: CallBlockSpec(("clock",), ("sources",), False, "n_aggregations"),
    VisibilityBlock: CallBlockSpec(("clock",), ("applied",), False, "n_visibility"),
    MutexGrantBlock: CallBlockSpec(("clock",), ("threads", "minibatches"), True, "n_mutex_grants"),
}


#: One link of a node's hash chain (see ``_chain``): it covers every chained row of
#: ``node`` whose sequence number lies in [``first_seq``, ``end_seq``).
ChainLink = Model(
    "chain_link",
    _id(),
    _run_fk(),
    _int("node"),
    _int("link_no"),
    _int("first_seq"),
    _int("end_seq"),
    _op(),
    _int("invocation"),
    _int("n_rows"),
    _blob("manifest"),  # (table, seq, digest) per row
    _int("keyed"),  # 1: an HMAC under REPLAY_TRACE_KEY (never stored)
    _blob("link"),
    UniqueConstraint("run", "node", "link_no"),
)

#: One node's checkpoint at the end of an invocation (time travel): a marker written
#: after its blocks have committed, so a checkpoint with a row here is whole for that
#: node.  ``step`` is the invocation's place among the run's loop invocations.
#: Not chained: a restored checkpoint is checked against the invocation's digests.
Checkpoint = Model(
    "checkpoint",
    *_per_node_invocation(),
    _int("step"),
    _text("counters", default="{}"),  # JSON: message counters
    _text("refused", default="[]"),  # JSON: [dds, why] left out
    _int("nbytes"),
    _float("seconds", default=0.0),  # encoding and writing it
    _float("created_at"),
    UniqueConstraint("run", "op", "invocation", "node"),
    Index(None, "run", "step"),
)

#: The rows one node owns of one DDS in one checkpoint: ``slots`` and ``values`` are
#: codec blobs; ``kind`` ``array`` (values flattened, ``dtype`` and row ``shape``) or
#: ``plain`` (a tagged-JSON text of plain data, see ``_plain``, as u8).
CheckpointBlock = Model(
    "checkpoint_block",
    *_per_node_invocation(),
    _str("dds", 200),
    _str("kind", 16),
    _str("dtype", 16),
    _text("shape", default="[]"),
    _int("length"),
    _int("count"),
    *_coded("slots"),
    *_coded("values"),
    Index(None, "run", "op", "invocation"),
)

#: The value the driver got from its ``k``-th collective call (``reduce``, ``gather``),
#: served to a driver that fast-forwards to a checkpoint.  ``encoding``: ``array``
#: (``dtype``, ``shape``), ``plain`` (tagged JSON as u8) or ``refused`` (``detail`` says
#: why; such a value cannot be served).
CollectiveValue = Model(
    "collective_value",
    _id(),
    _run_fk(),
    _int("k"),
    _str("kind", 16),
    _str("encoding", 16),
    _str("dtype", 16, default=""),
    _text("shape", default="[]"),
    _text("detail", default=""),
    *_coded("data"),
    UniqueConstraint("run", "k"),
)

#: Time-travel tables and their blob columns: reported as checkpoint bytes, apart from
#: the trace's own bytes (they do not count against the bytes-per-body budget).
CHECKPOINT_BLOB_COLUMNS: dict[Model, tuple[str, ...]] = {
    CheckpointBlock: ("slots", "values"),
    CollectiveValue: ("data",),
}

#: Result of a replay or dual test of a run, written by ``replay``.
Verdict = Model(
    "verdict",
    _id(),
    _run_fk(),
    _str("kind", 32),
    Column("passed", Boolean, nullable=False),
    _text("detail", default="{}"),
    _float("created_at"),
    CheckConstraint(f"kind IN {VERDICT_KINDS!r}", name="kind"),
    Index(None, "run", "created_at"),
)

#: Values of ``phase.kind``.
PHASE_KINDS = ("reconnaissance", "planning", "digests")

#: How long one node spent in a phase of an invocation outside its rounds
#: (``PHASE_KINDS``), written with the invocation; for timelines only.
#: Added without a schema version bump: a reader that does not know this table never
#: reads it, and a trace written before it exports without these slices.  Not chained:
#: nothing replays from it, and an exporter takes its values as untrusted.
Phase = Model(
    "phase",
    *_per_node_invocation(),
    _str("kind", 32),
    _float("started_at"),  # wall clock, as ``run.started_at``
    _float("seconds"),
    Index(None, "run", "node"),
)


#: Schema 7: one phase of one invocation on the nodes one recorder hosts (``Phase``'s
#: values, a row for all of them): ``started_at`` is the earliest node's start and
#: ``times`` holds (node, start offset µs, length µs) per node, column by column.
#: Not chained, as ``phase`` is not.
PhaseSet = Model(
    "phase_set",
    _id(),
    _run_fk(),
    _op(),
    _int("invocation"),
    _int("node"),
    _str("kind", 32),
    _int("n_nodes"),
    _float("started_at"),
    *_coded("times"),
)

#: Bulk tables and their blob columns (what ``store_bytes`` and corruption checks visit).
BLOB_COLUMNS: dict[Model, tuple[str, ...]] = {
    OperatorPlan: ("tasks", "task_of", "orders"),
    Invocation: ("round_seconds", "thread_times"),
    InvocationSet: ("nodes", "counters", "seconds", "round_us", "thread_times", "routed"),
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
    "METADATA",
    "Model",
    "CallBlockSpec",
    "ChainLink",
    "Checkpoint",
    "CheckpointBlock",
    "CollectiveValue",
    "Digest",
    "IndexOrderBlock",
    "Invocation",
    "InvocationSet",
    "OLDEST_READABLE",
    "LockGrantBlock",
    "MessageBlock",
    "MutexGrantBlock",
    "Objective",
    "OperatorPlan",
    "PHASE_KINDS",
    "Phase",
    "PhaseSet",
    "SCHEMA_KEY",
    "Run",
    "SchemaInfo",
    "Verdict",
    "VisibilityBlock",
]
