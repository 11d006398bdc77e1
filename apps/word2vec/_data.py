"""Data for word2vec: gensim's test corpora and evaluation sets, or a synthetic corpus.

The corpora (``lee_background.cor``, ``head500.noblanks.cor``) and the evaluation sets
(``wordsim353.tsv``, ``questions-words.txt``) ship in gensim's wheel under
``gensim/test/test_data/``.  They are extracted into the cache with
:func:`apps._datasets.fetch_wheel_member` (gensim is never installed or imported for
this) and checked against the SHA-256 they have in gensim 4.4.0, so a damaged cached
file is reported instead of trained on.

The synthetic corpus plants its answers: words come in *synonym groups* whose members
are used interchangeably in the same contexts, so after training a word's nearest
neighbours should be its synonyms, and a generated similarity list (synonyms high,
words of unrelated groups low) gives an offline ``wordsim``.
"""

from __future__ import annotations

import hashlib
import pathlib
import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

from .._datasets import DatasetUnavailableError, fetch_wheel_member, read_utf8, text_lines
from .._errors import AppError

_PACKAGE, _VERSION = "gensim", "4.4.0"
_PREFIX = "gensim/test/test_data/"
#: The members used, with their SHA-256 in gensim 4.4.0.
MEMBERS = {
    "lee_background.cor": "5d78d6dafd953bbf65797bef09a9ffb9ec430583381be705f8fd460000f370fb",
    "head500.noblanks.cor": "af9892fa37eef66079a8fcd5d25090104ee7e588f6121ee43817d82131f12474",
    "wordsim353.tsv": "f92a022fc2537793a15bc3a8c162ebcd74990e033a228bb6388cb71e4c0b1e1d",
    "questions-words.txt": "8c29b3332afc46f3fb8be04cb5297bf96f39aa7131272dff57869b4485b22a36",
}
#: ``-p corpus=`` names and their files.
CORPORA = {"lee": "lee_background.cor", "head500": "head500.noblanks.cor"}
#: Cache subdirectory of the extracted files.
CACHE_SUBDIR = "gensim-test-data"

#: Synthetic corpus: synonym groups, synonyms per group, context words per group.
SYNTHETIC_GROUPS, SYNTHETIC_SYNONYMS, SYNTHETIC_CONTEXT = 12, 3, 8
#: Synthetic corpus: sentences and words per sentence.
SYNTHETIC_SENTENCES, SYNTHETIC_LENGTH = 400, 24
#: Share of a synthetic sentence's words drawn from the frequent filler words (the ones
#: subsampling is for); the rest come from the sentence's group.
SYNTHETIC_FILLER_SHARE = 0.3
#: Frequent filler words of the synthetic corpus.
SYNTHETIC_FILLERS = 5

_TOKEN = re.compile(r"\w+")

WordPair = tuple[str, str, float]
Question = tuple[str, str, str, str]


def tokenize(line: str) -> list[str]:
    """Lower-case word tokens of one line (runs of letters, digits and underscores)."""
    return _TOKEN.findall(line.lower())


def gensim_test_data() -> pathlib.Path:
    """The cache directory holding the four gensim test files, fetched and checked."""
    dest = fetch_wheel_member(
        _PACKAGE, _VERSION, [_PREFIX + name for name in MEMBERS], CACHE_SUBDIR
    )
    for name in MEMBERS:
        check_file(dest / name)
    return dest


def check_file(path: pathlib.Path) -> None:
    """Raise a one-line :class:`DatasetUnavailableError` unless ``path`` is the gensim file
    of its name, byte for byte."""
    want = MEMBERS[path.name]
    try:
        got = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        raise DatasetUnavailableError(
            f"word2vec: cannot read {path}: {exc.strerror or exc}"
        ) from None
    if got != want:
        raise DatasetUnavailableError(
            f"word2vec: {path} is corrupt (its SHA-256 is {got[:12]}..., gensim {_VERSION}'s "
            f"is {want[:12]}...); delete it and run again to fetch it anew"
        )


def read_corpus(path: pathlib.Path, sentence_len: int) -> list[list[str]]:
    """The token lists of a text file, one line per sentence, cut into pieces of at most
    ``sentence_len`` tokens.  A missing, unreadable, non-UTF-8 or word-less file is an
    :class:`AppError` naming the file."""
    text = read_utf8(path, "word2vec: corpus", "give a plain text file, one sentence per line")
    out: list[list[str]] = []
    for line in text_lines(text):
        words = tokenize(line)
        out.extend(words[i : i + sentence_len] for i in range(0, len(words), sentence_len))
    if not out:
        raise AppError(f"word2vec: corpus {str(path)!r} has no words")
    return out


