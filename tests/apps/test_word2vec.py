"""Word2vec: gensim test data extraction (and its failures), the synthetic corpus, the
skip-gram arithmetic, evaluation, training oracles, and the CLI on 1 and 2 ranks."""

from __future__ import annotations

import json
import os
import pathlib
import queue
import re
import shutil
import subprocess
import zipfile

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import engine as ap
from apps import _datasets
from apps._datasets import DatasetUnavailableError, cache_dir
from apps._errors import AppError
from apps.word2vec import _data, _eval, _kernel, _model, train

#: A small synthetic run: fast, and still enough to learn the planted synonyms.
SMALL = {"synthetic": True, "dim": 16, "epochs": 3, "minibatch": 4}


# --- gensim's test data from the wheel -----------------------------------------------------
@pytest.fixture
def fresh_cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """An empty data set cache for this test only."""
    root = tmp_path / "fresh-cache"
    monkeypatch.setenv("STRADS_REPLAY_CACHE", str(root))
    return root


def fake_gensim_wheel(tmp_path: pathlib.Path, contents: dict[str, bytes]) -> pathlib.Path:
    """A wheel holding ``contents`` under gensim's test-data folder; its code must not run."""
    wheel = tmp_path / "gensim-4.4.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("gensim/__init__.py", "raise SystemExit('wheel code was executed')\n")
        for name, data in contents.items():
            zf.writestr("gensim/test/test_data/" + name, data)
    return wheel


def fake_pip(monkeypatch: pytest.MonkeyPatch, wheel: pathlib.Path | None) -> list[list[str]]:
    """Make ``pip download`` copy ``wheel`` (or fail when it is None); returns the calls."""
    calls: list[list[str]] = []

    def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append(list(cmd))
        if wheel is None:
            return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="ERROR: no network\n")
        dest = pathlib.Path(cmd[cmd.index("--dest") + 1])
        shutil.copy(wheel, dest / wheel.name)
        return subprocess.CompletedProcess(cmd, 0, stdout="", stderr="")

    monkeypatch.setattr(_datasets.subprocess, "run", run)
    return calls


def test_the_four_members_are_fetched_from_the_pinned_wheel_and_checked(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, fresh_cache: pathlib.Path
) -> None:
    wheel = fake_gensim_wheel(tmp_path, {name: b"not gensim's file\n" for name in _data.MEMBERS})
    calls = fake_pip(monkeypatch, wheel)
    with pytest.raises(DatasetUnavailableError, match="corrupt") as err:
        _data.gensim_test_data()
    assert calls[0][-1] == "gensim==4.4.0"
    assert "\n" not in str(err.value) and "delete it" in str(err.value)
    # every member was extracted (only these), so the check, not the fetch, failed
    dest = cache_dir() / _data.CACHE_SUBDIR
    assert sorted(p.name for p in dest.iterdir()) == sorted(_data.MEMBERS)


def test_a_wheel_without_a_member_is_one_line(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, fresh_cache: pathlib.Path
) -> None:
    wheel = fake_gensim_wheel(tmp_path, {"wordsim353.tsv": b"a\tb\t1.0\n"})
    fake_pip(monkeypatch, wheel)
    with pytest.raises(DatasetUnavailableError, match="has no member") as err:
        _data.gensim_test_data()
    assert "\n" not in str(err.value)


def test_no_network_is_one_line_naming_the_way_out(
    monkeypatch: pytest.MonkeyPatch, fresh_cache: pathlib.Path
) -> None:
    fake_pip(monkeypatch, None)
    with pytest.raises(DatasetUnavailableError, match="synthetic=true") as err:
        _data.gensim_test_data()
    assert "gensim==4.4.0" in str(err.value) and "\n" not in str(err.value)


