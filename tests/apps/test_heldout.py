"""Held-out metrics: SGDMF's ``test_rmse``, Lasso's ``test_mse`` and LDA's held-out
perplexity (document completion), on a split drawn from the run's seed or on the user's test file; and the
compatibility promise: a trace recorded before these parameters existed (its params lack
them) replays identically."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import engine as ap
import replay._job
from apps._errors import AppError, DataFormatError
from apps.lasso import train as lasso
from apps.lda import train as lda
from apps.lda._model import completion_perplexity
from apps.sgdmf import train as sgdmf
from apps.sgdmf._app import held_out
from tests.apps.test_tabular import regression, write

#: A quick SGDMF on generated ratings.
SGD = {"synthetic": True, "synthetic_ratings": 2000, "epochs": 3, "rank": 4}
LASSO = {"iterations": 200, "threshold": 0.3, "compare": False}


def ratings_file(path: Path, rows: list[tuple[int, int, int]]) -> Path:
    head = "user_id:token\titem_id:token\trating:float\ttimestamp:float"
    path.write_text("\n".join([head, *(f"{u}\t{i}\t{r}\t0" for u, i, r in rows)]) + "\n")
    return path


# --- SGDMF -----------------------------------------------------------------------------------
def test_sgdmf_holdout_is_a_seeded_share_and_logs_test_rmse_every_epoch() -> None:
    runs = [ap.run(sgdmf, {**SGD, "holdout": 0.2}, seed=s) for s in (0, 0, 1)]
    first = runs[0]
    assert first.value["ratings"] + first.value["test_ratings"] == 2000
    assert 300 < first.value["test_ratings"] < 500
    test_rmse = first.objectives["test_rmse"]
    assert len(test_rmse) == 3 and min(test_rmse) > min(first.objectives["rmse"])
    assert runs[1].objectives == first.objectives
    assert runs[2].value["test_ratings"] != first.value["test_ratings"]
    assert "test_rmse" not in ap.run(sgdmf, SGD).objectives


def test_the_held_out_choice_depends_on_the_salt_and_rating_only() -> None:
    lines = [f"{u}\t{i}\t3\t0" for u in range(1, 40) for i in range(1, 40)]
    salt = bytes(16)
    chosen = [held_out(line, salt, 0.25) for line in lines]
    assert 0.2 < np.mean(chosen) < 0.3
    assert chosen == [held_out(line, salt, 0.25) for line in lines]
    assert chosen != [held_out(line, bytes(range(16)), 0.25) for line in lines]
    assert not any(held_out(line, salt, 0.0) for line in lines)


def test_sgdmf_test_file_is_scored_with_a_row_for_unseen_ids(tmp_path: Path) -> None:
    train = ratings_file(
        tmp_path / "train.inter",
        [(u, i, 1 + (u + i) % 5) for u in range(1, 9) for i in range(1, 9)],
    )
    test = ratings_file(tmp_path / "test.inter", [(2, 3, 4), (12, 1, 5), (1, 15, 2)])
    res = ap.run(sgdmf, {"data": str(train), "test": str(test), "epochs": 2, "rank": 3})
    assert res.value["users"] == 12 and res.value["items"] == 15
    assert res.value["test_ratings"] == 3 and len(res.objectives["test_rmse"]) == 2


@pytest.mark.parametrize(
    "params,message",
    [
        ({"holdout": 1.0}, "need 0 <= holdout < 1 (got 1.0)"),
        ({"holdout": 0.1, "test": "t.inter"}, "give holdout or test, not both"),
        ({"holdout": 1e-9}, "holdout=1e-09 left no ratings to test on"),
    ],
)
def test_sgdmf_bad_holdout_is_one_line(params: dict, message: str, cli) -> None:
    args = [a for k, v in {**SGD, **params}.items() for a in ("-p", f"{k}={v}")]
    proc = cli("run", "sgdmf", *args, "--no-trace")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and message in errors[0], proc.stderr


# --- Lasso -----------------------------------------------------------------------------------
def test_lasso_test_mse_is_the_saved_models_error_on_the_test_file(tmp_path: Path, cli) -> None:
    X, y = regression(n=60)
    data = write(tmp_path, X[:45], y[:45], "csv")
    (tmp_path / "test").mkdir()
    test = write(tmp_path / "test", X[45:], y[45:], "npz")
    model = tmp_path / "model.npz"
    args = ["-p", f"data={data}", "-p", f"test={test}", "-p", "compare=false"]
    proc = cli("run", "lasso", *args, "--no-trace", "--json", "--save", model)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    with np.load(model) as m:
        pred = (X[45:] - m["x_mean"]) / m["x_std"] @ m["coef"] + m["intercept"]
    assert out["result"]["test_samples"] == 15
    assert out["objectives"]["test_mse"] == [pytest.approx(np.mean((y[45:] - pred) ** 2))]
    assert out["result"]["test_mse"] < np.var(y[45:])  # better than predicting the mean


def test_lasso_holdout_is_drawn_from_the_seed(tmp_path: Path) -> None:
    X, y = regression(n=60)
    params = {**LASSO, "data": str(write(tmp_path, X, y, "npz")), "holdout": 0.25}
    runs = [ap.run(lasso, params, seed=s) for s in (0, 0, 1)]
    assert runs[0].value["samples"] == 45 and runs[0].value["test_samples"] == 15
    assert runs[1].objectives == runs[0].objectives
    assert runs[2].value["test_mse"] != runs[0].value["test_mse"]


def test_a_narrower_libsvm_test_file_pads_and_another_width_is_refused(tmp_path: Path) -> None:
    X, y = regression(n=30)
    params = {**LASSO, "data": str(write(tmp_path, X, y, "csv"))}
    svm = tmp_path / "t.svm"
    svm.write_text("1.5 1:0.5 2:-1\n-0.5 3:2\n")
    assert ap.run(lasso, {**params, "test": str(svm)}).value["test_samples"] == 2
    narrow = tmp_path / "t.csv"
    narrow.write_text("1,2,3\n4,5,6\n")
    with pytest.raises(DataFormatError, match="has 2 feature columns, the training data 5"):
        ap.run(lasso, {**params, "data": str(write(tmp_path, X, y, "npz")), "test": str(narrow)})


# --- old traces ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "app,params",
    [
        ("sgdmf", ["synthetic=true", "synthetic_ratings=1000", "epochs=2", "rank=4"]),
        ("lda", ["synthetic=true", "topics=3", "iterations=2", "docs=40"]),
        (  # the synthetic problem: the diabetes data would import scikit-learn (1.5 s)
            "lasso",
            [
                "dataset=synthetic",
                "samples=40",
                "features=20",
                "nonzeros=3",
                "iterations=5",
                "compare=false",
            ],
        ),
    ],
)
def test_a_trace_without_the_held_out_parameters_replays_identically(
    tmp_path: Path, app: str, params: list[str], cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "old.sqlite"
    args = [a for p in params for a in ("-p", p)]
    new = cli("run", app, *args, "--no-trace", "--json")
    # recorded as the code before these parameters recorded it: every parameter but them
    # (the run row is hash-chained, so the trace is written that way, not edited after)
    every = replay._job.all_params
    monkeypatch.setattr(
        replay._job,
        "all_params",
        lambda fn, given: {
            k: v for k, v in every(fn, given).items() if k not in ("holdout", "test")
        },
    )
    old = cli("run", app, *args, "--trace", trace, "--json")
    monkeypatch.undo()
    assert old.returncode == 0, old.stderr
    assert "holdout" not in json.loads(old.stdout)["params"]
    assert json.loads(old.stdout)["objectives"] == json.loads(new.stdout)["objectives"]
    for mode in ("cluster", "single"):
        rep = cli(mode, trace, "--json")
        assert rep.returncode == 0, rep.stderr
        assert json.loads(rep.stdout)["identical"]


# --- LDA -------------------------------------------------------------------------------------
#: Five planted topics, as in test_lda.py.
LDA = {"synthetic": True, "topics": 5}


def test_completion_perplexity_of_a_document_of_one_topic_is_that_topics_spread() -> None:
    phi = np.array([[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.25, 0.75]])
    assert completion_perplexity([np.array([0, 1, 1, 0, 0, 1])], phi, 1e-9) == pytest.approx(2.0)
    # the held half of [2, 3, 2, 3] is two 3s, each of probability 0.75
    got = completion_perplexity([np.array([2, 3, 2, 3]), np.array([1])], phi, 1e-9)
    assert got == pytest.approx(1 / 0.75)


def test_lda_heldout_perplexity_falls_with_training_and_tracks_the_training_one() -> None:
    short, long = (ap.run(lda, {**LDA, "iterations": n, "holdout": 0.2}) for n in (1, 15))
    assert short.value["heldout_documents"] == 40 and short.value["documents"] == 160
    assert long.value["heldout_perplexity"] < 0.7 * short.value["heldout_perplexity"]
    assert long.objectives["heldout_perplexity"] == [long.value["heldout_perplexity"]]
    ratio = long.value["heldout_perplexity"] / long.value["perplexity"]
    assert 1.0 < ratio < 1.25
    again = ap.run(lda, {**LDA, "iterations": 1, "holdout": 0.2}, seed=1)
    assert again.value["heldout_perplexity"] != short.value["heldout_perplexity"]


def test_lda_test_file_drops_unknown_words_and_refuses_a_file_of_them(tmp_path: Path) -> None:
    test = tmp_path / "held.txt"
    test.write_text("t0w0 t0w1 t0w2 zebra t0w0\nt1w1 t1w0 t1w3\nunknown words only here\n")
    res = ap.run(lda, {**LDA, "iterations": 2, "test": str(test)})
    assert res.value["heldout_documents"] == 2 and res.value["documents"] == 200
    test.write_text("unknown words only here\n")
    with pytest.raises(AppError, match="no held-out document has two words of the training"):
        ap.run(lda, {**LDA, "iterations": 1, "test": str(test)})
