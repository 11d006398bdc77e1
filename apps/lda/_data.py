"""Data for LDA: gensim's test corpora (one document per line), the user's text file in
the same form (``-p corpus=PATH``), or planted topics.

``lee_background.cor`` (300 news stories, ~60k tokens) and ``head500.noblanks.cor``
(250 Wikipedia articles, ~330k tokens) ship in gensim's wheel under
``gensim/test/test_data/``; they are extracted into the same cache folder word2vec
uses (gensim is never installed or imported) and checked against their SHA-256 in
gensim 4.4.0.

Vocabulary: lower-case word tokens of at least ``MIN_WORD_LEN`` characters, not all
digits, not in ``STOP_WORDS``, occurring at least ``min_count`` times and in at most ``max_df`` of the
documents (which removes the stop words without a stop-word list).

The synthetic corpus plants its topics: topic ``k`` owns the words ``t{k}w{i}``, each
document mixes a few topics (Dirichlet proportions), and every token is one topic's
word, so a sampler that works gives topics whose top words belong to one planted topic.
"""

from __future__ import annotations

import pathlib
import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from .._datasets import fetch_checked_members, read_utf8, text_lines
from .._errors import AppError

_PACKAGE, _VERSION = "gensim", "4.4.0"
_PREFIX = "gensim/test/test_data/"
#: The corpora and their SHA-256 in gensim 4.4.0 (the same files word2vec reads).
MEMBERS = {
    "lee_background.cor": "5d78d6dafd953bbf65797bef09a9ffb9ec430583381be705f8fd460000f370fb",
    "head500.noblanks.cor": "af9892fa37eef66079a8fcd5d25090104ee7e588f6121ee43817d82131f12474",
}
#: ``-p corpus=`` names and their files.
CORPORA = {"lee": "lee_background.cor", "head500": "head500.noblanks.cor"}
#: Cache subdirectory of the extracted files (shared with word2vec).
CACHE_SUBDIR = "gensim-test-data"
#: Shortest word kept: shorter tokens are mostly stop words and stemming debris.
MIN_WORD_LEN = 3
#: English function words that ``max_df`` leaves in a corpus of a few hundred documents.
STOP_WORDS = frozenset(
    """about above after again against all also among and any are around because been
    before being between both but can could did does doing down during each either even
    every few for from further had has have having her here hers herself him himself his
    how however into its itself just last least less made make many more most much must
    near neither next nor not now off once one only other our ours out over own per quite
    rather said same say says she should since some such than that the their theirs them
    then there these they this those though through thus too under until upon very was
    way were what when where whether which while who whom whose why will with within
    without would yet you your yours""".split()
)

#: Synthetic corpus: documents, tokens per document, words per planted topic.
SYNTHETIC_DOCS, SYNTHETIC_LENGTH, SYNTHETIC_WORDS = 200, 60, 25
#: Dirichlet concentration of a synthetic document's topic proportions (small: few topics
#: per document, which is what makes the planted topics recoverable).
SYNTHETIC_ALPHA = 0.2

_TOKEN = re.compile(r"\w+")


def corpus_file(corpus: str) -> pathlib.Path:
    """The file of ``-p corpus=``: for ``lee`` or ``head500`` the cached, checked gensim
    file; anything else is the path of the user's text file (``./lee`` for a file of
    that name).  A path that does not exist is a one-line :class:`AppError`."""
    if corpus in CORPORA:
        dest = fetch_checked_members(_PACKAGE, _VERSION, _PREFIX, MEMBERS, CACHE_SUBDIR, "lda")
        return dest / CORPORA[corpus]
    path = pathlib.Path(corpus)
    if not path.exists():
        raise AppError(
            f"lda: corpus must be one of {', '.join(CORPORA)} or a text file with one "
            f"document per line; {corpus!r} is neither (no such file)"
        )
    return path


def read_documents(path: pathlib.Path) -> list[list[str]]:
    """The token lists of a text file, one document per line with a word.  A missing,
    unreadable, non-UTF-8 (naming the line) or word-less file is a one-line
    :class:`AppError`."""
    return [d for _, d in read_numbered_documents(path)]


