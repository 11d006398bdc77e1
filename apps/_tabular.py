"""A user's table of numbers for Lasso and MLR (``-p data=PATH``): features, then the target.

The format comes from the file's suffix, as the ecosystem's tools write them:

* ``.csv`` / ``.tsv``: one row per line, numeric fields, the target in the last column; a
  first line with a non-numeric field is a header and is skipped (blank lines too);
* ``.npz`` with arrays ``X`` (rows x features) and ``y`` (one target per row), or ``.npy``,
  one 2-D array whose last column is the target (read with ``allow_pickle=False``: opening
  data never runs code from it);
* ``.svm`` / ``.libsvm`` / ``.txt``: LibSVM / SVMlight, ``label index:value ...`` with
  1-based indices, absent features zero, ``#`` starting a comment.

Every failure is one :class:`~apps._errors.DataFormatError` (or, for a missing or
unreadable file, :class:`~apps._errors.AppError`) naming the file and, in a text file,
the line.  Text is read through :func:`apps._datasets.read_utf8` and every number through
:func:`apps._datasets.parse_number`, the helpers the rating files use.
"""

from __future__ import annotations

import csv
import os
import pathlib
import zipfile
from dataclasses import dataclass

import numpy as np

from engine.lowlevel import available_memory

from ._datasets import open_data, parse_number, read_utf8, text_lines
from ._errors import AppError, DataFormatError

#: Suffix -> format of ``-p data=``.
FORMATS = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".npz": "npz",
    ".npy": "npy",
    ".svm": "libsvm",
    ".libsvm": "libsvm",
    ".txt": "libsvm",
}


@dataclass(frozen=True)
class Table:
    """Rows of features ``X`` (float64, rows x features) and targets ``y`` (float64)."""

    X: np.ndarray
    y: np.ndarray
    path: str
    #: 1-based line of every row in a text file; None for numpy files.
    lines: np.ndarray | None = None

    def where(self, row: int) -> str:
        """Where row ``row`` (0-based) is, for a message: ``path:line`` or ``path row N``."""
        if self.lines is None:
            return f"{self.path} row {row + 1}"
        return f"{self.path}:{int(self.lines[row])}"


def read_table(path: str | os.PathLike[str], who: str) -> Table:
    """The table of ``path`` in the format its suffix names; ``who`` (the app) starts
    every error message.  At least one row and one feature column, every value finite."""
    p = pathlib.Path(path)
    kind = FORMATS.get(p.suffix.lower())
    if kind is None:
        known = ", ".join(FORMATS)
        raise AppError(f"{who}: data {str(p)!r}: unknown format {p.suffix!r}; use one of {known}")
    if kind in ("npz", "npy"):
        table = _read_numpy(p, kind, who)
    else:
        fix = f"give a {kind.upper() if kind != 'libsvm' else 'LibSVM'} text file"
        text = read_utf8(p, f"{who}: data", fix)
        table = (
            _read_libsvm(p, text, who) if kind == "libsvm" else _read_delimited(p, text, kind, who)
        )
    if len(table.y) == 0:
        raise DataFormatError(f"{who}: data {str(p)!r} has no rows")
    if table.X.shape[1] == 0:
        raise DataFormatError(
            f"{who}: data {str(p)!r} has no feature columns (features first, the target last)"
        )
    return table


def read_test_table(path: str | os.PathLike[str], who: str, features: int) -> Table:
    """The user's test table for a model of ``features`` features: a LibSVM file may end
    before the last features (they are zero in every row there); any other width is a
    :class:`DataFormatError`."""
    table = read_table(path, who)
    width = table.X.shape[1]
    if width < features and FORMATS[pathlib.Path(path).suffix.lower()] == "libsvm":
        X = np.zeros((len(table.y), features))
        X[:, :width] = table.X
        return Table(X, table.y, table.path, table.lines)
    if width != features:
        raise DataFormatError(
            f"{who}: test data {table.path!r} has {width} feature columns, the training "
            f"data {features}"
        )
    return table


def class_labels(table: Table, who: str) -> tuple[np.ndarray, np.ndarray]:
    """(class index 0..K-1 of every row, the K labels in sorted order): class ``k`` is
    label ``labels[k]``.  A label that is not an integer, or fewer than two classes, is a
    :class:`DataFormatError`."""
    y = table.y
    bad = np.flatnonzero(y != np.floor(y))
    if len(bad):
        i = int(bad[0])
        raise DataFormatError(
            f"{who}: {table.where(i)}: label {float(y[i])!r} is not an integer "
            "(the last column holds class labels)"
        )
    labels = np.unique(y)
    if len(labels) < 2:
        raise DataFormatError(f"{who}: data {table.path!r} has one class only; need two or more")
    return np.searchsorted(labels, y).astype(np.int64), labels.astype(np.int64)


