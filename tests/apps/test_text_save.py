"""``--save x.txt`` (gensim's word2vec text format) for every app that writes one: a word
the format cannot hold is refused before any training, and every word it accepts reads
back through gensim as it was written.  Names come from hypothesis: spaces, tabs,
unicode, empty."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest
from gensim.models import KeyedVectors
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import engine as ap
from apps._errors import AppError
from apps.transe import _app as transe_app
from apps.word2vec import _data as w2v_data
from engine.lowlevel import text_word_problem, write_model
from replay._errors import UsageError
from replay._model import check_save

# gensim's loader asks platform.processor(), which runs ``uname -p`` once per process:
# done here, at collection, so the unit tests below start no process themselves
platform.processor()

#: Characters of a user's names and lines: white space of every kind, any unicode.
CHARS = st.one_of(
    st.sampled_from(" \t\u00a0\u2028\x1c\x85"),
    st.characters(codec="utf-8", exclude_characters="\r\n"),
)
#: Names a user's data may hold (empty too).
NAMES = st.text(alphabet=CHARS, max_size=6)
SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _read_back(path: Path) -> list[str]:
    return list(KeyedVectors.load_word2vec_format(str(path), binary=False).index_to_key)


@SETTINGS
@given(words=st.lists(NAMES, min_size=1, max_size=5, unique=True))
@example(words=["\x00"]).via("a CI run: numpy dropped the NUL after the check passed")
@example(words=["a\x00b", "\x00c"])
def test_a_word_is_written_only_if_gensim_reads_it_back(
    tmp_path_factory: pytest.TempPathFactory, words: list[str]
) -> None:
    out = tmp_path_factory.mktemp("w") / "v.txt"
    vec = np.arange(len(words) * 2, dtype=np.float64).reshape(len(words), 2)
    bad = [w for w in words if text_word_problem(w) is not None]
    if bad:
        with pytest.raises(ap.SaveError, match="save to .npz instead|remove it from the name"):
            write_model(out, {"vectors": vec, "vocab": words})
        assert not out.exists()
        assert all(w == "" or w.endswith("\x00") or any(c.isspace() for c in w) for w in bad)
        return
    write_model(out, {"vectors": vec, "vocab": words})
    assert _read_back(out) == words


def _graph(where: Path, names: list[str]) -> Path:
    """A graph whose entities are ``names`` (each in a triple of every split)."""
    where.mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid", "test"):
        lines = [f"{a}\tnear\t{b}" for a, b in zip(names, names[1:] + names[:1], strict=True)]
        (where / f"{split}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return where


@SETTINGS
@given(names=st.lists(NAMES, min_size=2, max_size=5, unique=True))
def test_transe_refuses_a_name_the_text_format_cannot_hold_before_training(
    tmp_path_factory: pytest.TempPathFactory, names: list[str]
) -> None:
    d = _graph(tmp_path_factory.mktemp("kg") / "data", names)
    out = d.parent / "x.txt"
    try:
        entities = transe_app.embedding_words(data=str(d))
    except AppError as exc:  # the data's own one-line error (an empty field, a tab)
        assert "expected 'head<TAB>relation<TAB>tail'" in str(exc) or "no triples" in str(exc)
        assert any(not n.strip() or "\t" in n for n in names)
        return
    assert set(entities) == {n.strip() for n in names}
    spaced = [e for e in entities if text_word_problem(e) is not None]
    if spaced:
        with pytest.raises(UsageError) as err:
            check_save(str(out), "transe", None, params={"data": str(d)})
        assert f"transe's word {spaced[0]!r} {text_word_problem(spaced[0])}" in str(err.value)
    else:
        check_save(str(out), "transe", None, params={"data": str(d)})
    assert not out.exists()


def _save_transe(cli, data: Path, out: Path):
    return cli(
        "run", "transe", "-p", f"data={data}", "-p", "epochs=1", "-p", "blocks=2",
        "--no-trace", "--save", out,
    )  # fmt: skip


def test_transe_save_refuses_a_spaced_name_before_training_and_writes_others(
    tmp_path: Path, cli
) -> None:
    out = tmp_path / "x.txt"
    proc = _save_transe(cli, _graph(tmp_path / "spaced", ["New York", "paris", "oslo"]), out)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"replay: error: --save {out}: transe's word 'New York' holds white space, which the "
        "word2vec text format cannot hold (gensim could not read the file back); save to "
        ".npz, which keeps every name"
    ]
    assert "iter" not in proc.stdout and not out.exists()  # nothing trained
    names = ["New_York", "par\u00eds", "\u6771\u4eac", "oslo"]
    proc = _save_transe(cli, _graph(tmp_path / "good", names), out)
    assert proc.returncode == 0, proc.stderr
    assert sorted(_read_back(out)) == sorted(names)


@SETTINGS
@given(lines=st.lists(st.text(alphabet=CHARS, max_size=30), min_size=1, max_size=6))
def test_word2vec_words_always_fit_the_text_format(
    tmp_path_factory: pytest.TempPathFactory, lines: list[str]
) -> None:
    """word2vec's words are tokens of its corpus, so no check before training is needed:
    every word of any corpus line (white space of any kind, unicode) is writable."""
    words = list(dict.fromkeys(w for line in lines for w in w2v_data.tokenize(line)))
    assert all(text_word_problem(w) is None for w in words)
    if words:
        out = tmp_path_factory.mktemp("w2v") / "v.txt"
        write_model(out, {"vectors": np.zeros((len(words), 2)), "vocab": words})
        assert _read_back(out) == words
