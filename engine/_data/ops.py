"""Pre-training operators: ``load``, ``create``, ``map``, ``reduce``, ``evaluate``,
``join``, ``store``.

All are collective: every rank calls them with the same arguments (SPMD).  Work on
elements is done by their owners, then results are shared so that every replica is
complete.  ``reduce`` folds the mapped values in index order on every node, so its
result does not depend on the number of nodes — which is what lets a serial and a
parallel run log bit-identical objectives.
"""

from __future__ import annotations

import functools
import hashlib
import operator
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .._asyncfor.closure import check_body, finish, guard, verify, watch
from .._errors import DataFormatError, DriverStepsDivergedError, InputFileError, _shown
from .._files import replacing
from .._runtime.checkpoint import collective
from .._runtime.session import Session, current, driver_only
from .dds import _DDS, dmap, dvector, gathered, make_whole
from .values import detached, stable_text


def load(
    path: str | os.PathLike[str],
    *,
    parse: Callable[[str], Any],
    name: str | None = None,
) -> dvector:
    """Read a text file into a dvector of records, one per line, through ``parse``.

    ``parse(line)`` returns the record, or ``None`` to skip the line (a header or a
    comment).  An exception from ``parse`` becomes a :class:`DataFormatError` naming
    the file, the line number and the parser's message.
    """
    p = Path(path)
    try:
        # bytes, decoded line by line: a text-mode reader decodes ahead in chunks, so
        # its UnicodeDecodeError would not say which physical line holds the bad byte
        fh = p.open("rb")
    except FileNotFoundError:
        raise InputFileError(f"input file {str(p)!r} does not exist") from None
    except OSError as exc:
        raise InputFileError(f"cannot read input file {str(p)!r}: {exc.strerror}") from None
    records: list[Any] = []
    with fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                bad = raw[exc.start : exc.start + 1]
                raise DataFormatError(
                    f"{p}:{lineno}: not UTF-8 text (byte 0x{bad.hex()} at column "
                    f"{exc.start + 1}: {exc.reason})"
                ) from None
            try:
                rec = parse(line.rstrip("\r\n"))
            except Exception as exc:  # noqa: BLE001 - any parser failure is a data error
                raise DataFormatError(f"{p}:{lineno}: {exc}") from None
            if rec is not None:
                records.append(rec)
    return dvector(len(records), data=records, name=name)


def _owned_values(
    sess: Session, src: _DDS, fn: Callable[[Any], Any], op: str
) -> tuple[list[np.ndarray], list[list[Any]]]:
    """Apply ``fn`` to every element on its owner; return (owned slots, values) per node.

    Under MPI each rank calls ``fn`` on the elements it owns only, so state ``fn`` kept
    (``seen.append(x)``) would hold a different part of the data on each rank, and all of
    it in one process: ``fn`` is held to the closure rule, as a loop body is (checked
    before it runs, and while it runs in checked and test mode).  ``op``: ``ap.map over
    A``, for messages."""
    check_body(op, fn, "its function")
    make_whole(sess=sess)  # ``fn`` may read any DDS on the node's own replica
    run = fn
    what = "element of shape" if src._numeric else "element"  # a row: its shape
    if sess.checked or sess.test_mode:
        run = guard(fn, op, -1, kind="", what=what, subject="its function")
    baseline = watch(fn, op, -1, kind="", what=what, subject="its function") if run is fn else None
    cl = sess.cluster
    sess.set_mode("exec")
    try:

        def work(node: int) -> list[Any]:
            buf = src._bufs[node]
            if src._numeric:
                return [run(buf[s].copy()) for s in src.owned(node).tolist()]
            return [run(detached(buf[s])) for s in src.owned(node).tolist()]

        values = cl.run_on_nodes(work)
        finish(run)
        verify(baseline)
    finally:
        sess.set_mode("driver")
    return [src.owned(p) for p in range(cl.size)], values


def _same(x: Any) -> Any:
    return x


def _in_order(n: int, slots: list[np.ndarray], values: list[list[Any]]) -> list[Any]:
    out: list[Any] = [None] * n
    for ss, vs in zip(slots, values, strict=True):
        for s, v in zip(ss.tolist(), vs, strict=True):
            out[s] = v
    return out


def create(
    n: int,
    fn: Callable[[int], Any],
    *,
    shape: int | tuple[int, ...] | None = None,
    dtype: Any = np.float64,
    name: str | None = None,
) -> dvector:
    """A dvector of ``n`` elements where element ``i`` is ``fn(i)`` (computed by its owner)."""
    sess = current()
    index = dvector(n, data=range(n), name=None if name is None else f"{name}.index")
    slots, values = _owned_values(sess, index, fn, f"ap.create of {name or 'a dvector'}")
    return dvector(n, shape=shape, dtype=dtype, data=_in_order(n, slots, values), name=name)