def labels_of(table: Table, labels: np.ndarray, who: str) -> np.ndarray:
    """The class index of every row of a test ``table`` whose classes are ``labels`` (the
    training data's): a label outside them is a :class:`DataFormatError`."""
    y = table.y
    k = np.minimum(np.searchsorted(labels, y), len(labels) - 1)
    bad = np.flatnonzero(labels[k] != y)
    if len(bad):
        i = int(bad[0])
        known = ", ".join(str(int(v)) for v in labels)
        raise DataFormatError(
            f"{who}: {table.where(i)}: label {float(y[i])!r} is not a class of the training "
            f"data ({known})"
        )
    return k.astype(np.int64)


# ----------------------------------------------------------------------------- text formats
def _read_delimited(p: pathlib.Path, text: str, kind: str, who: str) -> Table:
    delim = "," if kind == "csv" else "\t"
    body: list[str] = []
    lines: list[int] = []
    width = 0
    first = True
    all_lines = text_lines(text)
    for lineno, line in enumerate(all_lines, start=1):
        if not line.strip():
            continue
        # the csv module only where a field may be quoted: it is 3x slower than split
        fields = next(csv.reader([line], delimiter=delim)) if '"' in line else line.split(delim)
        if first:
            first = False
            if not all(_is_number(f) for f in fields):
                continue  # the header
        if not width:
            width = len(fields)
            if width < 2:
                raise DataFormatError(
                    f"{who}: {p}:{lineno}: one column only; need the features, then the target"
                )
        elif len(fields) != width:
            raise DataFormatError(
                f"{who}: {p}:{lineno}: {len(fields)} fields, but line {lines[0]} has {width}"
            )
        body.append(line)
        lines.append(lineno)
    if not body:
        return Table(np.zeros((0, 1)), np.zeros(0), str(p), np.zeros(0, dtype=np.int64))
    try:
        # numpy's C parser: 3.5x faster than float() per field on 100,000 x 21 values
        a = np.loadtxt(body, delimiter=delim, quotechar='"', comments=None, ndmin=2)
    except ValueError:  # a field that is not a number (for float): find it, and say which
        rows = []
        for lineno, line in zip(lines, body, strict=True):
            fields = next(csv.reader([line], delimiter=delim))
            try:
                rows.append([float(f) for f in fields])
            except ValueError:
                _field_error(p, lineno, fields, who)
        a = np.array(rows, dtype=np.float64)
    a = a.reshape(len(body), max(width, 1))
    bad = np.argwhere(~np.isfinite(a))
    if len(bad):  # float() reads nan and inf: parse_number says which field it was
        lineno = lines[int(bad[0][0])]
        line = all_lines[lineno - 1]
        fields = next(csv.reader([line], delimiter=delim))
        _field_error(p, lineno, fields, who)
    return Table(a[:, :-1], a[:, -1].copy(), str(p), np.array(lines, dtype=np.int64))


def _field_error(p: pathlib.Path, lineno: int, fields: list[str], who: str) -> None:
    """Raise the :class:`DataFormatError` of the first field of a line that
    :func:`parse_number` refuses (the fast path found that one does)."""
    try:
        for c, f in enumerate(fields, start=1):
            parse_number(f"column {c}", f)
    except ValueError as exc:
        raise DataFormatError(f"{who}: {p}:{lineno}: {exc}") from None
    raise AssertionError(f"{p}:{lineno}: every field parsed the second time")  # pragma: no cover


def _is_number(field: str) -> bool:
    try:
        float(field)
    except ValueError:
        return False
    return True


def _read_libsvm(p: pathlib.Path, text: str, who: str) -> Table:
    labels: list[float] = []
    feats: list[dict[int, float]] = []
    lines: list[int] = []
    for lineno, line in enumerate(text_lines(text), start=1):
        body = line.split("#", 1)[0].split()
        if not body:
            continue
        try:
            labels.append(parse_number("label", body[0]))
            feats.append(_libsvm_features(body[1:]))
        except ValueError as exc:
            raise DataFormatError(f"{who}: {p}:{lineno}: {exc}") from None
        lines.append(lineno)
    widest = max(range(len(feats)), key=lambda r: max(feats[r], default=0), default=0)
    width = max(feats[widest], default=0) if feats else 0
    _check_dense(p, lines[widest] if lines else 0, len(feats), width, who)
    X = np.zeros((len(feats), width))
    for r, f in enumerate(feats):
        if f:
            X[r, np.fromiter(f, dtype=np.int64) - 1] = list(f.values())
    return Table(X, np.array(labels), str(p), np.array(lines, dtype=np.int64))


def _check_dense(p: pathlib.Path, lineno: int, rows: int, width: int, who: str) -> None:
    """Refuse a LibSVM file whose dense table (``rows`` x its largest index) needs more
    memory than the machine has free: one index with a few digits too many would
    otherwise fail in numpy, naming neither file nor line, or thrash the machine."""
    need, have = rows * width * 8, available_memory()
    if have is not None and need > have:
        raise DataFormatError(
            f"{who}: {p}:{lineno}: feature index {width:,} makes the table {rows:,} x "
            f"{width:,} ({need / 2**30:,.1f} GiB as float64), more than the "
            f"{have / 2**30:.1f} GiB of memory this machine has free; check the index "
            "(the largest index is the number of features)"
        )


