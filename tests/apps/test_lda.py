"""LDA: gensim corpus extraction (and its failures), the vocabulary, the synthetic generator,
the sampler's arithmetic, loglik and planted topics on 1-3 nodes, the scikit-learn oracle,
the CLI under mpiexec with replay, a dual test, bad parameters."""

from __future__ import annotations

import asyncio
import gzip
import json
import math
import os
import pathlib
import shutil
import subprocess
import zipfile

import numpy as np
import platformdirs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine as ap
from apps import _datasets
from apps._datasets import DatasetUnavailableError, cache_dir
from apps._errors import AppError
from apps.lda import _data, planted_recovery, train
from apps.lda._app import load, word_blocks
from apps.lda._model import estimates, loglik, perplexity, sweep
from replay import testing
from tests.conftest import run_cli
from tests.tui.tui_helpers import wait_text
from tui import BrowserApp

#: Five planted topics: small enough for seconds, and recovered from every seed tried.
SMALL: dict[str, object] = {"synthetic": True, "topics": 5, "iterations": 40}
SMALL_CLI = ["-p", "synthetic=true", "-p", "topics=5", "-p", "iterations=12"]


# --- gensim's corpora from the wheel ---------------------------------------------------------
@pytest.fixture
def fresh_cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    root = tmp_path / "fresh-cache"
    monkeypatch.setenv("STRADS_REPLAY_CACHE", str(root))
    return root


def fake_pip(monkeypatch: pytest.MonkeyPatch, contents: dict[str, bytes] | None, tmp: pathlib.Path):
    """``pip download`` gives a wheel holding ``contents`` under gensim's test data (or fails
    when None); the wheel's code raises if it is ever run.  Returns the calls."""
    calls: list[list[str]] = []
    wheel = tmp / "gensim-4.4.0-py3-none-any.whl"
    if contents is not None:
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr("gensim/__init__.py", "raise SystemExit('wheel code was executed')\n")
            for name, data in contents.items():
                zf.writestr("gensim/test/test_data/" + name, data)

    def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append(list(cmd))
        if contents is None:
            return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="ERROR: no network\n")
        shutil.copy(wheel, pathlib.Path(cmd[cmd.index("--dest") + 1]) / wheel.name)
        return subprocess.CompletedProcess(cmd, 0, stdout="", stderr="")

    monkeypatch.setattr(_datasets.subprocess, "run", run)
    return calls


def test_corpora_come_from_the_pinned_wheel_and_a_wrong_file_is_one_line(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, fresh_cache: pathlib.Path
) -> None:
    calls = fake_pip(monkeypatch, {name: b"not gensim's\n" for name in _data.MEMBERS}, tmp_path)
    with pytest.raises(DatasetUnavailableError, match="lda: .* is corrupt") as err:
        _data.corpus_file("lee")
    assert calls[0][-1] == "gensim==4.4.0"
    assert "\n" not in str(err.value) and "delete it" in str(err.value)
    dest = cache_dir() / _data.CACHE_SUBDIR
    assert sorted(p.name for p in dest.iterdir()) == sorted(_data.MEMBERS)


def test_missing_member_and_no_network_are_one_line(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, fresh_cache: pathlib.Path
) -> None:
    fake_pip(monkeypatch, {"lee_background.cor": b"a b c\n"}, tmp_path)
    with pytest.raises(DatasetUnavailableError, match="has no member") as err:
        _data.corpus_file("head500")
    assert "\n" not in str(err.value)
    fake_pip(monkeypatch, None, tmp_path)
    with pytest.raises(DatasetUnavailableError, match="synthetic=true") as err:
        _data.corpus_file("lee")
    assert "gensim==4.4.0" in str(err.value) and "\n" not in str(err.value)


def test_cli_corrupt_cached_corpus_is_one_line_exit_2(tmp_path: pathlib.Path, cli) -> None:
    cache = tmp_path / "cache"
    dest = cache / "datasets" / _data.CACHE_SUBDIR
    dest.mkdir(parents=True)
    for name in _data.MEMBERS:
        (dest / name).write_text("damaged\n")
    proc = cli(
        "run", "lda", "-p", "corpus=lee", "--no-trace", env={"STRADS_REPLAY_CACHE": str(cache)}
    )
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "corrupt" in errors[0] and "Traceback" not in proc.stderr