def test_check_file_accepts_the_right_bytes_only(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "wordsim353.tsv"
    path.write_bytes(b"tiger\tcat\t7.35\n")
    monkeypatch.setitem(
        _data.MEMBERS, "wordsim353.tsv", __import__("hashlib").sha256(path.read_bytes()).hexdigest()
    )
    _data.check_file(path)
    path.write_bytes(b"tiger\tcat\t7.36\n")
    with pytest.raises(DatasetUnavailableError, match="corrupt"):
        _data.check_file(path)
    path.unlink()
    with pytest.raises(DatasetUnavailableError, match="cannot read"):
        _data.check_file(path)


def test_cli_corrupt_cached_corpus_is_one_line_exit_2(tmp_path: pathlib.Path, cli) -> None:
    cache = tmp_path / "cache"
    env = {"STRADS_REPLAY_CACHE": str(cache)}
    dest = cache / "datasets" / _data.CACHE_SUBDIR
    dest.mkdir(parents=True)
    for name in _data.MEMBERS:
        (dest / name).write_text("damaged\n")
    proc = cli("run", "word2vec", "-p", "corpus=head500", "--no-trace", env=env)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "corrupt" in lines[0] and "Traceback" not in proc.stderr


def test_cli_missing_or_binary_corpus_file_is_one_line_exit_2(tmp_path: pathlib.Path, cli) -> None:
    missing = tmp_path / "nope.txt"
    proc = cli("run", "word2vec", "-p", f"data={missing}", "--no-trace")
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    binary = tmp_path / "corpus.txt"
    binary.write_bytes(b"good words \xff\xfe bad bytes\n")
    proc = cli("run", "word2vec", "-p", f"data={binary}", "--no-trace")
    assert proc.returncode == 2 and "not UTF-8" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "bad,match",
    [
        ({"sync": "async"}, "sync must be"),
        ({"corpus": "wiki"}, "corpus must be"),
        ({"window": 0}, "window=0"),
        ({"min_alpha": 0.1}, "min_alpha=0.1"),
        ({"pool": -1}, "pool=-1"),
    ],
)
def test_bad_parameters_are_app_errors(bad: dict, match: str) -> None:
    with pytest.raises(AppError, match=match):
        ap.run(train, {**SMALL, **bad}, nodes=1)


def test_cli_bad_parameter_is_one_line_exit_2(cli) -> None:
    proc = cli("run", "word2vec", "-p", "synthetic=true", "-p", "sync=async", "--no-trace")
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "word2vec: sync must" in proc.stderr


@pytest.mark.network
@pytest.mark.skipif(
    os.environ.get("STRADS_REPLAY_NETWORK_TESTS") != "1",
    reason="set STRADS_REPLAY_NETWORK_TESTS=1 to download from PyPI",
)
def test_gensim_test_data_downloads_for_real() -> None:
    where = _data.gensim_test_data()
    head = _data.read_corpus(where / "head500.noblanks.cor", 10_000)
    assert len(head) == 250 and sum(map(len, head)) > 300_000
    assert len(_data.read_wordsim(where / "wordsim353.tsv")) == 353
    assert len(_data.read_questions(where / "questions-words.txt")) == 19544


