"""Codecs for bulk arrays: numpy bytes, optionally delta-coded and zlib-compressed.

A blob is stored next to a codec name drawn from the fixed whitelist :data:`CODECS`;
decoding uses only ``zlib`` and ``np.frombuffer`` — never pickle — so opening a
trace runs no code from it.  Integer arrays are narrowed to the smallest dtype that
holds them before compression (plan task ids fit in a byte; element ids do not).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._errors import TraceFormatError

#: zlib level: 6 is within a few percent of 9 on our arrays at a third of the time.
ZLIB_LEVEL = 6

_DTYPES = {
    "u8": np.uint8,
    "i8": np.int8,
    "u16": np.uint16,
    "i16": np.int16,
    "u32": np.uint32,
    "i32": np.int32,
    "i64": np.int64,
    "f64": np.float64,
}

#: Every codec a trace may name: (compressed, delta-coded, little-endian dtype).
CODECS: dict[str, tuple[bool, bool, np.dtype]] = {
    f"{comp}-{'d' if delta else ''}{name}": (comp == "zlib", delta, np.dtype(dt).newbyteorder("<"))
    for comp in ("raw", "zlib")
    for delta in (False, True)
    for name, dt in _DTYPES.items()
    if not (delta and name == "f64")
}


def smallest_int_dtype(arr: np.ndarray) -> str:
    """Name of the smallest whitelisted integer dtype that holds every value of ``arr``."""
    if arr.size == 0:
        return "u8"
    lo, hi = int(arr.min()), int(arr.max())
    if lo >= 0:
        for name, limit in (("u8", 1 << 8), ("u16", 1 << 16), ("u32", 1 << 32)):
            if hi < limit:
                return name
        return "i64"
    for name, bits in (("i8", 8), ("i16", 16), ("i32", 32)):
        if -(1 << (bits - 1)) <= lo and hi < (1 << (bits - 1)):
            return name
    return "i64"


def int_width(arr: np.ndarray) -> int:
    """Bytes per value of ``arr`` once narrowed to :func:`smallest_int_dtype`."""
    return np.dtype(_DTYPES[smallest_int_dtype(arr)]).itemsize


#: ``encode(..., level=AUTO)``: try a sample first, and store bytes that do not compress
#: (trained float weights: about 0.94 of their size at any level) raw, without paying
#: for compressing all of them (10 ms for a 430 kB array at level 6).
AUTO = -1
#: Bytes of the sample :data:`AUTO` compresses, and the ratio below which it compresses all.
SAMPLE_BYTES, WORTH = 1 << 16, 0.9
#: Blobs up to this size are stored raw: zlib's frame takes 6 of the bytes it could save
#: and each call costs microseconds of set-up, and a commit holds about ten such blobs.
TINY_BYTES = 64


def encode(arr: np.ndarray, *, delta: bool = False, level: int | None = None) -> tuple[bytes, str]:
    """Encode a 1-d integer or float array; returns (blob, codec name).

    ``level``: the zlib level (default :data:`ZLIB_LEVEL`; 0 stores raw bytes without
    trying, for data known not to compress; :data:`AUTO` decides from a sample)."""
    a = np.asarray(arr).ravel()
    if a.dtype.kind == "f":
        name, delta = "f64", False
        a = a.astype("<f8", copy=False)
    else:
        if a.dtype.kind not in "iub":
            raise TypeError(f"cannot encode an array of dtype {a.dtype}; use integers or floats")
        a = a.astype(np.int64, copy=False)
        if delta and a.size:
            a = np.diff(a, prepend=np.int64(0))  # int64 wrap-around is undone by cumsum
        name = smallest_int_dtype(a)
        a = a.astype(np.dtype(_DTYPES[name]).newbyteorder("<"), copy=False)
    raw = a.tobytes()
    if level == AUTO:
        level = None
        if len(raw) > SAMPLE_BYTES:
            sample = raw[:SAMPLE_BYTES]
            level = 0 if len(zlib.compress(sample, 1)) > WORTH * len(sample) else None
    if level == 0 or (level is None and len(raw) <= TINY_BYTES):
        return raw, f"raw-{'d' if delta else ''}{name}"
    packed = zlib.compress(raw, ZLIB_LEVEL if level is None else level)
    comp = "zlib" if len(packed) < len(raw) else "raw"
    return (packed if comp == "zlib" else raw), f"{comp}-{'d' if delta else ''}{name}"


def decode(data: bytes | None, codec: str, count: int | None, where: str) -> np.ndarray:
    """Decode a blob to int64 (or float64); ``count`` is the expected length if known.

    ``where`` names the table, row and column for the error message.
    """
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
        raise TraceFormatError(f"{where}: count {count!r} is not a length; the trace is damaged")
    spec = CODECS.get(codec) if isinstance(codec, str) else None
    if spec is None:
        raise TraceFormatError(
            f"{where}: unknown codec {codec!r}; the trace is corrupt or from a newer version"
        )
    if data is None:
        raise TraceFormatError(f"{where}: blob is missing; the trace is corrupt")
    compressed, delta, dtype = spec
    raw = bytes(data)
    if compressed:
        limit = count * dtype.itemsize + 1 if count is not None else 0
        try:
            d = zlib.decompressobj()
            raw = d.decompress(raw, limit)
            if not d.eof and (limit == 0 or len(raw) < limit):
                raise zlib.error("incomplete stream")
        except zlib.error as exc:
            raise TraceFormatError(
                f"{where}: corrupt compressed data ({exc}); the trace is damaged"
            ) from None
    if len(raw) % dtype.itemsize or (count is not None and len(raw) != count * dtype.itemsize):
        want = "" if count is None else f", expected {count * dtype.itemsize}"
        raise TraceFormatError(
            f"{where}: blob decodes to {len(raw)} bytes{want} ({codec}); the trace is damaged"
        )
    a = np.frombuffer(raw, dtype=dtype)
    if dtype.kind == "f":
        return a.astype(np.float64)
    a = a.astype(np.int64)
    return np.cumsum(a, dtype=np.int64) if delta else a


def encode_lines(lines: Sequence[str]) -> tuple[bytes, str]:
    """Encode short one-line names (element names) as one UTF-8 u8 blob, a line each
    (an empty name is stored as ``-``, so that no list is ambiguous)."""
    text = "\n".join(s.replace("\n", " ") or "-" for s in lines).encode()
    return encode(np.frombuffer(text, dtype=np.uint8))


def decode_lines(data: bytes | None, codec: str, count: int, where: str) -> list[str]:
    """The ``count`` names of a blob written by :func:`encode_lines`."""
    raw = decode(data, codec, None, where)
    if raw.size and (raw.min() < 0 or raw.max() > 255):
        raise TraceFormatError(f"{where}: names are not bytes; the trace is damaged")
    try:
        text = raw.astype(np.uint8).tobytes().decode()
    except UnicodeDecodeError:
        raise TraceFormatError(f"{where}: names are not UTF-8; the trace is damaged") from None
    lines = text.split("\n") if text else []
    if len(lines) != count:
        raise TraceFormatError(
            f"{where}: {len(lines)} name(s) for {count} entries; the trace is damaged"
        )
    return lines


def where(table: Any, row_id: int, col: str) -> str:
    """How errors name a blob: its table, row id and column."""
    return f"table {table.__tablename__} row {row_id} column {col}"


def decode_column(row: Any, table: Any, col: str, count: int | None) -> np.ndarray:
    """Decode blob column ``col`` of a row of ``table`` (its codec is in ``col_codec``)."""
    return decode(getattr(row, col), getattr(row, col + "_codec"), count, where(table, row.id, col))


__all__ = [
    "CODECS",
    "decode",
    "decode_column",
    "decode_lines",
    "encode",
    "encode_lines",
    "int_width",
    "smallest_int_dtype",
    "where",
]
