"""A safe, bit-exact encoding of plain data for checkpoints and collective values.

Plain data is None, bool, int, float, str, numpy scalars of a whitelisted dtype, and
tuples and lists of them.  It becomes tagged JSON (floats as ``float.hex``, so NaN, the
sign of zero and every bit survive), stored as a u8 codec blob.  Decoding builds only
those types: no pickle, no ``eval``, nothing from the trace runs.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ._codec import decode, encode
from ._errors import TraceFormatError

#: numpy scalar dtypes a value may hold (little-endian names, as ``dtype.str``).
SCALAR_DTYPES = frozenset(
    np.dtype(t).newbyteorder("<").str
    for t in ("f8", "f4", "f2", "i8", "i4", "i2", "i1", "u8", "u4", "u2", "u1")
) | {"|b1", "|i1", "|u1"}
#: Nesting depth a value may have.
MAX_DEPTH = 32


class NotPlain(TypeError):
    """A value is not plain data; the message says why."""


def _tag(v: Any, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise NotPlain(f"it nests deeper than {MAX_DEPTH} levels")
    if v is None:
        return ["n"]
    if isinstance(v, np.generic):  # before float: np.float64 is a float subclass
        if v.dtype.str not in SCALAR_DTYPES:
            raise NotPlain(f"it holds a numpy {v.dtype} scalar")
        x = v.item()
        return ["ns", v.dtype.str, x.hex() if isinstance(x, float) else str(x)]
    if isinstance(v, bool):
        return ["b", v]
    if isinstance(v, int):
        return ["i", str(v)]
    if isinstance(v, float):
        return ["f", v.hex()]
    if isinstance(v, str):
        return ["s", v]
    if isinstance(v, (tuple, list)):
        return ["t" if isinstance(v, tuple) else "l", [_tag(x, depth + 1) for x in v]]
    raise NotPlain(f"it holds a {type(v).__qualname__} object, not plain data")


def _untag(t: Any, where: str, depth: int = 0) -> Any:
    bad = TraceFormatError(f"{where}: not a plain-data encoding; the trace is damaged")
    if depth > MAX_DEPTH or not isinstance(t, list) or not t or not isinstance(t[0], str):
        raise bad
    tag, rest = t[0], t[1:]
    try:
        if tag == "n" and not rest:
            return None
        if tag == "b" and isinstance(rest[0], bool):
            return rest[0]
        if tag == "i" and isinstance(rest[0], str):
            return int(rest[0])
        if tag == "f" and isinstance(rest[0], str):
            return float.fromhex(rest[0])
        if tag == "s" and isinstance(rest[0], str):
            return rest[0]
        if tag == "ns" and rest[0] in SCALAR_DTYPES and isinstance(rest[1], str):
            dt = np.dtype(rest[0])
            x: Any = float.fromhex(rest[1]) if dt.kind == "f" else int(rest[1])
            return dt.type(x)
        if tag in ("t", "l") and isinstance(rest[0], list):
            items = [_untag(x, where, depth + 1) for x in rest[0]]
            return tuple(items) if tag == "t" else items
    except (ValueError, IndexError, OverflowError, TypeError):
        raise bad from None
    raise bad


def encode_plain(value: Any) -> tuple[bytes, str]:
    """(blob, codec) of plain ``value``; :class:`NotPlain` if it is not plain data."""
    text = json.dumps(_tag(value, 0), separators=(",", ":"))
    return encode(np.frombuffer(text.encode(), dtype=np.uint8))


def decode_plain(data: bytes | None, codec: str, where: str) -> Any:
    """The value :func:`encode_plain` stored."""
    raw = decode(data, codec, None, where)
    if raw.size and (raw.min() < 0 or raw.max() > 255):
        raise TraceFormatError(f"{where}: plain data is not bytes; the trace is damaged")
    try:
        tagged = json.loads(raw.astype(np.uint8).tobytes().decode())
    except (UnicodeDecodeError, ValueError):
        raise TraceFormatError(f"{where}: plain data is not JSON; the trace is damaged") from None
    return _untag(tagged, where)


#: Dtype kinds an array value may have (the codec stores them losslessly).
ARRAY_KINDS = "fiub"


def array_dtype(a: np.ndarray) -> str | None:
    """The dtype name to store ``a`` under, or None when the codec cannot hold it."""
    if a.dtype.kind not in ARRAY_KINDS or a.dtype.itemsize > 8 or a.dtype.str[1:] == "u8":
        return None  # the codec widens integers to int64: uint64 would not survive
    return a.dtype.newbyteorder("<").str if a.dtype.itemsize > 1 else a.dtype.str


def decode_array(
    data: bytes | None, codec: str, dtype: str, shape: Any, count: int, where: str
) -> np.ndarray:
    """An array stored flattened through the codec, back in its dtype and shape."""
    try:
        dt = np.dtype(dtype)
        shp = tuple(int(x) for x in shape)
    except (TypeError, ValueError):
        raise TraceFormatError(f"{where}: bad dtype or shape; the trace is damaged") from None
    if dt.kind not in ARRAY_KINDS or dt.itemsize > 8:
        raise TraceFormatError(f"{where}: dtype {dtype!r} is not allowed; the trace is damaged")
    per = int(np.prod(shp, dtype=np.int64))
    flat = decode(data, codec, count * per, where)
    return flat.astype(dt).reshape((count, *shp))


__all__ = ["NotPlain", "array_dtype", "decode_array", "decode_plain", "encode_plain"]
