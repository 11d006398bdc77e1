"""TransE: data extraction, the synthetic graph, filtered ranks against a brute-force
reference, the bucket schedule, learning on planted data, and the CLI on 2 MPI ranks."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import zipfile

import numpy as np
import pytest

import engine as ap
from apps import _datasets
from apps._datasets import DatasetUnavailableError, cache_dir
from apps._errors import AppError
from apps.transe import filtered_ranks, train
from apps.transe._app import (
    entity_blocks,
    evaluate,
    make_buckets,
    margin_step,
    tournament,
)
from apps.transe._data import (
    GRID_SIDE,
    PYKEEN_VERSION,
    SYNTHETIC_SHIFTS,
    dataset_dir,
    read_graph,
    read_split,
    synthetic_graph,
)
from apps.transe._eval import known_tensor, metrics
from tests.conftest import MPI_TIMEOUT

#: Parameters under which the planted grid is learnt in about a second.
FAST = {"synthetic": True, "epochs": 120, "dim": 16, "lr": 0.02}


# --- data: the pykeen wheel -------------------------------------------------------------------


def fake_pykeen_wheel(tmp_path: pathlib.Path, name: str, train_text: str) -> pathlib.Path:
    """A wheel laid out like pykeen's, whose code would fail loudly if anything ran it."""
    wheel = tmp_path / f"pykeen-{PYKEEN_VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pykeen/__init__.py", "raise SystemExit('wheel code was executed')\n")
        zf.writestr(f"pykeen/datasets/{name}/train.txt", train_text)
        zf.writestr(f"pykeen/datasets/{name}/valid.txt", "a\tr2\tc\n")
        zf.writestr(f"pykeen/datasets/{name}/test.txt", "c\tr1\ta\n")
    return wheel


def serve_wheel(monkeypatch: pytest.MonkeyPatch, wheel: pathlib.Path | None) -> list[list[str]]:
    """Make ``pip download`` copy ``wheel`` (or fail like an offline pip when None)."""
    calls: list[list[str]] = []

    def fake_run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append(list(cmd))
        if wheel is None:
            return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution\n")
        shutil.copy(wheel, pathlib.Path(cmd[cmd.index("--dest") + 1]) / wheel.name)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(_datasets.subprocess, "run", fake_run)
    return calls


