"""LDA by collapsed Gibbs sampling in the STRADS style, with ``async_for`` over word blocks.

The words are dealt into ``blocks`` blocks of equal token counts; one iteration is one
``async_for`` over the blocks, and the body of block ``b`` resamples the topic of every
token whose word is in ``b`` (in corpus order) with a compiled sweep:

* **word-topic counts** (``word_topic``, a dvector whose rows are words) are
  partitioned: a word's row is read and written only by its block's body, so blocks
  never conflict on it and the planner runs them in parallel on every node and thread;
* **document-topic counts** (``doc_topic``, rows are documents) and the **topic totals**
  (``topic_total``) are touched by every block: they are *relaxed* DDS
  (``relaxed=True``).  A body sees their values at the start of the round plus its own
  node's (and thread's) changes; the changes of all nodes are summed at the end of the
  round.  The counts are integers, so after every round they are exact again - only
  the view a body samples with is stale, by at most one round (approximate distributed
  LDA, as STRADS and Yahoo!LDA run it);
* the token topics ``z`` are one row per block;
* random numbers come from ``ap.rng()``, so a block draws the same numbers on any node.

The body runs as a compiled kernel by default (:func:`gibbs_kernel`: one numba loop per
task group, the same accesses and the same random streams, so the same bits as the
Python body); ``kernel=false`` runs the Python body (``pdb`` steps through it).

With one node and one thread nothing is stale and the sampler is the exact serial one.
In test mode (``--checked``, dual tests) the relaxed DDS become ordinary, every block
conflicts with every other, and the run is the exact serial sampler on 1, 2 or 3 nodes.
The objective ``loglik`` is the joint log-likelihood log p(w, z) after every iteration.
"""

from __future__ import annotations

import heapq
import pathlib
from typing import Any

import numpy as np

import engine as ap

from .._errors import AppError
from .._params import require_finite
from ._data import (
    Corpus,
    build_corpus,
    corpus_file,
    encode,
    read_documents,
    read_numbered_documents,
    synthetic_corpus,
)
from ._model import completion_perplexity, estimates, loglik, perplexity, sweep, top_words

#: Words shown per topic in the result.
TOP_WORDS = 8
#: Parameters added after traces were recorded, with the value that runs as such a trace
#: ran (``replay._apps.recorded_params``): a trace without ``kernel`` ran the Python
#: body, the only one until 2026-12-07 (the kernel gives the same bits; a replay runs
#: what was recorded all the same).
ADDED_PARAMS = {"kernel": False}


def _check(**p: Any) -> None:
    require_finite("lda", **{name: p[name] for name in ("alpha", "beta", "max_df", "holdout")})
    bad = [
        f"{name}={p[name]!r} (need {need})"
        for name, ok, need in (
            ("topics", p["topics"] >= 2, ">= 2"),
            ("iterations", p["iterations"] >= 0, ">= 0"),
            ("alpha", p["alpha"] > 0.0, "> 0"),
            ("beta", p["beta"] > 0.0, "> 0"),
            ("blocks", p["blocks"] >= 1, ">= 1"),
            ("min_count", p["min_count"] >= 1, ">= 1"),
            ("max_df", 0.0 < p["max_df"] <= 1.0, "0 < max_df <= 1"),
            ("docs", p["docs"] >= 1, ">= 1"),
            ("length", p["length"] >= 1, ">= 1"),
            ("holdout", 0.0 <= p["holdout"] < 1.0, "0 <= holdout < 1"),
        )
        if not ok
    ]
    if bad:
        raise AppError("lda: bad parameter " + "; ".join(bad))
    if p["holdout"] and p["test"]:
        raise AppError("lda: give holdout or test, not both")


def word_blocks(counts: np.ndarray, blocks: int) -> np.ndarray:
    """Block of every word: most frequent first, each to the block with the fewest tokens
    so far (ties: lowest block), so blocks carry equal work."""
    heap = [(0, b) for b in range(blocks)]
    out = np.empty(len(counts), dtype=np.int64)
    for w in np.argsort(-counts, kind="stable").tolist():
        load, b = heapq.heappop(heap)
        out[w] = b
        heapq.heappush(heap, (load + int(counts[w]), b))
    return out


