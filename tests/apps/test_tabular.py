"""A user's table for Lasso and MLR (``-p data=PATH``): CSV, TSV, NPY, NPZ and LibSVM read
to the same numbers, every malformed file is one line naming file and line, and a run on
the user's data records and replays."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import engine as ap
from apps._errors import AppError, DataFormatError
from apps._tabular import class_labels, read_table
from apps.lasso import train as lasso
from apps.mlr import train as mlr


def regression(n: int = 40, p: int = 5, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p))
    return X, X @ (np.linspace(2.0, -1.0, p) * (np.arange(p) % 2)) + 0.1 * rng.normal(size=n)


def write(tmp: Path, X: np.ndarray, y: np.ndarray, fmt: str) -> Path:
    """The table (X, y) as a file of format ``fmt``, every float written exactly."""
    path = tmp / f"table.{fmt}"
    if fmt == "npz":
        np.savez(path, X=X, y=y)
    elif fmt == "npy":
        np.save(path, np.column_stack([X, y]))
    elif fmt in ("csv", "tsv"):
        sep = "," if fmt == "csv" else "\t"
        head = sep.join([f"x{j}" for j in range(X.shape[1])] + ["target"])
        body = [sep.join(repr(float(v)) for v in [*row, t]) for row, t in zip(X, y, strict=True)]
        path.write_text("\n".join([head, *body]) + "\n")
    else:
        lines = [
            f"{float(t)!r} " + " ".join(f"{j + 1}:{float(v)!r}" for j, v in enumerate(row) if v)
            for row, t in zip(X, y, strict=True)
        ]
        path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("fmt", ["csv", "tsv", "npz", "npy", "svm", "libsvm", "txt"])
def test_every_format_reads_the_same_numbers(tmp_path: Path, fmt: str) -> None:
    X, y = regression()
    X[3, 4] = 0.0  # an absent LibSVM feature is a zero
    table = read_table(write(tmp_path, X, y, fmt), "lasso")
    assert np.array_equal(table.X, X) and np.array_equal(table.y, y)


def test_csv_without_header_and_with_blank_lines_and_comment_in_libsvm(tmp_path: Path) -> None:
    csv = tmp_path / "t.csv"
    csv.write_text("1,2,3\n\n4,5,6\n")
    t = read_table(csv, "lasso")
    assert t.X.tolist() == [[1, 2], [4, 5]] and t.y.tolist() == [3, 6]
    svm = tmp_path / "t.svm"
    svm.write_text("# written by hand\n1 3:2.5  # third feature\n-1 1:1\n")
    t = read_table(svm, "mlr")
    assert t.X.tolist() == [[0, 0, 2.5], [1, 0, 0]] and t.y.tolist() == [1, -1]
    assert t.where(1) == f"{svm}:3"


BAD_TEXT = [
    ("t.csv", "a,b,y\n1,2,3\n4,5\n", ":3: 2 fields, but line 2 has 3"),
    ("t.csv", "1,2,3\n4,x,6\n", ":2: column 2 'x' is not a number"),
    ("t.csv", "1,2,3\n4,nan,6\n", ":2: column 2 'nan' is not finite"),
    ("t.tsv", "1\t2\n3\tinf\n", ":2: column 2 'inf' is not finite"),
    ("t.csv", "x,y\n1\n", ":2: one column only"),
    ("t.csv", "", "has no rows"),
    ("t.csv", "a,b,y\n\n", "has no rows"),
    ("t.svm", "1 1:2\n0 1:2 x\n", ":2: expected INDEX:VALUE, got 'x'"),
    ("t.svm", "1 0:2\n", ":1: feature index 0 is not positive (LibSVM indices start at 1; "),
    ("t.svm", "1 2:1 2:3\n", ":1: feature index 2 appears twice"),
    ("t.svm", "1 1:2\nyes 1:2\n", ":2: label 'yes' is not a number"),
    ("t.svm", "1\n0\n", "has no feature columns"),
]


@pytest.mark.parametrize("name,text,message", BAD_TEXT)
def test_a_malformed_text_file_is_one_error_naming_file_and_line(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(DataFormatError) as info:
        read_table(path, "lasso")
    msg = str(info.value)
    assert msg.startswith("lasso: ") and str(path) in msg and message in msg, msg
    assert "\n" not in msg


@given(
    rows=st.lists(
        st.dictionaries(st.integers(1, 9), st.integers(-9, 9), min_size=1, max_size=4),
        min_size=1,
        max_size=6,
    ),
    at=st.integers(0, 5),
    index=st.integers(10**13, 10**18),
)
def test_a_libsvm_index_too_large_for_memory_names_its_line(
    rows: list[dict[int, int]], at: int, index: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A typo of a few digits in one index would make a dense table of petabytes: numpy's
    MemoryError named neither the file nor the line (exit 1)."""
    at = min(at, len(rows) - 1)
    rows[at][index] = 1
    text = "".join(
        "# a comment\n" + f"{r} " + " ".join(f"{k}:{v}" for k, v in row.items()) + "\n"
        for r, row in enumerate(rows)
    )
    path = tmp_path_factory.mktemp("svm") / "t.svm"
    path.write_text(text)
    with pytest.raises(DataFormatError) as info:
        read_table(path, "lasso")
    msg = str(info.value)
    assert msg.startswith(f"lasso: {path}:{2 * at + 2}: feature index {index:,} makes"), msg
    assert "\n" not in msg and "memory" in msg


