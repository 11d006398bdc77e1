"""Bulk-array codecs: exact round trips, narrow dtypes, and damage reported with its place."""

from __future__ import annotations

import pickle
import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tracer import CODECS, TraceFormatError
from tracer._codec import decode, encode, smallest_int_dtype

ints = hnp.arrays(
    np.int64,
    st.integers(0, 300),
    elements=st.one_of(
        st.integers(-(2**63), 2**63 - 1), st.integers(-300, 300), st.integers(0, 70_000)
    ),
)


@given(ints, st.booleans())
def test_int_arrays_round_trip_exactly(arr: np.ndarray, delta: bool) -> None:
    blob, codec = encode(arr, delta=delta)
    assert codec in CODECS
    out = decode(blob, codec, len(arr), "t")
    assert out.dtype == np.int64 and np.array_equal(out, arr)


@given(hnp.arrays(np.float64, st.integers(0, 50), elements=st.floats(allow_nan=False)))
def test_float_arrays_round_trip_exactly(arr: np.ndarray) -> None:
    blob, codec = encode(arr)
    assert codec.endswith("f64")
    assert np.array_equal(decode(blob, codec, len(arr), "t"), arr)


@pytest.mark.parametrize(
    "values,dtype",
    [
        ([], "u8"),
        ([0, 255], "u8"),
        ([0, 256], "u16"),
        ([65535], "u16"),
        ([65536], "u32"),
        ([2**32 - 1], "u32"),
        ([2**32], "i64"),
        ([-1, 127], "i8"),
        ([-129], "i16"),
        ([-(2**15), 2**15 - 1], "i16"),
        ([2**15, -1], "i32"),
        ([-(2**31) - 1], "i64"),
    ],
)
def test_smallest_dtype_that_fits(values: list[int], dtype: str) -> None:
    assert smallest_int_dtype(np.array(values, dtype=np.int64)) == dtype


def test_task_ids_cost_about_a_byte_each_before_compression() -> None:
    ids = np.random.default_rng(0).integers(0, 4, 100_000)
    blob, codec = encode(ids)
    assert codec == "zlib-u8"
    assert len(blob) < 40_000  # 2 bits of entropy per id


def test_sorted_element_ids_shrink_with_delta_coding() -> None:
    ids = (1 << 40) + np.arange(0, 30_000, 3)
    plain, _ = encode(ids)
    coded, codec = encode(ids, delta=True)
    assert codec.startswith("zlib-d") and len(coded) * 5 < len(plain)


def test_unknown_codec_is_refused() -> None:
    with pytest.raises(TraceFormatError, match=r"table x row 3 column y: unknown codec 'pickle'"):
        decode(pickle.dumps([1, 2]), "pickle", None, "table x row 3 column y")


def test_bad_zlib_is_reported_with_its_place() -> None:
    with pytest.raises(TraceFormatError, match=r"^table t row 1 column c: corrupt compressed"):
        decode(b"not zlib at all", "zlib-i64", 2, "table t row 1 column c")


def test_truncated_zlib_is_reported() -> None:
    blob = zlib.compress(np.arange(1000, dtype="<i8").tobytes())
    with pytest.raises(TraceFormatError, match="corrupt compressed"):
        decode(blob[: len(blob) // 2], "zlib-i64", 1000, "t")


@pytest.mark.parametrize("count", [3, 5])
def test_wrong_length_is_reported(count: int) -> None:
    blob, codec = encode(np.arange(4))
    with pytest.raises(TraceFormatError, match="decodes to"):
        decode(blob, codec, count, "t")


def test_decompression_stops_at_the_expected_size() -> None:
    bomb = zlib.compress(bytes(50_000_000))
    with pytest.raises(TraceFormatError, match="decodes to 9 bytes, expected 8"):
        decode(bomb, "zlib-i64", 1, "t")


def test_odd_raw_length_is_reported() -> None:
    with pytest.raises(TraceFormatError, match="decodes to 7 bytes"):
        decode(b"1234567", "raw-i64", None, "t")


def test_auto_level_stores_what_does_not_compress_raw_and_the_rest_compressed() -> None:
    from tracer._codec import AUTO, SAMPLE_BYTES, decode, encode

    rng = np.random.default_rng(0)
    weights = rng.normal(0.3, 0.1, 3 * SAMPLE_BYTES // 8)  # trained floats: ~0.94 at best
    counts = np.repeat(np.arange(40, dtype=np.int64), 3 * SAMPLE_BYTES // 40)
    small = rng.normal(size=100)  # under the sample size: compressed as before
    for arr, kind in ((weights, "raw"), (counts, "zlib"), (small, "raw")):
        blob, codec = encode(arr, level=AUTO)
        assert codec.startswith(kind), codec
        assert np.array_equal(decode(blob, codec, len(arr), "t"), arr)
    assert encode(weights, level=AUTO)[0] == weights.astype("<f8").tobytes()
