"""The numerical core of skip-gram with negative sampling, one minibatch at a time.

Everything here is plain numpy on plain arrays, so the loop body, the tests and the
benchmark share one implementation of the arithmetic.  A minibatch is a block of
token-id rows (``-1`` pads the end of a row).  For it :func:`minibatch_pairs` draws,
from one generator, in a fixed order: which words survive frequent-word subsampling,
each surviving word's reduced window, and ``negative`` noise words per (context,
centre) pair from the unigram^0.75 distribution.  :func:`sgns_update` then takes one
SGD step on the pairs from the rows as they were at the start of the minibatch (the
gradients of a word that occurs several times add up), which is what lets the body
be vectorised instead of looping over words in Python.

The pair convention is gensim's: the *input* vector of the context word predicts the
*output* vector of the centre word (``syn0[context]`` against ``syn1neg[centre]``),
and a noise word equal to the centre word is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

#: Exponent of the noise distribution (Mikolov et al.): flattens the unigram counts.
NOISE_POWER = 0.75
#: Slots of the noise table: more slots follow count**0.75 more closely for rare words.
NOISE_TABLE = 1_000_000
#: Scores are clipped to +-this before the sigmoid, so a saturated pair adds no NaN.
MAX_SCORE = 30.0


@dataclass(frozen=True)
class Pairs:
    """The training pairs of one minibatch: ``context`` (input words), ``target``
    (centre words), ``noise`` (``(pairs, negative)`` noise words) and ``words``, the
    number of words that survived subsampling."""

    context: np.ndarray
    target: np.ndarray
    noise: np.ndarray
    words: int


def keep_probabilities(counts: np.ndarray, sample: float) -> np.ndarray:
    """Per word, the probability of keeping an occurrence (gensim's subsampling formula).

    ``sample`` is the threshold as a share of all words; ``0`` keeps everything.
    """
    counts = np.asarray(counts, dtype=np.float64)
    if sample <= 0 or counts.size == 0:
        return np.ones(len(counts))
    threshold = sample * counts.sum()
    p = (np.sqrt(counts / threshold) + 1.0) * (threshold / counts)
    return np.minimum(p, 1.0)


def noise_table(
    counts: np.ndarray, size: int = NOISE_TABLE, power: float = NOISE_POWER
) -> np.ndarray:
    """word2vec.c's unigram table: ``size`` word ids, each word filling a share of the
    slots proportional to count**power; a uniform slot is a draw from the noise."""
    w = np.asarray(counts, dtype=np.float64) ** power
    cdf = np.cumsum(w) / w.sum()
    slots = (np.arange(size) + 0.5) / size
    return np.minimum(np.searchsorted(cdf, slots, side="right"), len(cdf) - 1).astype(np.int32)


def minibatch_pairs(
    rows: np.ndarray,
    keep: np.ndarray,
    table: np.ndarray,
    window: int,
    negative: int,
    rng: np.random.Generator,
    pool: int = 0,
) -> Pairs:
    """Subsample the words of ``rows``, form skip-gram pairs and draw their noise words."""
    rows = np.asarray(rows)
    ids = rows.reshape(-1)
    sent = np.repeat(np.arange(rows.shape[0]), rows.shape[1]) if rows.ndim == 2 else None
    valid = ids >= 0
    ids, sent = ids[valid], (sent[valid] if sent is not None else np.zeros(valid.sum(), int))
    kept = rng.random(len(ids)) < keep[ids]
    ids, sent = ids[kept], sent[kept]
    n = len(ids)
    # gensim's reduced window: each centre word looks window - b words either side
    reach = window - rng.integers(0, window, size=n) if n else np.zeros(0, dtype=np.int64)
    ctx_parts, tgt_parts = [], []
    for d in range(1, window + 1):
        centre = np.flatnonzero(reach[: n - d] >= d) if n > d else np.zeros(0, dtype=np.int64)
        right = centre[sent[centre] == sent[centre + d]]
        ctx_parts.append(ids[right + d])
        tgt_parts.append(ids[right])
        centre = np.flatnonzero(reach[d:] >= d) + d if n > d else np.zeros(0, dtype=np.int64)
        left = centre[sent[centre] == sent[centre - d]]
        ctx_parts.append(ids[left - d])
        tgt_parts.append(ids[left])
    context = np.concatenate(ctx_parts) if ctx_parts else np.zeros(0, dtype=np.int64)
    target = np.concatenate(tgt_parts) if tgt_parts else np.zeros(0, dtype=np.int64)
    if pool > 0:  # shared negatives: every pair draws from one small sample of the noise
        words = table[rng.integers(0, len(table), size=pool)]
        noise = words[rng.integers(0, pool, size=(len(target), negative))]
    else:
        noise = table[rng.integers(0, len(table), size=(len(target), negative))]
    return Pairs(context.astype(np.int64), target.astype(np.int64), noise.astype(np.int64), n)


@dataclass(frozen=True)
class Gather:
    """Which embedding rows a minibatch's step reads and writes: ``in_rows`` (distinct
    context words) and ``out_rows`` (distinct centre and noise words), with each pair's
    position in them (``ctx``: ``(pairs,)``, ``out_idx``: ``(pairs, 1 + negative)``,
    column 0 the centre word); ``outs`` are the word ids behind ``out_idx``."""

    in_rows: np.ndarray
    ctx: np.ndarray
    out_rows: np.ndarray
    out_idx: np.ndarray
    outs: np.ndarray


def gather_plan(pairs: Pairs) -> Gather:
    """The rows :func:`step` needs for ``pairs``."""
    in_rows, ctx = np.unique(pairs.context, return_inverse=True)
    outs = np.concatenate([pairs.target[:, None], pairs.noise], axis=1)
    out_rows, out_idx = np.unique(outs, return_inverse=True)
    return Gather(in_rows, ctx.reshape(-1), out_rows, out_idx.reshape(outs.shape), outs)


def step(
    plan: Gather, h_rows: np.ndarray, o_rows: np.ndarray, lr: float
) -> tuple[np.ndarray, np.ndarray, float]:
    """One SGD step of skip-gram with negative sampling on gathered rows.

    ``h_rows`` are the input vectors of ``plan.in_rows``, ``o_rows`` the output vectors
    of ``plan.out_rows``.  Returns their values after the step and the summed negative
    log-likelihood of the pairs before it.
    """
    return _step(h_rows, o_rows, plan.ctx, plan.out_idx, plan.outs, lr)


def sgns_update(
    pairs: Pairs, w_in: np.ndarray, w_out: np.ndarray, lr: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """:func:`step` on whole matrices: ``(in_rows, new_in, out_rows, new_out, loss)``."""
    plan = gather_plan(pairs)
    new_in, new_out, loss = step(plan, w_in[plan.in_rows], w_out[plan.out_rows], lr)
    return plan.in_rows, new_in, plan.out_rows, new_out, loss


def _step(
    h_rows: np.ndarray,
    o_rows: np.ndarray,
    ctx: np.ndarray,
    out_idx: np.ndarray,
    outs: np.ndarray,
    lr: float,
) -> tuple[np.ndarray, np.ndarray, float]:
    """The step on gathered rows: ``ctx`` indexes ``h_rows``, ``out_idx`` ``o_rows``."""
    dtype = h_rows.dtype
    P, K1 = out_idx.shape
    h = h_rows[ctx]  # (P, d)
    o = o_rows[out_idx]  # (P, 1+K, d)
    score = np.clip(np.matmul(o, h[:, :, None])[:, :, 0], -MAX_SCORE, MAX_SCORE)
    # a noise word equal to the centre word is skipped, as in word2vec.c and gensim
    live = np.ones((P, K1), dtype=bool)
    live[:, 1:] = outs[:, 1:] != outs[:, :1]
    signed = score.copy()
    signed[:, 1:] *= -1.0
    loss = float(np.logaddexp(0.0, -signed)[live].sum())
    # label - sigmoid(score): 1 - s(x) = s(-x) for the centre word, -s(x) for noise
    g = 1.0 / (1.0 + np.exp(signed))
    g[:, 1:] *= -1.0
    g *= live
    g *= lr
    g = g.astype(dtype, copy=False)
    grad_h = np.matmul(g[:, None, :], o)[:, 0, :]  # (P, d)
    cols = np.repeat(np.arange(P), K1)
    to_out = sp.csr_matrix((g.reshape(-1), (out_idx.reshape(-1), cols)), shape=(len(o_rows), P))
    to_in = sp.csr_matrix((np.ones(P, dtype=dtype), (ctx, np.arange(P))), shape=(len(h_rows), P))
    new_out = o_rows + np.asarray(to_out @ h)
    new_in = h_rows + np.asarray(to_in @ grad_h)
    return new_in.astype(dtype, copy=False), new_out.astype(dtype, copy=False), loss


__all__ = [
    "Gather",
    "gather_plan",
    "step",
    "MAX_SCORE",
    "NOISE_POWER",
    "Pairs",
    "keep_probabilities",
    "minibatch_pairs",
    "NOISE_TABLE",
    "noise_table",
    "sgns_update",
]