# --- reading, vocabulary, encoding -------------------------------------------------------------
def test_read_corpus_cuts_long_lines_and_tokenizes(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "c.txt"
    path.write_text("The cat, the DOG.\n\n a b c d e\n")
    assert _data.read_corpus(path, 2) == [
        ["the", "cat"],
        ["the", "dog"],
        ["a", "b"],
        ["c", "d"],
        ["e"],
    ]
    path.write_text("  \n...\n")
    with pytest.raises(AppError, match="has no words"):
        _data.read_corpus(path, 5)


def test_vocab_is_by_count_then_first_occurrence_and_encode_pads() -> None:
    sents = [["b", "a", "c", "a"], ["c", "b", "x"], ["x"]]
    vocab = _data.build_vocab(sents, min_count=2)
    assert vocab.words == ["b", "a", "c", "x"] and vocab.counts.tolist() == [2, 2, 2, 2]
    vocab = _data.build_vocab([["a", "b", "a", "c", "c", "c"]], min_count=2)
    assert vocab.words == ["c", "a"]
    rows = _data.encode([["a", "b", "c"], ["b"], ["c", "c"]], vocab, 3)
    assert rows.tolist() == [[1, 0, -1], [0, 0, -1]] and rows.dtype == np.int32


def test_synthetic_corpus_is_deterministic_and_planted() -> None:
    s1, pairs = _data.synthetic_corpus(sentences=50, seed=3)
    s2, _ = _data.synthetic_corpus(sentences=50, seed=3)
    s3, _ = _data.synthetic_corpus(sentences=50, seed=4)
    assert s1 == s2 and s1 != s3
    assert len(s1) == 50 and all(len(s) == _data.SYNTHETIC_LENGTH for s in s1)
    for sentence in s1:  # one group per sentence: its synonyms never mix with another's
        groups = {m.group(1) for w in sentence if (m := re.match(r"(?:syn|ctx)(\d+)x", w))}
        assert len(groups) <= 1
    high = [p for p in pairs if p[2] == 9.0]
    assert high and all(a.split("x")[0] == b.split("x")[0] for a, b, _ in high)


# --- the arithmetic ----------------------------------------------------------------------------
def test_keep_probabilities_follow_gensims_formula() -> None:
    counts = np.array([1000, 100, 1])
    p = _model.keep_probabilities(counts, 1e-2)
    t = 1e-2 * counts.sum()
    want = np.minimum((np.sqrt(counts / t) + 1) * t / counts, 1.0)
    assert np.allclose(p, want) and p[0] < 0.2 and p[2] == 1.0
    assert _model.keep_probabilities(counts, 0.0).tolist() == [1.0, 1.0, 1.0]


def test_noise_table_follows_count_to_the_075() -> None:
    counts = np.array([81, 16, 1])
    table = _model.noise_table(counts, size=10_000)
    share = np.bincount(table, minlength=3) / len(table)
    want = counts**0.75 / (counts**0.75).sum()
    assert np.allclose(share, want, atol=1e-3)


def test_pairs_stay_inside_their_sentence_and_window() -> None:
    rows = np.array([[0, 1, 2, 3], [4, 5, -1, -1]])
    keep = np.ones(6)
    table = np.arange(6, dtype=np.int32)
    got = _model.minibatch_pairs(rows, keep, table, 1, 2, np.random.default_rng(0))
    pairs = sorted(zip(got.context.tolist(), got.target.tolist(), strict=True))
    assert pairs == [(0, 1), (1, 0), (1, 2), (2, 1), (2, 3), (3, 2), (4, 5), (5, 4)]
    assert got.noise.shape == (8, 2) and got.words == 6
    wide = _model.minibatch_pairs(rows, keep, table, 3, 2, np.random.default_rng(1))
    assert all((c < 4) == (t < 4) for c, t in zip(wide.context, wide.target, strict=True))
    assert len(wide.target) <= 2 * (3 + 2 + 1) + 2


def test_shared_negatives_come_from_a_pool_of_that_size() -> None:
    rows = np.arange(40).reshape(2, 20)
    table = np.arange(1000, dtype=np.int32)
    got = _model.minibatch_pairs(rows, np.ones(1000), table, 5, 5, np.random.default_rng(2), 4)
    assert len(np.unique(got.noise)) <= 4 < len(got.target)


def test_one_pair_step_equals_the_textbook_update() -> None:
    rng = np.random.default_rng(0)
    w_in, w_out = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    pairs = _model.Pairs(np.array([0]), np.array([1]), np.array([[2, 3]]), 2)
    ins, new_in, outs, new_out, loss = _model.sgns_update(pairs, w_in, w_out, 0.1)
    h = w_in[0]
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    g = [0.1 * (1 - sig(h @ w_out[1])), -0.1 * sig(h @ w_out[2]), -0.1 * sig(h @ w_out[3])]
    assert ins.tolist() == [0] and outs.tolist() == [1, 2, 3]
    assert np.allclose(new_in[0], h + g[0] * w_out[1] + g[1] * w_out[2] + g[2] * w_out[3])
    for k, row in enumerate(outs.tolist()):
        assert np.allclose(new_out[k], w_out[row] + g[k] * h)
    want = -np.log(sig(h @ w_out[1])) - np.log(sig(-h @ w_out[2])) - np.log(sig(-h @ w_out[3]))
    assert loss == pytest.approx(want)


def test_a_noise_word_equal_to_the_centre_is_skipped() -> None:
    w_in, w_out = np.ones((2, 2)), np.ones((2, 2))
    pairs = _model.Pairs(np.array([0]), np.array([1]), np.array([[1]]), 2)
    _, _, outs, new_out, loss = _model.sgns_update(pairs, w_in, w_out, 0.5)
    sig2 = 1 / (1 + np.exp(-2.0))
    assert np.allclose(new_out[outs.tolist().index(1)], 1 + 0.5 * (1 - sig2))
    assert loss == pytest.approx(-np.log(sig2))


def test_pairs_come_in_gensims_order() -> None:
    # centre by centre, each centre's context words left to right, never across sentences
    rows = np.array([[0, 1, 2], [3, 4, -1]])
    got = _model.minibatch_pairs(rows, np.ones(5), np.arange(5, dtype=np.int32), 2, 1, FixedReach())
    assert list(zip(got.target.tolist(), got.context.tolist(), strict=True)) == [
        (0, 1),
        (0, 2),
        (1, 0),
        (1, 2),
        (2, 0),
        (2, 1),
        (3, 4),
        (4, 3),
    ]


class FixedReach:
    """A stand-in generator: keeps every word and gives every word the full window."""

    def random(self, n: int) -> np.ndarray:
        return np.zeros(n)

    def integers(self, lo: int, hi: int, size: object = None) -> np.ndarray:
        return np.zeros(size, dtype=np.int64)


def tiny_minibatch(seed: int, dim: int = 8, scale: float = 0.5) -> tuple:
    """(plan, input rows, output rows) of a random two-sentence minibatch over 30 words."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 30, size=(2, 25)).astype(np.int32)
    rows[1, 20:] = -1
    counts = np.bincount(rows[rows >= 0], minlength=30) + 1
    keep = _model.keep_probabilities(counts, 1e-2)
    table = _model.noise_table(counts, size=500)
    pairs = _model.minibatch_pairs(rows, keep, table, 3, 4, rng)
    plan = _model.gather_plan(pairs)
    w_in = rng.normal(0, scale, size=(30, dim)).astype(np.float32)
    w_out = rng.normal(0, scale, size=(30, dim)).astype(np.float32)
    return plan, w_in[plan.in_rows], w_out[plan.out_rows]


@pytest.mark.parametrize(
    "seed,dim,scale", [(0, 8, 0.5), (1, 13, 0.5), (2, 100, 0.1), (3, 8, 3.0), (5, 5, 0.5)]
)
def test_the_compiled_kernel_equals_the_numpy_reference_bit_for_bit(
    seed: int, dim: int, scale: float
) -> None:
    # bitwise, not approximately: both round every float32 multiply and add separately, sum
    # the dot product left to right and take exp/log1p in float64 from the C library
    plan, h, o = tiny_minibatch(seed, dim, scale)
    assert len(plan.ctx) > 20
    if seed == 0:  # the skip of a noise word equal to the centre word is exercised
        assert (plan.outs[:, 1:] == plan.outs[:, :1]).any()
    got_h, got_o, got_loss = _model.step(plan, h, o, 0.05)
    ref_h, ref_o, ref_loss = _model.reference_step(plan, h, o, 0.05)
    assert got_h.dtype == np.float32 and got_o.dtype == np.float32
    assert np.array_equal(got_h, ref_h) and np.array_equal(got_o, ref_o)
    assert got_loss == ref_loss
    assert not np.array_equal(got_h, h) and not np.array_equal(got_o, o)  # it did train
    if scale == 3.0:  # large vectors: many scores beyond +-MAX_EXP, which are not updated
        scores = np.einsum("pd,pkd->pk", h[plan.ctx], o[plan.out_idx])
        assert (np.abs(scores) >= _kernel.MAX_EXP).any()


def test_a_later_pair_sees_the_update_of_an_earlier_one() -> None:
    # the same pair twice is the one-pair update applied twice, not twice its gradient
    rng = np.random.default_rng(4)
    w_in, w_out = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    one = _model.Pairs(np.array([0]), np.array([1]), np.array([[2, 3]]), 2)
    twice = _model.Pairs(np.array([0, 0]), np.array([1, 1]), np.array([[2, 3], [2, 3]]), 2)
    _, h1, _, o1, _ = _model.sgns_update(one, w_in, w_out, 0.3)
    w_in2, w_out2 = w_in.astype(np.float32), w_out.astype(np.float32)
    w_in2[[0]], w_out2[[1, 2, 3]] = h1, o1
    _, h2, _, o2, _ = _model.sgns_update(one, w_in2, w_out2, 0.3)
    _, ht, _, ot, _ = _model.sgns_update(twice, w_in, w_out, 0.3)
    assert np.array_equal(ht, h2) and np.array_equal(ot, o2)
    summed = w_in[0] + 2 * (h1[0] - w_in[0])  # what one step with summed gradients gives
    assert not np.allclose(ht[0], summed, atol=1e-4)


def test_a_kernel_that_cannot_compile_is_one_line_app_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import numba

    def broken(*args: object, **kwargs: object) -> object:
        raise numba.core.errors.TypingError("Failed in nopython mode pipeline\nmore lines")

    monkeypatch.setattr(_kernel, "_compiled", [])
    monkeypatch.setattr(numba, "njit", broken)
    with pytest.raises(AppError, match="cannot compile the training kernel") as err:
        _kernel.kernel()
    assert "\n" not in str(err.value) and "TypingError" in str(err.value)
    with pytest.raises(AppError, match="cannot compile"):
        ap.run(train, SMALL, nodes=1)


# --- evaluation --------------------------------------------------------------------------------
def test_wordsim_and_analogies_on_planted_vectors() -> None:
    index = {"king": 0, "queen": 1, "man": 2, "woman": 3, "car": 4}
    # cos: king-queen 0.92, king-car 0, man-woman -0.83 against gold ranks 3, 1, 2
    v = np.array([[1, 0.2, 0], [1, -0.2, 0], [0, 1, 0.3], [0, -1, 0.3], [0, 0, 5.0]])
    pairs = [("King", "queen", 8.0), ("man", "woman", 7.0), ("king", "car", 1.0), ("x", "y", 3.0)]
    score = _eval.wordsim(v, index, pairs)
    assert (score.covered, score.total) == (3, 4) and score.value == pytest.approx(0.5)
    acc = _eval.analogies(v, index, [("man", "woman", "king", "queen"), ("a", "b", "c", "d")])
    assert (acc.value, acc.covered, acc.total) == (1.0, 1, 2)
    wrong = _eval.analogies(v, index, [("man", "woman", "king", "car")])
    assert wrong.value == 0.0
    assert _eval.nearest(v, 0, 1).tolist() == [1]


# --- training oracles (in-process, synthetic corpus) --------------------------------------------
def group_neighbours(vectors: np.ndarray, vocab: _data.Vocab) -> float:
    """Share of planted synonyms whose nearest neighbour is a word of their own group
    (chance: about 10 in 136)."""
    hits = total = 0
    for g in range(_data.SYNTHETIC_GROUPS):
        group = {i for w, i in vocab.index.items() if re.fullmatch(rf"(?:syn|ctx){g}x\d+", w)}
        for k in range(_data.SYNTHETIC_SYNONYMS):
            w = vocab.index[_data.synonym(g, k)]
            hits += int(_eval.nearest(vectors, w, 1)[0] in group)
            total += 1
    return hits / total


def test_training_learns_the_planted_groups() -> None:
    captured: dict[str, np.ndarray] = {}

    def run() -> dict:
        out = train(**SMALL)
        captured["W"] = next(d for d in ap.current().dds if d.name == "W_in").gather()
        return out

    res = ap.run(run, nodes=1)
    loss, sim = res.objectives["loss"], res.objectives["wordsim"]
    assert len(loss) == len(sim) == 3 and "analogy" not in res.objectives
    assert loss[-1] < loss[0] - 0.3, loss
    assert sim[-1] > 0.6, sim
    sentences, _ = _data.synthetic_corpus()
    vocab = _data.build_vocab(sentences, 5)
    assert group_neighbours(captured["W"], vocab) >= 0.8


@pytest.fixture(scope="module")
def serial_wordsim() -> float:
    """The final ``wordsim`` of the small synthetic run on one node."""
    return ap.run(train, SMALL, nodes=1).objectives["wordsim"][-1]


@pytest.mark.parametrize(
    "sync,nodes,threads,extra",
    [
        ("bsp", 2, 1, {}),
        ("ssp", 2, 1, {}),
        ("hybrid", 2, 2, {}),
        ("hybrid", 2, 1, {"per_clock": 2}),
    ],
)
def test_parallel_runs_learn_like_serial(
    sync: str, nodes: int, threads: int, extra: dict, serial_wordsim: float
) -> None:
    serial = serial_wordsim
    par = ap.run(train, {**SMALL, "sync": sync, **extra}, nodes=nodes, threads=threads)
    assert par.objectives["wordsim"][-1] > serial - 0.1, (serial, par.objectives)
    assert par.planner["sgns"]["strategy"] == sync
    assert par.planner["sgns"]["params"] == ["W_in", "W_out", "loss"]
    minibatches = -(-400 // SMALL["minibatch"])  # 400 synthetic sentences
    clocks = -(-minibatches // (nodes * threads * extra.get("per_clock", 1)))
    assert par.planner["sgns"]["rounds"] == clocks


def test_the_same_seed_gives_the_same_run_and_another_seed_does_not() -> None:
    a = ap.run(train, {**SMALL, "epochs": 1}, nodes=1, seed=1).objectives
    b = ap.run(train, {**SMALL, "epochs": 1}, nodes=1, seed=1).objectives
    c = ap.run(train, {**SMALL, "epochs": 1}, nodes=1, seed=2).objectives
    assert a == b and a != c


# --- the CLI under MPI -------------------------------------------------------------------------
# in-process commands, but `run`/`cluster`/`dual --ranks 2` start mpiexec: the scan cannot see it
@pytest.mark.mpi
def test_cli_two_ranks_hybrid_learns_and_replays_both_ways(tmp_path: pathlib.Path, cli) -> None:
    trace = tmp_path / "w2v.sqlite"
    args = ["run", "word2vec", "--ranks", "2", "--json", "--trace", str(trace)]
    proc = cli(*args, "-p", "synthetic=true", "-p", "dim=16", "-p", "epochs=3")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["params"]["sync"] == "hybrid" and out["ranks"] == 2
    assert out["objectives"]["wordsim"][-1] > 0.6, out["objectives"]
    assert out["planner"]["sgns"]["bytes_moved"] > 0
    for how in ("cluster", "single"):
        replayed = cli(how, trace, "--json")
        assert replayed.returncode == 0, (how, replayed.stderr)
        assert json.loads(replayed.stdout)["identical"] is True, how


@pytest.mark.mpi
def test_cli_dual_two_ranks_passes_both_ways(cli) -> None:
    args = ["dual", "word2vec", "--ranks", "2", "--json", "--no-trace"]
    proc = cli(*args, "-p", "synthetic=true", "-p", "dim=8", "-p", "epochs=1")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["forward"]["passed"] and out["backward"]["passed"], out


def test_the_browser_draws_the_objectives(tmp_path: pathlib.Path, cli) -> None:
    import asyncio

    from tests.tui.tui_helpers import wait_text
    from tui import BrowserApp

    trace = tmp_path / "w2v.sqlite"
    args = ["run", "word2vec", "-p", "synthetic=true", "-p", "dim=8", "-p", "epochs=2"]
    proc = cli(*args, "--trace", trace)
    assert proc.returncode == 0, proc.stderr

    async def main() -> tuple[str, str]:
        app = BrowserApp([trace])
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("enter")
            first = await wait_text(pilot, "loss: 2 iteration(s)")
            await pilot.press("c")
            second = await wait_text(pilot, "wordsim: 2 iteration(s)")
            return first, second

    first, second = asyncio.run(main())
    assert "sgns" in first and "hybrid" in first
    assert "⠉" in second or "⣀" in second or "⠤" in second  # a braille curve


def test_two_nodes_sum_the_deltas_of_minibatches_run_from_the_same_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the parallel program computes, hand-checked on one clock: two nodes each run
    one minibatch from the clock's starting rows, and a row's new value is its start
    plus the sum of both nodes' deltas (not their mean, not a sequential run)."""
    # the spy keeps what it saw in a queue: the closure rule (which stops a body that
    # changes a list it reaches) compares a library object by identity only
    seen: queue.SimpleQueue[tuple[np.ndarray, np.ndarray, np.ndarray, float]] = queue.SimpleQueue()
    real = _model.step

    def step(
        plan: _model.Gather, h: np.ndarray, o: np.ndarray, lr: float, kernel: _kernel.Kernel
    ) -> tuple:
        new_h, new_o, loss = real(plan, h, o, lr, kernel)
        if ap.current().mode != "recon":  # reconnaissance runs the body too
            seen.put((plan.in_rows.copy(), np.array(h), new_h.copy(), lr))
        return new_h, new_o, loss

    monkeypatch.setattr(_model, "step", step)
    captured: dict[str, np.ndarray] = {}

    def run() -> dict:
        out = train(synthetic=True, dim=8, epochs=1, minibatch=200)  # Hybrid, the default
        captured["W"] = next(d for d in ap.current().dds if d.name == "W_in").gather()
        return out

    ap.run(run, nodes=2)  # 400 sentences: two minibatches, one clock
    calls = [seen.get() for _ in range(seen.qsize())]
    assert len(calls) == 2
    (rows0, h0, new0, lr0), (rows1, h1, new1, lr1) = sorted(calls, key=lambda c: -c[3])
    assert lr0 == 0.025 and lr1 == pytest.approx(0.025 - 0.0249 / 2)
    shared, i0, i1 = np.intersect1d(rows0, rows1, return_indices=True)
    assert len(shared) > 10
    # the second minibatch read the rows as they were before the first one ran
    np.testing.assert_array_equal(h0[i0], h1[i1])
    moved0, moved1 = new0[i0] - h0[i0], new1[i1] - h1[i1]
    assert np.abs(moved0).max() > 0 and np.abs(moved1).max() > 0
    expected = h0[i0] + (moved0 + moved1)
    np.testing.assert_allclose(captured["W"][shared], expected, rtol=1e-5, atol=1e-7)
    mean = h0[i0] + (moved0 + moved1) / 2
    assert not np.allclose(captured["W"][shared], mean, rtol=1e-5, atol=1e-7)


@given(
    st.lists(st.integers(0, 40), max_size=60),
    st.sampled_from([(-1,), (-1, 6)]),
    st.sampled_from([np.int64, np.int32]),
)
def test_distinct_rows_are_numpys_unique_with_its_inverse(
    ids: list[int], shape: tuple[int, ...], dtype: type
) -> None:
    # gather_plan's dedupe must give the very rows and positions np.unique gives: the step's
    # order of rows, hence the bits of every replay, depends on them
    arr = np.array(ids, dtype=dtype)
    if shape == (-1, 6):
        arr = arr[: len(arr) // 6 * 6].reshape(shape)
    rows, where = _model.distinct(arr)
    want_rows, want_where = np.unique(arr, return_inverse=True)
    assert rows.dtype == want_rows.dtype and np.array_equal(rows, want_rows)
    assert np.array_equal(where, want_where.reshape(-1))
    assert np.array_equal(rows[where], arr.reshape(-1))


@st.composite
def minibatches(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int, int]:
    """A minibatch of padded sentences over a vocabulary, its keep probabilities, a noise
    table from drawn counts (some words get no slot), window, negatives and pool."""
    vocab = draw(st.integers(1, 30))
    width = draw(st.integers(1, 12))
    lengths = draw(st.lists(st.integers(0, width), min_size=1, max_size=6))
    rows = np.full((len(lengths), width), -1, dtype=np.int32)
    for r, n in enumerate(lengths):
        rows[r, :n] = draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n))
    keep = np.array(
        draw(st.lists(st.sampled_from([0.0, 0.3, 1.0]), min_size=vocab, max_size=vocab))
    )
    counts = np.array(draw(st.lists(st.integers(1, 10_000), min_size=vocab, max_size=vocab)))
    table = _model.noise_table(counts, size=draw(st.sampled_from([1, 7, 100, 1000])))
    return (
        rows,
        keep,
        table,
        draw(st.integers(1, 6)),
        draw(st.integers(1, 4)),
        draw(st.sampled_from([0, 3])),
    )


