"""``watch``: the first invocation, then the first loop body, after which an expression
over the DDS holds, found by replaying from checkpoints (see ``_inspect``).

The watch expression is user code typed on the command line, evaluated with Python's
``eval`` in a namespace holding only numpy (``np``), a few numeric builtins and the
checkpointed DDS as arrays — never text from the trace.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.lowlevel import dds_contents, find_dds

from ._errors import UsageError
from ._inspect import _controller_for, _jsonable, _Stop, replay_with
from ._timetravel import Start, first_step, program_order, require_checkpoints


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
            f"a checkpointed DDS ({', '.join(available) or 'none'})"
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


def _checkpoint_arrays(run: Any, cp: Any, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    state = run.checkpoint_state(cp.op, cp.invocation)
    out = {}
    for n in names:
        slots, values = state.rows[n]
        arr = np.empty((state.lengths[n], *np.asarray(values).shape[1:]), np.asarray(values).dtype)
        arr[slots] = values
        out[n] = arr
    return out


def watchable(run: Any) -> list[str]:
    """The DDS a watch expression may name: numeric DDS every checkpoint holds."""
    cps = require_checkpoints(run)
    state = run.checkpoint_state(cps[0].op, cps[0].invocation)
    return [n for n, (_, v) in state.rows.items() if isinstance(v, np.ndarray)]


def watch(run: Any, app: Any, w: Watch) -> dict[str, Any]:
    """The first invocation, then the first body, after which ``w`` holds."""
    cps = require_checkpoints(run)
    order = program_order(run)
    first = first_step(run)  # a resumed run starts at its first checkpoint
    step = {point: first + k for k, point in enumerate(order)}
    # bisect over the checkpoints (the expression is assumed to stay true once true)
    lo, hi = -1, len(cps)  # cps[lo] does not hold (-1: the start), cps[hi] holds
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if holds(w, _checkpoint_arrays(run, cps[mid], w.names)):
            hi = mid
        else:
            lo = mid
    if lo < 0 and first > 0:
        if hi == 0:
            raise UsageError(
                f"{w.text} already holds at {cps[0].op}#{cps[0].invocation}, where run "
                f"{run.info.run_id[:12]} resumed run {str(run.info.continues)[:12]}; "
                f"watch that run (--run {run.info.continues})"
            )
        lo = 0  # nothing before the checkpoint the resumed run started from is in it
    start = Start(None, -1, -1) if lo < 0 else Start(cps[lo].op, cps[lo].invocation, cps[lo].step)
    last = cps[hi].step if hi < len(cps) else first + len(order) - 1
    found: dict[str, Any] = {}

    def after(op: str, invocation: int) -> None:
        arrays = {n: dds_contents(_dds(n)) for n in w.names}
        if holds(w, arrays):
            found.update(op=op, invocation=invocation, step=step.get((op, invocation), -1))
            raise _Stop()
        if step.get((op, invocation), -1) >= last:
            raise _Stop()

    replay_with(_controller_for(run, start), run, app, after=after)
    result: dict[str, Any] = {
        "expression": w.text,
        "found": bool(found),
        "op": found.get("op"),
        "invocation": found.get("invocation"),
        "index": None,
        "node": None,
        "values": {},
        "from": start.as_json(),
        "break": None,
    }
    if not found:
        return result
    target = (found["op"], found["invocation"])
    hit: dict[str, Any] = {}

    def wrap(op: str, invocation: int, node: int, body: Any) -> Any:
        if (op, invocation) != target or hit:
            return body
        ds = [_dds(n) for n in w.names]
        everything = None

        def probe(j: Any) -> Any:
            nonlocal everything
            if hit:
                return body(j)
            if everything is None:
                everything = [np.arange(len(d), dtype=np.int64) for d in ds]
            before = [d.rows(node, s) for d, s in zip(ds, everything, strict=True)]
            out = body(j)
            now = [d.rows(node, s) for d, s in zip(ds, everything, strict=True)]
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

    replay_with(_controller_for(run, start), run, app, wrap=wrap, after=stop_after)
    result.update(index=hit.get("index"), node=hit.get("node"), values=hit.get("values", {}))
    return result


def _dds(name: str) -> Any:
    d = find_dds(name)
    if d is None:
        raise UsageError(f"the program did not create DDS {name!r} (code changed?)")
    return d


__all__ = [
    "Watch",
    "compile_watch",
    "holds",
    "watch",
    "watchable",
]