@pytest.fixture
def real_cache(monkeypatch: pytest.MonkeyPatch, fresh_cache: pathlib.Path) -> None:
    """gensim's corpora in the test's cache: copied from the user's cache when it has them,
    downloaded when network tests are allowed, else the test is skipped."""
    mine = pathlib.Path(platformdirs.user_cache_dir("strads-replay")) / "datasets"
    src = mine / _data.CACHE_SUBDIR
    if all((src / name).is_file() for name in _data.MEMBERS):
        dest = fresh_cache / "datasets" / _data.CACHE_SUBDIR
        dest.mkdir(parents=True)
        for name in _data.MEMBERS:
            shutil.copy(src / name, dest / name)
    elif os.environ.get("STRADS_REPLAY_NETWORK_TESTS") != "1":
        pytest.skip("gensim's corpora are not cached; set STRADS_REPLAY_NETWORK_TESTS=1")


def test_lee_corpus_trains_and_its_loglik_improves(real_cache: None) -> None:
    res = ap.run(train, {"corpus": "lee", "iterations": 6, "topics": 8}, nodes=2)
    out = res.value
    assert out["documents"] == 300 and 2000 < out["words"] < 4000 and out["tokens"] > 25_000
    ll = res.objectives["loglik"]
    assert ll[-1] > ll[0] and all(math.isfinite(x) for x in ll)
    assert len(out["top_words"]) == 8 and "said" not in " ".join(out["top_words"]).split()


# --- reading and the vocabulary --------------------------------------------------------------
def test_read_documents_failures_are_one_line(tmp_path: pathlib.Path) -> None:
    with pytest.raises(AppError, match="does not exist"):
        _data.read_documents(tmp_path / "nope.cor")
    bad = tmp_path / "bin.cor"
    bad.write_bytes(b"words \xff\xfe more\n")
    with pytest.raises(AppError, match="not UTF-8 text"):
        _data.read_documents(bad)
    bad.write_text(" \n...\n")
    with pytest.raises(AppError, match="has no words"):
        _data.read_documents(bad)
    bad.write_text("Cats and DOGS\n\nmice\n")
    assert _data.read_documents(bad) == [["cats", "and", "dogs"], ["mice"]]


def test_vocabulary_drops_rare_short_numeric_stop_and_everywhere_words() -> None:
    docs = [
        ["apple", "banana", "the", "2001", "ox", "everywhere", "rare"],
        ["apple", "banana", "banana", "everywhere", "the", "2001", "ox"],
        ["apple", "cherry", "cherry", "everywhere", "the", "2001", "ox"],
        ["cherry", "banana", "everywhere"],
    ]
    c = _data.build_corpus(docs, min_count=2, max_df=0.8)
    assert c.vocab == ["banana", "apple", "cherry"]  # most frequent first, ties by first use
    assert [d.tolist() for d in c.docs] == [[1, 0], [1, 0, 0], [1, 2, 2], [2, 0]]
    assert c.doc_term().tolist() == [[1, 1, 0], [2, 1, 0], [0, 1, 2], [1, 0, 1]]
    with pytest.raises(AppError, match="lower min_count"):
        _data.build_corpus(docs, min_count=50, max_df=0.8)


def test_synthetic_corpus_plants_topics_and_is_seeded() -> None:
    docs, planted = _data.synthetic_corpus(4, docs=30, length=20, words=6, seed=1)
    assert len(docs) == 30 and all(len(d) == 20 for d in docs)
    assert set(planted.values()) == {0, 1, 2, 3} and len(planted) == 24
    assert all(w in planted for d in docs for w in d)
    # few topics per document: the planted structure is there to be found
    mixes = [len({planted[w] for w in d}) for d in docs]
    assert np.mean(mixes) < 3
    assert _data.synthetic_corpus(4, docs=30, length=20, words=6, seed=1)[0] == docs
    assert _data.synthetic_corpus(4, docs=30, length=20, words=6, seed=2)[0] != docs


