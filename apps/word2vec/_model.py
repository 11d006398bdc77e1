"""The numerical core of skip-gram with negative sampling, one minibatch at a time.

The loop body, the tests and the benchmark share this one implementation.  A
minibatch is a block of token-id rows (``-1`` pads the end of a row).  For it
:func:`minibatch_pairs` draws, from one generator, in a fixed order: which words
survive frequent-word subsampling, each surviving word's reduced window, and
``negative`` noise words per (context, centre) pair from the unigram^0.75
distribution, and lists the pairs in gensim's order.  :func:`gather_plan` names the
distinct rows the pairs touch; :func:`step` runs gensim's per-pair SGD over local
copies of those rows (the compiled kernel of ``_kernel``; :func:`reference_step` is
the same arithmetic in numpy, for tests), so the body reads and writes each row once.

The pair convention is gensim's: the *input* vector of the context word predicts the
*output* vector of the centre word (``syn0[context]`` against ``syn1neg[centre]``),
and a noise word equal to the centre word is skipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import _kernel

#: Exponent of the noise distribution (Mikolov et al.): flattens the unigram counts.
NOISE_POWER = 0.75
#: Slots of the noise table: more slots follow count**0.75 more closely for rare words.
NOISE_TABLE = 1_000_000


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


#: Slots per bucket of a :class:`NoiseIndex` (as a shift): with 16 slots a lookup steps
#: past another word's start about once in 16 (head500: 0.06 steps a lookup), and the
#: buckets' first words (int32) take a quarter of the table's bytes; 256 slots took
#: four times as long (a step in one lookup of two, each a mispredicted branch).
NOISE_BUCKET_SHIFT = 4


@dataclass(frozen=True)
class NoiseIndex:
    """What :func:`~apps.word2vec._kernel.noise_words` reads instead of a noise table:
    ``first[b]``, the word in slot ``b << shift``, and ``starts[w]``, the first slot
    holding a word >= ``w`` (see :func:`noise_index`)."""

    first: np.ndarray
    starts: np.ndarray
    shift: int


def noise_index(table: np.ndarray, shift: int = NOISE_BUCKET_SHIFT) -> NoiseIndex | None:
    """The :class:`NoiseIndex` of ``table``, or None when the table's words are not in
    non-decreasing order over its slots (not a :func:`noise_table`): the index gives
    ``table[slot]`` only for such a table, so any other is read slot by slot."""
    t = np.asarray(table)
    if t.ndim != 1 or t.size == 0 or t[0] < 0 or np.any(t[1:] < t[:-1]):
        return None
    starts = np.searchsorted(t, np.arange(int(t[-1]) + 1), side="left").astype(np.int32)
    first = np.ascontiguousarray(t[:: 1 << shift], dtype=np.int32)
    return NoiseIndex(first, starts, shift)


def minibatch_pairs(
    rows: np.ndarray,
    keep: np.ndarray,
    table: np.ndarray,
    window: int,
    negative: int,
    rng: np.random.Generator,
    pool: int = 0,
    *,
    compiled: bool = True,
    index: NoiseIndex | None = None,
) -> Pairs:
    """Subsample the words of ``rows``, form skip-gram pairs and draw their noise words.

    The pairs come in gensim's order: centre word by centre word, and for each its
    context words from left to right.  Draws, in this order: one uniform per word
    (subsampling), one reduced window per surviving word, then the noise words.
    ``compiled`` forms the pairs with :func:`~apps.word2vec._kernel.skipgram_pairs`
    (numba), else with numpy, and with ``index`` (``table``'s :func:`noise_index`) looks
    the noise words up in it instead of the table: the same pairs and words either way
    (tests compare them).
    """
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
    if compiled:
        pairs_of = _kernel.helpers()[0]
        context, target = pairs_of(
            np.ascontiguousarray(ids, dtype=np.int64),
            np.ascontiguousarray(sent, dtype=np.int64),
            np.ascontiguousarray(reach, dtype=np.int64),
        )
    else:
        context, target = _window_pairs(ids, sent, reach, window)
    if pool > 0:  # shared negatives: every pair draws from one small sample of the noise
        words = table[rng.integers(0, len(table), size=pool)]
        noise = words[rng.integers(0, pool, size=(len(target), negative))]
    else:
        slots = rng.integers(0, len(table), size=(len(target), negative))
        if compiled and index is not None:
            noise = _kernel.helpers()[2](slots, index.first, index.starts, index.shift)
        else:
            noise = table[slots]
    return Pairs(context, target, noise.astype(np.int64, copy=False), n)


def _window_pairs(
    ids: np.ndarray, sent: np.ndarray, reach: np.ndarray, window: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`~apps.word2vec._kernel.skipgram_pairs` with numpy: (context, centre)."""
    n = len(ids)
    offsets = np.concatenate([np.arange(-window, 0), np.arange(1, window + 1)])
    pos = np.arange(n)[:, None] + offsets[None, :]  # (n, 2 * window), left to right
    inside = (pos >= 0) & (pos < n) & (np.abs(offsets)[None, :] <= reach[:, None])
    safe = np.clip(pos, 0, max(n - 1, 0))
    inside &= sent[safe] == sent[:, None]
    centre, col = np.nonzero(inside)  # row-major: centre by centre, context left to right
    return ids[pos[centre, col]].astype(np.int64), ids[centre].astype(np.int64)


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


def distinct(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(ids, return_inverse=True)`` for word ids (non-negative integers),
    the same arrays, by marking the ids in a table as long as the largest id instead
    of sorting: a minibatch's ids are many repeats from a small vocabulary, where the
    sort took a sixth of an epoch."""
    flat = np.asarray(ids).reshape(-1)
    if len(flat) == 0 or flat.min() < 0:
        return np.unique(flat, return_inverse=True)
    mark = np.zeros(int(flat.max()) + 1, dtype=bool)
    mark[flat] = True
    rows = np.flatnonzero(mark).astype(flat.dtype, copy=False)
    where = np.empty(len(mark), dtype=np.intp)
    where[rows] = np.arange(len(rows), dtype=np.intp)
    return rows, where[flat]


def gather_plan(pairs: Pairs, *, compiled: bool = True) -> Gather:
    """The rows :func:`step` needs for ``pairs`` (``compiled``: the distinct ids found by
    :func:`~apps.word2vec._kernel.distinct_ids`, else by :func:`distinct`; the same)."""
    outs = np.concatenate([pairs.target[:, None], pairs.noise], axis=1).astype(np.int64)
    find = distinct
    if compiled and not (pairs.context.size and pairs.context.min() < 0 or outs.min(initial=0) < 0):
        find = _kernel.helpers()[1]
    in_rows, ctx = find(np.ascontiguousarray(pairs.context, dtype=np.int64).reshape(-1))
    out_rows, out_idx = find(outs.reshape(-1))
    return Gather(
        in_rows,
        np.ascontiguousarray(ctx.reshape(-1), dtype=np.int64),
        out_rows,
        np.ascontiguousarray(out_idx.reshape(outs.shape), dtype=np.int64),
        outs,
    )


def step(
    plan: Gather,
    h_rows: np.ndarray,
    o_rows: np.ndarray,
    lr: float,
    kernel: _kernel.Kernel | None = None,
) -> tuple[np.ndarray, np.ndarray, float]:
    """gensim's sequential SGD over the pairs of ``plan`` on gathered rows.

    ``h_rows`` are the float32 input vectors of ``plan.in_rows``, ``o_rows`` the output
    vectors of ``plan.out_rows`` (neither is changed).  Returns their values after the
    pairs and the summed negative log-likelihood.  ``kernel`` defaults to the compiled
    :func:`~apps.word2vec._kernel.sgns_pairs`; :func:`reference_step` gives the same bits.
    """
    h = np.array(h_rows, dtype=np.float32, order="C")
    o = np.array(o_rows, dtype=np.float32, order="C")
    run = _kernel.kernel() if kernel is None else kernel
    loss = run(h, o, plan.ctx, plan.out_idx, plan.outs, float(lr))
    return h, o, float(loss)


def reference_step(
    plan: Gather, h_rows: np.ndarray, o_rows: np.ndarray, lr: float
) -> tuple[np.ndarray, np.ndarray, float]:
    """:func:`step` written with numpy rows, for tests: the same float32 operations in
    the same order (the dot product as the kernel's float32 lane sums, the saxpys as
    float32 row operations), so it matches the compiled kernel bit for bit."""
    h = np.array(h_rows, dtype=np.float32)
    o = np.array(o_rows, dtype=np.float32)
    loss = 0.0
    for p in range(len(plan.ctx)):
        c = plan.ctx[p]
        work = np.zeros(h.shape[1], dtype=np.float32)
        for d in range(plan.out_idx.shape[1]):
            if d > 0 and plan.outs[p, d] == plan.outs[p, 0]:
                continue
            t = plan.out_idx[p, d]
            x = float(_dot(h[c], o[t]))
            z = -x if d == 0 else x
            loss += max(z, 0.0) + math.log1p(math.exp(-abs(z)))
            if abs(x) >= _kernel.MAX_EXP:
                continue
            label = 1.0 if d == 0 else 0.0
            g = np.float32((label - 1.0 / (1.0 + math.exp(-x))) * lr)
            work += g * o[t]
            o[t] += g * h[c]
        h[c] += work
    return h, o, loss


def _dot(a: np.ndarray, b: np.ndarray) -> np.float32:
    """The kernel's float32 dot product: lane j sums the products j, j + LANES, ... left
    to right (a running float32 sum), then the lanes are added in order."""
    prod = a * b
    lanes = [
        np.cumsum(prod[j :: _kernel.LANES], dtype=np.float32)[-1]
        for j in range(min(_kernel.LANES, len(prod)))
    ]
    f = lanes[0]
    for part in lanes[1:]:
        f = np.float32(f + part)
    return np.float32(f)


def sgns_update(
    pairs: Pairs, w_in: np.ndarray, w_out: np.ndarray, lr: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """:func:`step` on whole matrices: ``(in_rows, new_in, out_rows, new_out, loss)``."""
    plan = gather_plan(pairs)
    new_in, new_out, loss = step(plan, w_in[plan.in_rows], w_out[plan.out_rows], lr)
    return plan.in_rows, new_in, plan.out_rows, new_out, loss


__all__ = [
    "Gather",
    "distinct",
    "gather_plan",
    "reference_step",
    "step",
    "NOISE_BUCKET_SHIFT",
    "NOISE_POWER",
    "NoiseIndex",
    "noise_index",
    "Pairs",
    "keep_probabilities",
    "minibatch_pairs",
    "NOISE_TABLE",
    "noise_table",
    "sgns_update",
]
