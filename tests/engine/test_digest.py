"""The xxh3-chunks digest: however the bytes are split among holders, the pieces they
make combine into the definition's digest (``engine._data.digest``)."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from engine._data import digest as dg


@st.composite
def split_bytes(draw: st.DrawFn) -> tuple[int, bytes, list[int]]:
    """A chunk size, a byte string and the cut points of its holders (some holders
    empty, some inside one chunk, some spanning several)."""
    chunk = draw(st.sampled_from([1, 2, 3, 8, 16]))
    data = draw(st.binary(max_size=6 * chunk + 5))
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=6)))
    return chunk, data, cuts


@given(split_bytes())
def test_pieces_of_any_split_combine_into_the_definition(
    case: tuple[int, bytes, list[int]],
) -> None:
    chunk, data, cuts = case
    bounds = [0, *cuts, len(data)]
    pieces = [dg.piece(data[a:b], a, chunk) for a, b in zip(bounds, bounds[1:], strict=False)]
    assert dg.combine(b"head", len(data), pieces, chunk) == dg.chunked(b"head", data, chunk)


def test_the_definition_is_xxh3_of_head_length_and_chunk_digests() -> None:
    size = 8192
    assert dg.CHUNK == size  # part of the definition: traces hold digests made with it
    data = bytes(range(256)) * 70  # 17920 bytes: two whole chunks and a short one
    parts = [data[:size], data[size : 2 * size], data[2 * size :]]
    want = xxhash.xxh3_128_hexdigest(
        b"H" + len(data).to_bytes(8, "little") + b"".join(xxhash.xxh3_128_digest(p) for p in parts)
    )
    assert dg.chunked(b"H", data) == "xc:" + want
    assert dg.kind_of("xc:" + want) == dg.CHUNKS


def test_a_change_anywhere_or_a_moved_boundary_changes_the_digest() -> None:
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 3 * dg.CHUNK + 100, dtype=np.uint8).tobytes()
    base = dg.chunked(b"h", data)
    for at in (0, dg.CHUNK - 1, dg.CHUNK, 2 * dg.CHUNK + 7, len(data) - 1):
        flipped = bytearray(data)
        flipped[at] ^= 1
        assert dg.chunked(b"h", bytes(flipped)) != base, at
    assert dg.chunked(b"h", data + b"\x00") != base  # the length is hashed too
    assert dg.chunked(b"h", b"") != dg.chunked(b"h", b"\x00")


@pytest.mark.parametrize(
    "shape,dtype",
    [((0, 3), np.float64), ((), np.float64), ((5, 2), np.complex64), ((7,), np.float16)],
)
def test_a_piece_takes_any_array_as_its_c_order_bytes(shape: tuple[int, ...], dtype: type) -> None:
    a = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
    got = dg.combine(b"", a.nbytes, [dg.piece(a, 0)])
    assert got == dg.chunked(b"", a.tobytes())


def test_pieces_that_leave_a_gap_or_overlap_are_refused() -> None:
    data = bytes(40)
    with pytest.raises(ValueError, match="do not follow"):
        dg.combine(b"", 40, [dg.piece(data[:10], 0, 8), dg.piece(data[12:], 12, 8)], 8)
    with pytest.raises(ValueError, match="cover 30 bytes, not 40"):
        dg.combine(b"", 40, [dg.piece(data[:30], 0, 8)], 8)
