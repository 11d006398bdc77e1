"""Filtered link-prediction ranks of TransE, vectorised with numpy.

For a test triple (h, r, t) the tail side scores every entity e as a tail, d(h + r, e),
and the head side every entity as a head, d(e + r, t); smaller distance is better.  The
*filtered* rank ignores the candidates that form another known triple (in train, valid or
test), as in Bordes et al. (2013).  Ties count half (the "realistic" rank: the mean of the
optimistic and the pessimistic rank), so a model that scores everything equal gets the
expected rank of a random guess, not rank 1.
"""

from __future__ import annotations

import numpy as np

#: Test triples scored at once: bounds the (chunk, entities, dim) temporary.
EVAL_CHUNK = 128


def distances(x: np.ndarray, E: np.ndarray, norm: int) -> np.ndarray:
    """``d[i, e] = || x[i] - E[e] ||_norm`` for a batch ``x`` against every entity."""
    diff = x[:, None, :] - E[None, :, :]
    if norm == 1:
        return np.abs(diff).sum(axis=2)
    return np.sqrt((diff * diff).sum(axis=2))


def known_tensor(triples: np.ndarray, n_entities: int, n_relations: int) -> np.ndarray:
    """Boolean ``[head, relation, tail]`` tensor of the known triples (the filter)."""
    known = np.zeros((n_entities, n_relations, n_entities), dtype=bool)
    known[triples[:, 0], triples[:, 1], triples[:, 2]] = True
    return known


def filtered_ranks(
    E: np.ndarray, R: np.ndarray, test: np.ndarray, known: np.ndarray, norm: int
) -> np.ndarray:
    """Filtered realistic ranks: tail ranks of every test triple, then head ranks."""
    tails, heads = [], []
    for lo in range(0, len(test), EVAL_CHUNK):
        h, r, t = test[lo : lo + EVAL_CHUNK].T
        rows = np.arange(len(h))
        # tail side: candidates e for (h, r, ?), distance || h + r - e ||
        d = distances(E[h] + R[r], E, norm)
        tails.append(_rank(d, d[rows, t], known[h, r, :], t))
        # head side: candidates e for (?, r, t), distance || e + r - t || = || (t - r) - e ||
        d = distances(E[t] - R[r], E, norm)
        heads.append(_rank(d, d[rows, h], known[:, r, t].T, h))
    return np.concatenate(tails + heads) if tails else np.empty(0)


def _rank(d: np.ndarray, true: np.ndarray, other: np.ndarray, answer: np.ndarray) -> np.ndarray:
    """Rank of ``true`` among the candidates of each row that are not ``other`` triples."""
    mask = other.copy()
    mask[np.arange(len(answer)), answer] = True  # the answer itself is not a competitor
    better = ((d < true[:, None]) & ~mask).sum(axis=1)
    equal = ((d == true[:, None]) & ~mask).sum(axis=1)
    return 1.0 + better + equal / 2.0


def metrics(ranks: np.ndarray) -> tuple[float, float]:
    """(mean reciprocal rank, share of ranks <= 10) of filtered ranks."""
    if len(ranks) == 0:
        return float("nan"), float("nan")
    return float(np.mean(1.0 / ranks)), float(np.mean(ranks <= 10))


__all__ = ["distances", "filtered_ranks", "known_tensor", "metrics"]
