"""``ap.load`` under MPI parses on each rank only the lines that start in its share of
the file's bytes (``engine._data.ops._read_records``); the ranks' records, concatenated
in rank order, must be the whole file's, for any bytes and any number of ranks.

What can go wrong is the boundary: a line that starts in one share and ends in the
next, a share inside a multi-byte character or between ``\\r`` and ``\\n``, an empty
share (more ranks than lines), a last line without a newline, a bad line whose report
must be the first one of the file whichever rank finds it.  Generated files mix all of
those; each is split over 1 to 9 ranks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine._data.ops import _read_records
from engine._errors import DataFormatError

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


#: Lines joined by each of the ends an editor knows, mixed in one file.
ENDS = [b"\n", b"\r\n", b"\r"]
text_files = st.tuples(
    st.lists(
        st.tuples(st.sampled_from([b"", b"1", b"23,\xc3\xa9", b"x", b" "]), st.sampled_from(ENDS))
    ),
    st.sampled_from([b"", b"7", b"x"]),
).map(lambda t: b"".join(a + e for a, e in t[0]) + t[1])


@settings(max_examples=150, deadline=None)
@given(data=text_files, ranks=st.integers(1, 4))
def test_a_line_ends_where_an_editor_ends_it(tmp_path_factory, data: bytes, ranks: int):
    """``\n``, ``\r\n`` and a lone ``\r`` each end a line (docs/data.md), on every
    rank: the records are the editor's lines and a bad line is named by the editor's
    number.  A file of lone ``\r`` endings used to be one line."""
    p = Path(tmp_path_factory.mktemp("ends")) / "data.txt"
    p.write_bytes(data)
    editor = re.split(r"\r\n|\r|\n", data.decode())
    if editor[-1] == "":
        editor.pop()
    bad = [n for n, line in enumerate(editor, start=1) if "x" in line]
    shares = [_read_records(p, parse, (r, ranks)) for r in range(ranks)]
    errors = [err for _, _, err in shares if err is not None]
    if bad:
        assert min(errors)[0] == bad[0]
    else:
        want = [(int(ln.split(",")[0]), ln) for ln in editor if ln.strip()]
        assert [rec for recs, _, _ in shares for rec in recs] == want


def test_a_bad_line_after_lone_carriage_returns_is_named_by_its_number(tmp_path: Path) -> None:
    import engine as ap

    p = tmp_path / "mac.csv"
    p.write_bytes(b"1,a\r2,b\r3x,c\r4,d\r")
    with pytest.raises(DataFormatError) as info:
        ap.run(lambda: ap.load(p, parse=parse), nodes=2)
    assert str(info.value) == f"{p}:3: bad field '3x'"
    p.write_bytes(b"1,a\r2,b\r3,c\r4,d")
    got = ap.run(lambda: [r for r in ap.load(p, parse=parse, name="A").gather()], nodes=2)
    assert got.value == [(1, "1,a"), (2, "2,b"), (3, "3,c"), (4, "4,d")]
