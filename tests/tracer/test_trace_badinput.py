"""Bad input: one line naming the problem and what to do, and the file left untouched."""

from __future__ import annotations

import gzip
import os
import shutil
import sqlite3
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tracehelp import digest

import tracer
from tracer import TraceFormatError, TraceNotFoundError, TracerError
from tracer._codec import encode
from tracer._schema import CALL_BLOCKS
from tracer._stream import decode_calls, expand


def refuse(path: Path, error: type, pattern: str) -> str:
    """Every way of opening ``path`` fails with ``error`` and leaves the bytes alone."""
    before = digest(path) if path.is_file() else None
    messages = []
    for opener in (
        tracer.open,
        tracer.open_writable,
        lambda p: tracer.TraceRecorder(p, "r", [0], True),
        tracer.create_store,
    ):
        with pytest.raises(error, match=pattern) as info:
            opener(path)
        messages.append(str(info.value))
        assert "\n" not in str(info.value)
        if before is not None:
            assert digest(path) == before
    return messages[0]


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.sqlite"
    with pytest.raises(TraceNotFoundError) as info:
        tracer.open(path)
    assert str(info.value) == (
        f"{path} does not exist: pass a file written by 'replay run --trace' (see 'replay ls')"
    )
    assert isinstance(info.value, FileNotFoundError)
    assert not path.exists()


def test_directory(tmp_path: Path) -> None:
    refuse(tmp_path, TraceFormatError, "is a directory, not a trace file")


def test_random_bytes(tmp_path: Path) -> None:
    path = tmp_path / "noise.sqlite"
    path.write_bytes(np.random.default_rng(0).bytes(5000))
    msg = refuse(path, TraceFormatError, "is not a replay trace")
    assert msg == (
        f"{path} is not a replay trace (not a SQLite file): "
        "pass a file written by 'replay run --trace' (see 'replay ls')"
    )


def test_empty_file_is_not_a_trace_for_readers(tmp_path: Path) -> None:
    path = tmp_path / "empty.sqlite"
    path.touch()
    with pytest.raises(TraceFormatError, match="is empty, not a replay trace"):
        tracer.open(path)
    assert path.stat().st_size == 0


