"""``ap.save``: a trained model out, in formats a user loads without this project.

Two formats, chosen by the file name:

* ``.npz`` (numpy's archive): one array per keyword, named after it; strings are stored
  as numpy unicode arrays, never as pickled objects, so ``numpy.load(path)`` reads it
  with its default ``allow_pickle=False``;
* ``.txt`` (gensim's word2vec text format, for embeddings): a header ``N DIM``, then one
  line ``word v1 v2 ... vDIM`` per row.  It holds one table, so it takes exactly one
  2-D numeric array and one array of ``N`` words.

The writing half (:func:`write_model`) is a pure function of arrays, so
``replay export --model`` writes a checkpoint's model with the same code.  Files are
replaced atomically through :func:`engine._files.replacing`, which refuses links,
directories, devices and trace stores as ``ap.store`` does.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import OutputPathError, SaveError
from .._files import check_target, check_writable, replacing
from .._runtime.session import current, driver_only
from .dds import _DDS, dvector, gathered

#: File name endings :func:`save` writes, and what each holds.
FORMATS = {".npz": "numpy arrays", ".txt": "gensim word2vec text"}


def model_format(path: str | os.PathLike[str]) -> str:
    """``".npz"`` or ``".txt"`` from ``path``'s ending; anything else is a :class:`SaveError`."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        kinds = ", ".join(f"{k} ({v})" for k, v in FORMATS.items())
        raise SaveError(f"cannot save a model to {os.fspath(path)!r}: name it {kinds}")
    return suffix


def _array(name: str, value: Any) -> np.ndarray:
    """``value`` as an array ``numpy.load`` reads without pickle."""
    if not name.isidentifier():
        raise SaveError(f"ap.save: array name {name!r} is not a Python identifier")
    arr = np.asarray(value)
    if arr.dtype == object:
        if not all(isinstance(v, str) for v in arr.ravel().tolist()):
            raise SaveError(
                f"ap.save: {name} holds Python objects, which numpy.load could only read with "
                "allow_pickle=True: pass numbers or strings"
            )
        arr = arr.astype(str)
    if arr.dtype.kind not in "biufcU":
        raise SaveError(f"ap.save: {name} has dtype {arr.dtype}, not numbers or strings")
    if arr.dtype.kind == "U" and isinstance(value, list | tuple | np.ndarray):
        given = np.asarray(value, dtype=object).ravel().tolist()
        for i, (w, kept) in enumerate(zip(given, arr.ravel().tolist(), strict=True)):
            if isinstance(w, str) and w != kept:  # numpy drops a string's trailing NULs
                raise SaveError(
                    f"ap.save: {name}[{i}] = {w!r} ends with a NUL character, which numpy's "
                    "string arrays drop; remove it from the name"
                )
    return arr