def test_a_libsvm_index_too_large_is_exit_2_on_the_cli(tmp_path: Path, cli) -> None:
    path = tmp_path / "t.svm"
    path.write_text("1 1:2\n2 1:3 3000000000000:1\n3 1:1\n")
    proc = cli("run", "lasso", "-p", f"data={path}", "--no-trace")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and f"{path}:2: feature index 3,000,000,000,000" in errors[0]


def test_bad_bytes_missing_file_and_unknown_suffix(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(b"1,2\n3,4\n5,\xff\n")
    with pytest.raises(DataFormatError, match=r"not UTF-8 text \(line 3, byte 10\)"):
        read_table(path, "mlr")
    with pytest.raises(AppError, match="mlr: data file .*none.npz' does not exist"):
        read_table(tmp_path / "none.npz", "mlr")
    with pytest.raises(AppError, match=r"unknown format '\.dat'; use one of \.csv, \.tsv"):
        read_table(tmp_path / "t.dat", "mlr")


def test_bad_numpy_files_are_one_line(tmp_path: Path) -> None:
    X, y = regression(n=6, p=2)
    cases: list[tuple[str, str]] = []
    np.savez(tmp_path / "noy.npz", X=X, target=y)
    cases.append(("noy.npz", "has no array 'y' (it has: X, target); need X and y"))
    np.savez(tmp_path / "short.npz", X=X, y=y[:-1])
    cases.append(("short.npz", "X has 6 rows but y has 5"))
    X2 = X.copy()
    X2[4, 1] = np.inf
    np.savez(tmp_path / "inf.npz", X=X2, y=y)
    cases.append(("inf.npz", "inf.npz row 5: X column 2 is inf, not finite"))
    np.save(tmp_path / "flat.npy", y)
    cases.append(("flat.npy", "need a 2-D array with at least 2 columns"))
    np.save(tmp_path / "words.npy", np.array([["a", "b"]]))
    cases.append(("words.npy", "holds <U1 values, not numbers"))
    np.save(tmp_path / "objects.npy", np.array([[1, None]], dtype=object), allow_pickle=True)
    cases.append(("objects.npy", "holds Python objects (a pickled array), which are never"))
    np.savez(tmp_path / "objects.npz", X=np.array([[1, None]], dtype=object), y=y[:1])
    cases.append(("objects.npz", "holds Python objects (a pickled array), which are never"))
    (tmp_path / "empty.npz").write_bytes(b"")
    cases.append(("empty.npz", "is empty"))
    (tmp_path / "junk.npz").write_bytes(b"not numpy at all")
    cases.append(("junk.npz", "is not a readable npz file"))
    np.save(tmp_path / "array.npz.npy", X)
    (tmp_path / "array.npz.npy").rename(tmp_path / "array.npz")
    cases.append(("array.npz", "is a single array, not an .npz archive; name it .npy"))
    for name, message in cases:
        with pytest.raises(DataFormatError) as info:
            read_table(tmp_path / name, "lasso")
        assert message in str(info.value) and "\n" not in str(info.value), (name, info.value)
        assert "allow_pickle" not in str(info.value), info.value  # never advise it


def _forged_npy(shape: tuple[int, ...], dtype: str, payload: int) -> bytes:
    """A ``.npy`` whose header claims ``shape`` and which holds ``payload`` bytes."""
    import io

    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        head, {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": shape}
    )
    return head.getvalue() + b"\0" * payload


@given(
    # either a little more than the file holds, or more than any machine has
    rows=st.one_of(st.integers(2, 400), st.integers(10**8, 10**12)),
    cols=st.one_of(st.integers(2, 30), st.integers(10**6, 10**8)),
    dtype=st.sampled_from(["<f8", "<i4", "<f4", "|u1"]),
    payload=st.integers(0, 64),
    archive=st.booleans(),
)
def test_a_numpy_header_claiming_more_than_the_file_holds_is_one_line(
    rows: int,
    cols: int,
    dtype: str,
    payload: int,
    archive: bool,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """numpy allocates what the header claims before reading: a claim of terabytes was a
    MemoryError, 'the program failed', exit 1."""
    payload = min(payload, rows * cols * np.dtype(dtype).itemsize - 1)  # less than claimed
    data = _forged_npy((rows, cols), dtype, payload)
    path = tmp_path_factory.mktemp("npy") / ("t.npz" if archive else "t.npy")
    if archive:
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("X.npy", data)
            z.writestr("y.npy", _forged_npy((rows,), "<f8", 8))
    else:
        path.write_bytes(data)
    with pytest.raises(DataFormatError) as info:
        read_table(path, "lasso")
    msg = str(info.value)
    assert msg.startswith(f"lasso: data {str(path)!r}") and "\n" not in msg, msg


def test_a_forged_numpy_header_is_exit_2_on_the_cli(tmp_path: Path, cli) -> None:
    (tmp_path / "t.npy").write_bytes(_forged_npy((10**12, 3), "<f8", 16))
    proc = cli("run", "lasso", "-p", f"data={tmp_path / 't.npy'}", "--no-trace")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "the file is damaged" in errors[0], proc.stderr


def test_class_labels_are_sorted_integers_and_must_be_integral(tmp_path: Path) -> None:
    path = tmp_path / "c.csv"
    path.write_text("f,label\n0.1,9\n0.2,3\n0.3,7\n0.4,3\n")
    y, labels = class_labels(read_table(path, "mlr"), "mlr")
    assert labels.tolist() == [3, 7, 9] and y.tolist() == [2, 0, 1, 0]
    path.write_text("f,label\n0.1,1\n0.2,0.5\n")
    with pytest.raises(DataFormatError, match=r"c\.csv:3: label 0\.5 is not an integer"):
        class_labels(read_table(path, "mlr"), "mlr")
    path.write_text("0.1,4\n0.2,4\n")
    with pytest.raises(DataFormatError, match="one class only"):
        class_labels(read_table(path, "mlr"), "mlr")


# --- the apps on the user's data -------------------------------------------------------------
#: scikit-learn's oracle is checked in test_lasso.py; importing it here costs 2.5 s
LASSO = {"iterations": 200, "threshold": 0.3, "compare": False}


def test_lasso_gives_the_same_bits_from_csv_npz_and_libsvm(tmp_path: Path) -> None:
    X, y = regression()
    runs = []
    for fmt in ("csv", "npz", "svm"):
        sub = tmp_path / fmt
        sub.mkdir()
        runs.append(ap.run(lasso, {**LASSO, "data": str(write(sub, X, y, fmt))}))
    first = runs[0]
    assert first.value["converged"] and first.value["nonzeros"] == 2
    assert first.value["samples"] == 40 and first.value["features"] == 5
    for other in runs[1:]:
        assert other.objectives == first.objectives
        assert other.digests == first.digests


def blobs(n: int = 80, seed: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Three separable classes labelled 10, 20 and 30."""
    rng = np.random.default_rng(seed)
    k = rng.integers(0, 3, n)
    X = np.eye(3)[k] + 0.2 * rng.normal(size=(n, 3))
    return X, (10 * (k + 1)).astype(np.float64)


def test_mlr_gives_the_same_accuracy_from_csv_npz_and_libsvm(tmp_path: Path) -> None:
    X, y = blobs()
    runs = []
    for fmt in ("csv", "npz", "svm"):
        sub = tmp_path / fmt
        sub.mkdir()
        runs.append(ap.run(mlr, {"epochs": 3, "data": str(write(sub, X, y, fmt))}))
    first = runs[0]
    assert first.value["classes"] == [10, 20, 30]
    assert first.value["train"] == 60 and first.value["test"] == 20
    assert first.value["test_accuracy"] >= 0.9
    for other in runs[1:]:
        assert other.objectives == first.objectives


@pytest.mark.parametrize(
    "app,fmt",
    [("lasso", "csv"), ("mlr", "tsv"), ("mlr", "npz"), ("lasso", "npy"), ("lasso", "svm")],
)
def test_a_run_on_the_users_data_records_and_replays(
    tmp_path: Path, app: str, fmt: str, cli
) -> None:
    X, y = blobs() if app == "mlr" else regression()
    data = write(tmp_path, X, y, fmt)
    trace = tmp_path / "t.sqlite"
    extra = ["-p", "epochs=2"] if app == "mlr" else ["-p", "iterations=8", "-p", "compare=false"]
    rec = cli("run", app, "-p", f"data={data}", *extra, "--trace", trace, "--json")
    assert rec.returncode == 0, rec.stderr
    assert json.loads(rec.stdout)["params"]["data"] == str(data)
    for mode in ("cluster", "single"):
        rep = cli(mode, trace, "--json")
        assert rep.returncode == 0, rep.stderr
        assert json.loads(rep.stdout)["identical"]


def test_replay_of_a_run_whose_data_file_changed_diverges(tmp_path: Path, cli) -> None:
    X, y = regression()
    data = write(tmp_path, X, y, "csv")
    trace = tmp_path / "t.sqlite"
    params = ["-p", f"data={data}", "-p", "iterations=5", "-p", "compare=false"]
    assert cli("run", "lasso", *params, "--trace", trace).returncode == 0
    X[7, 1] += 1e-9
    write(tmp_path, X, y, "csv")
    rep = cli("cluster", trace, "--json")
    assert rep.returncode == 3
    assert json.loads(rep.stdout)["first_difference"]["dds"] == "X"


@pytest.mark.parametrize(
    "app,text,message",
    [
        ("lasso", "a,b,y\n1,2,3\n4,5\n", "t.csv:3: 2 fields, but line 2 has 3"),
        ("mlr", "a,label\n1,2\n2,2.5\n", "t.csv:3: label 2.5 is not an integer"),
        ("mlr", "1,0\n2,1\n", "has 2 rows; need at least 3"),
        ("lasso", "1,5,2\n2,5,3\n3,5,1\n", "feature column 2 is constant"),
    ],
)
def test_bad_data_on_the_cli_is_one_line_and_exit_2(
    tmp_path: Path, app: str, text: str, message: str, cli
) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text)
    proc = cli("run", app, "-p", f"data={path}", "--no-trace")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and message in errors[0], proc.stderr


def test_mlr_tests_on_the_users_test_table(tmp_path: Path, cli) -> None:
    X, y = blobs()
    data = write(tmp_path, X[:60], y[:60], "csv")
    (tmp_path / "t").mkdir()
    test = write(tmp_path / "t", X[60:], y[60:], "svm")
    res = ap.run(mlr, {"epochs": 3, "data": str(data), "test": str(test)})
    assert res.value["train"] == 60 and res.value["test"] == 20
    assert res.value["test_accuracy"] >= 0.9 and res.value["classes"] == [10, 20, 30]
    test.write_text("10 1:1\n40 2:1\n")
    proc = cli("run", "mlr", "-p", f"data={data}", "-p", f"test={test}", "--no-trace")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{test}:2: label 40.0 is not a class of the training data (10, 20, 30)" in proc.stderr
    proc = cli("run", "mlr", "-p", f"test={test}", "--no-trace")
    assert proc.returncode == 2 and "mlr: test needs data" in proc.stderr
