"""Every reader of a user's text file counts lines as the file does, at ``\\n`` alone: a
form feed, U+0085 or U+2028 inside a line (``pdftotext`` writes a form feed at each page
break) neither cuts a document in two nor shifts the line a message names.  And a byte
order mark at the start (Excel's "CSV UTF-8", Notepad) changes nothing that is read."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import engine as ap
from apps._errors import AppError, DataFormatError
from apps._tabular import read_table
from apps.lda._data import read_documents
from apps.sgdmf import _app as sgdmf
from apps.transe._data import read_split
from apps.word2vec._data import read_corpus

#: Characters ``str.splitlines`` breaks at besides ``\n`` and ``\r\n``.
OTHER_BREAKS = "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
WORDS = st.lists(st.sampled_from(["cat", "dog", "bond", "goal", "team"]), min_size=1, max_size=5)
#: One line of words, some joined by a break ``splitlines`` knows instead of a space.
LINE = st.lists(st.tuples(WORDS, st.sampled_from(" " + OTHER_BREAKS)), min_size=1, max_size=3)
ENDS = st.sampled_from(["\n", "\r\n", "\r"])  # Python's universal newlines


def _join(parts: list[tuple[list[str], str]]) -> str:
    return "".join(" ".join(words) + sep for words, sep in parts).rstrip(" ")


def _file(tmp: pytest.TempPathFactory, name: str, text: str) -> Path:
    path = tmp.mktemp("text") / name
    path.write_bytes(text.encode("utf-8"))
    return path


@given(docs=st.lists(LINE, min_size=1, max_size=6), end=ENDS)
def test_a_corpus_has_one_document_and_one_sentence_per_line(
    docs: list[list[tuple[list[str], str]]], end: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    lines = [_join(d) for d in docs]
    path = _file(tmp_path_factory, "docs.txt", end.join(lines) + end)
    got = read_documents(path)
    assert len(got) == len(lines)
    assert got == [line.split() for line in lines]  # the breaks separate words, as spaces do
    assert len(read_corpus(path, sentence_len=1000)) == len(lines)


@given(before=st.lists(LINE, max_size=4), end=ENDS, csv=st.booleans())
def test_a_bad_table_line_is_named_by_its_number_in_the_file(
    before: list[list[tuple[list[str], str]]],
    end: str,
    csv: bool,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # comment lines before the bad one hold the other breaks; a header only for CSV
    rows = ["x,y,target", *("1,2,3" for _ in before)] if csv else ["# " + _join(b) for b in before]
    if csv and before:
        rows[0] = "x" + _join(before[0]) + ",y,target"  # a header with a break in a name
    bad = "4,five,6" if csv else "1 1:five"
    path = _file(tmp_path_factory, "t.csv" if csv else "t.svm", end.join([*rows, bad]) + end)
    with pytest.raises(DataFormatError) as info:
        read_table(path, "lasso")
    assert f"{path}:{len(rows) + 1}: " in str(info.value), str(info.value)


@given(before=st.integers(0, 4), inner=st.sampled_from(OTHER_BREAKS), end=ENDS)
def test_a_bad_triple_is_named_by_its_number_in_the_file(
    before: int, inner: str, end: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    good = [f"a{inner}b\tr\tc" for _ in range(before)]  # a name holding a break is one name
    path = _file(tmp_path_factory, "train.txt", end.join([*good, "a\tr"]) + end)
    with pytest.raises(AppError, match=rf" line {before + 1}: expected"):
        read_split(path)
    good_only = _file(tmp_path_factory, "train.txt", end.join([*good, "x\tr\ty"]) + end)
    assert len(read_split(good_only)) == before + 1


BOM = "\ufeff".encode()
NUMBER = st.integers(-99, 99).map(str)


def _table(rows: list[list[str]], kind: str) -> str:
    if kind == "svm":
        return "".join(f"{r[0]} " + " ".join(f"{j}:{v}" for j, v in enumerate(r[1:], 1)) + "\n"
                       for r in rows)  # fmt: skip
    return "".join(("," if kind == "csv" else "\t").join(r) + "\n" for r in rows)


def _same_with_bom(tmp: pytest.TempPathFactory, name: str, text: str, read: object) -> None:
    plain, marked = tmp.mktemp("plain") / name, tmp.mktemp("bom") / name
    plain.write_bytes(text.encode("utf-8"))
    marked.write_bytes(BOM + text.encode("utf-8"))
    assert read(marked) == read(plain)  # type: ignore[operator]


@given(
    rows=st.lists(st.lists(NUMBER, min_size=3, max_size=3), min_size=1, max_size=4),
    kind=st.sampled_from(["csv", "tsv", "svm"]),
)
def test_a_byte_order_mark_changes_no_table(
    rows: list[list[str]], kind: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Kept, it made a headerless table's first row a header, dropped without a word."""

    def read(path: Path) -> tuple[list[list[float]], list[float]]:
        t = read_table(path, "lasso")
        return t.X.tolist(), t.y.tolist()

    _same_with_bom(tmp_path_factory, f"t.{kind}", _table(rows, kind), read)


@given(
    triples=st.lists(st.tuples(*[st.sampled_from(["a", "b", "r"])] * 3), min_size=1, max_size=4),
    docs=st.lists(WORDS.map(" ".join), min_size=1, max_size=4),
)
def test_a_byte_order_mark_changes_no_triple_or_document(
    triples: list[tuple[str, str, str]],
    docs: list[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Kept, it made the first triple's head another entity than the same name elsewhere."""
    lines = "".join("\t".join(t) + "\n" for t in triples)
    _same_with_bom(tmp_path_factory, "train.txt", lines, read_split)
    _same_with_bom(tmp_path_factory, "docs.txt", "\n".join(docs), read_documents)
    _same_with_bom(tmp_path_factory, "docs.txt", "\n".join(docs), lambda p: read_corpus(p, 9))


@pytest.mark.parametrize("header", [sgdmf.RATINGS_HEADER + "\n", ""])
def test_a_byte_order_mark_changes_no_rating(header: str, tmp_path: Path) -> None:
    text = header + "1\t2\t3\t0\n2\t1\t5\t0\n"
    for name, data in (("plain.inter", text.encode()), ("bom.inter", BOM + text.encode())):
        (tmp_path / name).write_bytes(data)

    def ratings(name: str) -> list[object]:
        def prog() -> list[object]:
            return list(ap.load(tmp_path / name, parse=sgdmf.parse_line).gather())

        return ap.run(prog).value  # type: ignore[no-any-return]

    assert ratings("bom.inter") == ratings("plain.inter") and len(ratings("plain.inter")) == 2


@given(lines=st.lists(WORDS.map(" ".join), min_size=1, max_size=5), end=ENDS, data=st.data())
def test_a_bad_byte_is_named_by_the_line_an_editor_shows(
    lines: list[str], end: str, data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    at = data.draw(st.integers(0, len(lines) - 1))
    raw = [line.encode() for line in lines]
    raw[at] += b"\xff"
    path = tmp_path_factory.mktemp("bad") / "docs.txt"
    path.write_bytes(end.encode().join(raw) + end.encode())
    with pytest.raises(DataFormatError, match=rf"not UTF-8 text \(line {at + 1}, byte "):
        read_documents(path)
