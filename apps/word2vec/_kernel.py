"""The compiled inner loop: gensim's per-pair skip-gram SGD over gathered rows (numba).

:func:`sgns_pairs` is ``fast_sentence_sg_neg`` of gensim's ``word2vec_inner.pyx``, run
for every (context, centre) pair of a minibatch in order, on local copies of the rows
the minibatch touches (``h``: input vectors, ``o``: output vectors, both float32,
updated in place).  For each pair: the centre word (label 1) and then each noise word
(label 0; one equal to the centre word is skipped) in turn scores ``f = h[c] . o[t]``;
``g = (label - sigmoid(f)) * lr`` goes into a work vector ``work += g * o[t]`` and at
once into the output row ``o[t] += g * h[c]``; a score at or beyond +-:data:`MAX_EXP`
is skipped, as gensim does.  After the pair, ``h[c] += work``.  So a later pair sees
every earlier pair's update, as in gensim, instead of one step from the minibatch's
starting rows.

The arithmetic is pinned so that :func:`apps.word2vec._model.reference_step`, written
with numpy, gives the same bits: the dot product sums float32 products into
:data:`LANES` partial sums (element i into sum i % LANES, each left to right) and adds
those in order, every multiply and add rounds to float32 separately (numba leaves fused multiply-add
off unless ``fastmath`` asks for it), and the sigmoid and the loss are float64
(``math.exp``/``math.log1p`` are the C library's in both).  The returned loss is the
float64 sum, over every non-skipped (pair, output) of the minibatch, of the negative
log-likelihood before that output's update.

The kernel is compiled on first use (:func:`kernel`), cached on disk by numba; a
failure to compile is an :class:`~apps._errors.AppError` (one line, exit 2).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .._errors import AppError

#: gensim's MAX_EXP: a pair whose score is at or beyond +-this is not updated (its
#: sigmoid is saturated; gensim's table ends there).
MAX_EXP = 6.0

#: Partial sums of a dot product: element i goes to sum i % LANES, and the sums are added
#: in order at the end (a fixed order, so the result does not depend on the machine);
#: more lanes let the CPU's vector units work, one lane would be a strict left-to-right sum.
LANES = 8

Kernel = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, float], float]


def sgns_pairs(
    h: np.ndarray,
    o: np.ndarray,
    ctx: np.ndarray,
    out_idx: np.ndarray,
    outs: np.ndarray,
    lr: float,
) -> float:
    """Sequential SGD over the pairs, in place on ``h`` (rows ``ctx`` index) and ``o``
    (rows ``out_idx`` index; column 0 the centre word, then the noise words, whose word
    ids are ``outs``).  Returns the summed negative log-likelihood (see the module)."""
    P, K1 = out_idx.shape
    dim = h.shape[1]
    work = np.zeros(dim, dtype=np.float32)
    acc = np.zeros(LANES, dtype=np.float32)
    full = dim - dim % LANES
    loss = 0.0
    for p in range(P):
        c = ctx[p]
        for i in range(dim):
            work[i] = np.float32(0.0)
        for d in range(K1):
            if d > 0 and outs[p, d] == outs[p, 0]:
                continue
            t = out_idx[p, d]
            for j in range(LANES):
                acc[j] = np.float32(0.0)
            for i0 in range(0, full, LANES):
                for j in range(LANES):
                    acc[j] = acc[j] + h[c, i0 + j] * o[t, i0 + j]
            for i in range(full, dim):
                acc[i - full] = acc[i - full] + h[c, i] * o[t, i]
            f = acc[0]
            for j in range(1, LANES):
                f = f + acc[j]
            x = np.float64(f)  # float() would stay float32 in numba
            label = 1.0 if d == 0 else 0.0
            z = -x if d == 0 else x  # loss: log(1 + exp(z)), without overflow
            loss += max(z, 0.0) + math.log1p(math.exp(-abs(z)))
            if x <= -MAX_EXP or x >= MAX_EXP:
                continue
            g = np.float32((label - 1.0 / (1.0 + math.exp(-x))) * lr)
            for i in range(dim):
                work[i] = work[i] + g * o[t, i]
            for i in range(dim):
                o[t, i] = o[t, i] + g * h[c, i]
        for i in range(dim):
            h[c, i] = h[c, i] + work[i]
    return loss


def skipgram_pairs(
    ids: np.ndarray, sent: np.ndarray, reach: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The (context, centre) word pairs of the surviving words ``ids`` (sentence numbers
    ``sent``, reduced windows ``reach``): centre word by centre word, and for each its
    context words from left to right, within its reach and its sentence."""
    n = ids.shape[0]
    most = 0  # a centre word has at most 2 * reach context words
    for c in range(n):
        most += 2 * reach[c]
    context = np.empty(most, dtype=np.int64)
    target = np.empty(most, dtype=np.int64)
    k = 0
    for c in range(n):
        lo, hi = max(c - reach[c], 0), min(c + reach[c], n - 1)
        for p in range(lo, hi + 1):
            if p != c and sent[p] == sent[c]:
                context[k] = ids[p]
                target[k] = ids[c]
                k += 1
    return context[:k], target[:k]


