"""TransE (Bordes et al. 2013) with ``async_for``: margin ranking loss over corrupted triples.

A triple (h, r, t) should satisfy e_h + r_r ≈ e_t.  Each step takes a minibatch of training
triples, corrupts the head or the tail of each (a coin flip and the replacement entity are
drawn from ``ap.rng()``), and descends ``max(0, margin + d(h + r, t) - d(h' + r, t'))`` with
d the L1 or L2 distance; entity vectors are projected back to unit L2 norm before every
step, relation vectors once at initialisation.

**Why the loop is shaped this way.**  A body per triple would conflict with nearly every
other body: Nations has 14 entities and 55 relations, so any two triples almost always share
an entity or a relation, the conflict graph is one component and the planner can only run
the loop serially.  Two changes give the planner real parallelism, and both are visible in
the program rather than hidden in the engine:

* *Entity blocks* (as in PyTorch-BigGraph): entities are dealt into ``blocks`` blocks of
  about equal triple counts, and the training triples are cut into *buckets* by the blocks
  of their head and tail.  A round-robin tournament pairs the blocks: in each of the
  ``blocks - 1`` rounds the ``blocks / 2`` pairs are disjoint, and one ``async_for`` runs
  one body per pair (a minibatched body: all triples between the two blocks, the triples
  inside a block in the first round).  Corruptions are drawn from the two blocks of the
  body, so a body touches only its own entity rows, and the bodies of a round never
  conflict: the planner places them on different nodes.
* *Relation gradients are applied after the round*: a body reads relation vectors but does
  not write them; it writes its summed relation gradient into its own rows of ``Rgrad``.
  A body of round k sees each relation as it stands after rounds 0..k-1 of the epoch: ``R``
  plus one step per earlier round with that round's gradients (read from ``Rgrad``, summed
  in body order).  Once per epoch a second ``async_for`` (one body per relation, no
  conflicts) folds the epoch's steps into ``R`` with the same arithmetic.  Within a round a
  relation is thus updated once, with the gradient of every triple of that round evaluated
  at its value from the round's start, and an epoch has ``blocks`` synchronised rounds
  (``blocks - 1`` entity rounds and one relation update), not ``2 * (blocks - 1)``.

Every body's read and write sets are fixed by the buckets (not by the random draws), so one
reconnaissance serves every epoch and the plan never has to be redone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

import engine as ap

from .._errors import AppError
from .._params import require_finite
from ._data import DATASETS, KnowledgeGraph, graph_dir, read_graph
from ._eval import filtered_ranks, known_tensor, metrics

#: Smallest stored norm an entity vector is divided by when it is projected to unit norm.
NORM_FLOOR = 1e-12


@dataclass(frozen=True)
class Bucket:
    """The work of one body: entity rows it owns in its round, and its triples in local ids."""

    rows: np.ndarray  # global entity ids of the two blocks, sorted
    rels: np.ndarray  # global relation ids its triples use, sorted
    head: np.ndarray  # per triple: position of the head in ``rows``
    rel: np.ndarray  # per triple: position of the relation in ``rels``
    tail: np.ndarray  # per triple: position of the tail in ``rows``


def entity_blocks(train: np.ndarray, n_entities: int, blocks: int) -> np.ndarray:
    """Block (0..blocks-1) of every entity: largest-degree first onto the lightest block,
    so the blocks carry about equal numbers of triple ends (ties: lowest id, lowest block)."""
    degree = np.bincount(train[:, [0, 2]].ravel(), minlength=n_entities)
    load = np.zeros(blocks, dtype=np.int64)
    size = np.zeros(blocks, dtype=np.int64)
    out = np.empty(n_entities, dtype=np.int64)
    for e in np.argsort(-degree, kind="stable").tolist():
        b = int(np.lexsort((size, load))[0])  # lightest load, then fewest entities
        out[e] = b
        load[b] += degree[e]
        size[b] += 1
    return out


def tournament(blocks: int) -> list[list[tuple[int, int]]]:
    """Round-robin pairing of an even number of blocks: ``blocks - 1`` rounds of disjoint
    pairs in which every two blocks meet exactly once (the circle method)."""
    ring = list(range(blocks))
    rounds = []
    for _ in range(blocks - 1):
        rounds.append([(ring[i], ring[blocks - 1 - i]) for i in range(blocks // 2)])
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return rounds


def make_buckets(train: np.ndarray, block: np.ndarray, blocks: int) -> list[list[Bucket]]:
    """Per round, per pair of blocks: the bucket of training triples that body runs."""
    bh, bt = block[train[:, 0]], block[train[:, 2]]
    out = []
    for k, pairs in enumerate(tournament(blocks)):
        per_round = []
        for a, c in pairs:
            sel = ((bh == a) & (bt == c)) | ((bh == c) & (bt == a))
            if k == 0:  # every block plays in every round; its inner triples go in the first
                sel |= (bh == bt) & ((bh == a) | (bh == c))
            mine = train[sel]
            rows = np.flatnonzero((block == a) | (block == c))
            rels = np.unique(mine[:, 1])
            per_round.append(
                Bucket(
                    rows=rows,
                    rels=rels,
                    head=np.searchsorted(rows, mine[:, 0]),
                    rel=np.searchsorted(rels, mine[:, 1]),
                    tail=np.searchsorted(rows, mine[:, 2]),
                )
            )
        out.append(per_round)
    return out


def margin_step(
    E: np.ndarray,
    R: np.ndarray,
    G: np.ndarray,
    triples: tuple[np.ndarray, np.ndarray, np.ndarray],
    corrupt: tuple[np.ndarray, np.ndarray],
    lr: float,
    margin: float,
    norm: int,
) -> float:
    """One SGD step on a minibatch, in place on the local entity rows ``E``; the relation
    descent direction is added to ``G`` (``R`` is read only).  Returns the summed loss."""
    h, r, t = triples
    h2, t2 = corrupt
    xp = E[h] + R[r] - E[t]
    xn = E[h2] + R[r] - E[t2]
    if norm == 1:
        dp, dn = np.abs(xp).sum(axis=1), np.abs(xn).sum(axis=1)
        gp, gn = np.sign(xp), np.sign(xn)
    else:
        dp, dn = np.sqrt((xp * xp).sum(axis=1)), np.sqrt((xn * xn).sum(axis=1))
        gp = xp / np.maximum(dp, NORM_FLOOR)[:, None]
        gn = xn / np.maximum(dn, NORM_FLOOR)[:, None]
    loss = margin + dp - dn
    active = loss > 0
    gp = gp * active[:, None]
    gn = gn * active[:, None]
    # one scatter for the four ends (in this order), not four np.add.at calls
    np.add.at(E, np.concatenate([h, t, h2, t2]), lr * np.concatenate([-gp, gp, gn, -gn]))
    np.add.at(G, r, gn - gp)
    return float(loss[active].sum())


def run_bucket(
    bk: Bucket,
    E: np.ndarray,
    R: np.ndarray,
    rng: np.random.Generator,
    *,
    lr: float,
    margin: float,
    norm: int,
    minibatch: int,
) -> tuple[np.ndarray, float]:
    """SGD over a bucket's triples in a random order, in place on its entity rows ``E``.
    Returns the summed relation descent direction (rows of ``bk.rels``) and the loss."""
    G = np.zeros_like(R)
    n = len(bk.head)
    order = rng.permutation(n)
    total = 0.0
    for lo in range(0, n, minibatch):
        sel = order[lo : lo + minibatch]
        E /= np.maximum(np.sqrt((E * E).sum(axis=1)), NORM_FLOOR)[:, None]
        h, r, t = bk.head[sel], bk.rel[sel], bk.tail[sel]
        tail_side = rng.random(len(sel)) < 0.5
        other = rng.integers(0, len(bk.rows), size=len(sel))
        corrupt = (np.where(tail_side, h, other), np.where(tail_side, other, t))
        total += margin_step(E, R, G, (h, r, t), corrupt, lr, margin, norm)
    return G, total


def check_params(
    dataset: str, epochs: int, dim: int, lr: float, margin: float, norm: int, blocks: int, mb: int
) -> None:
    """Raise :class:`AppError` naming the first bad parameter."""
    require_finite("transe", lr=lr, margin=margin)
    if dataset not in DATASETS:
        raise AppError(f"transe: dataset must be one of {', '.join(DATASETS)}, got {dataset!r}")
    if norm not in (1, 2):
        raise AppError(f"transe: norm must be 1 (L1) or 2 (L2), got {norm}")
    if blocks < 2 or blocks % 2:
        raise AppError(f"transe: blocks must be an even number >= 2, got {blocks}")
    if epochs < 0 or dim < 1 or mb < 1 or not lr > 0 or not margin > 0:
        raise AppError(
            "transe: need epochs >= 0, dim >= 1, minibatch >= 1, lr > 0, margin > 0 "
            f"(got {epochs}, {dim}, {mb}, {lr}, {margin})"
        )


def prefetch(dataset: str = "nations", synthetic: bool = False, data: str = "", **_: Any) -> None:
    """Fetch the data set :func:`train` will read, in the calling process (``replay run``
    calls it before it starts MPI ranks, so a first download can show its progress)."""
    if not data and not synthetic and dataset in DATASETS:
        graph_dir(dataset)


def embedding_words(
    dataset: str = "nations", synthetic: bool = False, data: str = "", **_: Any
) -> tuple[str, ...]:
    """The entity names a ``.txt`` save writes (the words of ``EMBEDDING``), read from the
    data without training: ``replay run --save x.txt`` checks them before the run."""
    return read_graph(graph_dir(dataset, synthetic, data)).entities


def evaluate(E: np.ndarray, R: np.ndarray, kg: KnowledgeGraph, norm: int) -> tuple[float, float]:
    """(filtered MRR, filtered Hits@10) on the test split, head and tail sides together."""
    known = known_tensor(kg.all_triples(), kg.n_entities, kg.n_relations)
    return metrics(filtered_ranks(E, R, kg.test, known, norm))


#: What ``replay run --save`` writes and ``replay export --model`` reads back from a
#: checkpoint: saved array name -> the DDS it is (the rest of ``train``'s ``model`` entry
#: is data the trace does not hold).
MODEL_DDS = {"entities": "E", "relations": "R"}
#: What the model of ``--save`` holds besides the DDS (the data: an export cannot give it).
MODEL_DATA = ("entity_names", "relation_names")
#: (vectors, words) among the saved arrays: what ``--save x.txt`` writes in word2vec text.
EMBEDDING = ("entities", "entity_names")


def train(
    dataset: str = "nations",
    epochs: int = 100,
    dim: int = 50,
    lr: float = 0.003,
    margin: float = 1.0,
    norm: int = 1,
    blocks: int = 4,
    minibatch: int = 64,
    synthetic: bool = False,
    data: str = "",
) -> dict[str, Any]:
    """Train TransE; logs the mean margin ``loss`` per epoch, then the filtered ``mrr`` and
    ``hits10`` on the test split."""
    check_params(dataset, epochs, dim, lr, margin, norm, blocks, minibatch)
    kg = read_graph(graph_dir(dataset, synthetic, data))
    if blocks > kg.n_entities:
        raise AppError(f"transe: blocks ({blocks}) exceeds the {kg.n_entities} entities")
    nE, nR = kg.n_entities, kg.n_relations
    buckets = make_buckets(kg.train, entity_blocks(kg.train, nE, blocks), blocks)
    slots = blocks // 2

    bound = 6.0 / math.sqrt(dim)  # Bordes et al.: uniform(-6/sqrt(k), 6/sqrt(k))
    E = ap.dvector(nE, shape=(dim,), init=ap.init.uniform(-bound, bound), name="E")
    r0 = ap.rng().uniform(-bound, bound, size=(nR, dim))
    R = ap.dvector(nR, shape=(dim,), data=r0 / np.linalg.norm(r0, axis=1, keepdims=True), name="R")
    n_rounds = len(buckets)
    # row (k * slots + i) * nR + r: relation r's summed gradient from body i of round k
    Rgrad = ap.dvector(n_rounds * slots * nR, shape=(dim,), init=ap.init.zeros(), name="Rgrad")
    Loss = ap.dvector(n_rounds * slots, shape=(1,), init=ap.init.zeros(), name="Loss")

    def relation_after(r: int, rounds: int) -> np.ndarray:
        """R[r] after the first ``rounds`` rounds of this epoch: one step per round, with
        the gradients of that round's bodies summed in body order."""
        value = R[r]
        for k in range(rounds):
            row = k * slots * nR + r
            step = Rgrad[row]
            for s in range(1, slots):
                step = step + Rgrad[row + s * nR]
            value = value + lr * step
        return value

    def entity_body(k: int) -> Any:
        def body(i: int) -> None:
            bk = buckets[k][i]
            local_e = np.stack([E[e] for e in bk.rows.tolist()])
            if len(bk.rels):
                local_r = np.stack([relation_after(r, k) for r in bk.rels.tolist()])
                G, total = run_bucket(
                    bk, local_e, local_r, ap.rng(), lr=lr, margin=margin, norm=norm,
                    minibatch=minibatch,
                )  # fmt: skip
            else:
                G, total = np.zeros((0, dim)), 0.0
            for j, e in enumerate(bk.rows.tolist()):
                E[e] = local_e[j]
            full = np.zeros((nR, dim))
            full[bk.rels] = G
            base = (k * slots + i) * nR
            for r in range(nR):  # every row, zeros included: no stale gradient survives
                Rgrad[base + r] = full[r]
            Loss[k * slots + i] = total

        return body

    def relation_body(r: int) -> None:
        R[r] = relation_after(r, n_rounds)

    bodies = [entity_body(k) for k in range(n_rounds)]
    for _ in range(epochs):
        for k, body in enumerate(bodies):
            ap.async_for(0, slots, body, name=f"ent{k}")
        ap.async_for(0, nR, relation_body, name="rel")
        ap.log_objective("loss", float(Loss.gather().sum()) / len(kg.train))
    mrr, hits10 = evaluate(E.gather(), R.gather(), kg, norm)
    ap.log_objective("mrr", mrr)
    ap.log_objective("hits10", hits10)
    return {
        "entities": nE,
        "relations": nR,
        "train": len(kg.train),
        "test": len(kg.test),
        "mrr": mrr,
        "hits10": hits10,
        "model": {
            "entities": E,
            "relations": R,
            "entity_names": np.array(kg.entities, dtype=str),
            "relation_names": np.array(kg.relations, dtype=str),
        },
    }
