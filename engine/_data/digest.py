"""Which hash a DDS digest uses, and how a digest names it.

A run digests every DDS after every loop invocation, and replay, resume and time travel
compare those digests bit for bit, so a trace's digests must be recomputed with the hash
that made them.  A digest says which one it is:

* ``xc:`` and 32 hex digits, *xxh3-chunks* (the default since 2026-11-27): the rows of
  a numeric DDS, in slot order, are one byte string B cut into chunks of
  :data:`CHUNK` (8 KiB) bytes (the last one shorter); the digest is the xxh3-128 of the DDS's
  head, len(B) as 8 little-endian bytes and the 16-byte xxh3-128 digests of the chunks
  in order (:func:`chunked`).  Its point is that every rank hashes the chunks that lie
  in its own rows where they are and sends on only the bytes of the chunks that straddle
  a boundary between two ranks' rows (:func:`piece`, :func:`combine`): under MPI that is
  at most one chunk per boundary instead of every row.  A non-numeric DDS is hashed as
  by xxh3-128 (its values are pickled to rank 0 anyway).
* ``x3:`` and 32 hex digits, xxh3-128 of the head and B in one stream (traces of
  2026-11-26; ``--digest xxh3``).
* 32 bare hex digits, blake2b-128 of the same stream (traces recorded before
  2026-11-26; ``--digest blake2b``, for a cryptographic hash).

All three use the ``xxhash`` package's xxh3 (about 30 GB/s) or hashlib's blake2b.  A
replay takes the hash from the trace's own digests, and comparing two digests of
different hashes is refused.
"""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

import numpy as np
import xxhash

CHUNKS = "xxh3-chunks"
XXH3 = "xxh3-128"
BLAKE2B = "blake2b-128"
#: The hash a new run digests with unless told otherwise.
DEFAULT = CHUNKS
KINDS = (CHUNKS, XXH3, BLAKE2B)
#: What a digest of each hash starts with.
_PREFIX = {CHUNKS: "xc:", XXH3: "x3:", BLAKE2B: ""}
#: Short names the CLI accepts.
NAMES = {"xxh3": XXH3, "blake2b": BLAKE2B, CHUNKS: CHUNKS, XXH3: XXH3, BLAKE2B: BLAKE2B}
#: Bytes per chunk of :data:`CHUNKS` (part of its definition: never change it)
CHUNK = 1 << 13


def resolve(name: str | None) -> str:
    """The hash ``name`` means (a short or full name; None: the default)."""
    if name is None:
        return DEFAULT
    if name not in NAMES:
        raise ValueError(f"unknown digest hash {name!r}; expected one of {', '.join(KINDS)}")
    return NAMES[name]


def new(kind: str, head: bytes = b"") -> Any:
    """A hasher of ``kind`` fed ``head`` (for :data:`CHUNKS`: the stream hash of a
    non-numeric DDS; its numeric rows go through :func:`piece` and :func:`combine`)."""
    if resolve(kind) == BLAKE2B:
        return hashlib.blake2b(head, digest_size=16)
    return xxhash.xxh3_128(head)


def text(kind: str, h: Any) -> str:
    """The digest string of hasher ``h`` of ``kind``."""
    return _PREFIX[kind] + h.hexdigest()


def kind_of(digest: str) -> str:
    """The hash that made ``digest``."""
    for kind in (CHUNKS, XXH3):
        if digest.startswith(_PREFIX[kind]):
            return kind
    return BLAKE2B


# ------------------------------------------------------------------ xxh3-chunks
class Piece(NamedTuple):
    """What one holder of the bytes ``[start, start + len)`` of B contributes to a
    :data:`CHUNKS` digest: ``head``, its bytes before the first chunk boundary (all of
    them when it reaches none), ``full``, the 16-byte digests of the chunks that lie
    wholly inside it, and ``tail``, its bytes after the last boundary."""

    start: int
    head: bytes
    full: bytes
    tail: bytes


def piece(data: Any, start: int, chunk: int = CHUNK) -> Piece:
    """The :class:`Piece` of the bytes of ``data`` (an array or a buffer), which are B
    from ``start``."""
    if isinstance(data, np.ndarray):  # any dtype and shape: its bytes in C order
        data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    mv = memoryview(data)
    if mv.nbytes == 0:  # (a view with a 0 in its shape cannot be cast)
        return Piece(start, b"", b"", b"")
    mv = mv.cast("B") if mv.ndim != 1 or mv.format != "B" else mv
    end = start + len(mv)
    first = -(-start // chunk) * chunk  # the first boundary at or after start
    if first >= end:
        return Piece(start, bytes(mv), b"", b"")
    last = end // chunk * chunk  # the last boundary at or before end
    full = b"".join(
        xxhash.xxh3_128_digest(mv[a - start : a - start + chunk]) for a in range(first, last, chunk)
    )
    return Piece(start, bytes(mv[: first - start]), full, bytes(mv[last - start :]))


def combine(head: bytes, total: int, pieces: list[Piece], chunk: int = CHUNK) -> str:
    """The :data:`CHUNKS` digest of B (``total`` bytes) from the pieces of consecutive
    holders that cover it in order; a chunk cut by holders' boundaries is hashed here
    from their bytes."""
    digests: list[bytes] = []
    pending, at = bytearray(), 0
    for p in pieces:
        if p.start != at:
            raise ValueError(f"pieces do not follow each other: one starts at {p.start}, not {at}")
        pending += p.head
        at += len(p.head)
        if pending and at % chunk == 0:
            digests.append(xxhash.xxh3_128_digest(bytes(pending)))
            pending.clear()
        if p.full and pending:
            raise ValueError(f"a piece's whole chunks start at {at}, inside a chunk")
        if p.full:
            digests.append(p.full)
            at += len(p.full) // 16 * chunk
        pending += p.tail
        at += len(p.tail)
    if pending:
        digests.append(xxhash.xxh3_128_digest(bytes(pending)))
    if at != total:
        raise ValueError(f"pieces cover {at} bytes, not {total}")
    return _PREFIX[CHUNKS] + xxhash.xxh3_128_hexdigest(
        head + total.to_bytes(8, "little") + b"".join(digests)
    )


def chunked(head: bytes, data: bytes, chunk: int = CHUNK) -> str:
    """The definition of a :data:`CHUNKS` digest of ``head`` and B = ``data``."""
    parts = [xxhash.xxh3_128_digest(data[a : a + chunk]) for a in range(0, len(data), chunk)]
    return _PREFIX[CHUNKS] + xxhash.xxh3_128_hexdigest(
        head + len(data).to_bytes(8, "little") + b"".join(parts)
    )


class DigestKindError(RuntimeError):
    """Two digests of different hashes were about to be compared (a bug of ours: the
    replay must digest with the trace's hash)."""


def check_same_kind(recorded: str, computed: str) -> None:
    """Refuse to compare digests made by different hashes (they always differ)."""
    a, b = kind_of(recorded), kind_of(computed)
    if a != b:
        raise DigestKindError(
            f"the trace's digests are {a} but this run computed {b}: they cannot be compared"
        )


__all__ = [
    "BLAKE2B",
    "CHUNK",
    "CHUNKS",
    "DEFAULT",
    "KINDS",
    "NAMES",
    "XXH3",
    "DigestKindError",
    "Piece",
    "check_same_kind",
    "chunked",
    "combine",
    "kind_of",
    "new",
    "piece",
    "resolve",
    "text",
]
