"""The trained model out of ``replay run --save`` and ``replay export --model``, the app's
result in ``--json`` and the plain output, and honest convergence (issue 37)."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

#: Each app with small parameters, and the arrays its ``--save`` holds: name -> how the
#: shape follows from its ``--json`` result (a key of the result, or a number).
APPS: dict[str, tuple[list[str], dict[str, tuple[Any, ...]]]] = {
    "sgdmf": (
        ["synthetic=true", "epochs=1", "synthetic_ratings=5000", "rank=4"],
        {"W": ("users", 4), "H": ("items", 4)},
    ),
    "lasso": (
        [
            "dataset=synthetic",
            "samples=60",
            "features=30",
            "nonzeros=3",
            "threshold=0.3",
            "compare=false",
        ],
        {"coef": ("features",), "intercept": (), "x_mean": ("features",), "x_std": ("features",)},
    ),
    "mlr": (["synthetic=true", "epochs=1"], {"weights": (10, 65)}),
    "lda": (
        ["synthetic=true", "iterations=2", "topics=5", "docs=40"],
        {
            "word_topic": ("words", 5),
            "doc_topic": ("documents", 5),
            "vocab": ("words",),
            "doc_line": ("documents",),
        },
    ),
    "transe": (
        ["synthetic=true", "epochs=1", "dim=8"],
        {
            "entities": ("entities", 8),
            "relations": ("relations", 8),
            "entity_names": ("entities",),
            "relation_names": ("relations",),
        },
    ),
    "word2vec": (
        ["synthetic=true", "epochs=1", "dim=8"],
        {"vectors": ("vocab", 8), "vocab": ("vocab",)},
    ),
}


def _p(params: list[str]) -> list[str]:
    return [a for p in params for a in ("-p", p)]


def _run(cli: Any, app: str, *extra: str, params: list[str] | None = None) -> Any:
    return cli("run", app, *_p(APPS[app][0] if params is None else params), *extra)


@pytest.mark.parametrize("app", sorted(APPS))
def test_every_app_saves_a_model_numpy_loads(app: str, cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "model.npz"
    r = _run(cli, app, "--no-trace", "--json", "--save", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    result = doc["result"]
    want = {
        name: tuple(result[d] if isinstance(d, str) else d for d in dims)
        for name, dims in APPS[app][1].items()
    }
    with np.load(out) as z:  # numpy alone, without allow_pickle
        got = {k: z[k] for k in z.files}
    assert {k: v.shape for k, v in got.items()} == want
    assert all(np.isfinite(v).all() for v in got.values() if v.dtype.kind == "f")
    # --json names each part of the model by its shape instead of printing it
    assert {k: tuple(v["shape"]) for k, v in result["model"].items()} == want
    assert doc["saved"] == str(out)


def test_save_changes_no_digest_and_the_plain_output_shows_the_result(
    cli: Any, tmp_path: Path
) -> None:
    plain = _run(cli, "sgdmf", "--no-trace", "--save", str(tmp_path / "m.npz"))
    assert plain.returncode == 0, plain.stderr
    assert "result: users=" in plain.stdout and "items=" in plain.stdout
    assert f"model: {tmp_path / 'm.npz'}" in plain.stdout
    runs = [
        json.loads(_run(cli, "sgdmf", "--no-trace", "--json", *save).stdout)
        for save in ([], ["--save", str(tmp_path / "m2.npz")])
    ]
    assert runs[0]["digests"] == runs[1]["digests"] and runs[0]["digests"]
    assert runs[0]["objectives"] == runs[1]["objectives"]
    assert runs[0]["saved"] is None and runs[0]["converged"] is None


def test_word2vec_text_format_parses_line_by_line(cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "vectors.txt"
    r = _run(cli, "word2vec", "--no-trace", "--json", "--save", str(out))
    assert r.returncode == 0, r.stderr
    vocab = json.loads(r.stdout)["result"]["vocab"]
    lines = out.read_text(encoding="utf-8").splitlines()
    n, dim = (int(x) for x in lines[0].split(" "))
    assert (n, dim) == (vocab, 8) and len(lines) == n + 1
    words = []
    for line in lines[1:]:
        word, *values = line.split(" ")
        assert len(values) == dim and all(np.isfinite([float(v) for v in values]))
        words.append(word)
    assert len(set(words)) == n


def test_sgdmf_rows_are_the_rating_files_ids_less_one(cli: Any, tmp_path: Path) -> None:
    """docs/models.md: row ``u - 1`` of W is user ``u`` (ids start at 1): the saved
    factors predict the test file with the run's own final ``test_rmse``."""
    rng = np.random.default_rng(3)
    rows = [(rng.integers(1, 30), rng.integers(1, 40), rng.integers(1, 6)) for _ in range(900)]
    for name, part in (("train.inter", rows[:800]), ("test.inter", rows[800:])):
        (tmp_path / name).write_text("".join(f"{u}\t{i}\t{r}\t0\n" for u, i, r in part))
    r = cli("run", "sgdmf", *_p(["data=train.inter", "test=test.inter", "epochs=2", "rank=4"]),
            "--no-trace", "--json", "--save", "m.npz", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    ids = np.array(rows)
    with np.load(tmp_path / "m.npz") as z:
        W, H = z["W"], z["H"]
    assert len(W) == ids[:, 0].max() and len(H) == ids[:, 1].max()
    u, i, rating = ids[800:].T
    rmse = np.sqrt(np.mean((rating - np.sum(W[u - 1] * H[i - 1], axis=1)) ** 2))
    assert rmse == pytest.approx(doc["objectives"]["test_rmse"][-1], rel=1e-12)


def test_lda_doc_topic_rows_are_the_training_documents_in_file_order(
    cli: Any, tmp_path: Path
) -> None:
    """docs/models.md: no row for a blank line or a document of no vocabulary word; the
    others in file order, each row summing to the document's kept words."""
    themes = ["cat dog mouse barn", "stock bond market trade"]
    lines = [" ".join([themes[j % 2]] * (j + 2)) for j in range(12)]
    lines[3:3] = ["", "zebra"]  # blank, and a word below min_count
    (tmp_path / "docs.txt").write_text("\n".join(lines) + "\n")
    r = cli("run", "lda", *_p(["corpus=docs.txt", "topics=2", "iterations=1", "max_df=1.0"]),
            "--no-trace", "--save", "m.npz", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    with np.load(tmp_path / "m.npz") as z:
        rows = z["doc_topic"].sum(axis=1).tolist()
    assert rows == [4 * (j + 2) for j in range(12)]


@pytest.mark.parametrize(
    ("save", "message"),
    [
        ("model.csv", "name it .npz"),
        ("missing/model.npz", "does not exist"),
        ("adir.npz", "is a directory"),
        ("model.txt", "sgdmf has no word embedding"),
        ("trace.npz", "is a trace store"),
    ],
)
def test_a_bad_save_path_is_one_line_and_exit_2_before_the_run(
    save: str, message: str, cli: Any, tmp_path: Path
) -> None:
    (tmp_path / "adir.npz").mkdir()
    (tmp_path / "trace.npz").write_bytes(b"SQLite format 3\x00" + b"\x00" * 100)
    trace = tmp_path / "t.sqlite"
    r = _run(cli, "sgdmf", "--trace", str(trace), "--save", str(tmp_path / save))
    assert r.returncode == 2
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert not trace.exists()  # refused before anything was made


#: Ways a user spells one file: as given, absolute, through ``./`` or ``sub/..``, a
#: symbolic link to its directory, or a hard link to it.
SPELLINGS = ["plain", "absolute", "dot", "updown", "linked_dir", "hard_link"]
#: (app, parameter, data file, its text): each app's data a --save could name.
DATA = [
    ("lasso", "data", "rows.npz", None),
    ("lasso", "test", "held.npz", None),
    ("word2vec", "data", "corpus.txt", "a b c d\n" * 20),
    ("lda", "corpus", "docs.txt", "a b c d\n" * 20),
]


def _spell(how: str, base: Path, name: str) -> str:
    if how == "hard_link":
        link = base / f"again-{name}"
        if not link.exists():
            link.hardlink_to(base / name)
        return str(link)
    if how == "linked_dir" and not (base / "via").exists():
        (base / "via").symlink_to(base, target_is_directory=True)
    return {
        "plain": name,
        "absolute": str(base / name),
        "dot": f"./{name}",
        "updown": f"sub/../{name}",
        "linked_dir": f"via/{name}",
    }[how]


@settings(max_examples=12, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.sampled_from(DATA), how=st.sampled_from(SPELLINGS))
def test_save_never_replaces_the_runs_own_data(
    data: tuple[str, str, str, str | None], how: str, cli: Any, tmp_path_factory: Any
) -> None:
    app, param, name, text = data
    base = tmp_path_factory.mktemp("data")
    (base / "sub").mkdir()
    params = [f"{param}={name}"]
    if text is None:
        rng = np.random.default_rng(0)
        for table in ("train.npz", name):
            np.savez(base / table, X=rng.standard_normal((20, 3)), y=rng.standard_normal(20))
        if param == "test":
            params.append("data=train.npz")
    else:
        (base / name).write_text(text)
    before = (base / name).read_bytes()
    r = cli("run", app, *_p(params), "--trace", str(base / "t.sqlite"),
            "--save", _spell(how, base, name), cwd=base)  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"-p {param}= names" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert (base / name).read_bytes() == before and not (base / "t.sqlite").exists()


def _unwritable(tmp_path: Path) -> list[Path]:
    """Directories no file can be made in: /proc (even for root), and for other users
    one without write permission."""
    dirs = [Path("/proc")]
    if os.geteuid() != 0:
        (tmp_path / "ro").mkdir(mode=0o555)
        dirs.append(tmp_path / "ro")
    return dirs


def test_a_save_or_export_into_a_directory_it_cannot_write_is_refused_first(
    cli: Any, tmp_path: Path
) -> None:
    """The run trained to its end and then failed on the write: 'internal error: OSError'
    (exit 70) on a read-only file system, a raw errno line in /proc."""
    trace = tmp_path / "t.sqlite"
    assert _run(cli, "sgdmf", "--trace", str(trace), "--checkpoint-every", "1").returncode == 0
    (tmp_path / "prog.py").write_text(USER_APP + SAVES_TO)
    for d in _unwritable(tmp_path):
        new = tmp_path / "new.sqlite"
        for args, option in (
            (["run", "sgdmf", *_p(APPS["sgdmf"][0]), "--trace", str(new), "--save"], "--save"),
            (["export", str(trace), "--model"], "--model"),
            (["export", str(trace), "--format", "chrome", "-o"], "-o"),
            (["run", f"{tmp_path / 'prog.py'}:saves", "--no-trace", "-p"], "ap.save path"),
        ):
            out = d / "m.npz" if option != "-o" else d / "t.json"
            last = f"out={out}" if option == "ap.save path" else str(out)
            r = cli(*args, last)
            assert r.returncode == 2, (args, r.stderr)
            assert f"{option} {out}: cannot write in {d}: " in r.stderr, r.stderr
            assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
            assert not new.exists() and "iter" not in r.stdout  # before any work


SAVES_TO = """
def saves(out: str = ""):
    ap.save(out, X=ap.dvector(2, shape=(), init=ap.init.zeros(), name="X"))
"""


READS_AND_SAVES = """
import engine as ap

def fit(data: str = "rows.txt", out: str = "rows.txt"):
    A = ap.load(data, parse=float)
    ap.save(out, A=ap.dvector(len(A), shape=(), init=ap.init.zeros(), name="A0"))
"""


def test_no_save_replaces_a_file_the_run_read_that_no_parameter_names(
    cli: Any, tmp_path: Path
) -> None:
    """TransE reads train.txt inside its data directory: '--save kg/train.txt' replaced
    the training triples with the vectors (and a program's ap.save its ap.load input)."""
    kg = tmp_path / "kg"
    kg.mkdir()
    names = [f"e{i}" for i in range(12)]
    for split, k in (("train.txt", 60), ("valid.txt", 6), ("test.txt", 6)):
        rows = [f"{names[j % 12]}\tr{j % 3}\t{names[(5 * j + 1) % 12]}\n" for j in range(k)]
        (kg / split).write_text("".join(rows))
    (tmp_path / "rows.txt").write_text("1\n2\n")
    (tmp_path / "prog.py").write_text(READS_AND_SAVES)
    before = {p: p.read_bytes() for p in [*kg.iterdir(), tmp_path / "rows.txt"]}
    for args in (
        ["transe", *_p(["data=kg", "epochs=1", "dim=4"]), "--save", "kg/train.txt"],
        ["prog.py:fit", "-p", "out=./rows.txt"],
    ):
        r = cli("run", *args, "--no-trace", cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        assert "is a file this run reads its data from" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert {p: p.read_bytes() for p in before} == before


def test_export_of_a_checkpoint_equals_the_save_of_a_run_that_stopped_there(
    cli: Any, tmp_path: Path
) -> None:
    params = [p for p in APPS["sgdmf"][0] if not p.startswith("epochs=")]
    trace = tmp_path / "t.sqlite"
    for epochs, extra in ((2, ["--trace", str(trace), "--checkpoint-every", "1"]), (1, [])):
        r = _run(
            cli, "sgdmf", *extra, "--save", str(tmp_path / f"run{epochs}.npz"),
            params=[*params, f"epochs={epochs}"],
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
    for checkpoint, epochs in ((["--checkpoint", "0"], 1), ([], 2)):
        out = tmp_path / f"export{epochs}.npz"
        r = cli("export", str(trace), "--model", str(out), *checkpoint)
        assert r.returncode == 0, r.stderr
        assert f"wrote the model at sgd#{epochs - 1} (W, H)" in r.stdout
        with np.load(out) as got, np.load(tmp_path / f"run{epochs}.npz") as saved:
            assert got.files == saved.files == ["W", "H"]
            assert all(np.array_equal(got[k], saved[k]) for k in saved.files)
    r = cli("export", str(trace), "--model", str(tmp_path / "export2.npz"))
    assert r.returncode == 2 and "already exists" in r.stderr  # --force to overwrite


def test_export_says_what_the_trace_cannot_give(cli: Any, tmp_path: Path) -> None:
    trace = tmp_path / "t.sqlite"
    r = _run(cli, "transe", "--trace", str(trace), "--checkpoint-every", "1")
    assert r.returncode == 0, r.stderr
    r = cli("export", str(trace), "--model", str(tmp_path / "e.txt"))
    assert r.returncode == 0, r.stderr
    assert "no entity_names" in r.stderr and "row number" in r.stderr
    lines = (tmp_path / "e.txt").read_text().splitlines()
    n, dim = (int(x) for x in lines[0].split())
    assert dim == 8 and [line.split()[0] for line in lines[1:]] == [str(i) for i in range(n)]


@st.composite
def _forged_slots(draw: st.DrawFn) -> tuple[int, list[int]]:
    """(length, slots): every slot once, in any order, then maybe one of them replaced
    by any number (a duplicate, a negative, one past the end) or one dropped."""
    n = draw(st.integers(0, 6))
    slots = draw(st.permutations(range(n)))
    if slots and draw(st.booleans()):
        slots[draw(st.integers(0, n - 1))] = draw(st.integers(-2 * n, 2 * n))
    if slots and draw(st.booleans()):
        slots.pop()
    return n, slots


@given(forged=_forged_slots(), extra=st.integers(-1, 1))
@example(forged=(3, [0, 1, 5]), extra=0)  # past the end
@example(forged=(3, [2, 0, -1]), extra=0)  # -1: the last row, again
@settings(max_examples=50)  # the examples above are the rare kinds of forgery
def test_forged_checkpoint_rows_are_refused_or_placed_exactly(
    forged: tuple[int, list[int]], extra: int
) -> None:
    """A checkpoint's slots and length come from the trace (hostile): a slot outside the
    DDS was an IndexError (exit 70), and a negative one put a row at the wrong place."""
    import tracer
    from replay._model import _checkpoint_arrays
    from tracer._run import CheckpointState

    n, slots = forged
    values = np.arange(max(len(slots) + extra, 0), dtype=np.float64) + 0.5
    state = CheckpointState("add", 0, {"X": (np.array(slots, dtype=np.int64), values)},
                            {"X": n}, {})  # fmt: skip
    exact = sorted(slots) == list(range(n)) and len(values) == n
    try:
        got = _checkpoint_arrays(state)
    except tracer.TraceFormatError as exc:
        assert not exact and "the trace is damaged" in str(exc)
        return
    assert exact and np.array_equal(got["X"][slots], values)


def _damage_checkpoint(trace: Path) -> None:
    with sqlite3.connect(trace) as db:
        db.execute("UPDATE checkpoint_block SET \"values\" = x'00ff00ff'")


@pytest.mark.parametrize(
    ("how", "message"),
    [
        (["--no-checkpoints"], "has no checkpoints"),
        (["--checkpoint-every", "1", "damage"], "damaged"),
        (["--checkpoint-every", "1", "--checkpoint", "5"], "has checkpoints 0 to 0"),
    ],
)
def test_export_of_a_bad_or_empty_trace_is_one_line_and_exit_2(
    how: list[str], message: str, cli: Any, tmp_path: Path
) -> None:
    trace = tmp_path / "t.sqlite"
    record = [a for a in how if a not in ("damage", "--checkpoint", "5")]
    r = _run(cli, "sgdmf", "--trace", str(trace), *record)
    assert r.returncode == 0, r.stderr
    if "damage" in how:
        _damage_checkpoint(trace)
    extra = ["--checkpoint", "5"] if "5" in how else []
    r = cli("export", str(trace), "--model", str(tmp_path / "m.npz"), *extra)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "m.npz").exists()


USER_APP = """
import engine as ap

def fit(n: int = 6):
    X = ap.dvector(n, shape=(2,), init=ap.init.zeros(), name="X")

    def body(j):
        X[j] = X[j] + j

    ap.async_for(0, n, body, name="add")
    return {"rows": n, "model": {"X": X, "labels": [f"r{j}" for j in range(n)]}}

def silent(n: int = 2):
    return {"rows": n}

def odd(n: int = 2):
    import numpy as np
    return {"loss": np.float32(0.5), "bad": float("nan"), "ok": np.bool_(True),
            "big": np.zeros((50, 3)), "small": np.arange(3), "text": "two\\nlines"}
"""


def test_a_users_program_saves_the_model_it_returns(cli: Any, tmp_path: Path) -> None:
    app = tmp_path / "prog.py"
    app.write_text(USER_APP)
    r = cli("run", f"{app}:fit", "--no-trace", "--save", str(tmp_path / "m.npz"))
    assert r.returncode == 0, r.stderr
    assert "result: rows=6" in r.stdout
    with np.load(tmp_path / "m.npz") as z:
        assert z["X"].tolist() == [[j, j] for j in range(6)]
        assert z["labels"].tolist() == [f"r{j}" for j in range(6)]
    r = cli("run", f"{app}:silent", "--no-trace", "--save", str(tmp_path / "s.npz"))
    assert r.returncode == 2 and "silent returned no model" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "s.npz").exists()


#: A Lasso that stops at its round limit far from its tolerance, and one that converges.
STOPS = ["dataset=synthetic", "samples=60", "features=80", "floor=1.0", "iterations=5"]
CONVERGES = APPS["lasso"][0]


def test_a_solver_that_stops_early_says_so_in_plain_json_and_exit_status(cli: Any) -> None:
    plain = cli("run", "lasso", *_p([*STOPS, "compare=false"]), "--no-trace")
    assert plain.returncode == 0
    warning = [line for line in plain.stderr.splitlines() if "without converging" in line]
    assert len(warning) == 1
    assert warning[0].startswith("replay: lasso stopped after 5 rounds without converging (KKT ")
    assert "converged=false" in plain.stdout
    js = cli("run", "lasso", *_p([*STOPS, "compare=false"]), "--no-trace", "--json")
    doc = json.loads(js.stdout)
    assert doc["converged"] is False and doc["result"]["converged"] is False
    assert doc["result"]["kkt"] > doc["result"]["tolerance"]
    strict = cli(
        "run", "lasso", *_p([*STOPS, "compare=false"]), "--no-trace", "--require-convergence"
    )
    assert strict.returncode == 1 and "without converging" in strict.stderr


def test_a_solver_that_converges_passes_require_convergence(cli: Any) -> None:
    r = cli("run", "lasso", *_p(CONVERGES), "--no-trace", "--json", "--require-convergence")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["converged"] is True and "converging" not in r.stderr


def test_require_convergence_of_an_app_that_does_not_say_checks_nothing_aloud(
    cli: Any,
) -> None:
    """An exit 0 with no word would read as 'converged' in CI."""
    r = _run(cli, "sgdmf", "--no-trace", "--json", "--require-convergence")
    assert r.returncode == 0 and json.loads(r.stdout)["converged"] is None, r.stderr
    said = [line for line in r.stderr.splitlines() if "--require-convergence" in line]
    assert said == [
        "replay: warning: --require-convergence checked nothing: sgdmf's result has no "
        "'converged' (only a solver with a tolerance, such as lasso, says)"
    ]
    plain = cli("run", "lasso", *_p(CONVERGES), "--no-trace", "--require-convergence")
    assert plain.returncode == 0 and "--require-convergence" not in plain.stderr


STOPS_SHORT = """
import os
import engine as ap

def fit(epochs: int = 3):
    X = ap.dvector(4, shape=(), init=ap.init.zeros(), name="X")

    def body(j):
        X[j] = X[j] * 2.0 + j

    for e in range(epochs):
        ap.async_for(0, 4, body, name="add")
        if e == 1 and os.environ.get("STOP_AT_EPOCH_1"):
            raise KeyboardInterrupt  # what Ctrl-C does
    return {"iterations": epochs, "converged": False, "model": {"X": X}}
"""


@pytest.mark.parametrize("as_json", [[], ["--json"]])
def test_a_resumed_run_that_stops_short_warns_as_the_run_does(
    as_json: list[str], cli: Any, tmp_path: Path
) -> None:
    (tmp_path / "prog.py").write_text(STOPS_SHORT)
    trace = tmp_path / "t.sqlite"
    r = cli("run", f"{tmp_path / 'prog.py'}:fit", "--trace", str(trace), "--checkpoint-every",
            "1", env={"STOP_AT_EPOCH_1": "1"})  # fmt: skip
    assert r.returncode != 0 and "without converging" not in r.stderr
    r = cli("resume", str(trace), *as_json)
    assert r.returncode == 0, r.stderr
    warning = [line for line in r.stderr.splitlines() if "without converging" in line]
    assert warning == ["replay: fit stopped after 3 rounds without converging"], r.stderr


def test_export_of_a_users_program_names_arrays_after_its_dds(cli: Any, tmp_path: Path) -> None:
    app, trace = tmp_path / "prog.py", tmp_path / "t.sqlite"
    app.write_text(USER_APP)
    saved = tmp_path / "saved.npz"
    r = cli(
        "run", f"{app}:fit", "--trace", str(trace), "--checkpoint-every", "1", "--save", str(saved)
    )
    assert r.returncode == 0, r.stderr
    r = cli("export", str(trace), "--model", str(tmp_path / "e.npz"))
    assert r.returncode == 0, r.stderr
    with np.load(tmp_path / "e.npz") as got, np.load(saved) as want:
        assert got.files == ["X"] and np.array_equal(got["X"], want["X"])
    both = cli("export", str(trace), "--model", str(tmp_path / "f.npz"), "-o", "x.json")
    assert both.returncode == 2 and "pass -o FILE" in both.stderr


@pytest.mark.mpi  # --ranks 2 starts mpiexec: ap.save gathers over MPI, rank 0 writes
def test_two_ranks_save_the_model_their_checkpoint_holds(cli: Any, tmp_path: Path) -> None:
    trace, saved = tmp_path / "t.sqlite", tmp_path / "m.npz"
    r = _run(cli, "sgdmf", "--ranks", "2", "--trace", str(trace), "--checkpoint-every", "1",
             "--save", str(saved))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert cli("export", str(trace), "--model", str(tmp_path / "e.npz")).returncode == 0
    with np.load(saved) as want, np.load(tmp_path / "e.npz") as got:
        assert want["W"].shape == (300, 4) and want["H"].shape == (500, 4)
        assert all(np.array_equal(got[k], want[k]) for k in ("W", "H"))


def test_any_return_value_becomes_strict_json_and_one_plain_line(cli: Any, tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(USER_APP)
    r = cli("run", f"{tmp_path / 'prog.py'}:odd", "--no-trace", "--json")
    assert r.returncode == 0, r.stderr

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")

    result = json.loads(r.stdout, parse_constant=refuse)["result"]
    assert result["loss"] == 0.5 and result["bad"] is None and result["ok"] is True
    assert result["big"]["shape"] == [50, 3] and result["small"] == [0, 1, 2]
    plain = cli("run", f"{tmp_path / 'prog.py'}:odd", "--no-trace")
    lines = [ln for ln in plain.stdout.splitlines() if ln.startswith("result:")]
    assert lines == ["result: loss=0.5 bad=null ok=true text=two lines"]


EVERY_EPOCH = """
import engine as ap

def fit(epochs: int = 3, out: str = "."):
    X = ap.dvector(4, shape=(), init=ap.init.zeros(), name="X")

    def body(j):
        X[j] = X[j] * 2.0 + j

    for e in range(epochs):
        ap.async_for(0, 4, body, name="add")
        ap.save(f"{out}/x{e}.npz", X=X)
"""


def _saved_x(path: Path) -> np.ndarray:
    with np.load(path) as saved:
        return saved["X"]


def test_a_replay_from_a_checkpoint_never_saves_a_skipped_model(cli: Any, tmp_path: Path) -> None:
    """Before the checkpoint the bodies were skipped: the DDS hold no model of that time."""
    (tmp_path / "prog.py").write_text(EVERY_EPOCH)
    out, trace = tmp_path / "out", tmp_path / "t.sqlite"
    out.mkdir()
    r = cli("run", f"{tmp_path / 'prog.py'}:fit", "-p", f"out={out}", "--trace", str(trace),
            "--checkpoint-every", "1")  # fmt: skip
    assert r.returncode == 0, r.stderr
    recorded = {p.name: _saved_x(p) for p in out.iterdir()}
    assert sorted(recorded) == ["x0.npz", "x1.npz", "x2.npz"]
    for p in out.iterdir():
        p.unlink()
    r = cli("single", str(trace), "--from", "add:2")
    assert r.returncode == 0 and "identical" in r.stdout, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["x1.npz", "x2.npz"]
    assert all(np.array_equal(_saved_x(out / n), recorded[n]) for n in ("x1.npz", "x2.npz"))


def test_export_of_a_model_refuses_a_timeline_format(cli: Any, tmp_path: Path) -> None:
    """--format names a timeline's format; with --model it was silently ignored."""
    m = tmp_path / "m.npz"
    r = cli("export", str(tmp_path / "t.sqlite"), "--model", str(m), "--format", "chrome")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--format" in r.stderr and not (tmp_path / "m.npz").exists()


EPOCHS_APP = """
import engine as ap

def fit(epochs: int = 5):
    X = ap.dvector(3, shape=(), init=ap.init.zeros(), name="X")

    def body(j):
        X[j] = X[j] + 1.0

    for _ in range(epochs):
        ap.async_for(0, 3, body, name="add")
    return {"model": {"X": X}}
"""


@pytest.mark.parametrize(("epochs", "every"), [(4, 2), (6, 4), (4, 1), (5, 2)])
def test_export_of_the_last_checkpoint_says_when_it_is_not_the_final_model(
    cli: Any, tmp_path: Path, epochs: int, every: int
) -> None:
    """``replay export TRACE --model last.npz`` writes the last checkpoint's model; with
    checkpoints every N (or the measured default) the run can go on past it, and the
    file was not the trained model though nothing said so.  A note says so exactly
    when the export differs from the ``--save`` of the finished run."""
    app, trace, saved = tmp_path / "prog.py", tmp_path / "t.sqlite", tmp_path / "saved.npz"
    app.write_text(EPOCHS_APP)
    r = cli("run", f"{app}:fit", "-p", f"epochs={epochs}", "--trace", str(trace),
            "--checkpoint-every", str(every), "--save", str(saved))  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = cli("export", str(trace), "--model", str(tmp_path / "e.npz"))
    assert r.returncode == 0, r.stderr
    with np.load(tmp_path / "e.npz") as got, np.load(saved) as want:
        final = np.array_equal(got["X"], want["X"])
    last = (epochs - 1) // every * every  # the checkpoints follow add#0, add#N, add#2N, ...
    assert final == (last == epochs - 1)
    note = "this is not its final model"
    assert (note in r.stderr) == (not final), r.stderr
    if not final:
        assert (
            f"the run went on for {epochs - 1 - last} loop invocation(s) after this checkpoint, "
            f"to add#{epochs - 1}"
        ) in r.stderr, r.stderr
