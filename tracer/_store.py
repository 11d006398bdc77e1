"""Opening trace stores: SQLite files (WAL, shared by every rank) or any SQLAlchemy URL.

Writers (``create_store``) tune SQLite for several processes committing to one file:
WAL so readers never block the writer, ``synchronous=NORMAL`` (a commit survives the
death of the process, which is the crash the trace must survive), a busy timeout, and
``BEGIN IMMEDIATE`` so that two writers queue on the lock instead of failing on a
snapshot upgrade.  Readers (``open_engine``) check the file before SQLite sees it and
open it read-only, so bad input is reported in one line and never modified.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import stat
import time
from pathlib import Path
from typing import Any
from urllib.request import pathname2url

from sqlalchemy import Engine, create_engine, event, insert, inspect, select, update
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    IntegrityError,
    NoSuchModuleError,
    OperationalError,
)
from sqlalchemy.pool import QueuePool

from ._errors import (
    DriverMissingError,
    RunExistsError,
    RunNotFoundError,
    TraceFormatError,
    TraceNotFoundError,
    TraceWriteError,
)
from ._schema import (
    APP_ID,
    ENVIRONMENT_KEY,
    METADATA,
    OLDEST_READABLE,
    RUN_LIMITS,
    SCHEMA_KEY,
    SCHEMA_VERSION,
    Run,
    SchemaInfo,
)
from ._wal import wal_commits

#: Milliseconds a writer waits for another rank's transaction before giving up.
BUSY_TIMEOUT_MS = 60_000
#: What to tell a user who passed something that is not a trace.
HINT = "pass a file written by 'replay run --trace' (see 'replay ls')"

_SQLITE_MAGIC = b"SQLite format 3\x00"
#: The pip command that installs the PostgreSQL driver (psycopg).
POSTGRES_EXTRA = "pip install 'strads-replay[postgres]'"
#: Seconds a connection to a database server may take before the command gives up.
CONNECT_TIMEOUT_S = 10


def is_url(target: Any) -> bool:
    """True when ``target`` is an SQLAlchemy URL rather than a file path."""
    return isinstance(target, str) and "://" in target


def describe(target: Any) -> str:
    """How to name ``target`` in messages (a path, or a URL without its password)."""
    if isinstance(target, Engine):
        return target.url.render_as_string(hide_password=True)
    if is_url(target):
        if _userinfo_problem(target) is not None:  # where its password ends is unknown
            scheme, rest = target.split("://", 1)
            return f"{scheme}://***@{rest.split('?', 1)[0].rsplit('@', 1)[1]}"
        try:
            return make_url(target).render_as_string(hide_password=True)
        except (ArgumentError, ValueError):
            return "<an unparsable URL>"  # never echo it: it may hold a password
    return os.fspath(target)


def hide_password(text: str, target: Any) -> str:
    """``text`` with the password of ``target``'s URL (if any) replaced by ``***``."""
    try:
        url = target.url if isinstance(target, Engine) else make_url(target)
    except (ArgumentError, TypeError, ValueError):
        return text
    pw = url.password
    return text.replace(str(pw), "***") if pw else text


#: Characters that may stand unencoded in the user and password of a URL (RFC 3986
#: userinfo: unreserved, sub-delims and ":"); anything else must be percent-encoded.
_USERINFO_OK = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~!$&'()*+,;=:"
)
_HEX = frozenset("0123456789abcdefABCDEF")


def _userinfo_problem(target: str) -> str | None:
    """Why the ``USER:PASSWORD`` part of URL ``target`` is malformed, or None.

    It ends at the last ``@`` before any ``?``: SQLAlchemy splits at the first one and
    then reads the rest of the password as the host and port (``p@ss:w/rd`` became host
    ``ss``, port ``w``: a ValueError).  Which ``@`` the user meant cannot be known, so
    nothing is guessed: any character outside RFC 3986 userinfo, or a ``%`` that does not
    start an ``%XX`` escape, is refused.  (A ``@`` in the database name reads as one in
    the password, so it is refused too; it can be written ``%40``.)
    """
    rest = target.split("://", 1)[1].split("?", 1)[0]
    if "@" not in rest:
        return None
    userinfo = rest[: rest.rindex("@")]
    for k, ch in enumerate(userinfo):
        if ch == "%":
            if len(userinfo) < k + 3 or not set(userinfo[k + 1 : k + 3]) <= _HEX:
                return "a '%' that does not start a %XX escape"
        elif ch not in _USERINFO_OK:
            return f"an unencoded {ch!r}"
    return None


