"""The recorder's direct SQLite insert stores exactly what SQLAlchemy's insert stores.

The fast path (``tracer._insert``) builds its INSERT statements from the schema; these
tests generate rows for every table of the schema (any subset of the columns that may be
left out, values of each column's type at their edges, rows that break a unique
constraint) and write them both ways, into two stores: the stored tables must be equal,
and a commit SQLAlchemy refuses must be refused, whole, by the fast path too.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Boolean, Float, Integer, LargeBinary, String, Text, select

import tracer._insert as ins
from tracer import TraceWriteError, _schema, _store
from tracer._store import create_store

MODELS = sorted(
    (m for m in vars(_schema).values() if isinstance(m, _schema.Model)),
    key=lambda m: m.__tablename__,
)  # every table
assert len(MODELS) == len(_schema.METADATA.tables)


def _value(col: Any) -> st.SearchStrategy[Any]:
    t = col.type
    if isinstance(t, Boolean):
        base: st.SearchStrategy[Any] = st.booleans()
    elif isinstance(t, Float):
        base = st.floats(allow_nan=False) | st.sampled_from([0.0, -0.0, 1e308, 5e-324])
    elif isinstance(t, Integer):
        base = st.integers(-(2**63), 2**63 - 1) | st.integers(-3, 3)
    elif isinstance(t, LargeBinary):
        base = st.binary(max_size=64)
    elif isinstance(t, (String, Text)):
        base = st.text(max_size=12)
    else:
        raise AssertionError(f"no strategy for column {col} of type {t!r}")
    return (st.none() | base) if col.nullable else base


@st.composite
def _rows(draw: st.DrawFn, model: Any) -> list[dict[str, Any]]:
    cols = [c for c in model.__table__.columns if not (c.primary_key and c.autoincrement is True)]
    may_omit = [c for c in cols if c.nullable or c.default is not None]
    omit = draw(st.sets(st.sampled_from([c.name for c in may_omit]))) if may_omit else set()
    out = []
    for _ in range(draw(st.integers(1, 3))):
        row = {c.name: draw(_value(c)) for c in cols if c.name not in omit}
        out.append(row)
    if len(out) > 1 and draw(st.booleans()):
        out.append(dict(out[0]))  # a repeated row: refused where the table has a unique key
    return out


@st.composite
def _commits(draw: st.DrawFn) -> list[dict[Any, list[dict[str, Any]]]]:
    commits = []
    for _ in range(draw(st.integers(1, 3))):
        models = draw(st.lists(st.sampled_from(MODELS), min_size=1, max_size=4, unique=True))
        commits.append({m: draw(_rows(m)) for m in models})
    return commits


def _dump(engine: Any) -> dict[str, list[tuple[Any, ...]]]:
    out = {}
    with engine.connect() as conn:
        for model in MODELS:
            table = model.__table__
            rows = [tuple(r) for r in conn.execute(select(table)).all()]
            # the store's own schema_info row holds the time the store was made
            out[table.name] = rows[1:] if table.name == "schema_info" else rows
    return out


def _apply(writer: ins.RowWriter, commits: list[dict[Any, list[dict[str, Any]]]]) -> list[str]:
    outcomes = []
    for rows in commits:
        try:
            writer.write(rows)
            outcomes.append("ok")
        except TraceWriteError as exc:
            outcomes.append(str(exc).split(": ", 1)[1].split(":")[0])
    return outcomes


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    database=None,
)
@given(commits=_commits())
def test_direct_insert_stores_what_sqlalchemy_stores(tmp_path: Path, commits: Any) -> None:
    n = len(list(tmp_path.iterdir()))
    fast = create_store(tmp_path / f"fast{n}.sqlite")
    slow = create_store(tmp_path / f"slow{n}.sqlite")
    try:
        wf, ws = ins.RowWriter(fast), ins.RowWriter(slow)
        ws.fast = False
        assert wf.fast
        assert _apply(wf, commits) == _apply(ws, commits)
        assert _dump(fast) == _dump(slow)
        # every batch went the direct way (no table has a callable default)
        assert all(wf._statements.values())
    finally:
        fast.dispose()
        slow.dispose()


@contextlib.contextmanager
def _locked(path: Path, seconds: float) -> Iterator[None]:
    """Another connection holds ``path``'s write lock for ``seconds`` from entry on."""
    held = threading.Event()

    def hold() -> None:
        con = sqlite3.connect(path, isolation_level=None)
        con.execute("BEGIN IMMEDIATE")
        held.set()
        time.sleep(seconds)
        con.execute("COMMIT")
        con.close()

    other = threading.Thread(target=hold)
    other.start()
    held.wait()
    try:
        yield
    finally:
        other.join()


def _one_row() -> dict[Any, list[dict[str, Any]]]:
    from tracer._schema import Objective

    return {Objective: [dict(run="r", name="loss", iteration=0, value=1.5, node=0, seq=0)]}


def test_a_commit_waits_for_another_writer_and_then_lands(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    engine = create_store(path)
    with _locked(path, 0.3):
        t0 = time.monotonic()
        ins.RowWriter(engine).write(_one_row())
        waited = time.monotonic() - t0
    assert waited >= 0.2  # it really waited for the lock
    assert len(_dump(engine)["objective"]) == 1
    engine.dispose()


def test_a_lock_held_past_the_timeout_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_store, "BUSY_TIMEOUT_MS", 100)  # (read by the writer at each write)
    path = tmp_path / "t.sqlite"
    engine = create_store(path)
    with _locked(path, 1.0), pytest.raises(TraceWriteError, match="database is locked") as err:
        ins.RowWriter(engine).write(_one_row())
    assert "\n" not in str(err.value)
    assert _dump(engine)["objective"] == []
    engine.dispose()
