"""Inserting a commit's rows: one transaction, through SQLAlchemy or straight to SQLite.

Why there are two paths: a traced kernel epoch lasts about 20 ms, and the recorder
commits once per loop invocation (the crash guarantee: everything up to the last
completed invocation is durable).  SQLAlchemy's Core ``insert`` spends about 0.3 ms of
Python per commit on a handful of small rows, and SQLite's own busy handler sleeps at
least a millisecond whenever two ranks commit at the same moment, which they do (they
finish an invocation together).  So on SQLite the rows go to the DBAPI cursor as
``INSERT`` statements built once per table and set of keys, with each column's own bind
processor and Python-side default taken from the schema (what SQLAlchemy would apply),
and the lock is retried with sleeps of tens of microseconds instead.  Every other
database goes through SQLAlchemy.  ``tests/tracer/test_trace_insert.py`` writes the same rows
both ways and requires the stored tables to be equal.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, insert
from sqlalchemy.exc import DBAPIError

from . import _store
from ._store import write_error

#: First and largest sleep (s) between attempts to take SQLite's write lock: another
#: rank's commit holds it for about 0.1 ms, so a short first sleep wastes little.
FIRST_WAIT_S = 50e-6
LONGEST_WAIT_S = 5e-3

#: Rows of one commit: table model -> row dicts (column name -> value).
Rows = dict[Any, list[dict[str, Any]]]


class _Statement:
    """An INSERT for one table and one set of keys, with what SQLAlchemy would bind."""

    __slots__ = ("sql", "keys", "procs", "defaults")

    def __init__(self, table: Any, keys: tuple[str, ...], dialect: Any) -> None:
        cols = {c.name: c for c in table.columns}
        extra: list[tuple[str, Any]] = []
        for name, col in cols.items():
            if name in keys or col.default is None:
                continue
            if not col.default.is_scalar:  # a callable default: SQLAlchemy's job
                raise LookupError(name)
            extra.append((name, col.default.arg))
        names = [*keys, *(n for n, _ in extra)]
        self.sql = (
            f'INSERT INTO "{table.name}" ({", ".join(f"{chr(34)}{n}{chr(34)}" for n in names)}) '
            f"VALUES ({', '.join('?' * len(names))})"
        )
        self.keys = keys
        self.defaults = tuple(v for _, v in extra)
        procs: list[tuple[int, Callable[[Any], Any]]] = []
        for k, name in enumerate(names):
            proc = cols[name].type.dialect_impl(dialect).bind_processor(dialect)
            if proc is not None:
                procs.append((k, proc))
        self.procs = tuple(procs)

    def params(self, rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        keys, defaults, procs = self.keys, self.defaults, self.procs
        out = []
        for row in rows:
            vals = [row[k] for k in keys]
            vals += defaults
            for k, proc in procs:
                vals[k] = proc(vals[k])
            out.append(tuple(vals))
        return out


class RowWriter:
    """Writes each commit's rows in one transaction of ``engine``."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.fast = engine.dialect.name == "sqlite" and engine.dialect.driver == "pysqlite"
        self._statements: dict[tuple[Any, tuple[str, ...]], _Statement | None] = {}
        self._raw: Any = None  # the DBAPI connection commits use, and its thread
        self._thread = 0

    def write(self, rows: Rows) -> None:
        """Insert ``rows`` (every table's) in one transaction; a failure raises
        :class:`~tracer.TraceWriteError` with one line saying why."""
        # an executemany takes its columns from the first row: rows with other keys
        # would lose theirs silently, so each set of keys goes in a batch of its own
        batches: list[tuple[Any, tuple[str, ...], list[dict[str, Any]]]] = []
        for model, batch in rows.items():
            by_keys: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
            for row in batch:
                by_keys[tuple(sorted(row))].append(row)
            batches += [(model, keys, same) for keys, same in by_keys.items()]
        if self.fast and all(self._statement(m, k) is not None for m, k, _ in batches):
            self._write_sqlite(batches)
            return
        try:
            with self.engine.begin() as conn:
                for model, _, same in batches:
                    conn.execute(insert(model.__table__), same)
        except DBAPIError as exc:
            raise write_error(self.engine, exc) from None

    def _statement(self, model: Any, keys: tuple[str, ...]) -> _Statement | None:
        key = (model, keys)
        if key not in self._statements:
            table = model.__table__
            try:
                if not set(keys) <= set(table.columns.keys()):
                    raise LookupError(keys)
                self._statements[key] = _Statement(table, keys, self.engine.dialect)
            except LookupError:  # unknown keys or callable defaults: SQLAlchemy decides
                self._statements[key] = None
        return self._statements[key]

    def _write_sqlite(
        self, batches: list[tuple[Any, tuple[str, ...], list[dict[str, Any]]]]
    ) -> None:
        work = []
        for model, keys, same in batches:
            st = self._statement(model, keys)
            assert st is not None
            work.append((st.sql, st.params(same)))
        try:
            if self._raw is None:  # held from the first commit on: a checkout costs 0.1 ms
                self._raw = self.engine.raw_connection()
                self._raw.driver_connection.execute("PRAGMA busy_timeout=0")
                self._thread = threading.get_ident()
            if self._thread == threading.get_ident():
                self._transaction(self._raw.driver_connection.cursor(), work)
                return
            raw = self.engine.raw_connection()  # another thread: a connection of its own
            try:
                raw.driver_connection.execute("PRAGMA busy_timeout=0")  # type: ignore[union-attr]
                try:
                    self._transaction(raw.driver_connection.cursor(), work)  # type: ignore[union-attr]
                finally:
                    raw.driver_connection.execute(f"PRAGMA busy_timeout={_store.BUSY_TIMEOUT_MS}")  # type: ignore[union-attr]
            finally:
                raw.close()
        except (sqlite3.Error, DBAPIError) as exc:
            raise write_error(self.engine, exc) from None

    def close(self) -> None:
        """Give back the connection held for commits (before the engine is disposed)."""
        raw, self._raw = self._raw, None
        if raw is None:
            return
        try:
            if self._thread == threading.get_ident():
                raw.driver_connection.execute(f"PRAGMA busy_timeout={_store.BUSY_TIMEOUT_MS}")
            raw.close()
        except sqlite3.Error:
            pass  # the engine is disposed next, which closes it

    @staticmethod
    def _transaction(cur: sqlite3.Cursor, work: list[tuple[str, list[tuple[Any, ...]]]]) -> None:
        """BEGIN IMMEDIATE .. COMMIT, all of it again while another writer holds the lock."""
        deadline = time.monotonic() + _store.BUSY_TIMEOUT_MS / 1000
        wait = FIRST_WAIT_S
        while True:
            try:
                cur.execute("BEGIN IMMEDIATE")
                for sql, params in work:
                    cur.executemany(sql, params)
                cur.execute("COMMIT")
                return
            except BaseException as exc:
                if cur.connection.in_transaction:
                    cur.execute("ROLLBACK")
                busy = (
                    isinstance(exc, sqlite3.OperationalError)
                    and exc.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY  # or an extended code
                )
                if not busy or time.monotonic() > deadline:
                    raise
            time.sleep(wait)
            wait = min(wait * 2, LONGEST_WAIT_S)


__all__ = ["RowWriter"]
