"""Schema 7's ``invocation_set`` row: per-node arrays round-trip, damage is one error."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracer import TraceFormatError
from tracer._invset import (
    COUNTERS,
    GIVEN,
    MAX_SECONDS,
    MAX_US,
    MAX_VALUES,
    NodeDone,
    decode_phase,
    decode_set,
    encode_phase,
    encode_set,
)

#: Values a counter may hold (sequence numbers outgrow 32 bits in long runs).
counts = st.integers(0, 2**40)
micros = st.integers(0, 2**40)


@st.composite
def node_done(draw: st.DrawFn, node: int, rounds: int | None) -> NodeDone:
    """One node's record: counters, round lengths (``rounds`` of them when given, as an
    in-process cluster's nodes share their rounds), thread spans and routed counts."""
    n = rounds if rounds is not None else draw(st.integers(0, 12))
    spans = draw(st.integers(0, 8))
    routed = draw(st.integers(0, 5))
    return NodeDone(
        node,
        {name: draw(counts) for name in GIVEN},
        draw(st.floats(0, MAX_SECONDS)),
        np.array(draw(st.lists(micros, min_size=n, max_size=n)), np.int64),
        np.array(
            draw(
                st.lists(
                    st.tuples(counts, st.integers(0, 63), micros, micros),
                    min_size=spans,
                    max_size=spans,
                )
            ),
            np.int64,
        ).reshape(-1, 4),
        np.array(
            draw(st.lists(st.tuples(counts, counts, counts), min_size=routed, max_size=routed)),
            np.int64,
        ).reshape(-1, 3),
    )


@st.composite
def node_sets(draw: st.DrawFn) -> list[NodeDone]:
    nodes = draw(st.lists(st.integers(0, 4095), min_size=1, max_size=5, unique=True))
    shared = draw(st.none() | st.integers(0, 12))
    return [draw(node_done(n, shared)) for n in nodes]


def _row(cols: dict[str, Any]) -> Any:
    return SimpleNamespace(id=1, **cols)


@settings(max_examples=60, deadline=None)
@given(node_sets())
def test_an_invocation_set_row_round_trips(done: list[NodeDone]) -> None:
    got = decode_set(_row(encode_set(done)))
    assert got == sorted(done, key=lambda d: d.node)


def test_nodes_that_share_their_rounds_cost_one_node_of_round_lengths() -> None:
    """An in-process cluster's nodes measure the same rounds: stored as differences from
    the previous node's, 64 nodes' 64 lengths take under twice what one node's did."""
    rng = np.random.default_rng(3)
    rounds = rng.integers(20_000, 60_000, 64)
    counters = dict.fromkeys(GIVEN, 1)
    one = encode_set([NodeDone(0, counters, 0.5, rounds)])
    many = encode_set([NodeDone(n, counters, 0.5, rounds) for n in range(64)])
    apart = encode_set(
        [NodeDone(n, counters, 0.5, rng.integers(20_000, 60_000, 64)) for n in range(64)]
    )
    assert len(many["round_us"]) < 2 * len(one["round_us"]) < len(apart["round_us"]) / 10


def _good() -> dict[str, Any]:
    counters = dict.fromkeys(GIVEN, 3)
    tt = np.array([[0, 0, 5, 90], [1, 0, 2, 80]], np.int64)
    routed = np.array([[7, 2, 512]], np.int64)
    done = [NodeDone(n, counters, 0.25, np.array([100, 200]), tt, routed) for n in (0, 1)]
    return encode_set(done)


@pytest.mark.parametrize(
    "column,value,problem",
    [
        ("n_nodes", 0, "is not a node count"),
        ("n_nodes", 10**12, "is not a node count"),
        ("n_nodes", True, "is not a node count"),
        ("nodes_codec", "pickle", "unknown codec 'pickle'"),
        ("counters", b"\x00" * 3, "blob decodes to 3 bytes"),
        ("counters_codec", "zlib-u8", "corrupt compressed data"),
        ("round_us", b"\x01\x02", "blob decodes to 2 bytes"),
        ("thread_times_codec", "raw-f64", "blob decodes to"),
        ("routed", b"", "blob decodes to 0 bytes"),
    ],
)
def test_a_malformed_array_is_one_error_naming_its_column(
    column: str, value: Any, problem: str
) -> None:
    cols = _good() | {column: value}
    with pytest.raises(TraceFormatError, match=problem) as err:
        decode_set(_row(cols))
    assert "\n" not in str(err.value) and "table invocation_set row 1" in str(err.value)


@settings(max_examples=60, deadline=None)
@given(
    st.tuples(st.just("seconds"), st.floats().filter(lambda v: not 0 <= v <= MAX_SECONDS))
    | st.tuples(
        st.just("round_us"),
        st.integers(-(2**63), 2**63 - 1).filter(lambda v: not 0 <= v <= MAX_US),
    )
)
def test_a_time_out_of_range_is_refused_naming_its_column(bad: tuple[str, float]) -> None:
    """A NaN or infinite invocation time stopped ``replay export`` (internal error) and
    the browser's overview; a round length whose delta wrapped round int64 was shown."""
    from tracer._codec import encode

    column, value = bad
    cols = _good()
    if column == "seconds":
        cols["seconds"], cols["seconds_codec"] = encode(np.array([0.25, value]))
    else:  # node 0's second round (node 1's are stored as differences from node 0's)
        lengths = np.array([100, value, 100, 200], np.int64)
        cols["round_us"], cols["round_us_codec"] = encode(lengths, delta=True)
    with pytest.raises(TraceFormatError, match=f"row 1 column {column}: a .* that is not 0"):
        decode_set(_row(cols))