def read_numbered_documents(path: pathlib.Path) -> list[tuple[int, list[str]]]:
    """(line number from 1, tokens) of every line of a text file that has a word: an
    empty line, or one of punctuation only, is skipped (a ``#`` line is a document like
    any other).  Errors as :func:`read_documents`."""
    text = read_utf8(path, "lda: corpus", "give a plain text file, one document per line")
    docs = [(n, _TOKEN.findall(line.lower())) for n, line in enumerate(text_lines(text), 1)]
    docs = [(n, d) for n, d in docs if d]
    if not docs:
        raise AppError(f"lda: corpus {str(path)!r} has no words")
    return docs


@dataclass(frozen=True)
class Corpus:
    """Documents as arrays of word ids, and the words."""

    docs: list[np.ndarray]
    vocab: list[str]
    #: where each document came from: its line in the corpus file (from 1), or its
    #: number among the documents given (from 1)
    lines: list[int] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(len(d) for d in self.docs)

    def doc_term(self) -> np.ndarray:
        """Dense ``(documents, words)`` counts."""
        out = np.zeros((len(self.docs), len(self.vocab)), dtype=np.int64)
        for i, d in enumerate(self.docs):
            np.add.at(out[i], d, 1)
        return out


def build_corpus(
    docs: list[list[str]], min_count: int, max_df: float, lines: list[int] | None = None
) -> Corpus:
    """Keep the words described in the module docstring (ids: most frequent first, ties
    in order of first occurrence); documents left without a word are dropped.  ``lines``
    is where each of ``docs`` came from (default: its number, from 1)."""
    where = list(range(1, len(docs) + 1)) if lines is None else list(lines)
    counts = Counter(w for d in docs for w in d)
    df = Counter(w for d in docs for w in set(d))
    limit = max_df * len(docs)
    kept = [
        (w, c)
        for w, c in counts.items()
        if c >= min_count
        and df[w] <= limit
        and len(w) >= MIN_WORD_LEN
        and not w.isdigit()
        and w not in STOP_WORDS
    ]
    kept.sort(key=lambda wc: -wc[1])
    index = {w: i for i, (w, _) in enumerate(kept)}
    out = []
    kept_lines = []
    for d, line in zip(docs, where, strict=True):
        ids = np.array([index[w] for w in d if w in index], dtype=np.int64)
        if len(ids):
            out.append(ids)
            kept_lines.append(line)
    if not out or len(kept) < 2:
        raise AppError(
            f"lda: no document keeps a word with min_count={min_count} and max_df={max_df}; "
            "lower min_count or raise max_df"
        )
    return Corpus(out, [w for w, _ in kept], kept_lines)


def encode(docs: list[list[str]], vocab: list[str]) -> list[np.ndarray]:
    """Documents as arrays of ids in ``vocab``; words outside it are dropped, and so are
    documents left with fewer than two words (nothing to complete)."""
    index = {w: i for i, w in enumerate(vocab)}
    out = [np.array([index[w] for w in d if w in index], dtype=np.int64) for d in docs]
    return [d for d in out if len(d) >= 2]


def synthetic_corpus(
    topics: int,
    docs: int = SYNTHETIC_DOCS,
    length: int = SYNTHETIC_LENGTH,
    words: int = SYNTHETIC_WORDS,
    seed: int = 0,
) -> tuple[list[list[str]], dict[str, int]]:
    """(documents, planted topic of every word) with ``topics`` planted topics."""
    if topics < 2 or docs < 1 or length < 1 or words < 1:
        raise ValueError(
            f"need topics >= 2, docs, length, words >= 1 (got {topics}, {docs}, {length}, {words})"
        )
    rng = np.random.default_rng(seed)
    vocab = [[f"t{k}w{i}" for i in range(words)] for k in range(topics)]
    # within a topic, Zipf-like word frequencies (as in real text)
    within = 1.0 / np.arange(1, words + 1)
    within /= within.sum()
    out = []
    for _ in range(docs):
        theta = rng.dirichlet(np.full(topics, SYNTHETIC_ALPHA))
        ks = rng.choice(topics, size=length, p=theta)
        ws = rng.choice(words, size=length, p=within)
        out.append([vocab[k][w] for k, w in zip(ks.tolist(), ws.tolist(), strict=True)])
    planted = {w: k for k in range(topics) for w in vocab[k]}
    return out, planted


__all__ = [
    "CACHE_SUBDIR",
    "CORPORA",
    "MEMBERS",
    "STOP_WORDS",
    "Corpus",
    "build_corpus",
    "corpus_file",
    "encode",
    "read_documents",
    "read_numbered_documents",
    "synthetic_corpus",
]