def _libsvm_features(tokens: list[str]) -> dict[int, float]:
    out: dict[int, float] = {}
    for tok in tokens:
        idx, sep, val = tok.partition(":")
        if not sep:
            raise ValueError(f"expected INDEX:VALUE, got {tok!r}")
        try:
            i = int(idx)
        except ValueError:
            raise ValueError(f"feature index {idx!r} is not an integer") from None
        if i < 1:
            raise ValueError(
                f"feature index {i} is not positive (LibSVM indices start at 1; "
                "scikit-learn's dump_svmlight_file writes them with zero_based=False)"
            )
        if i in out:
            raise ValueError(f"feature index {i} appears twice")
        out[i] = parse_number(f"value of feature {i}", val)
    return out


# ---------------------------------------------------------------------------- numpy formats
def _read_numpy(p: pathlib.Path, kind: str, who: str) -> Table:
    what = f"{who}: data {str(p)!r}"
    fh, size = open_data(p, f"{who}: data")  # numpy reads through this handle
    with fh:
        if size == 0:
            raise DataFormatError(f"{what} is empty")
        try:
            loaded = np.load(fh, allow_pickle=False)
            if isinstance(loaded, np.lib.npyio.NpzFile):
                with loaded:
                    if kind != "npz":
                        raise DataFormatError(f"{what} is an .npz archive; name it .npz")
                    X, y = _npz_arrays(loaded, what)
            else:
                X, y = _npy_arrays(np.asarray(loaded), what, kind)
        except DataFormatError:
            raise
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
            # numpy's own words advise allow_pickle=True, and loading a pickle runs code
            # from the file, which a data file must never choose: never repeat them
            if "Object arrays" in str(exc):
                raise DataFormatError(
                    f"{what} holds Python objects (a pickled array), which are never loaded "
                    "from a data file; save a numeric array (np.save(path, X.astype(float)))"
                ) from None
            why = "not numpy's .npy or .npz format" if "allow_pickle" in str(exc) else exc
            raise DataFormatError(f"{what} is not a readable {kind} file ({why})") from None
        except MemoryError as exc:
            # numpy allocates what an array's header claims before it reads a byte: a
            # damaged or forged header (or data too large) fails here, not in the run
            raise DataFormatError(
                f"{what}: an array's header asks for more memory than this machine has "
                f"({exc}); the file is damaged, or too large to load here"
            ) from None
    table = Table(X, y, str(p))
    _check_finite(table, who)
    return table


def _npz_arrays(loaded: np.lib.npyio.NpzFile, what: str) -> tuple[np.ndarray, np.ndarray]:
    missing = [k for k in ("X", "y") if k not in loaded.files]
    if missing:
        have = ", ".join(loaded.files) or "none"
        raise DataFormatError(f"{what} has no array {missing[0]!r} (it has: {have}); need X and y")
    X, y = _numeric(loaded["X"], "X", what), _numeric(loaded["y"], "y", what)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if X.ndim != 2 or y.ndim != 1:
        raise DataFormatError(
            f"{what}: X must be 2-D and y 1-D, got shapes {X.shape} and {y.shape}"
        )
    if len(X) != len(y):
        raise DataFormatError(f"{what}: X has {len(X)} rows but y has {len(y)}")
    return X, y


def _npy_arrays(a: np.ndarray, what: str, kind: str) -> tuple[np.ndarray, np.ndarray]:
    if kind != "npy":
        raise DataFormatError(f"{what} is a single array, not an .npz archive; name it .npy")
    a = _numeric(a, "the array", what)
    if a.ndim != 2 or a.shape[1] < 2:
        raise DataFormatError(
            f"{what}: need a 2-D array with at least 2 columns (features, then the target), "
            f"got shape {a.shape}"
        )
    return a[:, :-1], a[:, -1].copy()


def _numeric(a: np.ndarray, name: str, what: str) -> np.ndarray:
    if a.dtype.kind not in "biuf":
        raise DataFormatError(f"{what}: {name} holds {a.dtype} values, not numbers")
    return np.ascontiguousarray(a, dtype=np.float64)


def _check_finite(table: Table, who: str) -> None:
    for name, a in (("X", table.X), ("y", table.y)):
        bad = np.argwhere(~np.isfinite(a))
        if len(bad):
            row = int(bad[0][0])
            col = f" column {int(bad[0][1]) + 1}" if a.ndim == 2 else ""
            raise DataFormatError(
                f"{who}: {table.where(row)}: {name}{col} is {float(a[tuple(bad[0])])!r}, not finite"
            )


__all__ = ["FORMATS", "Table", "class_labels", "labels_of", "read_table", "read_test_table"]
