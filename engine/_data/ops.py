"""Pre-training operators: ``load``, ``create``, ``map``, ``reduce``, ``evaluate``,
``join``, ``store``.

All are collective: every rank calls them with the same arguments (SPMD).  Work on
elements is done by their owners, then results are shared so that every replica is
complete.  ``reduce``'s result does not depend on the number of nodes — which is what
lets a serial and a parallel run log bit-identical objectives: a sum, max or min of
numbers is folded exactly on each node and only the folds cross (``engine._data.exact``);
anything else is folded in index order over the gathered values.
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
import xxhash

from .._asyncfor.closure import check_body, finish, guard, verify, watch
from .._errors import (
    DataFormatError,
    DriverStepsDivergedError,
    InputFileError,
    ShardMissError,
    _shown,
)
from .._files import grew, open_input, replacing
from .._runtime.checkpoint import collective
from .._runtime.session import Session, current, driver_only
from . import exact
from . import shard as _shard
from .dds import _DDS, HomeRows, dmap, dvector, gathered, make_whole
from .values import detached, stable_text


def load(
    path: str | os.PathLike[str],
    *,
    parse: Callable[[str], Any],
    name: str | None = None,
    sharded: bool | None = None,
) -> dvector:
    """Read a text file into a dvector of records, one per line, through ``parse``.

    A line ends at ``\n``, ``\r\n`` or a lone ``\r``; ``parse`` gets it without its end.

    ``parse(line)`` returns the record, or ``None`` to skip the line (a header or a
    comment).  An exception from ``parse`` becomes a :class:`DataFormatError` naming
    the file, the line number and the parser's message.

    The dvector is sharded (see ``engine._data.shard``) unless ``sharded=False``.  Under
    MPI each rank then parses only the lines that start in its share of the file's bytes
    and sends each record to its home rank, so no rank holds the whole data set; every
    rank still reads (and hashes) every byte, so ranks that read different files stop
    with one error naming each rank's file digest.
    """
    p = Path(path)
    sess = current()
    if sharded is not False and sess.cluster.is_mpi and sess.cluster.size > 1:
        return _load_shards(sess, p, parse, name)
    records, _, err = _read_records(p, parse)
    if err is not None:
        raise DataFormatError(f"{p}:{err[0]}: {err[1]}")
    return dvector(len(records), data=records, name=name, sharded=sharded)


def _read_records(
    p: Path, parse: Callable[[str], Any], part: tuple[int, int] | None = None
) -> tuple[list[Any], str, tuple[int, str] | None]:
    """Parse the lines of ``p`` through ``parse``; with ``part = (rank, ranks)`` only the
    lines that start in that rank's share of the file's bytes.  Returns the records, the
    xxh3 digest of the file (with ``part``: every line is read, to hash it) and the
    first error as (line number, message), after which nothing more is parsed."""
    # bytes, decoded line by line: a text-mode reader decodes ahead in chunks, so its
    # UnicodeDecodeError would not say which physical line holds the bad byte.  A regular
    # file only, and no more than its size at the open (the path may come from a trace)
    fh, size = open_input(p)
    records: list[Any] = []
    h = xxhash.xxh3_128()
    err: tuple[int, str] | None = None
    with fh:
        me, ranks = (0, 1) if part is None else part
        lo, hi = size * me // ranks, size * (me + 1) // ranks
        at = 0
        for lineno, raw in enumerate(_physical_lines(fh), start=1):
            start, at = at, at + len(raw)
            if at > size:
                raise grew(str(p))
            if part is not None:
                h.update(raw)
            if err is not None or not lo <= start < hi:
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                bad = raw[exc.start : exc.start + 1]
                err = (
                    lineno,
                    f"not UTF-8 text (byte 0x{bad.hex()} at column {exc.start + 1}: {exc.reason})",
                )
            else:
                try:
                    rec = parse(line.rstrip("\r\n"))
                except Exception as exc:  # noqa: BLE001 - any parser failure is a data error
                    err = (lineno, str(exc))
                else:
                    if rec is not None:
                        records.append(rec)
            if err is not None and part is None:
                break
    return records, h.hexdigest(), err


def _physical_lines(fh: Any) -> Any:
    """The lines of binary file ``fh`` as an editor counts them, each with its end: a
    line ends at ``\n``, ``\r\n`` or a lone ``\r`` (Excel for Mac's CSV), as in the
    apps' own readers (``apps._datasets.text_lines``).  Iterating the file splits at
    ``\n`` only, so a file of lone ``\r`` endings was one line (its header: SGDMF
    said the file had no ratings)."""
    for raw in fh:  # ``\r\n`` never straddles two of these: they end at ``\n``
        end = 2 if raw.endswith(b"\r\n") else 1 if raw.endswith((b"\n", b"\r")) else 0
        body, tail = raw[: len(raw) - end], raw[len(raw) - end :]
        if b"\r" not in body:
            yield raw  # the usual line: no lone ``\r`` inside
            continue
        *lines, last = body.split(b"\r")
        for line in lines:
            yield line + b"\r"
        if last or tail:
            yield last + tail


def _load_shards(sess: Session, p: Path, parse: Callable[[str], Any], name: str | None) -> dvector:
    """``load`` under MPI: each rank parses its share of the lines and sends each record
    to its home rank (one ``alltoall``); the ranks agree on the file and on the first
    bad line before any record moves."""
    cl = sess.cluster
    P, me = cl.size, cl.local_nodes[0]
    missing = None
    try:
        records, digest, err = _read_records(p, parse, (me, P))
    except InputFileError as exc:  # on this host only, maybe: the ranks agree first
        records, digest, err, missing = [], "", None, str(exc)
    what = f"dvector {name!r}" if name else "a dvector"
    got = sess.agree(f"loading a file into {what}", (digest, len(records), err, str(p), missing))
    lacking = [(r, g[4]) for r, g in enumerate(got) if g[4] is not None]
    if lacking:
        r, message = lacking[0]
        raise InputFileError(f"rank {r}: {message}")
    if len({g[0] for g in got}) > 1:  # each rank's own path: hosts may hold other copies
        raise DriverStepsDivergedError(
            [f"{what} from {g[3]} #{g[0][:8]}" for g in got],
            verb="created",
            why="the ranks read different bytes: give every host the same copy of the file, "
            "or a shared file system, and do not change it while a run reads it",
        )
    bad = [g[2] for g in got if g[2] is not None]
    if bad:
        lineno, message = min(bad)
        raise DataFormatError(f"{p}:{lineno}: {message}")
    counts = [int(g[1]) for g in got]
    n = sum(counts)
    first = sum(counts[:me])
    bounds = np.array([n * q // P for q in range(P + 1)], dtype=np.int64)
    at = np.searchsorted(bounds, np.arange(first, first + len(records)), side="right") - 1
    outgoing: list[list[Any]] = [[] for _ in range(P)]
    for q in np.unique(at).tolist():
        lo, hi = np.searchsorted(at, [q, q + 1])
        outgoing[q] = records[int(lo) : int(hi)]
    del records
    mine = [r for part in cl.alltoall(outgoing) for r in part]  # in rank order: by index
    return dvector(n, data=HomeRows(mine), name=name)


def _owned_values(
    sess: Session,
    src: _DDS,
    fn: Callable[[Any], Any],
    op: str,
    local: Callable[[int, list[Any]], Any] | None = None,
) -> tuple[list[np.ndarray], list[Any]]:
    """Apply ``fn`` to every element on its owner; return (owned slots, values) per node,
    or with ``local``, ``local(node, values)`` per node (what crosses between nodes).

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
    _shard.clear_missed()
    sess.set_mode("exec")
    try:

        def work(node: int) -> Any:
            buf = src._bufs[node]
            try:
                if src._numeric:
                    values = [run(buf[s].copy()) for s in src.owned(node).tolist()]
                else:
                    values = [run(detached(buf[s])) for s in src.owned(node).tolist()]
            except ShardMissError:  # in ``MISSED``: fetched below, and ``fn`` runs again
                return None
            return values if local is None else local(node, values)

        while True:  # ``fn`` is pure (the closure rule): it may run again
            values = cl.run_on_nodes(work)
            missed = _shard.take_missed(sess)  # sharded rows ``fn`` read where not held
            if not missed:
                break
            _shard.fetch_missed(sess, op, missed)
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
    """Fold ``fn(x)`` over every element of ``src`` with ``op``; the same bits on any
    number of nodes, on every rank, in serial and parallel runs.

    Without gathering the values (each node folds its own, only one small object per
    node crosses):

    * ``op=operator.add`` (the default) over Python ints (an exact int), over Python
      floats and numpy float64 scalars, Python ints allowed among them (the correctly
      rounded sum, ``math.fsum``'s, a numpy float64 if any value was one; NaN if a NaN or
      both infinities were summed, else the infinity; a sum of only -0.0 is -0.0), over
      numpy integer scalars of one dtype (wrapping around as numpy does), or over float64
      arrays of one shape of at most ``ARRAY_MAX`` (4,096) elements (element by element);
    * ``op=max`` / ``op=min`` (the builtins) over ints, or floats without NaN: the first
      largest (smallest) value in index order, as a left fold gives it.

    Anything else (your own ``op``, objects, bools, NaN under max/min, float32, int
    arrays, numpy ints among Python numbers, bigger arrays) is folded with ``op`` in
    index order over the values gathered on every node (each node then receives every
    value).  ``initial`` is folded in as
    the first value.  A replay of a run recorded before the exact fold existed (its
    trace has no ``exact_reduce`` label) folds in index order, as that run did.
    """
    sess = current()
    what = f"ap.reduce over {src.name}"

    def compute() -> Any:
        if not sess.exact_reduce or not exact.supported(op):
            slots, values = _owned_values(sess, src, fn or _same, what)
            return _fold(_in_order(len(src), slots, values))
        kept: dict[int, list[Any]] = {}

        def local(node: int, values: list[Any]) -> Any:
            kept[node] = values  # sent only if some node's values need the fold
            slots = [] if op is operator.add else src.owned(node).tolist()  # max/min: ties
            return exact.part(values, slots, op)

        slots, parts = _owned_values(sess, src, fn or _same, what, local)
        if len(src) and initial is not None:
            parts = [exact.part([initial], [-1], op), *parts]
        out = exact.combine(parts, op) if len(src) else exact.GATHER
        if out is not exact.GATHER:
            return out
        values = sess.cluster.run_on_nodes(lambda node: kept.pop(node))
        return _fold(_in_order(len(src), slots, values))

    def _fold(ordered: list[Any]) -> Any:
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