@dataclass(frozen=True)
class Vocab:
    """Words kept for training, most frequent first (ties in order of first occurrence)."""

    words: list[str]
    counts: np.ndarray
    index: dict[str, int]

    def __len__(self) -> int:
        return len(self.words)


def build_vocab(sentences: list[list[str]], min_count: int) -> Vocab:
    """The words occurring at least ``min_count`` times."""
    counts = Counter(w for s in sentences for w in s)  # insertion order = first occurrence
    kept = [(w, c) for w, c in counts.items() if c >= min_count]
    kept.sort(key=lambda wc: -wc[1])  # stable: ties stay in order of first occurrence
    words = [w for w, _ in kept]
    return Vocab(
        words, np.array([c for _, c in kept], dtype=np.int64), {w: i for i, w in enumerate(words)}
    )


def encode(sentences: list[list[str]], vocab: Vocab, width: int) -> np.ndarray:
    """``(sentences, width)`` int32 rows of word ids, out-of-vocabulary words dropped,
    padded with -1; sentences left without a word are dropped."""
    rows = []
    for s in sentences:
        ids = [vocab.index[w] for w in s if w in vocab.index]
        if ids:
            rows.append(ids)
    out = np.full((len(rows), width), -1, dtype=np.int32)
    for r, ids in enumerate(rows):
        out[r, : len(ids)] = ids
    return out


def read_wordsim(path: pathlib.Path) -> list[WordPair]:
    """The (word, word, human score) pairs of a WordSim353 ``.tsv`` (``#`` lines skipped)."""
    pairs = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        try:
            pairs.append((fields[0], fields[1], float(fields[2])))
        except (IndexError, ValueError):
            raise AppError(f"word2vec: {path}:{n}: expected WORD<TAB>WORD<TAB>SCORE") from None
    return pairs


def read_questions(path: pathlib.Path) -> list[Question]:
    """The analogy questions (a b c d: a is to b as c is to d) of ``questions-words.txt``."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        words = line.split()
        if len(words) == 4 and not line.startswith(":"):
            out.append((words[0], words[1], words[2], words[3]))
    return out


# ---------------------------------------------------------------- synthetic corpus
def synonym(group: int, k: int) -> str:
    """The ``k``-th planted synonym of ``group``."""
    return f"syn{group}x{k}"


def synthetic_corpus(
    sentences: int = SYNTHETIC_SENTENCES,
    length: int = SYNTHETIC_LENGTH,
    groups: int = SYNTHETIC_GROUPS,
    seed: int = 0,
) -> tuple[list[list[str]], list[WordPair]]:
    """(sentences, similarity pairs) with planted synonyms.

    Each sentence belongs to one group: its words are the group's context words and
    synonyms (any synonym in any slot, so synonyms share their contexts) mixed with
    frequent filler words.  The pairs score synonyms 9, a synonym and a context word
    of its own group 5, and words of two different groups 1.
    """
    if sentences < 1 or length < 2 or groups < 2:
        raise ValueError(
            f"need sentences >= 1, length >= 2, groups >= 2 (got {sentences}, {length}, {groups})"
        )
    rng = np.random.default_rng(seed)
    syn = [[synonym(g, k) for k in range(SYNTHETIC_SYNONYMS)] for g in range(groups)]
    ctx = [[f"ctx{g}x{k}" for k in range(SYNTHETIC_CONTEXT)] for g in range(groups)]
    fill = [f"filler{k}" for k in range(SYNTHETIC_FILLERS)]
    out = []
    for _ in range(sentences):
        g = int(rng.integers(groups))
        own = syn[g] + ctx[g]
        words = []
        for _ in range(length):
            if rng.random() < SYNTHETIC_FILLER_SHARE:
                words.append(fill[int(rng.integers(len(fill)))])
            else:
                words.append(own[int(rng.integers(len(own)))])
        out.append(words)
    pairs: list[WordPair] = []
    for g in range(groups):
        h = (g + 1) % groups
        for k in range(SYNTHETIC_SYNONYMS):
            for k2 in range(k + 1, SYNTHETIC_SYNONYMS):
                pairs.append((syn[g][k], syn[g][k2], 9.0))
            pairs.append((syn[g][k], ctx[g][k], 5.0))
            pairs.append((syn[g][k], syn[h][k], 1.0))
            pairs.append((syn[g][k], ctx[h][k], 1.0))
    return out, pairs


__all__ = [
    "CACHE_SUBDIR",
    "CORPORA",
    "MEMBERS",
    "Question",
    "Vocab",
    "WordPair",
    "build_vocab",
    "check_file",
    "encode",
    "gensim_test_data",
    "read_corpus",
    "read_questions",
    "read_wordsim",
    "synonym",
    "synthetic_corpus",
    "tokenize",
]
