"""The read API: ``tracer.open(path)`` returns a :class:`Trace`; replay and the TUI use it.

Reads are lazy: listing runs and operators reads summary rows only, and ``events``
decodes one invocation's blocks at a time, so browsing a trace of a million bodies
stays cheap.  Every blob is checked while decoding; damage is reported as
:class:`TraceFormatError` naming the table, row and column.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from sqlalchemy import (
    Boolean,
    Engine,
    Float,
    Integer,
    LargeBinary,
    String,
    func,
    insert,
    inspect,
    literal,
    select,
    union_all,
)
from sqlalchemy.exc import DBAPIError

from ._chain import trace_key
from ._errors import RunNotFoundError, TraceDamagedError, TraceFormatError
from ._invset import layout_of
from ._run import RunTrace
from ._schema import (
    BLOB_COLUMNS,
    ENVIRONMENT_KEY,
    RUN_LIMITS,
    RUN_STATUSES,
    SCHEMA_KEY,
    VERDICT_KINDS,
    WALL_CLOCK,
    Invocation,
    InvocationSet,
    Run,
    Verdict,
)
from ._store import checkpoint, describe, leave_wal, open_engine, sqlite_path, write_error
from ._verify import Report, check_run

#: The fewest leading characters of a run id that ``Trace.run`` takes for the id
#: (the commands print 12; a uuid4 hex prefix of 6 is shared by two runs of a trace
#: with about 1 chance in 16 million per pair, and then the prefix is refused).
MIN_RUN_PREFIX = 6
#: A ``running`` run with no commit for this many seconds is reported as crashed.  A
#: live run whose single invocation takes longer is misreported until it commits.
CRASH_AFTER_S = 30.0


def _damaged(where: str, col: str, what: str) -> TraceFormatError:
    return TraceFormatError(f"{where} column {col} {what}; the trace is damaged, re-record the run")


def _check(ok: bool, where: str, col: str, what: str) -> None:
    if not ok:
        raise _damaged(where, col, what)


def _json_object(text: Any, where: str) -> dict[str, Any]:
    """A JSON object column, decoded; anything else is a :class:`TraceFormatError`."""
    try:
        value = json.loads(text if text is not None else "{}")
    except (TypeError, ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise TraceFormatError(
            f"{where} is not a JSON object; the trace is damaged, re-record the run"
        )
    return value


def _int_col(r: Any, col: str, where: str, *, lo: int, hi: int) -> int:
    v = getattr(r, col)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise _damaged(where, col, f"holds {v!r}, not an integer in [{lo}, {hi}]")
    return v


def _float_col(v: Any, where: str, col: str) -> float:
    """A wall-clock time of a row (see :data:`WALL_CLOCK`)."""
    lo, hi = WALL_CLOCK
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise _damaged(where, col, f"holds {v!r}, not a wall-clock time")
    return float(v)


def _expected(col: Any) -> tuple[tuple[type, ...], str] | None:
    """The Python types a selected column's values must have, and how to name them."""
    t = getattr(col, "type", None)
    if isinstance(t, Boolean):
        return None  # SQLAlchemy has already turned it into a bool
    if isinstance(t, String):
        return (str,), "text"
    if isinstance(t, Integer):
        return (int,), "an integer"
    if isinstance(t, Float):
        return (int, float), "a number"
    if isinstance(t, LargeBinary):
        return (bytes, memoryview), "a blob"
    return None


def _check_types(stmt: Any, rows: list[Any]) -> None:
    """Every value of every row has its column's type (SQLite stores anything anywhere)."""
    if not rows or not hasattr(stmt, "selected_columns"):
        return
    checks = [(k, c, e) for k, c in enumerate(stmt.selected_columns) if (e := _expected(c))]
    for row in rows:
        for k, col, (types, what) in checks:
            v = row[k]
            if v is None or (isinstance(v, types) and not isinstance(v, bool)):
                continue
            table = getattr(getattr(col, "table", None), "name", None) or "a summary"
            m = row._mapping
            key = m.get("id", m.get("run_id")) if "id" in m or "run_id" in m else None
            at = f" row {key!r}" if key is not None else ""
            raise TraceFormatError(
                f"table {table}{at} column {col.name} holds {str(repr(v))[:40]}, not {what}; "
                "the trace is damaged, re-record the run"
            )


def pick_run(ids: list[str], query: str, source: str) -> int:
    """The position in ``ids`` (a trace's run ids, oldest first) of the run ``query``
    names: its whole id, or a prefix of at least ``MIN_RUN_PREFIX`` characters that one
    id alone starts with.  Anything else is one :class:`RunNotFoundError` line."""
    if query in ids:
        return ids.index(query)
    latest = ", ".join(i[:12] for i in ids[-5:])
    if len(query) < MIN_RUN_PREFIX:
        raise RunNotFoundError(
            f"{source}: run {query!r} is too short; give the id, or at least its first "
            f"{MIN_RUN_PREFIX} characters (latest runs: {latest})"
        )
    hits = [k for k, i in enumerate(ids) if i.startswith(query)]
    if len(hits) > 1:
        raise RunNotFoundError(
            f"{source}: run {query!r} is the start of {len(hits)} runs' ids "
            f"({', '.join(ids[k][:12] for k in hits[:5])}); give more of the id"
        )
    if not hits:
        raise RunNotFoundError(f"{source} holds no run {query!r} (latest runs: {latest})")
    return hits[0]


