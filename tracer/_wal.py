"""What a SQLite write-ahead log holds, read without SQLite and without writing.

A trace is written in WAL mode: commits go to ``T.sqlite-wal`` and a checkpoint copies
them into ``T.sqlite`` later.  A checkpoint writes page 1 (whose header gives the new
page count) before the pages after it, so one that stops half way — the disk filled
up, the process died — leaves a main file shorter than its header says while every
committed page is still in the WAL, and SQLite reads such a database correctly.  The
readers' size check (:func:`tracer._store.check_file`) asks this module which pages
the WAL's committed frames hold, following SQLite's own rules (https://sqlite.org/
fileformat2.html#the_write_ahead_log): a frame counts only while its salts match the
header's and the running checksum matches, and only up to the last commit frame.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

#: The WAL header's magic number; the low bit says the checksums are big-endian.
_MAGIC = 0x377F0682
_VERSION = 3007000
_HEADER = 32
_FRAME_HEADER = 24
_MASK = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class WalCommits:
    """The committed content of a WAL: the database size after its last commit (in
    pages) and the page numbers its committed frames hold."""

    pages: int
    held: frozenset[int]


def wal_path(path: Path) -> Path:
    """The WAL file that belongs to the SQLite file ``path``."""
    return Path(os.fspath(path) + "-wal")


def _checksum(data: bytes, s0: int, s1: int, big: bool) -> tuple[int, int]:
    words = struct.unpack(f"{'>' if big else '<'}{len(data) // 4}I", data)
    it = iter(words)
    for a, b in zip(it, it, strict=True):
        s0 = (s0 + a + s1) & _MASK
        s1 = (s1 + b + s0) & _MASK
    return s0, s1


def wal_commits(path: Path, page: int) -> WalCommits | None:
    """What the WAL of ``path`` commits for a database of ``page``-byte pages, or None
    when there is no WAL, it is for another page size, or it holds no valid commit."""
    try:
        fh = wal_path(path).open("rb")
    except OSError:
        return None
    with fh:
        head = fh.read(_HEADER)
        if len(head) < _HEADER:
            return None
        magic, version, size, _seq, salt1, salt2, c0, c1 = struct.unpack(">8I", head)
        if magic & ~1 != _MAGIC or version != _VERSION or size != page:
            return None
        big = bool(magic & 1)
        s0, s1 = _checksum(head[:24], 0, 0, big)
        if (s0, s1) != (c0, c1):
            return None
        pages = 0  # the database size after the last commit seen
        held: set[int] = set()
        pending: list[int] = []
        while True:
            frame = fh.read(_FRAME_HEADER + page)
            if len(frame) < _FRAME_HEADER + page:
                break  # a frame cut short (the write that failed) ends the log
            pgno, commit, f1, f2, k0, k1 = struct.unpack(">6I", frame[:_FRAME_HEADER])
            if (f1, f2) != (salt1, salt2) or pgno == 0:
                break  # left from an earlier generation of the log
            s0, s1 = _checksum(frame[:8], s0, s1, big)
            s0, s1 = _checksum(frame[_FRAME_HEADER:], s0, s1, big)
            if (s0, s1) != (k0, k1):
                break
            pending.append(pgno)
            if commit:
                pages = commit
                held.update(pending)
                pending = []
    return WalCommits(pages=pages, held=frozenset(held)) if pages else None


__all__ = ["WalCommits", "wal_commits", "wal_path"]
