"""Word2vec: skip-gram with negative sampling, trained with ``sync_for`` over sentences.

The serial program is gensim's: for each sentence, subsample its frequent words,
form (context, centre) pairs within a reduced window, draw noise words from the
unigram^0.75 table and update the vectors after every pair.  The changes for the
engine: the sentences and the two embedding matrices are DDS, the loop over
minibatches is a ``sync_for``, and every random draw comes from ``ap.rng()`` (seeded
by run seed, operator, epoch and minibatch), so a minibatch draws the same words on
any node, thread, replay or serial run.  A body gathers the rows its minibatch
touches from the DDS once, runs the pairs one after the other on those local copies
(a numba kernel, ``_kernel``), and writes each row back once; ``sync_for`` turns the
writes into deltas.

Choices that follow from the workload:

* Deltas are *summed*, not averaged (``register_aggregation``): a word's rows are
  touched by few minibatches, and averaging over nodes would shrink the learning
  rate of every word by the number of nodes (Hogwild sums, and so does this).  So a
  clock on P nodes computes: each node runs its minibatch from the clock's starting
  rows, and every row gets the sum of the nodes' deltas.  Averaging only the rows
  several nodes touched (every frequent word's output row) was measured and wrecks
  the vectors; the README's Word2vec section has the figures.
* ``replan="always"``: the noise words (and the subsampled words) of a minibatch
  change every epoch, since ``ap.rng()`` is seeded by the invocation, so each epoch's
  reconnaissance is run up front rather than discovered by a violation.
* Noise words are drawn per pair, as gensim does; ``pool > 0`` instead shares one
  small draw per minibatch (fewer distinct rows, hence fewer DDS accesses, at the
  price of correlated negatives).
* Each minibatch's loss goes to its own row of the ``loss`` DDS (bodies may write
  only DDS), summed by the driver after the epoch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import engine as ap

from .._errors import AppError
from .._params import require_finite
from . import _data, _eval, _kernel, _model

#: The synchronisation models ``-p sync=`` accepts.
SYNC_MODELS = ("bsp", "ssp", "hybrid")


def _sum(deltas: np.ndarray) -> np.ndarray:
    return deltas.sum(axis=0)


def prefetch(corpus: str = "lee", synthetic: bool = False, data: str = "", **_: Any) -> None:
    """Fetch gensim's test data in the calling process (``replay run`` calls it before
    it starts MPI ranks, so a first download shows its progress once)."""
    if not synthetic:
        _data.gensim_test_data()


def load(
    corpus: str, synthetic: bool, data: str, sentence_len: int, min_count: int
) -> tuple[np.ndarray, _data.Vocab, list[_data.WordPair], list[_data.Question]]:
    """(encoded sentences, vocabulary, similarity pairs, analogy questions) of a run."""
    if synthetic:
        sentences, pairs = _data.synthetic_corpus()
        sentences = [
            s[i : i + sentence_len] for s in sentences for i in range(0, len(s), sentence_len)
        ]
        questions: list[_data.Question] = []
    else:
        own = _data.read_corpus(Path(data), sentence_len) if data else None
        where = _data.gensim_test_data()
        sentences = own or _data.read_corpus(where / _data.CORPORA[corpus], sentence_len)
        pairs = _data.read_wordsim(where / "wordsim353.tsv")
        questions = _data.read_questions(where / "questions-words.txt")
    vocab = _data.build_vocab(sentences, min_count)
    if len(vocab) < 2:
        raise AppError(
            f"word2vec: only {len(vocab)} word(s) occur at least min_count={min_count} times; "
            "lower min_count or give a larger corpus"
        )
    return _data.encode(sentences, vocab, sentence_len), vocab, pairs, questions


#: What ``replay run --save`` writes and ``replay export --model`` reads back from a
#: checkpoint: saved array name -> the DDS it is (the rest of ``train``'s ``model`` entry
#: is data the trace does not hold).
MODEL_DDS = {"vectors": "W_in"}
#: What the model of ``--save`` holds besides the DDS (the data: an export cannot give it).
MODEL_DATA = ("vocab",)
#: (vectors, words) among the saved arrays: what ``--save x.txt`` writes in word2vec text.
EMBEDDING = ("vectors", "vocab")


def train(
    epochs: int = 5,
    dim: int = 100,
    window: int = 5,
    negative: int = 5,
    min_count: int = 5,
    sample: float = 1e-3,
    alpha: float = 0.025,
    min_alpha: float = 0.0001,
    sentence_len: int = 100,
    minibatch: int = 32,
    pool: int = 0,
    sync: str = "hybrid",
    staleness: int = 2,
    per_clock: int = 1,
    corpus: str = "lee",
    synthetic: bool = False,
    data: str = "",
) -> dict[str, Any]:
    """Train skip-gram word vectors on ``corpus`` (``lee`` or ``head500``), the text file
    ``data`` (one sentence per line), or a generated corpus (``synthetic``); logs ``loss`` and ``wordsim`` per epoch and, on a
    real corpus, ``analogy`` (3CosAdd accuracy on the covered questions) at the end.

    ``minibatch`` sentences (of at most ``sentence_len`` words) per step; the learning
    rate falls linearly from ``alpha`` to ``min_alpha`` over all steps.  Each pair
    draws its ``negative`` noise words (gensim's way); ``pool > 0`` shares them: a
    minibatch draws ``pool`` noise words and each pair takes its ``negative`` from them.
    """
    require_finite("word2vec", sample=sample, alpha=alpha, min_alpha=min_alpha)
    if (
        epochs < 0
        or dim < 1
        or window < 1
        or negative < 1
        or min_count < 1
        or not 0 <= sample < 1
        or not 0 < min_alpha <= alpha
        or sentence_len < 2
        or minibatch < 1
        or staleness < 0
        or pool < 0
        or per_clock < 1
    ):
        raise AppError(
            "word2vec: need epochs >= 0, dim, window, negative, min_count, minibatch >= 1, "
            "0 <= sample < 1, 0 < min_alpha <= alpha, sentence_len >= 2, staleness >= 0, pool >= 0, per_clock >= 1 "
            f"(got epochs={epochs}, dim={dim}, window={window}, negative={negative}, "
            f"min_count={min_count}, sample={sample}, alpha={alpha}, min_alpha={min_alpha}, "
            f"sentence_len={sentence_len}, minibatch={minibatch}, staleness={staleness}, pool={pool}, per_clock={per_clock})"
        )
    if sync not in SYNC_MODELS:
        raise AppError(f"word2vec: sync must be bsp, ssp or hybrid, got {sync!r}")
    if corpus not in _data.CORPORA:
        raise AppError(f"word2vec: corpus must be lee or head500, got {corpus!r}")
    kernel = _kernel.kernel()  # compile before any data is read: a failure is one line
    rows, vocab, pairs, questions = load(corpus, synthetic, data, sentence_len, min_count)
    V = len(vocab)
    keep = _model.keep_probabilities(vocab.counts, sample)
    table = _model.noise_table(vocab.counts)
    index = _model.noise_index(table)  # the noise words without the table's random reads
    S = ap.dvector(len(rows), shape=(sentence_len,), dtype=np.int32, data=rows, name="sentences")
    # gensim's initialisation: small uniform input vectors, zero output vectors
    W_in = ap.dvector(
        V, shape=(dim,), dtype=np.float32, init=ap.init.uniform(-1.0 / dim, 1.0 / dim), name="W_in"
    )
    W_out = ap.dvector(V, shape=(dim,), dtype=np.float32, init=ap.init.zeros(), name="W_out")
    M = -(-len(rows) // minibatch)
    L = ap.dvector(M, shape=(2,), init=ap.init.zeros(), name="loss")
    for d in (W_in, W_out, L):
        ap.register_aggregation(d, _sum)
    total_steps = max(epochs * M, 1)

    def body_for(first: int) -> Callable[[ap.Batch], None]:
        """The loop body of the epoch whose first step is number ``first``."""

        def body(batch: ap.Batch) -> None:
            lr = alpha - (alpha - min_alpha) * (first + batch.number) / total_steps
            got = _model.minibatch_pairs(
                batch.values, keep, table, window, negative, ap.rng(), pool, index=index
            )
            if len(got.target) == 0:
                L[batch.number] = (0.0, 0.0)
                return
            # read each touched row once, run the pairs one by one on the local copies,
            # write each row back once (sync_for turns the writes into deltas)
            # (take/put: the same accesses, in the same order, as one W[k] per row)
            plan = _model.gather_plan(got)
            h = W_in.take(plan.in_rows)
            o = W_out.take(plan.out_rows)
            if ap.reconnaissance():  # the rows are known now: skip the arithmetic there
                new_in, new_out, part = h, o, 0.0
            else:
                new_in, new_out, part = _model.step(plan, h, o, lr, kernel)
            W_in.put(plan.in_rows, new_in)
            W_out.put(plan.out_rows, new_out)
            L[batch.number] = (part, float(len(got.target)))

        return body

    loss = sim = float("nan")
    for ep in range(epochs):
        body = body_for(ep * M)
        ap.sync_for(
            S,
            minibatch,
            body,
            sync=sync,
            staleness=staleness,
            per_clock=per_clock,
            replan="always",
            name="sgns",
        )
        sums = L.gather().sum(axis=0)
        loss = float(sums[0] / sums[1]) if sums[1] > 0 else float("nan")
        sim = _eval.wordsim(W_in.gather(), vocab.index, pairs).value
        ap.log_objective("loss", loss)
        ap.log_objective("wordsim", sim)
    out: dict[str, Any] = {
        "vocab": V,
        "sentences": len(rows),
        "loss": loss,
        "wordsim": sim,
        "model": {"vectors": W_in, "vocab": np.array(vocab.words, dtype=str)},
    }
    if questions and epochs > 0:
        acc = _eval.analogies(W_in.gather(), vocab.index, questions).value
        if not math.isnan(acc):
            ap.log_objective("analogy", acc)
        out["analogy"] = acc
    return out