def test_word_blocks_balance_tokens() -> None:
    counts = np.array([50, 30, 20, 20, 10, 10, 5, 5])
    blocks = word_blocks(counts, 3)
    loads = np.bincount(blocks, weights=counts, minlength=3)
    assert loads.max() - loads.min() <= 10 and blocks[0] == 0


# --- the arithmetic ---------------------------------------------------------------------------
def test_loglik_is_the_collapsed_joint_likelihood() -> None:
    nw = np.array([[2, 0], [1, 1], [0, 3]])
    nd = np.array([[3, 1], [0, 3]])
    a, b = 0.3, 0.2
    V, K = nw.shape
    want = 0.0
    for k in range(K):
        want += math.lgamma(V * b) - math.lgamma(nw[:, k].sum() + V * b)
        want += sum(math.lgamma(nw[w, k] + b) - math.lgamma(b) for w in range(V))
    for d in range(2):
        want += math.lgamma(K * a) - math.lgamma(nd[d].sum() + K * a)
        want += sum(math.lgamma(nd[d, k] + a) - math.lgamma(a) for k in range(K))
    assert loglik(nw, nd, a, b) == pytest.approx(want, rel=1e-12)


def test_sweep_keeps_counts_equal_to_the_assignments() -> None:
    rng = np.random.default_rng(0)
    K, V, D, n = 4, 7, 5, 200
    words, docs = rng.integers(V, size=n), rng.integers(D, size=n)
    z = rng.integers(K, size=n)
    nw, nd = np.zeros((V, K), np.int64), np.zeros((D, K), np.int64)
    np.add.at(nw, (words, z), 1)
    np.add.at(nd, (docs, z), 1)
    nk = nw.sum(axis=0)
    u = rng.random(n)
    sweep(words, docs, z, nw, nd, nk, u, 0.1, 0.01, V * 0.01)
    want_w, want_d = np.zeros_like(nw), np.zeros_like(nd)
    np.add.at(want_w, (words, z), 1)
    np.add.at(want_d, (docs, z), 1)
    assert (nw == want_w).all() and (nd == want_d).all() and (nk == nw.sum(axis=0)).all()
    theta, phi = estimates(nw, nd, 0.1, 0.01)
    assert np.allclose(theta.sum(axis=1), 1) and np.allclose(phi.sum(axis=1), 1)


# --- training -------------------------------------------------------------------------------
def _counts_match_assignments() -> dict[str, object]:
    out = train(**SMALL)  # type: ignore[arg-type]
    dds = {d.name: d for d in ap.current().dds}
    nw, nd, nk = dds["word_topic"].gather(), dds["doc_topic"].gather(), dds["topic_total"].gather()
    out["consistent"] = bool(
        (nk[0] == nw.sum(axis=0)).all()
        and nd.sum() == nw.sum() == out["tokens"]
        and (nd.sum(axis=0) == nk[0]).all()
    )
    return out


@pytest.mark.parametrize("nodes,threads", [(1, 1), (2, 2), (3, 1)])
def test_loglik_improves_and_planted_topics_are_recovered(nodes: int, threads: int) -> None:
    res = ap.run(_counts_match_assignments, nodes=nodes, threads=threads)
    ll = np.array(res.objectives["loglik"])
    # improves on average: every window of 5 iterations beats the one before it, early on
    windows = ll[:30].reshape(6, 5).mean(axis=1)
    assert (np.diff(windows) > 0).all() and ll[-1] > ll[0]
    out = res.value
    assert out["planted_found"] == 5 and out["planted_purity"] >= 0.9
    # relaxed counts are exact again after every round: nothing lost or counted twice
    assert out["consistent"]
    assert res.planner["gibbs"]["rounds"] == 1 and res.planner["gibbs"]["imbalance"] <= 1.5


