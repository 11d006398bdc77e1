"""The trained model and the app's result out of a run: ``replay run --save``, the
``result`` of ``--json`` and its short line, the convergence warning, and
``replay export --model`` (a recorded checkpoint's model, from the trace alone).

A built-in app names its model in two places of its module: ``train`` returns it as
``result["model"]`` (DDS and plain arrays such as a vocabulary), and ``MODEL_DDS`` says
which saved array is which DDS, so that an export rebuilds the same arrays from a
checkpoint's rows.  ``EMBEDDING`` (vectors, words) is what a ``.txt`` file holds.  A
user's program gets ``--save`` by returning ``{"model": {...}}`` the same way.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

import engine
import tracer
from engine.lowlevel import model_format, text_word_problem, write_model

from ._apps import BUILTIN_APPS
from ._errors import UsageError
from ._paths import check_output
from ._timetravel import program_order, require_checkpoints

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


def check_save(
    path: str,
    app: str,
    trace: str | None,
    *,
    params: Mapping[str, Any] | None = None,
    writer: bool = True,
) -> str:
    """``--save PATH`` refused before the run starts (one line), or made absolute.  Only
    the ``writer`` (rank 0 under a user's mpiexec) looks at the path: the other ranks
    may run on hosts without its directory.  ``params`` are the run's parameters: a
    path one of them names is the run's data, which the model must not replace."""
    try:
        fmt = model_format(path)
    except engine.SaveError as exc:
        raise UsageError(f"--save: {exc}") from None
    if writer:
        check_output(path, force=True, reading=[trace] if trace else [], option="--save")
        for name, value in (params or {}).items():
            if _same_file(path, value):
                raise UsageError(
                    f"--save {path} is the file -p {name}= names, the run's data (and its "
                    "replay's); writing there would destroy it: pass another path"
                )
    if fmt == ".txt" and app in BUILTIN_APPS:
        from ._apps import resolve

        fn = resolve(app).fn
        if embedding_of(fn) is None:
            raise UsageError(
                f"--save {path}: {app} has no word embedding for the word2vec text format; "
                "save to .npz"
            )
        if writer:
            _check_words(path, app, fn, params or {})
    return os.path.abspath(path)


def _check_words(path: str, app: str, fn: Callable[..., Any], params: Mapping[str, Any]) -> None:
    """Refuse, before any training, a ``.txt`` save whose words the format cannot hold:
    the app's ``embedding_words(**params)`` reads them from its data (an app whose words
    are tokens split at white space, as word2vec's, need not say)."""
    from ._apps import parse_params

    words_of = getattr(_module(fn), "embedding_words", None)
    if words_of is None:
        return
    values = parse_params(fn, [f"{k}={v}" for k, v in params.items()])
    for word in words_of(**values):
        why = text_word_problem(word)
        if why is not None:
            raise UsageError(
                f"--save {path}: {app}'s word {word!r} {why}, which the word2vec text "
                "format cannot hold (gensim could not read the file back); save to .npz, "
                "which keeps every name"
            )


def _same_file(path: str, value: Any) -> bool:
    """Whether the existing file ``path`` is the file a parameter ``value`` names."""
    if not isinstance(value, str) or not value:
        return False
    try:
        return os.path.isfile(value) and os.path.samefile(path, value)
    except (OSError, ValueError):  # absent, unreadable, or a name with a NUL byte
        return False


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
    small arrays as lists, larger ones (and DDS) as their shape and dtype, lists cut at
    256 items, anything else as a short ``repr``."""
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
    if isinstance(result, dict) and isinstance(result.get("converged"), (bool, np.bool_)):
        return bool(result["converged"])
    return None


def result_line(result: Any) -> str | None:
    """``result: name=value ...`` of the scalars the app returned, cut to one line."""
    if not isinstance(result, dict):
        return None if result is None else "result: " + " ".join(str(result).split())
    parts = []
    for k, v in result.items():
        if isinstance(v, bool) or v is None:  # as --json says them (null: also not finite)
            parts.append(f"{k}={json.dumps(v)}")
        elif isinstance(v, float):
            parts.append(f"{k}={v:.6g}")
        elif isinstance(v, (int, str)):
            parts.append(f"{k}={' '.join(str(v).split())}")  # one line, whatever it holds
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


# ====================================================================== export
def _checkpoint_arrays(state: Any) -> dict[str, np.ndarray]:
    """Every numeric DDS of a checkpoint as one array in index order.  The rows come from
    the trace: each slot must be present exactly once (so the array is no bigger than the
    rows decoded), else the trace is damaged."""
    out = {}
    for dds, (slots, values) in state.rows.items():
        if not isinstance(values, np.ndarray):
            continue  # Python objects are not model arrays
        n = int(state.lengths.get(dds, -1))
        slots = np.asarray(slots, dtype=np.int64).ravel()
        inside = not len(slots) or (slots.min() >= 0 and slots.max() < n)
        if n != len(slots) or len(values) != n or len(np.unique(slots)) != n or not inside:
            raise tracer.TraceFormatError(
                f"the checkpoint at {state.op}#{state.invocation} does not hold every row of "
                f"{dds} once ({len(slots)} rows for {n} elements); the trace is damaged"
            )
        full = np.empty_like(values)
        full[slots] = values
        out[dds] = full
    return out


def _builtin_model(
    app: str, target: str
) -> tuple[dict[str, str], tuple[str, str] | None, tuple[str, ...]] | None:
    """(MODEL_DDS, EMBEDDING, MODEL_DATA) of a built-in app named in the trace (only a name of the
    fixed table is ever imported), or None for a user's program."""
    if BUILTIN_APPS.get(app) != target:
        return None
    from ._apps import resolve

    fn = resolve(app).fn
    mod = _module(fn)
    data = tuple(str(x) for x in getattr(mod, "MODEL_DATA", ()))
    return dict(getattr(mod, "MODEL_DDS", {})), embedding_of(fn), data


def _model_arrays(
    rows: dict[str, np.ndarray], app: str, target: str, cp: Any, path: str, notes: list[str]
) -> dict[str, np.ndarray]:
    """The arrays ``--save`` would have written, as far as the checkpoint's ``rows`` hold
    them (what they cannot give is added to ``notes``)."""
    known = _builtin_model(app, target)
    arrays: dict[str, np.ndarray] = {}
    if known is None:  # a user's program: every numeric DDS by its name
        for dds, a in rows.items():
            if dds.isidentifier():
                arrays[dds] = a
            else:
                notes.append(f"DDS {dds!r} left out: its name is not an identifier")
        return arrays
    names, emb, extra = known
    refused = dict(cp.refused)
    for name, dds in names.items():
        if dds not in rows:
            why = refused.get(dds, "not in the checkpoint")
            raise UsageError(f"the checkpoint at {cp.op}#{cp.invocation} lacks {dds}: {why}")
        arrays[name] = rows[dds]
    if model_format(path) == ".npz":
        if extra:
            notes.append(
                f"not in the trace (the data, not DDS): {', '.join(extra)}; "
                "'replay run --save' writes them"
            )
        return arrays
    if emb is None:
        raise UsageError(f"--model {path}: {app} has no word embedding; export to .npz")
    vectors, words = emb
    notes.append(
        f"the trace holds no {words} (the data, not a DDS): each word is its row "
        "number; 'replay run --save' writes the words"
    )
    return {
        vectors: arrays[vectors],
        words: np.array([str(i) for i in range(len(arrays[vectors]))]),
    }


def export_model(
    trace_path: str, run_id: str | None, path: str, checkpoint: int | None, *, force: bool
) -> tuple[str, list[str]]:
    """Write the model of a recorded checkpoint (default: the last) to ``path``; return
    what was written and notes on what the trace could not give."""
    try:
        model_format(path)
    except engine.SaveError as exc:
        raise UsageError(f"--model: {exc}") from None
    check_output(
        path, force=force, reading=[] if tracer.is_url(trace_path) else [trace_path],
        option="--model",
    )  # fmt: skip
    notes: list[str] = []
    with tracer.open(trace_path) as trace:
        run = trace.run(run_id)
        problem = trace.verify(run.info.run_id, full=True).problem
        if problem is not None:
            raise UsageError(
                f"{tracer.describe(trace_path)} run {run.info.run_id} is damaged: "
                f"{problem.line()}; run 'replay verify' for details"
            )
        cps = require_checkpoints(run)
        k = len(cps) - 1 if checkpoint is None else checkpoint
        if not 0 <= k < len(cps):
            raise UsageError(
                f"--checkpoint {checkpoint}: run {run.info.run_id[:12]} has checkpoints 0 to "
                f"{len(cps) - 1} (see 'replay show')"
            )
        cp = cps[k]
        state = run.checkpoint_state(cp.op, cp.invocation)
        app, target = run.info.app, run.info.target
        order = program_order(run)
        later = len(order) - 1 - order.index((cp.op, cp.invocation)) if order else 0
        if checkpoint is None and later > 0:
            # the last checkpoint need not follow the last invocation (checkpoints every
            # N, or the measured default): "the last" is then not the trained model
            last_op, last_inv = order[-1]
            notes.append(
                f"the run went on for {later} loop invocation(s) after this checkpoint, to "
                f"{last_op}#{last_inv}, which no checkpoint follows: this is not its final "
                "model ('replay run --save PATH' writes that)"
            )
    arrays = _model_arrays(_checkpoint_arrays(state), app, target, cp, path, notes)
    if not arrays:
        raise UsageError(f"the checkpoint at {cp.op}#{cp.invocation} holds no numeric DDS")
    try:
        write_model(path, arrays, force=force, label=f"--model {path}")
    except (engine.SaveError, engine.OutputPathError) as exc:
        raise UsageError(str(exc)) from None
    return f"{cp.op}#{cp.invocation} ({', '.join(arrays)})", notes


__all__ = [
    "check_save",
    "convergence_warning",
    "converged",
    "export_model",
    "result_json",
    "result_line",
    "saving",
]