@dataclass(frozen=True, slots=True)
class RunInfo:
    """Metadata and status of one run (``status`` may say crashed where the row says running).

    ``environment``: the interpreter environment of the run (``PYTHONHASHSEED``, BLAS
    thread variables and pools); empty for traces recorded before it was kept.
    """

    run_id: str
    app: str
    target: str
    params: dict[str, Any]
    code_digest: str
    ranks: int
    threads: int
    seed: int
    versions: dict[str, Any]
    started_at: float
    ended_at: float | None
    status: str
    error: str | None
    last_commit_at: float | None
    duration: float
    environment: dict[str, Any] = field(default_factory=dict)
    #: the id of the crashed run this run resumes (``replay resume``), or None
    continues: str | None = None
    #: plain values that label the run, such as a chaos run's seed and number
    labels: dict[str, Any] = field(default_factory=dict)
    #: the layout of the run's rows: 7 (one ``invocation_set`` row per invocation and
    #: recorder) or 6 (rows per node, read by the legacy reader)
    schema: int = 6


class Trace:
    """A read-only trace store (use :func:`open`)."""

    def __init__(self, engine: Engine, source: str, *, assume_finished: bool = False) -> None:
        self._engine = engine
        self.source = source
        self.assume_finished = assume_finished

    # ------------------------------------------------------------ plumbing
    def has_table(self, name: str) -> bool:
        """Whether the store has table ``name`` (tables added after a trace was written,
        such as ``phase``, are absent from it); False when the store cannot say."""
        try:
            with self._engine.connect() as conn:
                return bool(inspect(conn).has_table(name))
        except DBAPIError:
            return False

    def _all(self, stmt: Any, *, check: bool = True) -> list[Any]:
        """Rows of ``stmt``; ``check``: refuse a value whose type does not fit its column."""
        try:
            with self._engine.connect() as conn:
                rows = list(conn.execute(stmt).all())
        except DBAPIError as exc:
            reason = str(getattr(exc, "orig", exc)).splitlines()[0]
            raise TraceFormatError(
                f"{self.source} is damaged ({reason}); re-record the run"
            ) from None
        except (ValueError, TypeError, OverflowError) as exc:  # a column of the wrong type
            raise TraceFormatError(
                f"{self.source} holds a value of the wrong type ({exc}); re-record the run"
            ) from None
        if check:
            _check_types(stmt, rows)
        return rows

    def close(self) -> None:
        """Release the database connections."""
        self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Trace {self.source}>"

    # ------------------------------------------------------------ runs
    def runs(self) -> list[RunInfo]:
        """Every run in the store, oldest first."""
        commits = [Invocation]
        if self.has_table(InvocationSet.__tablename__):  # schema-7 runs (absent before)
            commits.append(InvocationSet)
        each = union_all(
            *(select(m.run, func.max(m.committed_at).label("t")).group_by(m.run) for m in commits)
        ).subquery()
        last = (
            select(each.c.run, func.max(each.c.t).label("last_commit"))
            .group_by(each.c.run)
            .subquery()
        )
        rows = self._all(
            select(Run.__table__, last.c.last_commit)
            .outerjoin(last, last.c.run == Run.run_id)
            .order_by(Run.started_at)
        )
        return [self._info(r, r.last_commit) for r in rows]

    def _info(self, r: Any, last_commit: float | None) -> RunInfo:
        where = f"table run row {r.run_id!r}"
        params = _json_object(r.params, f"{where} column params")
        versions = _json_object(r.versions, f"{where} column versions")
        labels = _json_object(r.labels, f"{where} column labels")
        _check(
            r.continues is None or isinstance(r.continues, str), where, "continues", "is not text"
        )
        layout = layout_of(versions, where)
        versions.pop(SCHEMA_KEY, None)
        environment = versions.pop(ENVIRONMENT_KEY, None)
        if not isinstance(environment, dict):
            environment = {}
        for col in ("run_id", "app", "target", "code_digest", "status"):
            _check(isinstance(getattr(r, col), str), where, col, "is not text")
        _check(r.error is None or isinstance(r.error, str), where, "error", "is not text")
        _check(r.status in RUN_STATUSES, where, "status", f"is not one of {RUN_STATUSES}")
        ranks, threads, seed = (
            _int_col(r, col, where, lo=RUN_LIMITS[col][0], hi=RUN_LIMITS[col][1])
            for col in ("ranks", "threads", "seed")
        )
        started = _float_col(r.started_at, where, "started_at")
        ended = None if r.ended_at is None else _float_col(r.ended_at, where, "ended_at")
        if last_commit is not None:
            last_commit = _float_col(last_commit, "table invocation", "committed_at")
        status = r.status
        latest = max(started, last_commit or 0.0)
        if status == "running" and ended is None:
            if self.assume_finished or time.time() - latest > CRASH_AFTER_S:
                status = "crashed"
        end = ended if ended is not None else latest
        return RunInfo(
            run_id=r.run_id,
            app=r.app,
            target=r.target,
            params=params,
            code_digest=r.code_digest,
            ranks=ranks,
            threads=threads,
            seed=seed,
            versions=versions,
            started_at=started,
            ended_at=ended,
            status=status,
            error=r.error,
            last_commit_at=last_commit,
            duration=max(0.0, end - started),
            environment=environment,
            continues=r.continues,
            labels=labels,
            schema=layout,
        )

    def run(self, run_id: str | None = None) -> RunTrace:
        """The run ``run_id`` (None: the latest one), named by its whole id or by a prefix
        of at least ``MIN_RUN_PREFIX`` characters that no other run shares (the commands
        print 12)."""
        runs = self.runs()
        if not runs:
            raise RunNotFoundError(f"{self.source} holds no runs yet")
        if run_id is None:
            return RunTrace(self, runs[-1])
        return RunTrace(self, runs[pick_run([r.run_id for r in runs], run_id, self.source)])

    def verify(self, run_id: str | None = None, *, full: bool = True) -> Report:
        """Check run ``run_id``'s hash chains (``full``: and cross-references).

        The key comes from ``REPLAY_TRACE_KEY``.  ``full=False`` is the cheap check that
        replay and the browser run on open; damage is returned, not raised.
        """
        rid = run_id if run_id is not None else self.run(None).info.run_id
        return check_run(self._engine, rid, full=full, key=trace_key())

    def ensure_intact(self, run_id: str | None = None) -> None:
        """Raise :class:`TraceDamagedError` (one line) if the cheap check finds damage."""
        rep = self.verify(run_id, full=False)
        if rep.problem is not None:
            raise TraceDamagedError(
                f"{self.source} run {rep.run_id} is damaged: {rep.problem.line()}; "
                "run 'replay verify' for details, or re-record the run"
            )

    def store_bytes(self) -> int:
        """Size of the store: the SQLite file plus its WAL, else the sum of blob sizes."""
        path = sqlite_path(self.source) if self._engine.dialect.name == "sqlite" else None
        if path is not None and path.exists():
            wal = Path(os.fspath(path) + "-wal")
            return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
        return sum(self._blob_bytes(None).values())

    def _blob_bytes(self, run_id: str | None) -> dict[str, int]:
        """Blob bytes per operator (all runs when ``run_id`` is None)."""
        out: dict[str, int] = {}
        for model, cols in BLOB_COLUMNS.items():
            if model is InvocationSet and not self.has_table(model.__tablename__):
                continue  # a store written before schema 7
            total = sum(
                (func.coalesce(func.length(getattr(model, c)), 0) for c in cols), literal(0)
            )
            stmt = select(model.op, func.sum(total)).group_by(model.op)
            if run_id is not None:
                stmt = stmt.where(model.run == run_id)
            for op, n in self._all(stmt):
                out[op] = out.get(op, 0) + int(n or 0)
        return out