def test_perplexity_is_on_par_with_scikit_learn() -> None:
    from sklearn.decomposition import LatentDirichletAllocation

    data, _ = load("lee", True, 5, 200, 60, 3, 0.5)
    X = data.doc_term()
    sk = LatentDirichletAllocation(
        n_components=5,
        doc_topic_prior=0.1,
        topic_word_prior=0.01,
        learning_method="batch",
        max_iter=50,
        random_state=0,
    ).fit(X)
    phi = sk.components_ / sk.components_.sum(axis=1, keepdims=True)
    theirs = perplexity(X, sk.transform(X), phi)
    ours = ap.run(train, SMALL, nodes=2).value["perplexity"]
    assert ours <= 1.1 * theirs


def test_the_benchmarks_numba_reference_is_a_correct_sampler() -> None:
    """benchmarks/lda.py times the app against this plain sampler: it must be one."""
    from benchmarks.lda import counts, numba_seed, numba_sweep

    data, planted = load("lee", True, 5, 200, 60, 3, 0.5)
    assert planted is not None
    K, V, D = 5, len(data.vocab), len(data.docs)
    words = np.concatenate(data.docs)
    docs = np.concatenate([np.full(len(d), i, dtype=np.int64) for i, d in enumerate(data.docs)])
    z, nw, nd, nk = counts(
        words, docs, np.random.default_rng(0).integers(K, size=len(words)), V, D, K
    )
    numba_seed(0)
    ll = []
    for _ in range(40):
        numba_sweep(words, docs, z, nw, nd, nk, 0.1, 0.01, V * 0.01)
        ll.append(loglik(nw, nd, 0.1, 0.01))
    # the counts are those of the assignments it ended with
    _, want_w, want_d, want_k = counts(words, docs, z, V, D, K)
    assert (nw == want_w).all() and (nd == want_d).all() and (nk == want_k).all()
    windows = np.array(ll[:30]).reshape(6, 5).mean(axis=1)
    assert (np.diff(windows) > 0).all()
    theta, phi = estimates(nw, nd, 0.1, 0.01)
    purity, found = planted_recovery(phi, data.vocab, planted)
    assert found == 5 and purity >= 0.9
    ours = ap.run(train, SMALL).value["perplexity"]
    assert abs(perplexity(data.doc_term(), theta, phi) / ours - 1) < 0.1