def test_truncated_to_half(trace_copy: Path) -> None:
    data = trace_copy.read_bytes()
    trace_copy.write_bytes(data[: len(data) // 2])
    refuse(
        trace_copy,
        TraceFormatError,
        r"is truncated \(\d+ bytes, expected \d+\): the trace is damaged",
    )


def test_truncated_on_a_page_boundary(trace_copy: Path) -> None:
    data = trace_copy.read_bytes()
    trace_copy.write_bytes(data[: 4096 * 3])
    refuse(trace_copy, TraceFormatError, "is truncated")


def test_truncated_inside_the_header(trace_copy: Path) -> None:
    trace_copy.write_bytes(trace_copy.read_bytes()[:50])
    refuse(trace_copy, TraceFormatError, "is truncated")


def test_foreign_sqlite_database(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE customer (id INTEGER PRIMARY KEY, name TEXT)")
        con.execute("INSERT INTO customer VALUES (1, 'ada')")
    con.close()
    msg = refuse(path, TraceFormatError, r"is not a replay trace \(no schema_info table\)")
    assert msg == (
        f"{path} is not a replay trace (no schema_info table): "
        "pass a file written by 'replay run --trace' (see 'replay ls')"
    )


def test_foreign_app_with_a_schema_info_table(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as con:
        con.execute(
            "CREATE TABLE schema_info (app_id TEXT PRIMARY KEY, version INT, created_at REAL)"
        )
        con.execute("INSERT INTO schema_info VALUES ('someone-else', 1, 0)")
    con.close()
    refuse(
        path, TraceFormatError, r"is a SQLite file of another application \(app id 'someone-else'\)"
    )


def test_newer_schema_version(trace_copy: Path) -> None:
    with sqlite3.connect(trace_copy) as con:
        con.execute("UPDATE schema_info SET version = ?", (tracer.SCHEMA_VERSION + 1,))
    con.close()
    msg = refuse(trace_copy, TraceFormatError, "newer than this strads-replay understands")
    assert msg.endswith("upgrade strads-replay to read it")


def _damage(path: Path, table: str, column: str, value: object) -> int:
    with sqlite3.connect(path) as con:
        (row_id,) = con.execute(f"SELECT min(id) FROM {table}").fetchone()
        con.execute(f"UPDATE {table} SET {column} = ? WHERE id = ?", (value, row_id))
    con.close()
    return row_id


@pytest.mark.parametrize(
    "column,value,problem",
    [
        ("deviations", b"\x78\x9cgarbage", r"blob decodes to 9 bytes, expected 0 \(raw-u8\)"),
        ("calls", b"", r"blob decodes to 0 bytes, expected 5 \(raw-u8\)"),
        ("calls_codec", "zlib-i64", "corrupt compressed data"),
        ("deviations_codec", "pickle", "unknown codec 'pickle'"),
        ("elements", b"X[1]\nX[2]", r"2 name\(s\) for 0 entries; the trace is damaged"),
        ("elements_codec", "pickle", "unknown codec 'pickle'"),
    ],
)
def test_corrupt_lock_blob_names_table_and_row(
    trace_copy: Path, column: str, value: object, problem: str
) -> None:
    row = _damage(trace_copy, "lock_grant_block", column, value)
    before = digest(trace_copy)
    col = column.removesuffix("_codec")
    where = f"table lock_grant_block row {row} column {col}"
    with tracer.open(trace_copy) as trace:
        run = trace.run()
        with pytest.raises(TraceFormatError, match=f"^{where}: .*{problem}"):
            list(run.events(kinds=["LockGranted"]))
        with pytest.raises(TraceFormatError, match=f"^{where}"):
            inv = run.invocations()[0]
            for node in run.nodes():
                run.lock_grants(inv.op, 0, node)
                run.lock_grants(inv.op, 1, node)
        assert run.operators()["acc"].invocations == 2  # summaries need no blobs
    assert digest(trace_copy) == before


@pytest.mark.parametrize(
    "column,value,problem",
    [
        ("thread_times", b"\x00\x01\x02", "blob decodes to 3 bytes, expected"),
        ("thread_times_codec", "pickle", "unknown codec 'pickle'"),
        ("round_us", b"\x00\x01\x02", "blob decodes to 3 bytes, expected"),
        ("counters_codec", "zlib-f32", "unknown codec 'zlib-f32'"),
        ("seconds", b"\x78\x9c\x01", "corrupt compressed data|blob decodes"),
    ],
)
def test_corrupt_invocation_arrays_name_table_and_row(
    trace_copy: Path, column: str, value: object, problem: str
) -> None:
    """A schema-7 row's per-node arrays: a blob of the wrong length or a codec tag this
    reader does not know is one error naming the table, row and column."""
    if column in ("thread_times", "round_us", "seconds"):  # bytes that decode, wrongly
        _damage(trace_copy, "invocation_set", column + "_codec", "raw-u8")
    if column == "seconds":
        _damage(trace_copy, "invocation_set", "seconds_codec", "zlib-f64")
    row = _damage(trace_copy, "invocation_set", column, value)
    where = f"table invocation_set row {row} column {column.removesuffix('_codec')}"
    with tracer.open(trace_copy) as trace:
        with pytest.raises(TraceFormatError, match=f"^{where}: .*({problem})"):
            trace.run().invocations()


@pytest.mark.parametrize(
    "column,value,problem",
    [
        ("n_nodes", 10**9, "is not a node count"),
        ("n_nodes", -1, "is not a node count"),
        ("n_nodes", 3, "blob decodes to"),  # the node list holds 2
    ],
)
def test_a_damaged_node_count_is_one_error_and_bounded_work(
    trace_copy: Path, column: str, value: object, problem: str
) -> None:
    """A count read from the file bounds what is decoded: a huge one is refused before
    anything is allocated or decompressed."""
    row = _damage(trace_copy, "invocation_set", column, value)
    with tracer.open(trace_copy) as trace:
        with pytest.raises(TraceFormatError, match=f"^table invocation_set row {row} column "):
            trace.run().invocations()
        with pytest.raises(TraceFormatError, match=problem):
            trace.run().operators()


def test_corrupt_routed_counts_name_table_and_row(trace_copy: Path) -> None:
    row = _damage(trace_copy, "invocation_set", "routed", b"zz")
    with (
        tracer.open(trace_copy) as trace,
        pytest.raises(TraceFormatError, match=f"^table invocation_set row {row} column routed: "),
    ):
        trace.run().routed()


def test_corrupt_plan_blob_names_table_and_row(trace_copy: Path) -> None:
    row = _damage(trace_copy, "operator_plan", "task_of", b"\x00\x01")
    with (
        tracer.open(trace_copy) as trace,
        pytest.raises(TraceFormatError, match=f"^table operator_plan row {row} column task_of: "),
    ):
        trace.run().plan("acc")


def test_corrupt_message_blob_names_table_and_row(tmp_path: Path) -> None:
    # a schema-6 trace, whose routed arrivals are message blocks (schema 7 keeps blocks
    # for the other channels only)
    trace_copy = tmp_path / "old.sqlite"
    data = Path(__file__).parent.parent / "data" / "sgdmf_rot_4.sqlite.gz"
    trace_copy.write_bytes(gzip.decompress(data.read_bytes()))
    row = _damage(trace_copy, "message_block", "source_seqs", b"zz")
    with (
        tracer.open(trace_copy) as trace,
        pytest.raises(
            TraceFormatError, match=f"^table message_block row {row} column source_seqs: "
        ),
    ):
        for node in trace.run().nodes():
            trace.run().messages(node)


def test_scribbled_pages_raise_only_tracer_errors(trace_copy: Path) -> None:
    data = bytearray(trace_copy.read_bytes())
    rng = np.random.default_rng(1)
    for page in range(2, len(data) // 4096):
        off = page * 4096 + int(rng.integers(0, 4000))
        data[off : off + 64] = rng.bytes(64)
    trace_copy.write_bytes(bytes(data))
    before = digest(trace_copy)
    try:
        with tracer.open(trace_copy) as trace:
            for info in trace.runs():
                run = trace.run(info.run_id)
                run.operators()
                list(run.events())
                run.plan("acc")
    except TracerError as exc:
        assert "\n" not in str(exc)
    except KeyError:
        pass  # the plan row itself was scribbled away
    assert digest(trace_copy) == before


def test_opening_a_good_trace_leaves_it_byte_identical(trace_copy: Path) -> None:
    before = digest(trace_copy)
    with tracer.open(trace_copy) as trace:
        run = trace.run()
        list(run.events())
        run.plan("acc")
    assert digest(trace_copy) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_directory(trace_copy: Path, tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    shutil.copyfile(trace_copy, ro / "t.sqlite")
    ro.chmod(0o555)
    try:
        with tracer.open(ro / "t.sqlite") as trace:
            assert trace.run().operators()["acc"].invocations == 2
    finally:
        ro.chmod(0o755)


def test_unknown_run_id(recorded_trace: Path) -> None:
    with (
        tracer.open(recorded_trace) as trace,
        pytest.raises(
            tracer.RunNotFoundError, match=r"holds no run 'zzzzzz' \(latest runs: run-1\)"
        ),
    ):
        trace.run("zzzzzz")


@st.composite
def wrapping_lengths(draw: st.DrawFn) -> list[int]:
    """Three to eight int64 lengths whose sum is a multiple of 2**64: 0 once wrapped."""
    n = draw(st.integers(3, 8))
    head = [2**64 // n + draw(st.integers(-(2**20), 2**20)) for _ in range(n - 1)]
    return [*head, 2**64 - sum(head)]


@settings(max_examples=30, deadline=None)
@given(model=st.sampled_from(sorted(CALL_BLOCKS, key=repr)), lengths=wrapping_lengths())
def test_call_lengths_whose_sum_wraps_round_are_refused(model: Any, lengths: list[int]) -> None:
    """A block's per-call lengths summed in int64: four of 2**62 summed to its 0 values,
    passed, and expanding the calls killed the reader with a segmentation fault."""
    spec = CALL_BLOCKS[model]
    calls = np.zeros((len(lengths), spec.width), np.int64)
    calls[:, -1] = lengths
    empty = encode(np.zeros(0, np.int64))
    cols: dict[str, Any] = {"calls": encode(calls.ravel())}
    cols |= {c: empty for c in spec.values}
    row = SimpleNamespace(
        id=1,
        n_calls=len(lengths),
        n_values=0,
        count=0 if spec.per_value else len(lengths),
        **{k: v[0] for k, v in cols.items()},
        **{k + "_codec": v[1] for k, v in cols.items()},
    )
    with pytest.raises(TraceFormatError, match="column calls: call lengths do not add up"):
        expand(model, row) if spec.per_value else decode_calls(model, row)