def test_extraction_takes_the_three_splits_out_of_the_wheel(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = fake_pykeen_wheel(tmp_path, "umls", "a\tr1\tb\nb\tr1\tc\n")
    calls = serve_wheel(monkeypatch, wheel)
    where = dataset_dir("umls")
    assert where.is_relative_to(cache_dir())
    assert sorted(p.name for p in where.iterdir()) == ["test.txt", "train.txt", "valid.txt"]
    assert calls[0][-1] == f"pykeen=={PYKEEN_VERSION}" and "--no-deps" in calls[0]
    kg = read_graph(where)
    assert kg.entities == ("a", "b", "c") and kg.relations == ("r1", "r2")
    assert kg.train.tolist() == [[0, 0, 1], [1, 0, 2]]
    assert kg.valid.tolist() == [[0, 1, 2]] and kg.test.tolist() == [[2, 0, 0]]
    dataset_dir("umls")
    assert len(calls) == 1  # the second call is served from the cache


def test_a_failed_download_is_one_line_naming_pykeen(monkeypatch: pytest.MonkeyPatch) -> None:
    serve_wheel(monkeypatch, None)
    with pytest.raises(DatasetUnavailableError) as info:
        dataset_dir("kinships")
    message = str(info.value)
    assert "\n" not in message and f"pykeen=={PYKEEN_VERSION}" in message
    assert "synthetic=true" in message


def test_an_unknown_dataset_is_refused_before_any_download(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = serve_wheel(monkeypatch, None)
    with pytest.raises(AppError, match="nations, kinships, umls"):
        dataset_dir("fb15k")
    assert calls == []


@pytest.mark.parametrize(
    "payload,what",
    [
        (b"a\tr\n", "line 1: expected 'head<TAB>relation<TAB>tail'"),
        (b"a\tr\tb\n\tr\tb\n", "line 2"),
        (b"\xff\xfe\x00garbage", "is not UTF-8 text"),
        (b"\n\n", "has no triples"),
    ],
)
def test_corrupt_split_files_name_the_file_and_line(
    tmp_path: pathlib.Path, payload: bytes, what: str
) -> None:
    path = tmp_path / "train.txt"
    path.write_bytes(payload)
    with pytest.raises(AppError) as info:
        read_split(path)
    assert what in str(info.value) and str(path) in str(info.value)
    assert "fix the file" in str(info.value)


@pytest.mark.network
@pytest.mark.skipif(
    os.environ.get("STRADS_REPLAY_NETWORK_TESTS") != "1",
    reason="set STRADS_REPLAY_NETWORK_TESTS=1 to download from PyPI",
)
def test_real_nations_from_the_pykeen_wheel() -> None:
    try:
        kg = read_graph(dataset_dir("nations"))
    except DatasetUnavailableError as exc:
        pytest.skip(f"pykeen wheel unavailable: {exc}")
    assert (kg.n_entities, kg.n_relations) == (14, 55)
    assert (len(kg.train), len(kg.valid), len(kg.test)) == (1592, 199, 201)


def test_cli_corrupt_cached_dataset_is_one_line_exit_2(tmp_path: pathlib.Path, cli) -> None:
    where = tmp_path / "datasets" / f"pykeen-{PYKEEN_VERSION}" / "nations"
    where.mkdir(parents=True)
    for split in ("train", "valid", "test"):
        (where / f"{split}.txt").write_text("usa\tembassy\n")  # truncated: two fields
    proc = cli(
        "run", "transe", "-p", "epochs=1", "--no-trace", env={"STRADS_REPLAY_CACHE": str(tmp_path)}
    )
    assert proc.returncode == 2, proc.stderr
    [line] = [ln for ln in proc.stderr.splitlines() if ln.startswith("replay: error")]
    assert "train.txt' line 1" in line and "delete it" in line
    assert "Traceback" not in proc.stderr


def test_cli_missing_split_file_is_one_line_exit_2(tmp_path: pathlib.Path, cli) -> None:
    synthetic_graph(tmp_path)
    (tmp_path / "test.txt").unlink()
    proc = cli("run", "transe", "-p", f"data={tmp_path}", "--no-trace")
    assert proc.returncode == 2
    assert "test.txt' does not exist" in proc.stderr and "Traceback" not in proc.stderr


# --- the synthetic graph ----------------------------------------------------------------------


def test_synthetic_graph_is_a_planted_translation_split_three_ways(
    tmp_path: pathlib.Path,
) -> None:
    kg = read_graph(synthetic_graph(tmp_path / "a", seed=3))
    side = GRID_SIDE
    expected = sum(
        (side - abs(dx)) * (side - abs(dy)) for dx, dy in SYNTHETIC_SHIFTS
    )  # grid points whose shifted point stays on the grid
    allt = kg.all_triples()
    assert len(allt) == expected == len({tuple(t) for t in allt.tolist()})
    assert kg.n_entities == side * side and kg.n_relations == len(SYNTHETIC_SHIFTS)
    assert 0 < len(kg.test) == len(kg.valid) < len(kg.train)
    # a translation: the same relation never maps one head to two tails
    pairs = {(h, r) for h, r, _ in allt.tolist()}
    assert len(pairs) == len(allt)
    again = read_graph(synthetic_graph(tmp_path / "b", seed=3))
    assert np.array_equal(again.train, kg.train) and np.array_equal(again.test, kg.test)
    other = read_graph(synthetic_graph(tmp_path / "c", seed=4))
    assert not np.array_equal(other.test, kg.test)


# --- filtered ranks ---------------------------------------------------------------------------


def brute_force_ranks(E, R, test, known, norm) -> list[float]:
    """Filtered realistic ranks by explicit loops: tails of every triple, then heads."""

    def dist(x):
        return float(np.sum(np.abs(x))) if norm == 1 else float(np.sqrt(np.sum(x * x)))

    tails, heads = [], []
    for h, r, t in test.tolist():
        true = dist(E[h] + R[r] - E[t])
        others = [dist(E[h] + R[r] - E[e]) for e in range(len(E)) if e != t and not known[h][r][e]]
        tails.append(1 + sum(d < true for d in others) + sum(d == true for d in others) / 2)
        true = dist(E[h] + R[r] - E[t])
        others = [dist(E[e] + R[r] - E[t]) for e in range(len(E)) if e != h and not known[e][r][t]]
        heads.append(1 + sum(d < true for d in others) + sum(d == true for d in others) / 2)
    return tails + heads


@pytest.mark.parametrize("norm", [1, 2])
def test_filtered_ranks_equal_a_brute_force_reference(norm: int) -> None:
    rng = np.random.default_rng(7)
    E = rng.integers(-2, 3, (9, 3)).astype(float)  # small integers: ties happen
    R = rng.integers(-1, 2, (3, 3)).astype(float)
    triples = np.unique(rng.integers(0, [9, 3, 9], (40, 3)), axis=0)
    test = triples[::3]
    known = known_tensor(triples, 9, 3)
    got = filtered_ranks(E, R, test, known, norm)
    want = brute_force_ranks(E, R, test, known.tolist(), norm)
    assert got.tolist() == want
    assert any(r != int(r) for r in want)  # the case exercises the half-counted ties


def test_a_perfect_embedding_ranks_first_and_filtering_matters() -> None:
    E = np.array([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0], [5.0, 5.0]])
    R = np.array([[1.0, 0.0]])
    test = np.array([[0, 0, 1]])
    # (0, r, 2) is also known, at distance 1 from the prediction; (0, r, 1) is exact
    known = known_tensor(np.array([[0, 0, 1], [1, 0, 2]]), 4, 1)
    assert filtered_ranks(E, R, test, known, 1).tolist() == [1.0, 1.0]
    assert metrics(np.array([1.0, 1.0])) == (1.0, 1.0)
    assert metrics(np.array([2.0, 20.0])) == (0.275, 0.5)


def test_margin_step_moves_the_pair_apart_and_sums_the_active_loss() -> None:
    E = np.array([[0.0, 0.0], [1.0, 1.0], [0.1, 0.0]])
    R = np.array([[0.5, 0.5]])
    G = np.zeros_like(R)
    h, r, t = np.array([0]), np.array([0]), np.array([1])
    corrupt = (np.array([0]), np.array([2]))  # tail replaced by entity 2
    before = (np.abs(E[0] + R[0] - E[1]).sum(), np.abs(E[0] + R[0] - E[2]).sum())
    loss = margin_step(E, R, G, (h, r, t), corrupt, 0.1, 2.0, 1)
    assert loss == pytest.approx(2.0 + before[0] - before[1])
    after = (np.abs(E[0] + R[0] - E[1]).sum(), np.abs(E[0] + R[0] - E[2]).sum())
    assert after[0] < before[0] and after[1] > before[1]
    # x+ = (-0.5, -0.5) and x- = (0.4, 0.5): descent direction -sign(x+) + sign(x-)
    assert G.tolist() == [[2.0, 2.0]]


# --- the schedule -----------------------------------------------------------------------------


@pytest.mark.parametrize("blocks", [2, 4, 6, 8])
def test_tournament_pairs_every_two_blocks_once_in_disjoint_rounds(blocks: int) -> None:
    rounds = tournament(blocks)
    assert len(rounds) == blocks - 1
    met = [frozenset(p) for pairs in rounds for p in pairs]
    assert len(met) == len(set(met)) == blocks * (blocks - 1) // 2
    for pairs in rounds:
        assert sorted(b for p in pairs for b in p) == list(range(blocks))


def test_buckets_partition_the_triples_and_stay_inside_their_blocks(
    tmp_path: pathlib.Path,
) -> None:
    kg = read_graph(synthetic_graph(tmp_path))
    block = entity_blocks(kg.train, kg.n_entities, 4)
    assert np.bincount(block).tolist() == [16, 16, 16, 16]
    buckets = make_buckets(kg.train, block, 4)
    seen = []
    for per_round in buckets:
        rows = [set(bk.rows.tolist()) for bk in per_round]
        assert not rows[0] & rows[1]  # the bodies of a round share no entity
        for bk in per_round:
            triples = np.stack([bk.rows[bk.head], bk.rels[bk.rel], bk.rows[bk.tail]], axis=1)
            seen += [tuple(t) for t in triples.tolist()]
    assert sorted(seen) == sorted(tuple(t) for t in kg.train.tolist())


# --- learning and parallel runs ---------------------------------------------------------------


def test_planted_graph_is_learnt_far_above_chance_and_ranks_agree_bitwise() -> None:
    one = ap.run(train, FAST, nodes=1)
    two = ap.run(train, FAST, nodes=2)
    loss = one.objectives["loss"]
    assert loss[-1] < 0.5 * loss[0]
    # chance: the same graph scored by untrained (random) embeddings
    kg = read_graph(synthetic_graph(cache_dir() / "chance"))
    rng = np.random.default_rng(0)
    chance, _ = evaluate(rng.normal(size=(64, 16)), rng.normal(size=(6, 16)), kg, 1)
    mrr = one.objectives["mrr"][-1]
    assert chance < 0.15 and mrr > 0.4 and one.objectives["hits10"][-1] > 0.8, (mrr, chance)
    # the bodies of a round never conflict, so 2 nodes compute exactly what 1 node does
    assert two.objectives == one.objectives
    assert two.planner["ent0"]["strategy"] == "components"
    assert two.planner["ent0"]["rounds"] == 1 and two.planner["ent0"]["bodies"] == 2


# in-process commands that start mpiexec for their ranks: the layer scan cannot see it
@pytest.mark.mpi
def test_cli_two_ranks_equals_the_in_process_run(cli) -> None:
    params = {"synthetic": True, "epochs": 3}
    proc = cli(
        "run", "transe", "--ranks", "2", "--json", "--no-trace", "--timeout", str(MPI_TIMEOUT),
        "-p", "synthetic=true", "-p", "epochs=3",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["objectives"] == ap.run(train, params, nodes=2).objectives
    assert set(out["objectives"]) == {"loss", "mrr", "hits10"}


@pytest.mark.mpi
def test_cli_recorded_two_rank_run_replays_on_the_cluster_and_in_one_process(
    tmp_path: pathlib.Path, cli
) -> None:
    trace = str(tmp_path / "transe.sqlite")
    proc = cli(
        "run", "transe", "--ranks", "2", "--threads", "2", "--trace", trace, "--json",
        "--timeout", str(MPI_TIMEOUT), "-p", "synthetic=true", "-p", "epochs=2",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for mode in ("cluster", "single"):
        proc = cli(mode, trace, "--json")
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["identical"] and out["first_difference"] is None, (mode, out)


@pytest.mark.mpi
def test_cli_dual_forward_and_backward_on_three_ranks(cli) -> None:
    proc = cli(
        "dual", "transe", "--ranks", "3", "--json", "--no-trace", "--timeout", str(MPI_TIMEOUT),
        "-p", "synthetic=true", "-p", "epochs=2",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["forward"]["passed"] and out["backward"]["passed"]
    assert out["parallel"] == "mpi"


@pytest.mark.parametrize(
    "params,what",
    [
        ({"norm": 3}, "norm must be 1"),
        ({"blocks": 5}, "blocks must be an even"),
        ({"lr": 0.0}, "lr > 0"),
        ({"dataset": "fb15k"}, "nations, kinships, umls"),
        ({"blocks": 66}, "exceeds the 64 entities"),
    ],
)
def test_bad_parameters_are_refused_naming_the_value(params: dict, what: str) -> None:
    with pytest.raises(AppError, match=what):
        ap.run(train, {"synthetic": True, **params})


def test_cli_bad_parameter_is_one_line_exit_2(cli) -> None:
    proc = cli("run", "transe", "-p", "synthetic=true", "-p", "norm=3", "--no-trace")
    assert proc.returncode == 2 and "norm must be 1 (L1) or 2 (L2), got 3" in proc.stderr
    assert "Traceback" not in proc.stderr