# --- CLI, replay, dual ------------------------------------------------------------------------
# recording and cluster replay run in-process (their ranks under mpiexec: marked mpi);
# pdb cannot be driven in-process under pytest, so `single --break` stays a real process
@pytest.mark.mpi
def test_cli_two_ranks_two_threads_replays_bitwise(tmp_path: pathlib.Path, cli) -> None:
    trace = tmp_path / "lda.db"
    proc = cli(
        "run", "lda", *SMALL_CLI, "--ranks", "2", "--threads", "2", "--trace", trace, "--json"
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    here = ap.run(train, {**SMALL, "iterations": 12}, nodes=2, threads=2)
    assert out["objectives"] == here.objectives
    assert out["planner"]["gibbs"]["strategy"] == "components"
    for mode in ("cluster", "single"):
        rep = cli(mode, trace, "--json")
        assert rep.returncode == 0, rep.stderr
        assert json.loads(rep.stdout)["identical"]
    # pdb inside block 2's body of iteration 3: the relaxed totals it sees count every token
    pdb = "p b, int(NK[0].sum())\nc\n"
    single = run_cli(["single", str(trace), "--break", "gibbs:3:2"], input=pdb)
    assert single.returncode == 0, single.stderr
    assert "stopped in gibbs#3 index 2" in single.stdout + single.stderr
    assert f"(Pdb) (2, {here.value['tokens']})" in single.stdout, single.stdout
    assert "identical" in single.stdout

    async def browse() -> str:  # the browser's overview shows the objectives
        async with BrowserApp([tmp_path]).run_test(size=(100, 30)) as pilot:
            await wait_text(pilot, "lda", "2×2")
            await pilot.press("enter")
            return await wait_text(pilot, "loglik: 12 iteration(s)", "components")

    assert "verdicts clu✓" in asyncio.run(browse())


@settings(max_examples=6, deadline=None)
@given(
    topics=st.integers(2, 5),
    docs=st.integers(3, 40),
    length=st.integers(4, 30),
    blocks=st.integers(1, 6),
    nodes=st.integers(1, 2),
    threads=st.integers(1, 2),
    seed=st.integers(0, 3),
)
def test_the_kernel_gives_the_python_bodys_bits(
    topics: int, docs: int, length: int, blocks: int, nodes: int, threads: int, seed: int
) -> None:
    """The default compiled body and ``kernel=false`` agree to the bit on generated
    corpora: every digest of every invocation and every objective."""
    params = {
        "synthetic": True, "topics": topics, "docs": docs, "length": length,
        "blocks": blocks, "iterations": 3, "min_count": 1, "max_df": 1.0,
    }  # fmt: skip
    runs = [
        ap.run(train, {**params, "kernel": k}, nodes=nodes, threads=threads, seed=seed)
        for k in (True, False)
    ]
    assert runs[0].digests == runs[1].digests
    assert runs[0].objectives == runs[1].objectives


def test_a_trace_without_the_kernel_parameter_replays_the_python_body() -> None:
    """A trace recorded before ``kernel`` existed ran the Python body; its replay runs it."""
    from replay._apps import recorded_params

    assert recorded_params(train, {"topics": 5})["kernel"] is False
    assert recorded_params(train, {"topics": 5, "kernel": True})["kernel"] is True


def test_dual_forward_and_backward_are_exact_on_two_nodes() -> None:
    results = testing.dual(train, {**SMALL, "iterations": 3}, nodes=2, threads=2)
    for res in results.values():
        assert res.passed, res.report()


#: Traces recorded on commit 31c25c7, when the body read and wrote one ``X[i]`` per row
#: (now ``take``/``put``): ``replay run lda -p synthetic=true -p topics=5
#: -p iterations=4 -p docs=60 -p length=30 --ranks R --threads T --no-checkpoints``.
ROWS_TRACE = pathlib.Path(__file__).parent.parent / "data" / "lda_rows_{}.sqlite.gz"
ROWS_PARAMS = {"synthetic": True, "topics": 5, "iterations": 4, "docs": 60, "length": 30}


@pytest.mark.parametrize("nodes,threads", [(1, 1), (2, 2)])
def test_runs_recorded_before_take_and_put_are_reproduced_bit_for_bit(
    nodes: int, threads: int, tmp_path: pathlib.Path, cli
) -> None:
    import tracer

    trace = tmp_path / "rows.sqlite"
    trace.write_bytes(
        gzip.decompress(pathlib.Path(str(ROWS_TRACE).format(f"{nodes}x{threads}")).read_bytes())
    )
    with tracer.open(trace) as t:
        run = t.run()
        recorded = [(d.op, d.invocation, d.dds, d.digest) for d in run.digests() if d.node == 0]
        objectives = run.objectives()
    # a run today, its threads and relaxed copies as they are
    res = ap.run(train, ROWS_PARAMS, nodes=nodes, threads=threads)
    assert [(d["op"], d["invocation"], d["dds"], d["digest"]) for d in res.digests] == recorded
    assert res.objectives == objectives
    # and the old trace replays (its code digest is the old body's)
    rep = cli("single", trace, "--json", "--allow-changed-code")
    assert rep.returncode == 0, rep.stderr
    out = json.loads(rep.stdout)
    assert out["identical"] and out["checked"] == {"digests": 16, "objectives": 5}


@pytest.mark.parametrize(
    "param,message",
    [
        ("topics=1", "topics=1 (need >= 2)"),
        ("max_df=0", "max_df=0.0 (need 0 < max_df <= 1)"),
        ("corpus=wiki", "corpus must be one of lee, head500 or a text file with one document"),
    ],
)
def test_cli_bad_parameter_is_one_line_exit_2(param: str, message: str, cli) -> None:
    proc = cli("run", "lda", "-p", param, "--no-trace")
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in proc.stderr


# --- the user's corpus -----------------------------------------------------------------------
def write_corpus(path: pathlib.Path, docs: list[list[str]]) -> pathlib.Path:
    path.write_text("".join(" ".join(d) + "\n" for d in docs))
    return path


def test_a_users_corpus_file_trains_as_the_same_documents_do(tmp_path: pathlib.Path) -> None:
    texts, _ = _data.synthetic_corpus(5, docs=80, length=40)
    path = write_corpus(tmp_path / "planted.txt", texts)
    params = {"topics": 5, "iterations": 3}
    mine = ap.run(train, {**params, "corpus": str(path)})
    planted = ap.run(train, {**params, "synthetic": True, "docs": 80, "length": 40})
    assert mine.objectives == planted.objectives and mine.digests == planted.digests
    assert mine.value["corpus"] == str(path) and mine.value["documents"] == 80


@pytest.mark.parametrize(
    "content,message",
    [
        (None, "none.txt' is neither (no such file)"),
        ("dir", "cannot be read: it is a directory, not a regular file"),
        (b"", "has no words"),
        (b"first document\nsecond \xff document\n", "is not UTF-8 text (line 2, byte 22)"),
        (b"the and of\n", "no document keeps a word with min_count=3"),
    ],
)
def test_a_bad_corpus_file_is_one_line_exit_2(
    tmp_path: pathlib.Path, content: bytes | str | None, message: str, cli
) -> None:
    path = tmp_path / ("none.txt" if content is None else "corpus.txt")
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    proc = cli("run", "lda", "-p", f"corpus={path}", "--no-trace")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and message in errors[0], proc.stderr
    if content is not None and content != b"the and of\n":
        assert str(path) in errors[0]


def test_a_run_on_a_users_corpus_records_and_replays(tmp_path: pathlib.Path, cli) -> None:
    texts, _ = _data.synthetic_corpus(4, docs=60, length=30)
    path = write_corpus(tmp_path / "c.txt", texts)
    trace = tmp_path / "lda.sqlite"
    args = ["-p", f"corpus={path}", "-p", "topics=4", "-p", "iterations=4", "--trace", trace]
    rec = cli("run", "lda", *args)
    assert rec.returncode == 0, rec.stderr
    for mode in ("cluster", "single"):
        rep = cli(mode, trace, "--json")
        assert rep.returncode == 0, rep.stderr
        assert json.loads(rep.stdout)["identical"]


CORPUS_LINES = [
    "apple banana cherry grape apple banana",
    "",  # empty: skipped
    "# -- !! --",  # punctuation only: no word, skipped
    "engine wheel brake motor engine wheel",
    "the and of",  # stop words only: no word of the vocabulary, dropped
    "# apple grape cherry",  # a '#' line with words is a document
    "motor brake gear wheel motor gear",
    "   ",
    "banana cherry grape melon banana melon",
    "gear engine brake wheel piston gear",
]


@pytest.mark.parametrize("holdout", [0.0, 0.3])
def test_saved_doc_topic_rows_name_their_corpus_lines(
    tmp_path: pathlib.Path, cli, holdout: float
) -> None:
    """Row i of the saved ``doc_topic`` is the document on line ``doc_line[i]`` of the
    user's file, whatever lines were skipped, dropped or held out: its topic counts add
    up to that line's words of the vocabulary."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(CORPUS_LINES) + "\n", encoding="utf-8")
    out = tmp_path / "m.npz"
    proc = cli(
        "run", "lda", "-p", f"corpus={corpus}", "-p", "iterations=2", "-p", "blocks=2",
        "-p", "min_count=1", "-p", "max_df=0.9", "-p", f"holdout={holdout}",
        "--no-trace", "--save", out,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    with np.load(out) as m:
        lines, counts, vocab = m["doc_line"], m["doc_topic"], set(m["vocab"].tolist())
    assert len(lines) == len(counts) and lines.dtype.kind == "i"
    with_words = {
        n
        for n, text in enumerate(CORPUS_LINES, 1)
        if any(w in vocab for w in _data._TOKEN.findall(text.lower()))
    }
    assert set(lines.tolist()) <= with_words and len(set(lines.tolist())) == len(lines)
    if holdout == 0.0:
        assert lines.tolist() == sorted(with_words) == [1, 4, 6, 7, 9, 10]
    for n, row in zip(lines.tolist(), counts, strict=True):
        words = _data._TOKEN.findall(CORPUS_LINES[n - 1].lower())
        assert row.sum() == sum(w in vocab for w in words), (n, row)