class WritableTrace(Trace):
    """A trace store opened for adding verdicts (use :func:`open_writable`)."""

    def close(self) -> None:
        """Fold the WAL into the file (a copied ``.sqlite`` then holds the verdicts
        written so far), then release the connections."""
        checkpoint(self._engine)
        super().close()
        leave_wal(sqlite_path(self._engine))

    def add_verdict(
        self, run_id: str, kind: str, passed: bool, detail: dict[str, Any] | None = None
    ) -> int:
        """Record a replay or dual-test verdict about ``run_id``; returns its id."""
        if kind not in VERDICT_KINDS:
            raise ValueError(
                f"unknown verdict kind {kind!r}; use one of {', '.join(VERDICT_KINDS)}"
            )
        self.run(run_id)  # raises RunNotFoundError
        try:
            with self._engine.begin() as conn:
                res = conn.execute(
                    insert(Verdict.__table__).values(
                        run=run_id,
                        kind=kind,
                        passed=bool(passed),
                        detail=json.dumps(detail or {}, sort_keys=True, default=repr),
                        created_at=time.time(),
                    )
                )
                key: Any = res.inserted_primary_key
                return int(key[0])
        except DBAPIError as exc:
            raise write_error(self._engine, exc) from None


def open(target: str | os.PathLike[str], *, assume_finished: bool = False) -> Trace:  # noqa: A001
    """Open a trace store read-only (a SQLite path or an SQLAlchemy URL).

    ``assume_finished``: the caller knows no writer is alive, so runs still marked
    running are reported as crashed at once (otherwise after ``CRASH_AFTER_S``).
    """
    engine = open_engine(target)
    return Trace(engine, describe(target), assume_finished=assume_finished)


def open_writable(target: str | os.PathLike[str]) -> WritableTrace:
    """Open an existing trace store for writing verdicts (checked like :func:`open`)."""
    engine = open_engine(target, writable=True)
    return WritableTrace(engine, describe(target))


__all__ = [
    "CRASH_AFTER_S",
    "RunInfo",
    "Trace",
    "WritableTrace",
    "open",
    "open_writable",
]