@given(st.floats())
def test_any_time_a_recorder_gives_is_stored_as_one_the_reader_takes(seconds: float) -> None:
    counters = dict.fromkeys(GIVEN, 1)
    (got,) = decode_set(_row(encode_set([NodeDone(0, counters, seconds)])))
    assert 0 <= got.seconds <= MAX_SECONDS


def test_counts_that_do_not_match_the_node_column_are_refused() -> None:
    """A node's count of spans changed: the spans no longer fall to the nodes they name."""
    cols = _good()
    counters = decode_set(_row(cols))
    moved = [
        NodeDone(
            d.node,
            d.counters,
            d.seconds,
            d.round_us,
            d.thread_times[:1]
            if d.node == 0
            else np.concatenate([d.thread_times, d.thread_times[:1]]),
            d.routed,
        )
        for d in counters
    ]
    bad = encode_set(moved)
    cols["thread_times"], cols["thread_times_codec"] = (
        bad["thread_times"],
        bad["thread_times_codec"],
    )
    with pytest.raises(TraceFormatError, match="node column does not match"):
        decode_set(_row(cols))


def test_a_huge_count_is_refused_before_anything_is_decoded() -> None:
    """A damaged count must not make a reader decompress or allocate without bound."""
    huge = np.zeros((len(COUNTERS), 2), np.int64)
    huge[COUNTERS.index("n_round_lengths")] = MAX_VALUES
    from tracer._codec import encode

    cols = _good()
    cols["counters"], cols["counters_codec"] = encode(huge.ravel())
    with pytest.raises(TraceFormatError, match="is not a length this reader decodes"):
        decode_set(_row(cols))


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 1e9), st.floats(0, 1e4)), min_size=1, max_size=8).map(
        lambda ts: [(n, 1.8e9 + s, sec) for n, (s, sec) in enumerate(ts)]
    )
)
def test_a_phase_row_round_trips_to_the_microsecond(times: list[tuple[int, float, float]]) -> None:
    row = SimpleNamespace(id=1, **encode_phase(times))
    for (n, s, sec), (gn, gs, gsec) in zip(times, decode_phase(row), strict=True):
        assert gn == n and abs(gs - s) < 2e-6 * max(1.0, s / 1e9) and abs(gsec - sec) <= 5e-7


def test_an_old_store_takes_a_new_run_and_both_layouts_verify(tmp_path: Path) -> None:
    """A schema-6 store stays 6 until a schema-7 run is written into it; then each run is
    read and verified by its own layout (the legacy reader for the old one)."""
    import gzip
    import sqlite3

    from tracehelp import record

    import tracer

    path = tmp_path / "old.sqlite"
    data = Path(__file__).parent.parent / "data" / "sgdmf_rot_4.sqlite.gz"
    path.write_bytes(gzip.decompress(data.read_bytes()))

    def version() -> int:
        with sqlite3.connect(path) as con:
            return int(con.execute("SELECT version FROM schema_info").fetchone()[0])

    with tracer.open_writable(path) as trace:
        (old,) = trace.runs()
        trace.add_verdict(old.run_id, "single", True, {})
    assert version() == 6  # a verdict needs no newer reader
    record(path, run_id="new")
    assert version() == tracer.SCHEMA_VERSION == 7
    with tracer.open(path) as trace:
        layouts = {r.run_id: r.schema for r in trace.runs()}
        assert layouts == {old.run_id: 6, "new": 7}
        for rid in layouts:
            rep = trace.verify(rid, full=True)
            assert rep.ok, rep.problem
        assert trace.run(old.run_id).operators()["sgd"].invocations == 2
        assert trace.run("new").operators()["acc"].invocations == 2


@st.composite
def wrapping_counts(draw: st.DrawFn) -> list[int]:
    """Three to eight int64 counts whose sum is a multiple of 2**64: 0 once wrapped."""
    n = draw(st.integers(3, 8))
    head = [2**64 // n + draw(st.integers(-(2**20), 2**20)) for _ in range(n - 1)]
    return [*head, 2**64 - sum(head)]


@settings(max_examples=40, deadline=None)
@given(
    column=st.sampled_from(["n_round_lengths", "n_thread_spans", "n_routed"]),
    counts=wrapping_counts(),
)
def test_counts_whose_sum_wraps_round_are_refused(column: str, counts: list[int]) -> None:
    """Per-node counts that each pass as non-negative but whose int64 sum wraps round
    (four of 2**62 sum to 0): the reader took the wrapped total, and splitting the
    empty column by those counts killed the process with a segmentation fault."""
    from tracer._codec import encode

    n = len(counts)
    cols = encode_set([NodeDone(k, dict.fromkeys(GIVEN, 1), 0.5) for k in range(n)])
    table = np.zeros((len(COUNTERS), n), np.int64)
    table[COUNTERS.index(column)] = counts
    cols["counters"], cols["counters_codec"] = encode(table.ravel())
    with pytest.raises(TraceFormatError, match="is not a length this reader decodes"):
        decode_set(_row(cols))
