"""Which hash a DDS digest uses, and how a digest names it.

A run digests every DDS after every loop invocation, and replay, resume and time travel
compare those digests bit for bit, so a trace's digests must be recomputed with the hash
that made them.  A digest says which one it is: ``x3:`` and 32 hex digits is xxh3-128
(the ``xxhash`` package; about 30 GB/s, so hashing W and H of a MovieLens model costs
0.02 ms of a 17 ms kernel epoch instead of blake2b's 0.6 ms), 32 bare hex digits is
blake2b-128 (what traces recorded before 2026-11-26 hold; ``replay run --digest
blake2b`` still records it, for a cryptographic hash).  A replay takes the hash from
the trace's own digests, and comparing two digests of different hashes is refused.
"""

from __future__ import annotations

import hashlib
from typing import Any

import xxhash

XXH3 = "xxh3-128"
BLAKE2B = "blake2b-128"
#: The hash a new run digests with unless told otherwise.
DEFAULT = XXH3
KINDS = (XXH3, BLAKE2B)
#: What a digest of each hash starts with.
_PREFIX = {XXH3: "x3:", BLAKE2B: ""}
#: Short names the CLI accepts.
NAMES = {"xxh3": XXH3, "blake2b": BLAKE2B, XXH3: XXH3, BLAKE2B: BLAKE2B}


def resolve(name: str | None) -> str:
    """The hash ``name`` means (a short or full name; None: the default)."""
    if name is None:
        return DEFAULT
    if name not in NAMES:
        raise ValueError(f"unknown digest hash {name!r}; expected one of {', '.join(KINDS)}")
    return NAMES[name]


def new(kind: str, head: bytes = b"") -> Any:
    """A hasher of ``kind`` fed ``head``."""
    if resolve(kind) == XXH3:
        return xxhash.xxh3_128(head)
    return hashlib.blake2b(head, digest_size=16)


def text(kind: str, h: Any) -> str:
    """The digest string of hasher ``h`` of ``kind``."""
    return _PREFIX[kind] + h.hexdigest()


def kind_of(digest: str) -> str:
    """The hash that made ``digest``."""
    return XXH3 if digest.startswith(_PREFIX[XXH3]) else BLAKE2B


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
    "DEFAULT",
    "KINDS",
    "NAMES",
    "XXH3",
    "DigestKindError",
    "check_same_kind",
    "kind_of",
    "new",
    "resolve",
    "text",
]
