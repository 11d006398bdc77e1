"""The store: SQLite tuning, URLs, read-only opening and reading while a run records."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest
from tracehelp import digest

import tracer
from tracer import _store


def test_a_new_store_is_wal_with_our_schema_info(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "t.sqlite"
    engine = tracer.create_store(path)
    engine.dispose()
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    rows = con.execute("SELECT app_id, version FROM schema_info").fetchall()
    assert rows == [("strads-replay-trace", tracer.SCHEMA_VERSION)]
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"run", "operator_plan", "invocation", "lock_grant_block", "verdict"} <= tables
    con.close()


def test_a_sqlalchemy_url_is_accepted(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'u.sqlite'}"
    tracer.start_run(url, "r", {"app": "x", "params": {"k": 1}, "versions": {"numpy": "2"}})
    rec = tracer.TraceRecorder(url, "r", [0], True)
    rec.objective("loss", 0, 0.5)
    rec.close("finished")
    with tracer.open(url) as trace:
        info = trace.run().info
        assert (info.app, info.params, info.versions) == ("x", {"k": 1}, {"numpy": "2"})
        assert trace.run().objectives() == {"loss": [0.5]}
        assert trace.store_bytes() == (tmp_path / "u.sqlite").stat().st_size


def test_opening_a_missing_sqlite_url_does_not_create_it(tmp_path: Path) -> None:
    with pytest.raises(tracer.TraceNotFoundError, match="does not exist"):
        tracer.open(f"sqlite:///{tmp_path / 'absent.sqlite'}")
    assert not (tmp_path / "absent.sqlite").exists()


def test_start_run_refuses_unknown_meta_keys(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown meta keys \['colour'\]"):
        tracer.start_run(tmp_path / "t.sqlite", "r", {"colour": "red"})


def test_an_empty_file_may_become_a_trace(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    path.touch()
    tracer.start_run(path, "r", {})
    with tracer.open(path) as trace:
        assert trace.run().run_id == "r"


def test_readers_see_commits_while_the_run_records(tmp_path: Path) -> None:
    path = tmp_path / "live.sqlite"
    rec = tracer.TraceRecorder(path, "r", [0], True)
    with tracer.open(path) as trace:
        run = trace.run()
        assert run.info.status == "running"
        for inv in range(3):
            rec.lock_grants("op", inv, 0, 0, 5, 10, np.array([2]), np.array([1]))
            rec.invocation_done("op", inv, 0, {"bodies": 5, "rounds": 1, "seconds": 0.0})
            assert run.operators()["op"].invocations == inv + 1
        rec.close("finished")
        assert trace.run().info.status == "finished"


def test_immutable_fallback_when_read_only_open_fails(
    trace_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = _store._ro_connect
    modes = []

    def fake(path: Path, immutable: bool) -> sqlite3.Connection:
        modes.append(immutable)
        if not immutable:
            raise sqlite3.OperationalError("unable to open database file")
        return real(path, immutable)

    monkeypatch.setattr(_store, "_ro_connect", fake)
    before = digest(trace_copy)
    with tracer.open(trace_copy) as trace:
        assert trace.run().operators()["acc"].invocations == 2
    assert modes[:2] == [False, True]
    assert digest(trace_copy) == before


def test_a_write_that_cannot_happen_is_one_tracer_error(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    rec = tracer.TraceRecorder(path, "r", [0], True)
    con = sqlite3.connect(path, timeout=0)
    con.execute("BEGIN EXCLUSIVE")  # another writer holds the lock
    monkey = _store.BUSY_TIMEOUT_MS
    try:
        rec._engine.dispose()
        _store.BUSY_TIMEOUT_MS = 50
        with pytest.raises(tracer.TraceWriteError, match=r"cannot write trace .*locked"):
            rec.invocation_done("op", 0, 0, {"bodies": 1, "rounds": 1, "seconds": 0.0})
    finally:
        _store.BUSY_TIMEOUT_MS = monkey
        con.rollback()
        con.close()
    rec.invocation_done("op", 0, 0, {"bodies": 1, "rounds": 1, "seconds": 0.0})  # retried fine
    rec.close("finished")
    with tracer.open(path) as trace:
        assert trace.run().operators()["op"].invocations == 1


def test_continues_and_labels_round_trip(tmp_path) -> None:
    path = tmp_path / "t.sqlite"
    tracer.start_run(str(path), "a", {"app": "x"})
    meta = {"app": "x", "continues": "a", "labels": {"chaos_seed": 3, "chaos_run": 1}}
    tracer.start_run(str(path), "b", meta)
    runs = {r.run_id: r for r in tracer.open(str(path), assume_finished=True).runs()}
    assert runs["a"].continues is None and runs["a"].labels == {}
    assert runs["b"].continues == "a"
    assert runs["b"].labels == {"chaos_seed": 3, "chaos_run": 1}


def test_labels_must_be_plain_values(tmp_path) -> None:
    with pytest.raises(ValueError, match="plain values"):
        tracer.start_run(str(tmp_path / "t.sqlite"), "a", {"labels": {"f": object()}})
