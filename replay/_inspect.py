"""Questions about a DDS over a whole run, answered by replaying from checkpoints.

``history`` gives an element's value after every invocation and the body that last
wrote it in that invocation; ``watch`` finds the first invocation, then the first loop
body, after which an expression over the DDS holds.  Both run the user's program in a
single-node replay (every recorded node in this process, the recorded orders
enforced, every digest checked), starting at the latest checkpoint before the range
asked about; neither stores every write nor runs anything read from the trace.

The watch expression is user code typed on the command line, evaluated with Python's
``eval`` in a namespace holding only numpy (``np``), a few numeric builtins and the
checkpointed DDS as arrays — never text from the trace.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import engine
from engine.lowlevel import dds_contents, find_dds

from ._controller import ReplayChecker, ReplayFinished, TraceController
from ._errors import UsageError
from ._job import recorded_modes
from ._timetravel import (
    FastForward,
    Start,
    first_step,
    program_order,
    require_checkpoints,
    start_before,
    step_of,
)


class _Stop(Exception):
    """The inspection has what it needs: end the replay early."""


def _jsonable(v: Any) -> Any:
    """An element's value for JSON: a list of floats for a numeric row."""
    if isinstance(v, np.ndarray):
        return v.astype(np.float64).tolist() if v.dtype.kind in "fiub" else repr(v)
    if isinstance(v, np.generic):
        return v.item()
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return repr(v)


def _where_ran(plan: Any, node: int, index: int) -> tuple[int, int]:
    """(round, thread) of loop index ``index`` on ``node`` in ``plan`` ((-1, -1) if absent)."""
    if plan is None:
        return -1, -1
    for r, rnd in enumerate(plan.rounds):
        if node < len(rnd):
            for task in rnd[node]:
                if index in np.asarray(task.indices):
                    return r, int(task.thread)
    return -1, -1


# ====================================================================== history
_ELEMENT = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*\[(.+)\]\s*$")


@dataclass(frozen=True)
class Element:
    """``DDS[INDEX]`` as typed: the DDS name and the index (a Python literal)."""

    dds: str
    index: Any
    text: str


def parse_element(text: str, names: list[str]) -> Element:
    """Parse ``W[17]``; the DDS must be one of ``names`` (the run's DDS)."""
    m = _ELEMENT.match(text)
    if not m:
        raise UsageError(f"expected an element as DDS[INDEX], such as W[17], got {text!r}")
    name, raw = m.group(1), m.group(2)
    try:
        index = ast.literal_eval(raw.strip())
    except (ValueError, SyntaxError):
        raise UsageError(
            f"the index in {text!r} must be a literal (17, 'key'), got {raw!r}"
        ) from None
    if name not in names:
        raise UsageError(
            f"the run has no DDS named {name!r}; its DDS: {', '.join(names) or 'none'}"
        )
    if isinstance(index, bool) or not isinstance(index, (int, str, tuple, float)):
        raise UsageError(f"the index in {text!r} must be a number, string or tuple")
    return Element(name, index, f"{name}[{index!r}]")


def dds_names(run: Any) -> list[str]:
    """Names of the run's DDS (every DDS is digested after every invocation)."""
    seen: dict[str, None] = {}
    for d in run.digests():
        seen.setdefault(d.dds, None)
    return list(seen)


def steps_between(
    run: Any, between: tuple[tuple[str, int], tuple[str, int]] | None
) -> tuple[list[tuple[str, int]], int, int]:
    """(the program order, first step, last step) of the range asked about."""
    order = program_order(run)
    if not order:
        raise UsageError(f"run {run.info.run_id[:12]} completed no loop invocation")
    if between is None:
        return order, 0, len(order) - 1
    a = step_of(order, between[0], "--between")
    b = step_of(order, between[1], "--between")
    if b < a:
        raise UsageError(
            f"--between: {between[1][0]}#{between[1][1]} runs before "
            f"{between[0][0]}#{between[0][1]}; give the earlier invocation first"
        )
    return order, a, b


