"""The trained model and the app's result out of a run: ``replay run --save``, the
``result`` of ``--json`` and its short line, and the convergence warning.

A built-in app names its model in two places of its module: ``train`` returns it as
``result["model"]`` (DDS and plain arrays such as a vocabulary), and ``MODEL_DDS`` says
which saved array is which DDS, so that an export rebuilds the same arrays from a
checkpoint's rows.  ``EMBEDDING`` (vectors, words) is what a ``.txt`` file holds.  A
user's program gets ``--save`` by returning ``{"model": {...}}`` the same way.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

import engine
from engine.lowlevel import model_format

from ._apps import BUILTIN_APPS
from ._errors import UsageError
from ._paths import check_output

#: Array elements a JSON result keeps as a list; a larger array is summarised.
JSON_ARRAY_LIMIT = 16
#: Characters of the plain output's ``result:`` line before it is cut.
RESULT_LINE = 160


# ====================================================================== an app's model
def _module(fn: Callable[..., Any]) -> Any:
    return sys.modules.get(fn.__module__)


def embedding_of(fn: Callable[..., Any]) -> tuple[str, str] | None:
    """(vectors, words): the arrays of ``fn``'s model a ``.txt`` save holds, if it says."""
    emb = getattr(_module(fn), "EMBEDDING", None)
    return (str(emb[0]), str(emb[1])) if emb else None


def check_save(path: str, app: str, trace: str | None) -> str:
    """``--save PATH`` refused before the run starts (one line), or made absolute."""
    try:
        fmt = model_format(path)
    except engine.SaveError as exc:
        raise UsageError(f"--save: {exc}") from None
    check_output(path, force=True, reading=[trace] if trace else [], option="--save")
    if fmt == ".txt" and app in BUILTIN_APPS:
        from ._apps import resolve

        if embedding_of(resolve(app).fn) is None:
            raise UsageError(
                f"--save {path}: {app} has no word embedding for the word2vec text format; "
                "save to .npz"
            )
    return os.path.abspath(path)


def saving(fn: Callable[..., Any], path: str, name: str) -> Callable[..., Any]:
    """``fn`` that, once trained, writes its ``result["model"]`` to ``path`` with ``ap.save``
    (in the run, so the DDS are gathered by their owners)."""
    emb = embedding_of(fn)

    @functools.wraps(fn)
    def train_and_save(**params: Any) -> Any:
        value = fn(**params)
        model = value.get("model") if isinstance(value, dict) else None
        if not isinstance(model, dict) or not model:
            raise UsageError(
                f"--save: {name} returned no model; return {{'model': {{'W': W, ...}}}} "
                "from it, or call ap.save(path, W=W, ...) in it"
            )
        if emb is not None and model_format(path) == ".txt":
            model = {k: model[k] for k in emb}
        engine.save(path, **model)
        return value

    return train_and_save


# ====================================================================== the result
def _summary(v: Any) -> dict[str, Any]:
    if isinstance(v, engine.dvector):
        return {"shape": [len(v), *(v.shape or ())], "dtype": str(v.dtype)}
    arr = np.asarray(v)
    return {"shape": list(arr.shape), "dtype": str(arr.dtype)}


def jsonable(value: Any, depth: int = 0) -> Any:
    """``value`` made JSON-safe: numpy scalars as numbers, non-finite floats as null,
    small arrays as lists, larger ones (and DDS) as their shape and dtype."""
    if depth > 8:
        return repr(value)[:80]
    if isinstance(value, dict):
        return {str(k): jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, depth + 1) for v in value[: JSON_ARRAY_LIMIT * 16]]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, np.ndarray) and value.size <= JSON_ARRAY_LIMIT:
        return jsonable(value.tolist(), depth + 1)
    if isinstance(value, (np.ndarray, engine.dvector)):
        return dict(_summary(value), note="omitted; write it with --save")
    return repr(value)[:80]


def result_json(value: Any) -> Any:
    """The app's return value for ``--json``: its ``model`` as the shape and dtype of each
    array (``--save`` writes them)."""
    if isinstance(value, dict) and isinstance(value.get("model"), dict):
        model = {str(k): _summary(v) for k, v in value["model"].items()}
        rest = jsonable({k: v for k, v in value.items() if k != "model"})
        return dict(rest, model=model)
    return jsonable(value)


def converged(result: Any) -> bool | None:
    """What the app's result says of convergence (None: it says nothing)."""
    if isinstance(result, dict) and isinstance(result.get("converged"), bool):
        return bool(result["converged"])
    return None


def result_line(result: Any) -> str | None:
    """``result: name=value ...`` of the scalars the app returned, cut to one line."""
    if not isinstance(result, dict):
        return None if result is None else f"result: {str(result)[:RESULT_LINE]}"
    parts = []
    for k, v in result.items():
        if isinstance(v, bool) or v is None:
            parts.append(f"{k}={str(v).lower()}")
        elif isinstance(v, float):
            parts.append(f"{k}={v:.6g}")
        elif isinstance(v, (int, str)):
            parts.append(f"{k}={v}")
    if not parts:
        return None
    line = "result: " + " ".join(parts)
    return line if len(line) <= RESULT_LINE else line[: RESULT_LINE - 3] + "..."


def convergence_warning(app: str, result: Any) -> str | None:
    """One line when the result says the solver stopped before its tolerance."""
    if converged(result) is not False:
        return None
    rounds = result.get("iterations")
    after = f" after {rounds} rounds" if isinstance(rounds, int) else ""
    kkt, tol = result.get("kkt"), result.get("tolerance")
    why = ""
    if isinstance(kkt, (int, float)) and isinstance(tol, (int, float)):
        why = f" (KKT {kkt:.3g} > {tol:.2g})"
    return f"replay: {app} stopped{after} without converging{why}"


__all__ = [
    "check_save",
    "convergence_warning",
    "converged",
    "result_json",
    "result_line",
    "saving",
]