def flat(parts: list[np.ndarray]) -> tuple[np.ndarray, tuple[int, ...]]:
    """``parts`` as one array and the offsets of each part in it (``len(parts) + 1``)."""
    ends = np.cumsum([0] + [len(p) for p in parts]).tolist()
    return np.concatenate(parts).astype(np.int64), tuple(ends)


def planted_recovery(
    phi: np.ndarray, vocab: list[str], planted: dict[str, int], n: int = 10
) -> tuple[float, int]:
    """(mean share of a learned topic's top ``n`` words that belong to its majority planted
    topic, number of distinct planted topics that are some learned topic's majority)."""
    shares, found = [], set()
    for words in top_words(phi, vocab, n):
        ks = np.array([planted[w] for w in words])
        major = int(np.bincount(ks).argmax())
        shares.append(float(np.mean(ks == major)))
        found.add(major)
    return float(np.mean(shares)), len(found)


@ap.kernel
def gibbs_kernel(
    b: int,
    NW: Any,
    ND: Any,
    NK: Any,
    Z: Any,
    words_of: np.ndarray,
    wo: np.ndarray,
    docs_of: np.ndarray,
    do: np.ndarray,
    tw_of: np.ndarray,
    to: np.ndarray,
    td_of: np.ndarray,
    rng: Any,
    alpha: float,
    beta: float,
    vbeta: float,
) -> None:
    """The body of :func:`train` as a compiled kernel: block ``b``'s rows in, one sweep
    over its tokens, its rows out, with the same accesses in the same order and the same
    uniform draws (``rng`` is ``ap.index_rng``)."""
    ws, ds = words_of[wo[b] : wo[b + 1]], docs_of[do[b] : do[b + 1]]
    tw, td = tw_of[to[b] : to[b + 1]], td_of[to[b] : to[b + 1]]
    nw = NW.take(ws)
    nd = ND.take(ds)
    nk = NK[0]
    z = Z[b]
    u = rng.uniform(len(tw))
    sweep(tw, td, z, nw, nd, nk, u, alpha, beta, vbeta)
    NW.put(ws, nw)
    ND.put(ds, nd)
    NK[0] = nk
    Z[b] = z


def load(
    corpus: str, synthetic: bool, topics: int, docs: int, length: int, min_count: int, max_df: float
) -> tuple[Corpus, dict[str, int] | None]:
    """(the corpus, the planted topic of every word or None for real data)."""
    data, planted, _ = load_split(corpus, synthetic, topics, docs, length, min_count, max_df)
    return data, planted


def load_split(
    corpus: str,
    synthetic: bool,
    topics: int,
    docs: int,
    length: int,
    min_count: int,
    max_df: float,
    holdout: float = 0.0,
    test: str = "",
) -> tuple[Corpus, dict[str, int] | None, list[np.ndarray] | None]:
    """(the training corpus, the planted topics or None, the held-out documents as word
    ids of the training vocabulary or None): ``test``'s documents, or a share ``holdout``
    of the documents drawn from the run's seed, kept out of the vocabulary too."""
    planted = None
    if synthetic:
        texts, planted = synthetic_corpus(topics, docs, length)
        lines = list(range(1, len(texts) + 1))
    else:
        numbered = read_numbered_documents(corpus_file(corpus))
        lines = [n for n, _ in numbered]
        texts = [d for _, d in numbered]
    held: list[list[str]] | None = None
    if test:
        held = read_documents(pathlib.Path(test))
    elif holdout > 0.0:
        k = round(len(texts) * holdout)
        if k < 1 or k == len(texts):
            raise AppError(
                f"lda: holdout={holdout} of {len(texts)} documents leaves {k} to test; "
                "need at least one to test and one to train"
            )
        perm = ap.rng().permutation(len(texts))  # the driver's stream: same on every rank
        out = set(perm[:k].tolist())
        held = [d for i, d in enumerate(texts) if i in out]
        texts = [d for i, d in enumerate(texts) if i not in out]
        lines = [n for i, n in enumerate(lines) if i not in out]
    data = build_corpus(texts, min_count, max_df, lines)
    if held is None:
        return data, planted, None
    ids = encode(held, data.vocab)
    if not ids:
        raise AppError("lda: no held-out document has two words of the training vocabulary")
    return data, planted, ids


