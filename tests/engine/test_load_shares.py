"""``ap.load`` under MPI parses on each rank only the lines that start in its share of
the file's bytes (``engine._data.ops._read_records``); the ranks' records, concatenated
in rank order, must be the whole file's, for any bytes and any number of ranks.

What can go wrong is the boundary: a line that starts in one share and ends in the
next, a share inside a multi-byte character or between ``\\r`` and ``\\n``, an empty
share (more ranks than lines), a last line without a newline, a bad line whose report
must be the first one of the file whichever rank finds it.  Generated files mix all of
those; each is split over 1 to 9 ranks."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from engine._data.ops import _read_records

#: Pieces a line is built from: digits and commas (a good record), multi-byte UTF-8,
#: a carriage return, a letter the parser refuses, a byte that is not UTF-8.
PIECES = [b"1", b"23", b",", b"\xc3\xa9", b"\xe2\x82\xac", b"\r", b"x", b"\xff"]


def parse(line: str) -> tuple[int, str] | None:
    """A record per line: its first field as an int (a letter in it is a bad line);
    a blank line is no record."""
    if not line.strip():
        return None
    head = line.split(",", 1)[0].replace("é", "").replace("€", "").replace("\r", "")
    if "x" in head:
        raise ValueError(f"bad field {head!r}")
    return (int(head or 0), line)


lines = st.lists(st.sampled_from(PIECES), max_size=6).map(b"".join)
files = st.tuples(st.lists(lines, max_size=25), st.booleans()).map(
    lambda t: b"\n".join(t[0]) + (b"\n" if t[1] and t[0] else b"")
)


@settings(max_examples=150, deadline=None)
@given(data=files, ranks=st.integers(1, 9))
def test_the_ranks_shares_make_up_the_whole_file(tmp_path_factory, data: bytes, ranks: int):
    p = Path(tmp_path_factory.mktemp("load")) / "data.txt"
    p.write_bytes(data)
    whole, _, whole_err = _read_records(p, parse)
    shares = [_read_records(p, parse, (r, ranks)) for r in range(ranks)]
    # every rank hashes every byte: the digests agree, and tell one file from another
    assert len({digest for _, digest, _ in shares}) == 1
    errors = [err for _, _, err in shares if err is not None]
    if whole_err is None:
        assert not errors
        assert [rec for recs, _, _ in shares for rec in recs] == whole
    else:
        # the first bad line of the file, whichever rank's share holds it
        assert min(errors) == whole_err


def test_a_changed_byte_changes_the_digest_every_rank_agrees_on(tmp_path: Path) -> None:
    p = tmp_path / "data.txt"
    p.write_bytes(b"1,a\n2,b\n3,c\n")
    before = {_read_records(p, parse, (r, 2))[1] for r in range(2)}
    p.write_bytes(b"1,a\n2,b\n3,d\n")
    after = {_read_records(p, parse, (r, 2))[1] for r in range(2)}
    assert len(before) == len(after) == 1 and before != after