def _embedding(arrays: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(vectors, words) of a ``.txt`` save: one 2-D numeric array and one of strings."""
    tables = [k for k, a in arrays.items() if a.ndim == 2 and a.dtype.kind in "biuf"]
    words = [k for k, a in arrays.items() if a.ndim == 1 and a.dtype.kind == "U"]
    if len(arrays) != 2 or len(tables) != 1 or len(words) != 1:
        raise SaveError(
            f"the word2vec text format holds one embedding: a 2-D array of vectors and an "
            f"array of its words, got {', '.join(arrays) or 'nothing'}; save to .npz instead"
        )
    vec, word = arrays[tables[0]], arrays[words[0]]
    if len(vec) != len(word):
        raise SaveError(
            f"the word2vec text format needs one word per vector: {tables[0]} has "
            f"{len(vec)} rows, {words[0]} {len(word)} words"
        )
    for i, w in enumerate(word.tolist()):
        why = text_word_problem(w)
        if why is not None:
            raise SaveError(
                f"{words[0]}[{i}] = {w!r} {why}, which the word2vec text format cannot "
                "hold; save to .npz instead"
            )
    return vec, word


def text_word_problem(word: str) -> str | None:
    """Why ``word`` cannot be a word of the word2vec text format (None: it can).  gensim
    reads a line as the word and the numbers between single spaces, so a word may hold no
    white space (nor, being a line, a line break), and an empty one reads as none; numpy's
    string arrays, which hold the words before they are written, drop trailing NULs."""
    if not word:
        return "is empty"
    if word != "".join(word.split()):
        return "holds white space"
    if word.endswith("\x00"):
        return "ends with a NUL character"
    return None


def prepare_model(path: str | os.PathLike[str], arrays: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``arrays`` checked for ``path``'s format and made loadable without pickle (a
    :class:`SaveError` names what cannot be written)."""
    fmt = model_format(path)
    if not arrays:
        raise SaveError("ap.save: no arrays to save; pass them as keywords (W=W, H=H)")
    out = {k: _array(k, v) for k, v in arrays.items()}
    if fmt == ".txt":
        _embedding(out)
    return out


def _write_npz(fh: Any, arrays: Mapping[str, np.ndarray]) -> None:
    """What ``np.savez(fh, **arrays)`` writes (one stored ``NAME.npy`` member per array),
    for any identifier: ``savez`` takes its own ``file`` and ``allow_pickle`` out of the
    keywords, so an array with either name failed or was silently left out."""
    with zipfile.ZipFile(fh, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, arr in arrays.items():
            with zf.open(name + ".npy", mode="w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(arr), allow_pickle=False)


def write_model(
    path: str | os.PathLike[str],
    arrays: Mapping[str, Any],
    *,
    force: bool = True,
    label: str | None = None,
) -> Path:
    """Write ``arrays`` to ``path`` (``.npz`` or word2vec ``.txt``), replacing it atomically."""
    out = prepare_model(path, arrays)
    check_target(path, force=force, label=label)  # before the work of formatting
    with replacing(path, force=force, label=label) as fh:
        if model_format(path) == ".npz":
            _write_npz(fh, out)
            return Path(path)
        vec, words = _embedding(out)
        cell = "%.9g" if vec.dtype.itemsize <= 4 else "%.17g"
        flat = vec.reshape(len(vec), -1)
        fh.write(f"{flat.shape[0]} {flat.shape[1]}\n".encode())
        for w, row in zip(words.tolist(), flat.tolist(), strict=True):
            fh.write((w + " " + " ".join(cell % v for v in row) + "\n").encode())
    return Path(path)


def save(path: str | os.PathLike[str], /, **arrays: Any) -> Path:
    """Write a trained model (DDS or arrays, by keyword) to ``.npz`` or word2vec ``.txt``.

    A collective driver operation: every rank calls it, the DDS are gathered and rank 0
    writes the file, replaced atomically; a link, directory, device or trace store is
    never written (:class:`OutputPathError`).  A user loads the result with numpy alone::

        ap.save("model.npz", W=W, H=H)          # numpy.load("model.npz")["W"]
        ap.save("vectors.txt", vectors=E, vocab=words)   # gensim's text format
    """
    driver_only("ap.save")
    sess = current()
    model_format(path)
    if sess.fast_forward is not None:
        # a replay fast-forwarding to a checkpoint skipped the bodies that computed these
        # values: writing them would put another model than the recorded run's in the file
        return Path(path)
    problem = None
    if sess.cluster.rank == 0:  # only rank 0 writes: its verdict on the path stops them all
        try:
            check_target(path, force=True, label=f"ap.save path {os.fspath(path)}")
            check_writable(path, label=f"ap.save path {os.fspath(path)}")
        except OutputPathError as exc:
            problem = str(exc)
    verdicts = sess.agree("ap.save", problem)
    if verdicts[0] is not None:
        raise OutputPathError(verdicts[0])
    values: dict[str, Any] = {}
    for name, v in arrays.items():
        if isinstance(v, dvector):
            values[name] = gathered(v)
        elif isinstance(v, _DDS):
            raise SaveError(f"ap.save: {name} is a {v.kind}; pass a dvector or an array")
        else:
            values[name] = v
    # every rank holds the same values: a model that cannot be written fails on all alike
    prepared = prepare_model(path, values)
    out = Path(path)
    if sess.cluster.rank == 0:
        write_model(out, prepared, force=True, label=f"ap.save path {out}")
    sess.cluster.barrier()
    return out


__all__ = ["FORMATS", "model_format", "prepare_model", "save", "write_model"]