def _read_element(el: Element) -> tuple[Any, Any]:
    """(the DDS, the element's current value) in the driver; bad indices are usage errors."""
    d = find_dds(el.dds)
    if d is None:
        raise UsageError(f"the program did not create DDS {el.dds!r} (code changed?)")
    if isinstance(d, engine.dvector):
        if not isinstance(el.index, int) or not -len(d) <= el.index < len(d):
            raise UsageError(
                f"{el.text}: index out of range; {el.dds} has {len(d)} element(s) (0..{len(d) - 1})"
            )
        return d, d[el.index]
    if el.index not in d.keys():
        raise UsageError(f"{el.text}: {el.dds} has no key {el.index!r}")
    return d, d[el.index]


def history(
    run: Any, app: Any, el: Element, between: tuple[tuple[str, int], tuple[str, int]] | None
) -> dict[str, Any]:
    """The element's value after every invocation in the range, and its last writer."""
    require_checkpoints(run)
    order, a, b = steps_between(run, between)
    step = {point: k for k, point in enumerate(order)}
    start = start_before(run, first_step(run) + a)
    entries: list[dict[str, Any]] = []
    writer: dict[tuple[str, int], tuple[Any, int]] = {}

    def wrap(op: str, invocation: int, node: int, body: Any) -> Any:
        k = step.get((op, invocation), -1)
        if not a <= k <= b:
            return body
        d = find_dds(el.dds)
        if not isinstance(d, engine.dvector) or d.shape is None:
            return body  # object elements and maps: no writer detection
        if not isinstance(el.index, int) or not -len(d) <= el.index < len(d):
            return body  # reported by ``after``
        slot = np.array([el.index % len(d)], dtype=np.int64)

        def probe(j: Any) -> Any:
            before = d.rows(node, slot).tobytes()
            out = body(j)
            if d.rows(node, slot).tobytes() != before:
                writer[(op, invocation)] = (getattr(j, "number", j), node)
            return out

        return probe

    def after(op: str, invocation: int) -> None:
        k = step.get((op, invocation), -1)
        _, value = _read_element(el)  # checks the index after the first invocation
        if a <= k <= b:
            w = writer.pop((op, invocation), None)
            who = None
            if w is not None:
                index, node = w
                rnd, thread = _where_ran(ctl.recorded_plan(op, invocation), node, int(index))
                who = {"index": int(index), "node": node, "thread": thread, "round": rnd}
            entries.append(
                {"op": op, "invocation": invocation, "value": _jsonable(value), "writer": who}
            )
        if k >= b:
            raise _Stop()

    ctl = _controller_for(run, start)
    replay_with(ctl, run, app, wrap=wrap, after=after)
    return {"element": el.text, "history": entries, "from": start.as_json()}


def _controller_for(run: Any, start: Start) -> TraceController:
    return TraceController(run, single=True, travel=FastForward(run, start))


def replay_with(
    ctl: TraceController,
    run: Any,
    app: Any,
    *,
    wrap: Callable[..., Any] | None = None,
    after: Callable[[str, int], None] | None = None,
) -> None:
    """Single-node replay of ``run`` under ``ctl`` with inspection hooks, until the
    program ends or a hook raises :class:`_Stop`; divergence raises as usual."""
    info = run.info
    ctl.set_body_hook(wrap)
    if after is not None:
        ctl.set_until(after)
    checker = ReplayChecker(run, skipped=ctl.travel.skipped)
    try:
        engine.run(
            app.fn,
            dict(info.params),
            nodes=info.ranks,
            threads=info.threads,
            seed=info.seed,
            recorder=checker,
            schedules=ctl,
            hooks=ctl,
            **recorded_modes(info),
        )
        checker.finish()
    except (_Stop, ReplayFinished):
        pass


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
    "Element",
    "Watch",
    "compile_watch",
    "dds_names",
    "history",
    "holds",
    "parse_element",
    "replay_with",
    "watch",
    "watchable",
]