def map(  # noqa: A001 - part of the operator vocabulary (ap.map)
    src: _DDS,
    fn: Callable[[Any], Any],
    *,
    shape: int | tuple[int, ...] | None = None,
    dtype: Any = np.float64,
    name: str | None = None,
) -> _DDS:
    """A new DDS with ``fn(x)`` for every element ``x`` of ``src`` (same keys for a dmap)."""
    sess = current()
    slots, values = _owned_values(sess, src, fn, f"ap.map over {src.name}")
    ordered = _in_order(len(src), slots, values)
    if isinstance(src, dmap):
        out = dmap(shape=shape, dtype=dtype, name=name)
        for k, v in zip(src.keys(), ordered, strict=True):
            out[k] = v
        return out
    return dvector(len(src), shape=shape, dtype=dtype, data=ordered, name=name)


def reduce(
    src: _DDS,
    fn: Callable[[Any], Any] | None = None,
    *,
    op: Callable[[Any, Any], Any] = operator.add,
    initial: Any = None,
) -> Any:
    """Fold ``fn(x)`` over every element of ``src`` with ``op``, in index order.

    The fold order never depends on the number of nodes, so the result is identical
    on every rank and in serial and parallel runs.
    """
    sess = current()

    def compute() -> Any:
        slots, values = _owned_values(sess, src, fn or _same, f"ap.reduce over {src.name}")
        ordered = _in_order(len(src), slots, values)
        if initial is None:
            if not ordered:
                raise DataFormatError(
                    f"reduce of empty {src.name!r} needs initial= (is the input it was loaded "
                    "from empty?)"
                )
            return functools.reduce(op, ordered)
        return functools.reduce(op, ordered, initial)

    # time travel: a run fast-forwarding to a checkpoint is served the recorded value
    return collective(sess, "reduce", compute)


def evaluate(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` with every DDS argument replaced by its whole contents (the array its
    ``gather()`` returns); the other arguments are passed as they are.

    Collective, like :func:`reduce`: every rank calls it with the same arguments, so ``fn``
    must compute its value from those arrays alone (no ``ap.rng()``, nothing that differs
    between ranks).  Only the *result* is recorded for time travel (a run fast-forwarding
    to a checkpoint is served it, without calling ``fn``), never the gathered arrays.  Use
    it for a metric over the whole model every epoch, such as a compiled RMSE::

        rmse = ap.evaluate(rmse_of, ratings, W, H)  # records one float per epoch

    where ``W.gather()`` and ``H.gather()`` would record both matrices every epoch.
    """
    sess = current()

    def compute() -> Any:
        values = [gathered(a) if isinstance(a, _DDS) else a for a in args]
        out = fn(*values)
        # fn is the program's: one rank's Python state in it would fork the drivers
        keys = sess.agree("ap.evaluate result", _value_key(out))
        if len(set(keys)) > 1:
            shown = sess.agree("ap.evaluate shown", _shown(out))
            raise DriverStepsDivergedError(
                [f"ap.evaluate = {v} (collective call {sess.collectives - 1})" for v in shown],
                verb="got",
            )
        return out

    return collective(sess, "evaluate", compute)


def _value_key(v: Any) -> bytes:
    """Bits that differ when two values differ (NaN equals NaN, -0.0 differs from 0.0)."""
    h = hashlib.blake2b(digest_size=16)
    if isinstance(v, np.ndarray) and v.dtype != object:
        h.update(f"{v.dtype.str}{v.shape}".encode())
        h.update(np.ascontiguousarray(v).tobytes())
    elif isinstance(v, float):
        h.update(struct.pack("<d", v))
    else:
        h.update(stable_text(v).encode())
    return h.digest()


def join(left: dvector | dmap, right: dvector | dmap, *, name: str | None = None) -> dmap:
    """A dmap from every key present in both inputs to the pair ``(left[k], right[k])``."""
    lk = list(range(len(left))) if isinstance(left, dvector) else left.keys()
    rk = set(range(len(right))) if isinstance(right, dvector) else set(right.keys())
    out = dmap(name=name)
    for k in lk:
        if k in rk:
            out[k] = (left[k], right[k])
    return out


def store(
    src: dvector | dmap,
    path: str | os.PathLike[str],
    *,
    fmt: Callable[[Any, Any], str] | None = None,
) -> Path:
    """Write ``src`` to a text file, one ``fmt(key, value)`` line per element (rank 0 writes).

    The file is replaced atomically, so a crash never leaves half a file; an existing
    regular file is replaced, but never a link, device, directory or trace store
    (:class:`OutputPathError`).
    """
    driver_only("ap.store")
    sess = current()
    values = gathered(src)
    keys = list(range(len(src))) if isinstance(src, dvector) else src.keys()
    out = Path(path)
    if sess.cluster.rank == 0:

        def default(k: Any, v: Any) -> str:
            if isinstance(v, np.ndarray):
                return f"{k}\t" + " ".join(repr(float(x)) for x in np.ravel(v))
            return f"{k}\t{v!r}"

        f = fmt or default
        with replacing(out, force=True, label=f"ap.store path {out}", encoding="utf-8") as fh:
            for k, v in zip(keys, values, strict=True):
                fh.write(f(k, v) + "\n")
    sess.cluster.barrier()
    return out


__all__ = ["create", "evaluate", "join", "load", "map", "reduce", "store"]
