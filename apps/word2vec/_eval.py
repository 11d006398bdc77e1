"""Evaluating word vectors: WordSim353 Spearman correlation and 3CosAdd analogies.

Both follow gensim's ``KeyedVectors.evaluate_word_pairs`` and
``evaluate_word_analogies``: words are compared case-insensitively, and pairs or
questions with a word outside the vocabulary are left out (and counted).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Questions scored per matrix product in the analogy test: trades memory for speed.
ANALOGY_CHUNK = 512


@dataclass(frozen=True)
class Score:
    """An evaluation: ``value`` over ``covered`` of ``total`` items (pairs or questions)."""

    value: float
    covered: int
    total: int


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """``vectors`` with every row scaled to length 1 (a zero row stays zero)."""
    v = np.asarray(vectors, dtype=np.float64)
    norm = np.linalg.norm(v, axis=1, keepdims=True)
    return v / np.where(norm > 0, norm, 1.0)


def wordsim(
    vectors: np.ndarray, index: dict[str, int], pairs: Sequence[tuple[str, str, float]]
) -> Score:
    """Spearman correlation of cosine similarity with the human scores, on in-vocabulary pairs.

    ``index`` maps lower-case words to rows.  ``nan`` when fewer than 3 pairs are covered.
    """
    unit = unit_rows(vectors)
    sims, gold = [], []
    for a, b, score in pairs:
        i, j = index.get(a.lower()), index.get(b.lower())
        if i is None or j is None:
            continue
        sims.append(float(unit[i] @ unit[j]))
        gold.append(score)
    if len(sims) < 3:
        return Score(float("nan"), len(sims), len(pairs))
    from scipy.stats import spearmanr  # ~1 s to import: only when a score is asked for

    rho = float(spearmanr(sims, gold).statistic)
    return Score(rho, len(sims), len(pairs))


def analogies(
    vectors: np.ndarray, index: dict[str, int], questions: Sequence[tuple[str, str, str, str]]
) -> Score:
    """Accuracy of 3CosAdd (b - a + c, nearest by cosine, a, b and c excluded) on the
    questions whose four words are in the vocabulary.  ``nan`` when none is covered."""
    unit = unit_rows(vectors)
    rows = []
    for q in questions:
        ids = [index.get(w.lower()) for w in q]
        if all(i is not None for i in ids):
            rows.append(ids)
    if not rows:
        return Score(float("nan"), 0, len(questions))
    asked = np.asarray(rows, dtype=np.int64)
    correct = 0
    for lo in range(0, len(asked), ANALOGY_CHUNK):
        part = asked[lo : lo + ANALOGY_CHUNK]
        query = unit[part[:, 1]] - unit[part[:, 0]] + unit[part[:, 2]]
        sims = query @ unit.T
        r = np.arange(len(part))
        for k in range(3):
            sims[r, part[:, k]] = -np.inf
        correct += int((sims.argmax(axis=1) == part[:, 3]).sum())
    return Score(correct / len(asked), len(asked), len(questions))


def nearest(vectors: np.ndarray, word: int, k: int) -> np.ndarray:
    """The ``k`` rows most cosine-similar to row ``word``, best first, itself excluded."""
    unit = unit_rows(vectors)
    sims = unit @ unit[word]
    sims[word] = -np.inf
    return np.argsort(-sims, kind="stable")[:k]


__all__ = ["ANALOGY_CHUNK", "Score", "analogies", "nearest", "unit_rows", "wordsim"]
