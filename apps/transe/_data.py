"""Knowledge graphs for TransE: Nations, Kinships and UMLS from the ``pykeen`` wheel, or a
synthetic graph with a planted translational structure.

The three graphs ship inside the ``pykeen`` wheel as tab-separated ``head relation tail``
files (``train.txt``, ``valid.txt``, ``test.txt``).  ``fetch_wheel_member`` reads only those
members out of the zip into the cache, so neither pykeen nor torch is installed and no code
from the wheel runs.  Entity and relation ids are the sorted names over all three splits, so
every rank, replay and serial run numbers them the same way.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

import numpy as np

from .._datasets import (
    _atomic_write,
    cache_dir,
    fetch_wheel_member,
    read_utf8,
    text_lines,
    writing_cache,
)
from .._errors import AppError

#: The pykeen release whose wheel holds the data sets (pinned: the files are data).
PYKEEN_VERSION = "1.11.1"
#: Data sets ``-p dataset=`` accepts.
DATASETS = ("nations", "kinships", "umls")
#: The three splits, in the order :class:`KnowledgeGraph` keeps them.
SPLITS = ("train", "valid", "test")

#: Side of the synthetic entity grid: ``GRID_SIDE ** 2`` entities.
GRID_SIDE = 8
#: Relation displacements of the synthetic graph: ``(h + d) = t`` on the grid.
SYNTHETIC_SHIFTS = ((1, 0), (0, 1), (-1, 0), (0, -1), (2, 1), (1, -2))
#: Share of the synthetic triples held out for validation and for testing (each).
SYNTHETIC_HELD_OUT = 0.1


@dataclass(frozen=True)
class KnowledgeGraph:
    """Triples as ``(n, 3)`` int64 arrays of (head, relation, tail) ids, and the names."""

    entities: tuple[str, ...]
    relations: tuple[str, ...]
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray

    @property
    def n_entities(self) -> int:
        """Number of entities."""
        return len(self.entities)

    @property
    def n_relations(self) -> int:
        """Number of relations."""
        return len(self.relations)

    def all_triples(self) -> np.ndarray:
        """Train, valid and test triples stacked (the filter of the filtered ranks)."""
        return np.concatenate([self.train, self.valid, self.test])


def dataset_dir(name: str) -> pathlib.Path:
    """The cache directory holding ``train.txt``, ``valid.txt`` and ``test.txt`` of ``name``,
    extracted from the pykeen wheel on first use."""
    if name not in DATASETS:
        raise AppError(f"transe: dataset must be one of {', '.join(DATASETS)}, got {name!r}")
    members = [f"pykeen/datasets/{name}/{split}.txt" for split in SPLITS]
    return fetch_wheel_member("pykeen", PYKEEN_VERSION, members, f"pykeen-{PYKEEN_VERSION}/{name}")


def read_split(path: pathlib.Path) -> list[tuple[str, str, str]]:
    """The ``(head, relation, tail)`` name triples of one tab-separated file.

    A missing file, a line without exactly three non-empty fields, undecodable bytes or a
    file without triples raise :class:`AppError` naming the file (and line)."""
    fix = _fix_hint(path)
    text = read_utf8(path, "transe: data", fix)
    triples = []
    for number, line in enumerate(text_lines(text), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 3 or not all(f.strip() for f in fields):
            raise AppError(
                f"transe: {str(path)!r} line {number}: expected 'head<TAB>relation<TAB>tail', "
                f"got {line[:60]!r}; {fix}"
            )
        head, rel, tail = (f.strip() for f in fields)
        triples.append((head, rel, tail))
    if not triples:
        raise AppError(f"transe: {str(path)!r} has no triples; {fix}")
    return triples


def _fix_hint(path: pathlib.Path) -> str:
    """What to do about a bad file: a cached download is fetched again once deleted."""
    try:
        pathlib.Path(path).resolve().relative_to(cache_dir().resolve())
    except ValueError:
        return "fix the file or pass another -p data=DIR"
    return "delete it and the next run fetches or generates it again"


def read_graph(directory: pathlib.Path) -> KnowledgeGraph:
    """Read ``train.txt``, ``valid.txt`` and ``test.txt`` of ``directory`` into ids."""
    named = [read_split(pathlib.Path(directory) / f"{split}.txt") for split in SPLITS]
    entities = sorted({x for part in named for h, _, t in part for x in (h, t)})
    relations = sorted({r for part in named for _, r, _ in part})
    ent_id = {e: i for i, e in enumerate(entities)}
    rel_id = {r: i for i, r in enumerate(relations)}
    arrays = [
        np.array([(ent_id[h], rel_id[r], ent_id[t]) for h, r, t in part], dtype=np.int64)
        for part in named
    ]
    return KnowledgeGraph(tuple(entities), tuple(relations), *arrays)


def synthetic_graph(directory: pathlib.Path, seed: int = 0) -> pathlib.Path:
    """Write a planted translational graph as ``train/valid/test.txt`` into ``directory``.

    Entities are the points of a ``GRID_SIDE`` x ``GRID_SIDE`` grid (named through a seeded
    permutation, so ids say nothing about positions); relation ``k`` links ``h`` to
    ``h + SYNTHETIC_SHIFTS[k]`` when that point is on the grid.  Every triple is a
    translation, so TransE can score the held-out ones far above chance."""
    rng = np.random.default_rng(seed)
    side = GRID_SIDE
    name_of = rng.permutation(side * side)
    triples = []
    for k, (dx, dy) in enumerate(SYNTHETIC_SHIFTS):
        for x in range(side):
            for y in range(side):
                u, v = x + dx, y + dy
                if 0 <= u < side and 0 <= v < side:
                    triples.append((name_of[x * side + y], k, name_of[u * side + v]))
    order = rng.permutation(len(triples))
    held = int(round(len(triples) * SYNTHETIC_HELD_OUT))
    parts = {
        "valid": order[:held],
        "test": order[held : 2 * held],
        "train": order[2 * held :],
    }
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        lines = [
            f"e{triples[i][0]}\tr{triples[i][1]}\te{triples[i][2]}" for i in sorted(parts[split])
        ]
        _atomic_write(directory / f"{split}.txt", ("\n".join(lines) + "\n").encode())
    return directory


def graph_dir(dataset: str = "nations", synthetic: bool = False, data: str = "") -> pathlib.Path:
    """The directory to train on: ``data`` if given, a synthetic graph, or a pykeen data set."""
    if data:
        return pathlib.Path(data)
    if synthetic:
        path = cache_dir() / "synthetic" / f"transe-grid{GRID_SIDE}-s0"
        if not all((path / f"{split}.txt").is_file() for split in SPLITS):
            with writing_cache():
                synthetic_graph(path)
        return path
    return dataset_dir(dataset)


__all__ = [
    "DATASETS",
    "PYKEEN_VERSION",
    "SPLITS",
    "KnowledgeGraph",
    "dataset_dir",
    "graph_dir",
    "read_graph",
    "read_split",
    "synthetic_graph",
]