@given(minibatches(), st.integers(0, 2**32 - 1), st.sampled_from([0, 1, 4, 8]))
def test_compiled_pairs_and_rows_are_numpys_bit_for_bit(
    batch: tuple[np.ndarray, np.ndarray, np.ndarray, int, int, int], seed: int, shift: int
) -> None:
    """The compiled pair forming, noise lookup (from the table's index, never the table)
    and row dedupe give the numpy path's arrays, dtypes and draws: every run's bits (and
    the replay of every trace recorded before they existed) depend on it."""
    rows, keep, table, window, negative, pool = batch
    index = _model.noise_index(table, shift)
    assert index is not None  # a noise table's words never decrease over its slots
    rng_a, rng_b = np.random.default_rng(seed), np.random.default_rng(seed)
    want = _model.minibatch_pairs(rows, keep, table, window, negative, rng_a, pool, compiled=False)
    got = _model.minibatch_pairs(
        rows, keep, table, window, negative, rng_b, pool, compiled=True, index=index
    )
    assert rng_a.bit_generator.state == rng_b.bit_generator.state  # the same draws
    assert got.words == want.words
    for name in ("context", "target", "noise"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype == np.int64 and a.shape == b.shape, name
        assert np.array_equal(a, b), name
    plan, ref = _model.gather_plan(got), _model.gather_plan(want, compiled=False)
    for name in ("in_rows", "ctx", "out_rows", "out_idx", "outs"):
        a, b = getattr(plan, name), getattr(ref, name)
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), name
    slots = np.arange(len(table), dtype=np.int64)[None, :]
    looked = _kernel.helpers()[2](slots, index.first, index.starts, index.shift)
    assert np.array_equal(looked[0], table)  # every slot, not only the drawn ones


def test_a_table_whose_words_decrease_is_read_slot_by_slot() -> None:
    """The index answers only for a table whose words never decrease over its slots; any
    other table has none, and the pairs then read the table itself."""
    for table in (np.array([0, 2, 1], dtype=np.int32), np.array([-1, 0], dtype=np.int32)):
        assert _model.noise_index(table) is None
    table = np.array([3, 0, 2, 1] * 25, dtype=np.int32)
    rows = np.arange(8, dtype=np.int32).reshape(1, 8) % 4
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
    a = _model.minibatch_pairs(rows, np.ones(4), table, 3, 2, rng_a, index=None)
    b = _model.minibatch_pairs(rows, np.ones(4), table, 3, 2, rng_b, compiled=False)
    assert np.array_equal(a.noise, b.noise)