def _unparsable(target: str, why: str) -> TraceFormatError:
    return TraceFormatError(
        f"{describe(target)} is not a valid database URL: {why}; percent-encode the user "
        "and password (@ as %40, : as %3A, / as %2F, % as %25) in "
        "postgresql+psycopg://USER:PASSWORD@HOST:PORT/DATABASE"
    )


def store_url(target: str) -> URL:
    """``target`` parsed, with ``postgresql://`` meaning the psycopg driver."""
    problem = _userinfo_problem(target)
    if problem is not None:
        raise _unparsable(target, f"its password (or user) holds {problem}")
    try:
        url = make_url(target)
    except ValueError:  # SQLAlchemy's int() of a port that is not a number
        raise _unparsable(target, "its port is not a number") from None
    except ArgumentError:
        raise TraceFormatError(
            f"{describe(target)} is not a valid SQLAlchemy URL: write it as "
            "postgresql+psycopg://USER:PASSWORD@HOST:PORT/DATABASE"
        ) from None
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    return url


def url_engine(target: str) -> Engine:
    """An engine on an SQLAlchemy URL; a missing driver is one line naming what to install.

    Nothing is connected here; connection errors surface at first use.
    """
    url = store_url(target)
    kw: dict[str, Any] = {}
    if url.get_backend_name() == "postgresql":
        kw["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
    try:
        return create_engine(url, **kw)
    except NoSuchModuleError:
        raise DriverMissingError(
            f"{describe(target)}: SQLAlchemy has no database dialect "
            f"{url.drivername!r}; for PostgreSQL write postgresql+psycopg://... and "
            f"install the postgres extra: {POSTGRES_EXTRA}"
        ) from None
    except ImportError as exc:
        module = getattr(exc, "name", None) or url.get_driver_name()
        if url.get_backend_name() == "postgresql" and url.get_driver_name() == "psycopg":
            how = f"install the postgres extra: {POSTGRES_EXTRA}"
        elif url.get_backend_name() == "postgresql":
            how = (
                f"install it, or use postgresql+psycopg:// and install the postgres extra: "
                f"{POSTGRES_EXTRA}"
            )
        else:
            how = f"install it (pip install {module})"
        raise DriverMissingError(
            f"{describe(target)} needs the database driver {module!r}, which is not "
            f"installed: {how}"
        ) from None


def sqlite_path(target: Any) -> Path | None:
    """The file behind ``target`` if it is a SQLite file, else None."""
    if isinstance(target, Engine):
        db = target.url.database if target.dialect.name == "sqlite" else None
        return Path(db) if db and db != ":memory:" and not db.startswith("file:") else None
    if is_url(target):
        url = store_url(target)
        db = url.database if url.get_backend_name() == "sqlite" else None
        return Path(db) if db and db != ":memory:" else None
    return Path(os.fspath(target))


# ====================================================================== writers
def _tune_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def create_store(target: str | os.PathLike[str] | Engine) -> Engine:
    """A writable engine on ``target`` (a path means SQLite), with the schema created."""
    if isinstance(target, Engine):
        engine = target
    elif is_url(target):
        engine = url_engine(str(target))
        if engine.dialect.name == "sqlite":
            _tune_sqlite(engine)
            path = sqlite_path(target)
            if path is not None and path.exists():
                refuse_special(path)
                if path.stat().st_size > 0:
                    open_engine(path, allow_empty=True).dispose()
    else:
        path = Path(os.fspath(target))
        if path.exists():
            refuse_special(path)
        if path.exists() and (path.is_dir() or path.stat().st_size > 0):
            open_engine(path, allow_empty=True).dispose()  # never touch a foreign file
        path.parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(f"sqlite:///{path}")
        _tune_sqlite(engine)
    try:
        ensure_schema(engine)
    except (TraceFormatError, TraceWriteError):
        engine.dispose()
        raise
    return engine


def ensure_schema(engine: Engine) -> None:
    """Create the tables and the ``schema_info`` row unless present; refuse foreign stores."""
    for attempt in range(3):  # several ranks may create the schema at the same moment
        try:
            names = set(inspect(engine).get_table_names())
            if names and "schema_info" not in names:
                raise TraceFormatError(
                    f"{describe(engine)} already holds tables of another application "
                    "(no schema_info table): pick a new trace path"
                )
            if "schema_info" in names:
                check_schema_info(engine)
            with engine.begin() as conn:
                METADATA.create_all(conn)
                have = conn.execute(select(SchemaInfo.app_id)).first()
                if have is None:
                    conn.execute(
                        insert(SchemaInfo.__table__).values(
                            app_id=APP_ID, version=SCHEMA_VERSION, created_at=time.time()
                        )
                    )
            return
        except (OperationalError, IntegrityError) as exc:
            if attempt == 2 or not any(m in str(exc) for m in _RACES):
                raise TraceWriteError(
                    f"cannot create the trace schema in {describe(engine)}: {_reason(exc, engine)}"
                ) from None


#: What a losing schema-creation race says (SQLite; PostgreSQL's catalog unique index).
_RACES = ("already exists", "UNIQUE", "duplicate key")


def _reason(exc: BaseException, target: Any = None) -> str:
    orig = getattr(exc, "orig", None)
    lines = str(orig if orig is not None else exc).strip().splitlines() or [type(exc).__name__]
    return hide_password(lines[0], target) if target is not None else lines[0]


#: SQLite's primary result code for a full disk (or a database at max_page_count), and
#: PostgreSQL's SQLSTATE disk_full.
_SQLITE_FULL = 13
_PG_DISK_FULL = "53100"


def is_disk_full(exc: BaseException) -> bool:
    """Whether a failed write failed for lack of space."""
    orig = getattr(exc, "orig", None) or exc
    code = getattr(orig, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF == _SQLITE_FULL
    return getattr(orig, "sqlstate", None) == _PG_DISK_FULL or (
        isinstance(orig, OSError) and orig.errno == errno.ENOSPC
    )


def write_error(engine: Engine, exc: BaseException) -> TraceWriteError:
    """A one-line :class:`TraceWriteError` for a failed write."""
    err = TraceWriteError(f"cannot write trace {describe(engine)}: {_reason(exc, engine)}")
    err.disk_full = is_disk_full(exc)
    return err


def _labels(labels: Any) -> dict[str, Any]:
    """``labels`` checked to be a dict of plain values (str, int, float, bool, None)."""
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and (v is None or isinstance(v, str | int | float | bool))
        for k, v in labels.items()
    ):
        raise ValueError(f"start_run: labels must map names to plain values, got {labels!r}")
    return labels


def run_row(run_id: str, meta: dict[str, Any]) -> dict[str, Any]:
    """The row of a new run (status ``running``) from ``meta`` (see :func:`start_run`)."""
    allowed = {
        "app",
        "target",
        "params",
        "code_digest",
        "ranks",
        "threads",
        "seed",
        "versions",
        "environment",
        "continues",
        "labels",
    }
    extra = set(meta) - allowed
    if extra:
        raise ValueError(
            f"start_run: unknown meta keys {sorted(extra)}; allowed: {sorted(allowed)}"
        )
    counts = {col: int(meta.get(col, lo)) for col, (lo, _) in RUN_LIMITS.items()}
    for col, (lo, hi) in RUN_LIMITS.items():
        if not lo <= counts[col] <= hi:  # a reader would refuse the row: never write it
            raise ValueError(f"start_run: {col} must be in [{lo}, {hi}], got {counts[col]}")
    return {
        "run_id": str(run_id),
        "app": str(meta.get("app", "")),
        "target": str(meta.get("target", "")),
        "params": json.dumps(meta.get("params", {}), sort_keys=True, default=repr),
        "code_digest": str(meta.get("code_digest", "")),
        **counts,
        "versions": json.dumps(_versions_column(meta), sort_keys=True, default=repr),
        "started_at": time.time(),
        "status": "running",
        "continues": None if meta.get("continues") is None else str(meta["continues"]),
        "labels": json.dumps(_labels(meta.get("labels", {})), sort_keys=True),
    }


def start_run(store: Any, run_id: str, meta: dict[str, Any]) -> dict[str, Any]:
    """Insert the row of a new run (status ``running``); creates the store if needed.

    ``meta`` keys: app, target, params (dict), code_digest, ranks, threads, seed,
    versions (dict), environment (dict: hash seed, BLAS threads), continues (the id of
    the crashed run this one resumes), labels (dict of plain values, e.g. a chaos run's
    seed and number).  Unknown keys are an error, missing ones get neutral defaults.
    Returns the row as inserted.
    """
    row = run_row(run_id, meta)
    engine = store if isinstance(store, Engine) else create_store(store)
    try:
        with engine.begin() as conn:
            if conn.execute(select(Run.run_id).where(Run.run_id == row["run_id"])).first():
                raise RunExistsError(
                    f"{describe(engine)} already holds a run {run_id!r}: use a new run id"
                )
            conn.execute(insert(Run.__table__).values(**row))
            # a schema-6 store that gets a schema-7 run needs this reader from now on (its
            # old runs keep their layout: ``run.versions[SCHEMA_KEY]`` says which); a
            # verdict added to it changes nothing an older reader cannot read
            conn.execute(
                update(SchemaInfo.__table__)
                .where(SchemaInfo.app_id == APP_ID, SchemaInfo.version < SCHEMA_VERSION)
                .values(version=SCHEMA_VERSION)
            )
    except DBAPIError as exc:
        raise write_error(engine, exc) from None
    finally:
        if not isinstance(store, Engine):
            engine.dispose()
    return row


def _versions_column(meta: dict[str, Any]) -> dict[str, Any]:
    """The ``versions`` JSON also holds the environment record (no schema change)."""
    out = dict(meta.get("versions", {}))
    if "environment" in meta:
        out[ENVIRONMENT_KEY] = dict(meta["environment"])
    out[SCHEMA_KEY] = SCHEMA_VERSION  # the layout this run's rows are written in
    return out


def finish_run(
    engine: Engine,
    run_id: str,
    status: str,
    error: str | None,
    end_node: int | None = None,
    end_seq: int | None = None,
) -> bool:
    """Set the end status of a still-running run; returns False if it had ended already."""
    stmt = (
        update(Run.__table__)
        .where(Run.run_id == run_id, Run.status == "running")
        .values(
            status=status, error=error, ended_at=time.time(), end_node=end_node, end_seq=end_seq
        )
    )
    try:
        with engine.begin() as conn:
            return conn.execute(stmt).rowcount > 0
    except DBAPIError as exc:
        raise write_error(engine, exc) from None


def mark_crashed(
    store: Any, run_id: str, error: str | None = None, status: str = "crashed"
) -> bool:
    """Mark a run whose writer died as ``crashed`` — or ``interrupted``, when the user
    stopped it with a signal — (no-op if it ended); True if marked."""
    engine = store if isinstance(store, Engine) else open_engine(store, writable=True)
    try:
        with engine.connect() as conn:
            if conn.execute(select(Run.run_id).where(Run.run_id == run_id)).first() is None:
                raise RunNotFoundError(f"{describe(engine)} holds no run {run_id!r}")
        return finish_run(engine, run_id, status, error)
    finally:
        if not isinstance(store, Engine):
            checkpoint(engine)
            engine.dispose()
            leave_wal(sqlite_path(engine))


# ====================================================================== readers
#: What ``os.stat`` says a non-regular file is, for the one-line refusal.
_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def special_kind(path: str | os.PathLike[str]) -> str | None:
    """What ``path`` is if it exists and is neither a regular file nor a directory.

    Uses ``os.stat`` only: opening a FIFO blocks until a writer appears, so nothing
    that may be one is ever opened before this check.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def refuse_special(path: str | os.PathLike[str]) -> None:
    """Raise :class:`TraceFormatError` if ``path`` is a FIFO, socket or device."""
    kind = special_kind(path)
    if kind is not None:
        raise TraceFormatError(f"{os.fspath(path)} is {kind}, not a trace file: {HINT}")


def check_file(path: Path) -> bool:
    """Refuse, in one line, a path that is missing or not an intact SQLite file; True
    when the file is intact only together with its WAL (``T.sqlite-wal``)."""
    shown = os.fspath(path)
    try:
        mode = os.stat(path).st_mode  # never open() first: a FIFO would block forever
    except FileNotFoundError:
        raise TraceNotFoundError(f"{shown} does not exist: {HINT}") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise TraceNotFoundError(
                f"{shown} is a symbolic link loop (following it never reaches a file): {HINT}"
            ) from None
        raise TraceNotFoundError(f"cannot read {shown}: {exc.strerror}") from None
    if stat.S_ISDIR(mode):
        raise TraceFormatError(f"{shown} is a directory, not a trace file: {HINT}")
    refuse_special(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            head = fh.read(100)
    except OSError as exc:
        raise TraceNotFoundError(f"cannot read {shown}: {exc.strerror}") from None
    if size == 0:
        raise TraceFormatError(f"{shown} is empty, not a replay trace: {HINT}")
    if not head.startswith(_SQLITE_MAGIC):
        raise TraceFormatError(f"{shown} is not a replay trace (not a SQLite file): {HINT}")
    if len(head) < 100:
        raise TraceFormatError(f"{shown} is truncated ({size} bytes): the trace is damaged")
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    pages = int.from_bytes(head[28:32], "big")
    valid = head[24:28] == head[92:96]  # header page count is trustworthy only then
    if page >= 512 and not size % page and not (valid and size < page * pages):
        return False
    # short: intact only if the WAL's committed frames hold every page the main file
    # lacks (a checkpoint that stopped half way, e.g. on a full disk; see tracer._wal)
    wal = wal_commits(path, page) if page >= 512 else None
    if wal is not None and all(p in wal.held for p in range(size // page + 1, wal.pages + 1)):
        return True
    raise TraceFormatError(
        f"{shown} is truncated ({size} bytes, expected {page * max(pages, wal.pages if wal else 0)}"
        f"{', and its -wal does not hold the rest' if wal else ''}): the trace is damaged; "
        "re-record the run"
    )


def _ro_connect(path: Path, immutable: bool) -> Any:
    uri = "file:" + pathname2url(str(path.resolve()))
    uri += "?immutable=1" if immutable else "?mode=ro"
    return sqlite3.connect(uri, uri=True, check_same_thread=False)


def open_engine(target: Any, *, writable: bool = False, allow_empty: bool = False) -> Engine:
    """An engine on an existing trace store, checked to be one of ours.

    A SQLite file is opened read-only (``mode=ro``) unless ``writable``; when SQLite
    cannot open a WAL file read-only (no ``-shm`` and a read-only directory) it is
    opened ``immutable``.  Nothing is written while checking.  ``allow_empty`` accepts a
    database without any table (one that a concurrent writer is about to fill).
    """
    path = None if isinstance(target, Engine) else sqlite_path(target)
    if isinstance(target, Engine):
        engine = target
    elif path is not None:  # a SQLite path or sqlite:/// URL: never let SQLite create it
        engine = _open_sqlite_ro(path, needs_wal=check_file(path))
    else:
        engine = url_engine(str(target))
    try:
        check_schema_info(engine, describe(target), allow_empty=allow_empty)
    except BaseException:
        if not isinstance(target, Engine):
            engine.dispose()
        raise
    if writable and not isinstance(target, Engine):
        engine.dispose()
        return create_store(target)
    return engine


def _open_sqlite_ro(path: Path, *, needs_wal: bool = False) -> Engine:
    """A read-only engine on ``path`` (``immutable`` if SQLite cannot open it ``mode=ro``)."""
    for immutable in (False, True):
        if immutable and needs_wal:  # immutable ignores the WAL, which holds the rest
            raise TraceFormatError(
                f"{path} keeps committed rows in {path.name}-wal, which SQLite can read only "
                f"with a {path.name}-shm beside it, and it cannot create one there: copy "
                f"{path.name} and {path.name}-wal to a writable directory and read the copy"
            )
        probe = create_engine(
            "sqlite://",
            creator=lambda im=immutable: _ro_connect(path, im),
            poolclass=QueuePool,
        )
        try:
            with probe.connect() as conn:
                conn.exec_driver_sql("SELECT count(*) FROM sqlite_master").all()
            return probe
        except UnicodeDecodeError as exc:  # a scribbled schema page: text that is no UTF-8
            probe.dispose()
            raise TraceFormatError(
                f"{path} is not a readable SQLite file ({exc}): {HINT}"
            ) from None
        except DBAPIError as exc:
            probe.dispose()
            if immutable or "unable to open" not in str(exc) and "readonly" not in str(exc):
                raise TraceFormatError(
                    f"{path} is not a readable SQLite file ({_reason(exc)}): {HINT}"
                ) from None
    raise AssertionError("unreachable")


def check_schema_info(engine: Engine, shown: str = "", *, allow_empty: bool = False) -> None:
    """Refuse a store without our ``schema_info`` row or with a newer schema version."""
    shown = shown or describe(engine)
    try:
        with engine.connect() as conn:
            names = set(inspect(conn).get_table_names())
            if not names and allow_empty:
                return
            if "schema_info" not in names:
                raise TraceFormatError(
                    f"{shown} is not a replay trace (no schema_info table): {HINT}"
                )
            rows = conn.execute(select(SchemaInfo.app_id, SchemaInfo.version)).all()
    except OperationalError as exc:
        if engine.dialect.name != "sqlite":  # the server is down, refused us, or is unknown
            raise TraceNotFoundError(
                f"cannot connect to {shown}: {_reason(exc, engine)}; check the host, port, "
                "user, password and database name in the URL"
            ) from None
        raise TraceFormatError(
            f"{shown} is not a readable trace ({_reason(exc)}): {HINT}"
        ) from None
    except DBAPIError as exc:
        raise TraceFormatError(
            f"{shown} is not a readable trace ({_reason(exc, engine)}): {HINT}"
        ) from None
    ours = [v for a, v in rows if a == APP_ID]
    if not ours:
        other = rows[0][0] if rows else "none"
        raise TraceFormatError(
            f"{shown} is a SQLite file of another application (app id {other!r}): {HINT}"
        )
    version = ours[0]
    if isinstance(version, bool) or not isinstance(version, int):
        raise TraceFormatError(
            f"{shown} has an invalid trace schema version {version!r} (table schema_info): "
            "the trace is damaged; re-record the run"
        )
    if version > SCHEMA_VERSION:
        raise TraceFormatError(
            f"{shown} has trace schema version {version}, newer than this strads-replay "
            f"understands ({SCHEMA_VERSION}): upgrade strads-replay to read it"
        )
    if version < 1:
        raise TraceFormatError(f"{shown} has an invalid trace schema version {version}")
    if version < OLDEST_READABLE:
        raise TraceFormatError(
            f"{shown} is an older trace (schema version {version}; this strads-replay reads "
            f"{OLDEST_READABLE} to {SCHEMA_VERSION}): re-record the run, or read it with the "
            "strads-replay that wrote it"
        )


def probe_store(target: str | os.PathLike[str]) -> None:
    """Check, before a run starts, that a URL ``target`` can hold a trace.

    Its driver is installed, its server answers, and the database is empty or already a
    trace store of ours.  Nothing is written.  A path is left to :func:`create_store`.
    """
    if is_url(target) and sqlite_path(target) is None:
        open_engine(target, allow_empty=True).dispose()


def checkpoint(engine: Engine) -> None:
    """Fold the WAL into the main file so the trace is one self-contained file."""
    if engine.dialect.name != "sqlite":
        return
    # on the DBAPI connection, outside the BEGIN IMMEDIATE that SQLAlchemy's autobegin
    # would issue: inside a transaction SQLite refuses to checkpoint, and says so only
    # in the returned row, so the WAL silently stayed beside the file
    try:
        raw = engine.raw_connection()
    except DBAPIError:
        return
    try:
        cur = raw.cursor()
        cur.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        cur.fetchall()
        cur.close()
    except Exception:  # noqa: BLE001 - another rank still writes; the last one folds the WAL
        pass
    finally:
        raw.close()


def leave_wal(path: Path | None) -> None:
    """Switch the trace file ``path`` back to a rollback journal, once its writers are
    done: a read-only reader of a WAL file creates ``-wal`` and ``-shm`` beside it and,
    unable to remove them, leaves them; of a rollback-journal file it creates nothing.
    Writers switch it to WAL again when they open it.  If any connection, of this process
    or another, still has the file open, SQLite refuses at once and it stays WAL."""
    if path is None:
        return
    try:  # mode=rw: never create a file that is not there
        con = sqlite3.connect(f"file:{pathname2url(str(path))}?mode=rw", uri=True, timeout=0)
    except sqlite3.Error:
        return
    try:
        con.execute("PRAGMA journal_mode=DELETE").fetchall()
    except sqlite3.Error:
        pass  # busy (another connection), read-only directory, full disk: stays WAL
    finally:
        con.close()


__all__ = [
    "BUSY_TIMEOUT_MS",
    "check_file",
    "create_store",
    "describe",
    "finish_run",
    "hide_password",
    "is_url",
    "leave_wal",
    "mark_crashed",
    "open_engine",
    "probe_store",
    "refuse_special",
    "special_kind",
    "start_run",
    "url_engine",
]