#: What ``replay run --save`` writes and ``replay export --model`` reads back from a
#: checkpoint: saved array name -> the DDS it is (the rest of ``train``'s ``model`` entry
#: is data the trace does not hold).
MODEL_DDS = {"word_topic": "word_topic", "doc_topic": "doc_topic"}
#: What the model of ``--save`` holds besides the DDS (the data: an export cannot give it):
#: ``doc_line[i]`` is the line of the corpus file (from 1) that row ``i`` of ``doc_topic``
#: came from (a synthetic corpus: the generated document's number).
MODEL_DATA = ("vocab", "doc_line")


def train(
    corpus: str = "lee",
    synthetic: bool = False,
    topics: int = 10,
    iterations: int = 50,
    alpha: float = 0.1,
    beta: float = 0.01,
    blocks: int = 12,
    min_count: int = 3,
    max_df: float = 0.5,
    docs: int = 200,
    length: int = 60,
    holdout: float = 0.0,
    test: str = "",
    kernel: bool = True,
) -> dict[str, Any]:
    """Fit LDA with ``topics`` topics by collapsed Gibbs sampling; logs ``loglik`` per
    iteration and ``perplexity`` (on the training documents) at the end.

    ``corpus`` is ``lee`` or ``head500`` (gensim's test corpora) or the path of a UTF-8
    text file with one document per line; ``synthetic=true``
    generates ``docs`` documents of ``length`` tokens from ``topics`` planted topics
    instead.  ``alpha`` and ``beta`` are the symmetric document-topic and topic-word
    priors; ``blocks`` is the number of word blocks (the loop's bodies); ``min_count``
    and ``max_df`` choose the vocabulary.  ``holdout`` (a share of the documents, drawn
    from the run's seed) or ``test`` (a file of documents) is kept out of training, and
    ``heldout_perplexity`` is logged at the end (document completion: see
    :func:`~apps.lda._model.completion_perplexity`).  Both are off by default, so a trace
    recorded before they existed replays with the same documents.  ``kernel=true`` (the
    default) runs the loop body compiled (:func:`gibbs_kernel`), ``kernel=false`` the
    Python body: the same bits either way.
    """
    _check(**locals())
    data, planted, held = load_split(
        corpus, synthetic, topics, docs, length, min_count, max_df, holdout, test
    )
    K, V, D = topics, len(data.vocab), len(data.docs)
    tok_doc = np.concatenate([np.full(len(d), i, dtype=np.int64) for i, d in enumerate(data.docs)])
    tok_word = np.concatenate(data.docs)
    block_of = word_blocks(np.bincount(tok_word, minlength=V), blocks)[tok_word]
    # per block: its words and documents (global ids), and its tokens as local row numbers
    b_words, b_docs, b_tw, b_td, b_pos = [], [], [], [], []
    for b in range(blocks):
        pos = np.flatnonzero(block_of == b)
        ws, tw = np.unique(tok_word[pos], return_inverse=True)
        ds, td = np.unique(tok_doc[pos], return_inverse=True)
        b_words.append(ws)
        b_docs.append(ds)
        b_tw.append(tw.astype(np.int64))
        b_td.append(td.astype(np.int64))
        b_pos.append(pos)
    # ... each kind as one flat array and block offsets, which is what the body reaches:
    # the closure rule fingerprints that before and after every invocation, and four
    # lists of `blocks` arrays cost ~0.45 ms there against ~0.12 ms for flat arrays
    words_of, wo = flat(b_words)
    docs_of, do = flat(b_docs)
    tw_of, to = flat(b_tw)
    td_of, _ = flat(b_td)
    width = max(1, max(len(p) for p in b_pos))
    z0 = ap.rng().integers(K, size=len(tok_word))  # the driver's stream: same on every rank
    zrows = np.full((blocks, width), -1, dtype=np.int64)
    for b, pos in enumerate(b_pos):
        zrows[b, : len(pos)] = z0[pos]
    nw0 = np.zeros((V, K), dtype=np.int64)
    np.add.at(nw0, (tok_word, z0), 1)
    nd0 = np.zeros((D, K), dtype=np.int64)
    np.add.at(nd0, (tok_doc, z0), 1)

    NW = ap.dvector(V, shape=(K,), dtype=np.int64, data=nw0, name="word_topic")
    ND = ap.dvector(D, shape=(K,), dtype=np.int64, data=nd0, relaxed=True, name="doc_topic")
    NK = ap.dvector(
        1, shape=(K,), dtype=np.int64, data=nw0.sum(axis=0)[None], relaxed=True, name="topic_total"
    )
    Z = ap.dvector(blocks, shape=(width,), dtype=np.int64, data=zrows, name="z")
    vbeta = V * beta

    def gibbs(b: int) -> None:
        # the block's rows in one take/put each: the same accesses, in the same order,
        # as one X[i] per row (reconnaissance records the same sets), at a fraction of
        # the cost (lee, 10 topics: ~12,000 row accesses per iteration)
        ws, ds = words_of[wo[b] : wo[b + 1]], docs_of[do[b] : do[b + 1]]
        tw, td = tw_of[to[b] : to[b + 1]], td_of[to[b] : to[b + 1]]
        nw = NW.take(ws)
        nd = ND.take(ds)
        nk = NK[0]
        z = Z[b]
        # uniform(), not random(): the same doubles, bit for bit (0 + 1 * x), but a body
        # whose code names ``random`` makes the closure rule read numpy's and Python's
        # global generator states around every invocation (~0.2 ms of an iteration)
        u = ap.rng().uniform(size=len(tw))
        sweep(tw, td, z, nw, nd, nk, u, alpha, beta, vbeta)
        NW.put(ws, nw)
        ND.put(ds, nd)
        NK[0] = nk
        Z[b] = z

    body: Any = gibbs
    if kernel:
        body = gibbs_kernel.bind(
            NW, ND, NK, Z, words_of, np.array(wo), docs_of, np.array(do), tw_of,
            np.array(to), td_of, ap.index_rng, alpha, beta, vbeta,
        )  # fmt: skip
    ll = loglik(nw0, nd0, alpha, beta)
    for _ in range(iterations):
        ap.async_for(0, blocks, body, name="gibbs")
        ll = loglik(NW.gather(), ND.gather(), alpha, beta)
        ap.log_objective("loglik", ll)
    nw, nd = NW.gather(), ND.gather()
    theta, phi = estimates(nw, nd, alpha, beta)
    perp = perplexity(data.doc_term(), theta, phi)
    ap.log_objective("perplexity", perp)
    extra: dict[str, Any] = {}
    if held is not None:
        extra = {
            "heldout_documents": len(held),
            "heldout_perplexity": completion_perplexity(held, phi, alpha),
        }
        ap.log_objective("heldout_perplexity", extra["heldout_perplexity"])
    out: dict[str, Any] = {
        "corpus": "synthetic" if synthetic else corpus,
        "documents": D,
        "words": V,
        "tokens": int(len(tok_word)),
        "topics": K,
        "iterations": iterations,
        "loglik": ll,
        "perplexity": perp,
        **extra,
        "top_words": [" ".join(ws) for ws in top_words(phi, data.vocab, TOP_WORDS)],
        "model": {
            "word_topic": NW,
            "doc_topic": ND,
            "vocab": np.array(data.vocab, dtype=str),
            "doc_line": np.array(data.lines, dtype=np.int64),
        },
    }
    if planted is not None:
        purity, found = planted_recovery(phi, data.vocab, planted)
        out["planted_purity"] = purity
        out["planted_found"] = found
    return out


__all__ = ["flat", "gibbs_kernel", "load", "planted_recovery", "train", "word_blocks"]
