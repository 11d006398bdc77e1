"""``watch``: the first invocation, then the first loop body, after which an expression
over the DDS holds, found by replaying from checkpoints (see ``_inspect``).

The watch expression is user code typed on the command line, evaluated with Python's
``eval`` in a namespace holding only numpy (``np``), a few numeric builtins and the
run's numeric DDS as arrays — never text from the trace.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.lowlevel import dds_contents, find_dds, rows_seen

from ._errors import UsageError
from ._inspect import (
    SERIAL_FALLBACK,
    _controller_for,
    _jsonable,
    _Stop,
    dds_names,
    replay_with,
)
from ._progress import phases_to, tick_line
from ._timetravel import Start, first_step, program_order, require_checkpoints, start_before


# ====================================================================== watch
def _numpy_import(name: str, *args: Any, **kw: Any) -> Any:
    """numpy imports some of its own modules lazily from the caller's frame (``.any()``):
    let those through, and nothing else."""
    if name == "numpy" or name.startswith("numpy."):
        return __import__(name, *args, **kw)
    raise ImportError(f"a watch expression cannot import {name!r}")


#: Builtins a watch expression may call besides numpy.
SAFE_BUILTINS: dict[str, Any] = {
    "abs": abs,
    "all": all,
    "any": any,
    "bool": bool,
    "float": float,
    "int": int,
    "len": len,
    "max": max,
    "min": min,
    "sum": sum,
}


@dataclass(frozen=True)
class Watch:
    """A compiled watch expression and the DDS it names."""

    text: str
    code: Any
    names: tuple[str, ...]


def compile_watch(text: str, available: list[str]) -> Watch:
    """Compile ``text``; every name must be ``np``, a safe builtin or an available DDS."""
    try:
        tree = ast.parse(text.strip(), "<watch expression>", mode="eval")
    except SyntaxError as exc:
        raise UsageError(f"the expression {text!r} does not parse: {exc.msg}") from None
    used = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)})
    dds = [n for n in used if n in available]
    unknown = [n for n in used if n not in available and n != "np" and n not in SAFE_BUILTINS]
    if unknown:
        raise UsageError(
            f"the expression names {', '.join(map(repr, unknown))}, which is neither np nor "
            f"a DDS of the run ({', '.join(available) or 'none'})"
        )
    if not dds:
        raise UsageError(f"the expression {text!r} names no DDS ({', '.join(available)})")
    return Watch(text, compile(tree, "<watch expression>", "eval"), tuple(dds))


def holds(w: Watch, arrays: dict[str, np.ndarray]) -> bool:
    """Evaluate ``w`` on ``arrays``; it must give one truth value."""
    ns: dict[str, Any] = {"__builtins__": dict(SAFE_BUILTINS, __import__=_numpy_import)}
    ns["np"] = np
    ns.update({k: arrays[k] for k in w.names})
    try:
        out = eval(w.code, ns)  # noqa: S307 - the user's own expression, see the module doc
        return bool(out)
    except ValueError as exc:
        if "truth value" in str(exc):
            raise UsageError(
                f"the expression {w.text!r} gives an array, not one truth value; "
                "end it with .any() or .all()"
            ) from None
        raise UsageError(f"the expression {w.text!r} failed: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - any failure of the user's expression
        raise UsageError(f"the expression {w.text!r} failed: {type(exc).__name__}: {exc}") from None


def names_in(text: str) -> set[str]:
    """The names ``text`` uses (none if it does not parse: :func:`compile_watch` says so)."""
    try:
        tree = ast.parse(text.strip(), "<watch expression>", mode="eval")
    except SyntaxError:
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def _checkpoint_arrays(
    run: Any, cp: Any, names: tuple[str, ...]
) -> tuple[dict[str, np.ndarray], list[str]]:
    """(the arrays of ``names`` in checkpoint ``cp``, the names it does not hold)."""
    state = run.checkpoint_state(cp.op, cp.invocation)
    out = {}
    for n in names:
        if n not in state.rows or not isinstance(state.rows[n][1], np.ndarray):
            continue
        slots, values = state.rows[n]
        arr = np.empty((state.lengths[n], *np.asarray(values).shape[1:]), np.asarray(values).dtype)
        arr[slots] = values
        out[n] = arr
    return out, [n for n in names if n not in out]


def watchable(run: Any, wanted: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """The DDS a watch expression may name: every DDS of the run, those some checkpoint
    holds as arrays first.  A DDS no loop body writes (a kernel's numeric copy of the
    data, such as sgdmf's ``ratings3``) is in no checkpoint: the replay evaluates it
    (:func:`_numeric` refuses one of Python objects there).  Checkpoints after the first
    are read only while a name in ``wanted`` is still missing."""
    found: dict[str, None] = {}
    others = dds_names(run)
    for cp in require_checkpoints(run):
        if wanted and wanted <= set(others) - found.keys():
            break  # no checkpoint needs reading to know them
        state = run.checkpoint_state(cp.op, cp.invocation)
        for n, (_, v) in state.rows.items():
            if isinstance(v, np.ndarray):
                found.setdefault(n, None)
        if wanted <= found.keys():
            break
    return [*found, *(n for n in others if n not in found)]


def _numeric(name: str, d: Any) -> Any:
    """``d``, the DDS named ``name`` in the replay, if its rows are numbers."""
    if d is not None and d.shape is None:
        raise UsageError(
            f"DDS {name!r} holds Python objects, not numeric rows: a watch expression "
            "takes numeric DDS (use 'replay history' for one of its elements)"
        )
    return d


#: ``checked`` in the result: every invocation up to the answer was evaluated.
EVERY_INVOCATION = "every invocation"
#: ``checked`` in the result: some were skipped by bisection (``--monotone``).
BISECTION = "bisection (assumed monotone)"


def watch(
    run: Any,
    app: Any,
    w: Watch,
    *,
    monotone: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The first invocation, then the first body, after which ``w`` holds; ``progress``
    gets phase lines (each fast-forward, the body-by-body replay) and tick lines (the
    invocations the scan has evaluated of those it may have to).

    By default every invocation is checked, in program order, until ``w`` holds: the
    checkpoints first (reading one costs milliseconds), then a replay of the
    invocations no checkpoint follows (or whose checkpoint lacks a DDS of ``w``) up to
    the first checkpoint where ``w`` holds.  ``monotone`` (the user says ``w`` stays
    true once true) bisects over the checkpoints instead and replays only between the
    two it ends on.  Where a DDS of ``w`` does not exist, ``w`` counts as not holding
    (``not_evaluable``); ``unchecked`` counts the invocations up to the answer that
    were never evaluated, so a result never claims more than was looked at.
    """
    cps = require_checkpoints(run)
    if monotone and _checkpoint_arrays(run, cps[-1], w.names)[1]:
        # a DDS of w that even the last checkpoint lacks is in none (no body writes it):
        # bisection would see nothing, so every invocation is replayed and checked
        monotone = False
    order = program_order(run)
    first = first_step(run)  # a resumed run starts at its first checkpoint
    step = {point: first + k for k, point in enumerate(order)}
    end = first + len(order) - 1
    checked: set[int] = set()  # steps after which w was evaluated, or found not evaluable
    #: step -> (op, invocation, the DDS of w lacking, "checkpoint" or "replay")
    absent: dict[int, tuple[str, int, list[str], str]] = {}

    def at(i: int) -> bool | None:
        """Whether w holds at checkpoint ``i``; None if the checkpoint lacks a DDS of w."""
        arrays, lacking = _checkpoint_arrays(run, cps[i], w.names)
        if lacking:
            if monotone:  # bisection goes on as if w did not hold there
                # not evaluated: it stays unchecked, so the result cannot claim it
                absent[cps[i].step] = (cps[i].op, cps[i].invocation, lacking, "checkpoint")
                return False
            return None  # the replay below evaluates it in the program
        checked.add(cps[i].step)
        return holds(w, arrays)

    if monotone:
        lo, hi = -1, len(cps)  # cps[lo] does not hold (-1: the start), cps[hi] holds
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if at(mid):
                hi = mid
            else:
                lo = mid
    else:
        hi = next((i for i in range(len(cps)) if at(i)), len(cps))
    if hi == 0 and first > 0:
        raise UsageError(
            f"{w.text} already holds at {cps[0].op}#{cps[0].invocation}, where run "
            f"{run.info.run_id[:12]} resumed run {str(run.info.continues)[:12]}; "
            f"watch that run (--run {run.info.continues})"
        )
    known = cps[hi].step if hi < len(cps) else None  # the first checkpoint seen holding
    stop = known - 1 if known is not None else end  # the last step that could come first
    if monotone:
        lo = max(lo, 0) if first > 0 else lo  # nothing before a resumed run's start is in it
        begin = cps[lo].step + 1 if lo >= 0 else 0
        todo = [s for s in range(max(begin, first), stop + 1) if s not in checked]
    else:
        todo = [s for s in range(first, stop + 1) if s not in checked]
    found = _scan(run, app, w, step, todo, checked, absent, progress) if todo else None
    if found is None:
        found = known
    last = found if found is not None else end
    unchecked = sum(1 for s in range(first, last + 1) if s not in checked and s != found)
    result: dict[str, Any] = {
        "expression": w.text,
        "found": found is not None,
        "op": None,
        "invocation": None,
        "index": None,
        "node": None,
        "values": {},
        "from": None,
        "break": None,
        "held_before": False,
        "serial_fallback": False,
        "checked": BISECTION if unchecked else EVERY_INVOCATION,
        "unchecked": unchecked,
        "invocations": len(order),
        # a run that did not finish recorded only its first invocations: "never holds"
        # is then about those, not about what the program would have gone on to do
        "run_status": run.info.status,
        # a resumed run's first checkpoint is where it started: what ran before is the
        # run it continues, which this watch never looked at
        "continues": run.info.continues,
        "resumed_after": (
            {"op": cps[0].op, "invocation": cps[0].invocation} if first > 0 else None
        ),
        "not_evaluable": [
            {"op": op, "invocation": inv, "dds": lacking, "in": where}
            for s, (op, inv, lacking, where) in sorted(absent.items())
            if s <= last
        ],
    }
    if found is None:
        return result
    target = order[found - first]
    start = start_before(run, found)
    result.update(op=target[0], invocation=target[1])
    result["from"] = start.as_json()
    result.update(_first_body(run, app, w, target, start, progress))
    try:  # its bodies ran outside the hooks that see a body: none could be named
        result["serial_fallback"] = run.plan(*target).strategy == SERIAL_FALLBACK
    except KeyError:  # a sync_for: no plan
        result["serial_fallback"] = False
    return result


def _fast_forward(start: Start, progress: Callable[[str], None] | None) -> Any:
    """The phases callback of a replay from ``start``, after naming its fast-forward."""
    phases = phases_to(progress)
    if phases is not None and start.op is not None:
        phases(f"fast-forward to the checkpoint after {start.op}#{start.invocation}")
    return phases


def _scan(
    run: Any,
    app: Any,
    w: Watch,
    step: dict[tuple[str, int], int],
    todo: list[int],
    checked: set[int],
    absent: dict[int, tuple[str, int, list[str], str]],
    progress: Callable[[str], None] | None = None,
) -> int | None:
    """Replay from the checkpoint before ``todo[0]`` and evaluate ``w`` after each step of
    ``todo``: the first step where it holds, or None."""
    want = set(todo)
    found: list[int] = []

    def after(op: str, invocation: int) -> None:
        s = step.get((op, invocation), -1)
        if s in want:
            ds = {n: _numeric(n, find_dds(n)) for n in w.names}
            lacking = [n for n, d in ds.items() if d is None]
            checked.add(s)
            if progress is not None:
                progress(tick_line(len(want & checked), len(want), "invocations"))
            if lacking:
                absent[s] = (op, invocation, lacking, "replay")
            elif holds(w, {n: dds_contents(d) for n, d in ds.items()}):
                found.append(s)
                raise _Stop()
        if s >= todo[-1]:
            raise _Stop()

    start = start_before(run, todo[0])
    phases = _fast_forward(start, progress)
    replay_with(_controller_for(run, start), run, app, after=after, phases=phases)
    return found[0] if found else None


def _first_body(
    run: Any,
    app: Any,
    w: Watch,
    target: tuple[str, int],
    start: Start,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Replay ``target`` body by body: the first body after which ``w`` holds on the
    replica of the node that ran it (index, node and the rows it changed); none if
    ``w`` already held before the first body (the driver made it true: it created a
    DDS or wrote one between the invocations)."""
    hit: dict[str, Any] = {}
    first = True

    def wrap(op: str, invocation: int, node: int, body: Any) -> Any:
        if (op, invocation) != target or hit:
            return body
        ds = [_dds(n) for n in w.names]
        everything = None

        def probe(j: Any) -> Any:
            nonlocal everything, first
            if hit:
                return body(j)
            if everything is None:
                everything = [np.arange(len(d), dtype=np.int64) for d in ds]
            before = [rows_seen(d, node, s) for d, s in zip(ds, everything, strict=True)]
            if first and holds(w, dict(zip(w.names, before, strict=True))):
                hit.update(held_before=True)
                return body(j)
            first = False
            out = body(j)
            now = [rows_seen(d, node, s) for d, s in zip(ds, everything, strict=True)]
            if holds(w, dict(zip(w.names, now, strict=True))):
                hit.update(index=int(getattr(j, "number", j)), node=node)
                for n, b, a in zip(w.names, before, now, strict=True):
                    bb = np.ascontiguousarray(b).reshape(len(b), -1).view(np.uint8)
                    aa = np.ascontiguousarray(a).reshape(len(a), -1).view(np.uint8)
                    changed = np.flatnonzero((aa != bb).any(axis=1))
                    for s in changed[:4].tolist():
                        hit.setdefault("values", {})[f"{n}[{s}]"] = _jsonable(a[s])
            return out

        return probe

    def stop_after(op: str, invocation: int) -> None:
        if (op, invocation) == target:
            raise _Stop()

    phases = _fast_forward(start, progress)
    replay_with(_controller_for(run, start), run, app, wrap=wrap, after=stop_after, phases=phases)
    return {
        "index": hit.get("index"),
        "node": hit.get("node"),
        "values": hit.get("values", {}),
        "held_before": bool(hit.get("held_before")),
    }


def _dds(name: str) -> Any:
    d = find_dds(name)
    if d is None:
        raise UsageError(f"the program did not create DDS {name!r} (code changed?)")
    return _numeric(name, d)


__all__ = [
    "BISECTION",
    "EVERY_INVOCATION",
    "Watch",
    "compile_watch",
    "holds",
    "names_in",
    "watch",
    "watchable",
]