def distinct_ids(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(flat, return_inverse=True)`` for non-negative ids: the distinct ids in
    increasing order and each id's position among them."""
    rows_of = np.zeros(flat.max() + 1 if flat.size else 0, dtype=np.int64)
    for x in flat:
        rows_of[x] = 1
    count = 0
    for x in range(rows_of.size):
        if rows_of[x]:
            rows_of[x] = count
            count += 1
        else:
            rows_of[x] = -1
    rows = np.empty(count, dtype=np.int64)
    for x in range(rows_of.size):
        if rows_of[x] >= 0:
            rows[rows_of[x]] = x
    where = np.empty(flat.size, dtype=np.int64)
    for i in range(flat.size):
        where[i] = rows_of[flat[i]]
    return rows, where


def noise_words(draws: np.ndarray, first: np.ndarray, starts: np.ndarray, shift: int) -> np.ndarray:
    """``table[draws]`` of a noise table (word ids in non-decreasing order over its slots)
    without reading the table: ``starts[w]`` is the first slot holding a word >= w, and
    ``first[b]`` the word in slot ``b << shift``.  A slot's word is the largest ``w``
    with ``starts[w] <= slot``, found from its bucket's first word; both arrays stay in
    the cache where the table's million slots did not (random reads were most of the
    pair drawing)."""
    out = np.empty(draws.shape, dtype=np.int64)
    flat, res = draws.reshape(-1), out.reshape(-1)
    last = starts.size - 1
    for i in range(flat.size):
        slot = flat[i]
        w = first[slot >> shift]
        while w < last and starts[w + 1] <= slot:
            w += 1
        res[i] = w
    return out


_compiled: list[Kernel] = []
#: :func:`skipgram_pairs`, :func:`distinct_ids` and :func:`noise_words`, compiled with
#: :func:`kernel`.
_helpers: list[Any] = []


def helpers() -> tuple[Any, Any, Any]:
    """The compiled :func:`skipgram_pairs`, :func:`distinct_ids` and :func:`noise_words`
    (see :func:`kernel`)."""
    kernel()
    return _helpers[0], _helpers[1], _helpers[2]


def kernel() -> Kernel:
    """:func:`sgns_pairs` compiled by numba (once per process; an :class:`AppError` if
    numba is missing or cannot compile it)."""
    if _compiled:
        return _compiled[0]
    try:
        import numba

        jitted: Any = numba.njit(cache=True, nogil=True)(sgns_pairs)
        f32, i64 = numba.float32, numba.int64
        jitted.compile(
            (f32[:, ::1], f32[:, ::1], i64[::1], i64[:, ::1], i64[:, ::1], numba.float64)
        )
        pairs: Any = numba.njit(cache=True, nogil=True)(skipgram_pairs)
        pairs.compile((i64[::1], i64[::1], i64[::1]))  # what minibatch_pairs passes
        ids: Any = numba.njit(cache=True, nogil=True)(distinct_ids)
        ids.compile((i64[::1],))
        noise: Any = numba.njit(cache=True, nogil=True)(noise_words)
        noise.compile((i64[:, ::1], numba.int32[::1], numba.int32[::1], i64))
    except Exception as exc:  # ImportError, numba's TypingError/LoweringError, ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise AppError(
            f"word2vec: cannot compile the training kernel with numba "
            f"({type(exc).__name__}: {first}); check that numba matches numpy "
            "(pip install -U numba)"
        ) from None
    _helpers[:] = [pairs, ids, noise]
    _compiled.append(jitted)
    return jitted


__all__ = [
    "LANES",
    "MAX_EXP",
    "Kernel",
    "distinct_ids",
    "helpers",
    "kernel",
    "noise_words",
    "sgns_pairs",
    "skipgram_pairs",
]
