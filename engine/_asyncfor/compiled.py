"""The numba side of compiled loop bodies: a checked row view of a DDS and the task loop.

A kernel body indexes its DDS arguments like the Python body indexes the DDS: ``X[i]``
returns a *copy* of row ``i`` and ``X[i] = v`` writes it.  In compiled code each DDS
argument is a :class:`Rows` structref over the node's replica that makes the same checks
the DDS access modes make in Python (``engine._data.dds``), one byte load per access:

* ``EXEC``: none (the replicated serial fallback);
* ``GUARD``: the plan guard's codes (a read of a slot another task writes, a write to a
  slot the running task does not own);
* ``GUARD_RO``: the DDS is written by nobody in the invocation: reads are free, writes are
  violations;
* ``ANY_OWN``: the guard for one thread running all of a node's tasks (single replay);
* ``CHECKED``: every access inside the running body's own reconnaissance sets;
* ``RECORD``: reconnaissance (see below);
* ``RECORD_RELAXED``: reconnaissance of a relaxed dvector: served as ``RECORD`` serves
  (reads see the body's own writes, writes stay in its overlay) but nothing is logged,
  as the Python reconnaissance of a relaxed dvector logs nothing.

``X.take(ids)`` and ``X.put(ids, rows)`` are ``X[i]`` for each id in order (the same
checks and the same log), without a row copy per id.

An access that fails a check is not performed (a read returns a row anyway, a write is
dropped, so nothing outside what the guard can undo changes); it is written to the
shared ``state`` array and the task loop stops after that body.  The Python side then
reports it through the same guard or checker the Python path uses, so the verdict, the
error text and ``replan=`` behave identically.

``RECORD`` is reconnaissance as one compiled loop, with the semantics of the Python
reconnaissance mode (``engine._data.dds._DVecRecon``): every access is logged as a pair
(body position, global element id) in buffers (``rlog`` / ``wlog``) that the Python side
grows: a full log stops the loop after that body (``FULL``; the body itself runs on
unchanged, only its log is incomplete), and the caller drops that body's entries,
doubles the log and resumes at that body.  A write is not applied to the replica but
kept in the running body's overlay (``ov``, doubled on the spot when full; a slot's
place in it in ``ovp``, stamped with the body's position in ``ovk``), so a body reads
back its own writes and no other body sees them.  An index out of range stops the loop as in the
other modes; the caller then leaves the range to the Python reconnaissance, which raises
what it always raised.

The numba imports live here, not in ``kernel``, so that ``import engine`` does not pay
for numba until a kernel is compiled.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import inspect
import operator
import os
import sys
import threading
import types as types_mod
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numba
import numpy as np
import platformdirs
from llvmlite import ir as _ir  # type: ignore[import-untyped]
from numba import njit, types
from numba.core import cgutils as _cgutils
from numba.core import config as _numba_config
from numba.core.extending import intrinsic, overload, overload_attribute, overload_method
from numba.core.serialize import dumps as _numba_dumps
from numba.experimental import structref
from numba.experimental.structref import _Utils as _StructUtils

#: ``Rows.mode`` values (see the module docstring).
EXEC, GUARD, GUARD_RO, ANY_OWN, CHECKED, RECORD, RECORD_RELAXED = 0, 1, 2, 3, 4, 5, 6
#: ``state`` slots: what went wrong (0 nothing, 1 an access left the plan or the sets,
#: 2 an index out of range, ``FULL`` a RECORD buffer is full), the argument position of the DDS, its slot, whether it was a
#: write, and the loop index of the running body.
S_FLAG, S_ARG, S_SLOT, S_WRITE, S_INDEX = 0, 1, 2, 3, 4
STATE_LEN = 5
FULL = 3
#: ``Rows.cnt`` slots of the RECORD mode: entries in ``rlog`` and in ``wlog``, rows in
#: ``ov``, and the body position the overlay belongs to.
C_READS, C_WRITES, C_OV, C_OVBODY = 0, 1, 2, 3
_FREE, _OTHER = 0, 255


@structref.register
class RowsType(types.StructRef):
    """numba type of :class:`Rows`."""

    def preprocess_fields(self, fields: Any) -> Any:
        return tuple((name, types.unliteral(typ)) for name, typ in fields)  # type: ignore[no-untyped-call]


_FIELDS = [
    "arr",
    "gm",
    "code",
    "mode",
    "arg",
    "state",
    "rp",
    "ri",
    "wp",
    "wi",
    "start",
    "gbase",
    "rlog",
    "wlog",
    "cnt",
    "ov",
    "ovk",
    "ovp",
]


class Rows(structref.StructRefProxy):
    """A DDS replica as a kernel argument: the node's array plus what to check."""

    def __new__(
        cls,
        arr: np.ndarray,
        gm: np.ndarray,
        code: int,
        mode: int,
        arg: int,
        state: np.ndarray,
        sets: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
        start: int,
        gbase: int,
        rec: tuple[np.ndarray, ...] | None = None,
    ) -> Rows:
        """``rec``: the RECORD mode's buffers ``(rlog, wlog, cnt, ov, ovk, ovp)`` (see
        :func:`record_buffers`); the other modes get empty ones of the same types, so that
        every mode runs the one compiled loop of the kernel."""
        rp, ri, wp, wi = sets
        rlog, wlog, cnt, ov, ovk, ovp = rec if rec is not None else (
            _NO_LOG, _NO_LOG, _NO_CNT, arr[:0], _NO_IDS, _NO_IDS
        )  # fmt: skip
        return _new_rows(
            arr, gm, code, mode, arg, state, rp, ri, wp, wi, start, gbase,
            rlog, wlog, cnt, ov, ovk, ovp,
        )  # fmt: skip


structref.define_proxy(Rows, RowsType, _FIELDS)  # type: ignore[no-untyped-call]

_NO_LOG = np.zeros((0, 2), dtype=np.int64)
_NO_CNT = np.zeros(4, dtype=np.int64)
_NO_IDS = np.zeros(0, dtype=np.int64)
_NO_SETS = tuple(np.zeros(1 if k % 2 == 0 else 0, dtype=np.int64) for k in range(4))


def record_buffers(arr: np.ndarray, logs: int, rows: int) -> tuple[np.ndarray, ...]:
    """Empty RECORD buffers for a replica ``arr``: logs of ``logs`` accesses each, an
    overlay of ``rows`` rows, and the overlay's per-slot stamp and place."""
    return (
        np.empty((logs, 2), dtype=np.int64),
        np.empty((logs, 2), dtype=np.int64),
        np.array([0, 0, 0, -1], dtype=np.int64),
        np.empty((rows, *arr.shape[1:]), dtype=arr.dtype),
        np.full(arr.shape[0], -1, dtype=np.int64),
        np.zeros(arr.shape[0], dtype=np.int64),
    )


def no_sets() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Empty CSR sets for the modes that do not check against reconnaissance sets."""
    return _NO_SETS  # type: ignore[return-value]


_CG: Any = _cgutils  # numba's codegen helpers (untyped)
_UTILS: Any = _StructUtils


def _borrowed(name: str) -> Any:
    """An intrinsic that reads array field ``name`` of a :class:`Rows` without taking a
    reference: the array it returns has no meminfo, so numba counts no references to it
    (an atomic increment and decrement per access, about 13% of a kernel SGDMF epoch).
    Safe because the ``Rows`` holds the array for the whole loop and the borrowed view
    never leaves the access (a read returns a copy of the row)."""

    @intrinsic
    def borrow(typingctx: Any, a: Any) -> Any:
        fty = a.field_dict[name]

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            data = _UTILS(context, builder, a).get_data_struct(args[0])
            view = _CG.create_struct_proxy(fty)(context, builder, value=getattr(data, name))
            view.meminfo = _CG.get_null_value(view.meminfo.type)
            view.parent = _CG.get_null_value(view.parent.type)
            return view._getvalue()

        return fty(a), codegen

    return borrow


_arr = _borrowed("arr")
_gm = _borrowed("gm")


@njit(inline="always")
def _in_row(indptr: Any, ids: Any, k: Any, gid: Any) -> bool:  # pragma: no cover - compiled
    lo, hi = indptr[k], indptr[k + 1]
    p = lo + np.searchsorted(ids[lo:hi], gid)
    return p < hi and ids[p] == gid


@njit(inline="always")
def _flag(a: Any, slot: Any, write: int, what: int) -> None:  # pragma: no cover - compiled
    st = a.state
    if st[S_FLAG] == 0:
        st[S_FLAG] = what
        st[S_ARG] = a.arg
        st[S_SLOT] = slot
        st[S_WRITE] = write


@njit(inline="always")
def _log(a: Any, s: Any, write: bool) -> None:  # pragma: no cover - compiled
    """RECORD: append (body position, element id); an access repeating the last one of
    the same kind is not logged again (the sets are de-duplicated per body anyway).  A
    full log sets ``FULL``: the caller grows it and runs this body again.
    ``RECORD_RELAXED`` logs nothing."""
    if a.mode != RECORD:
        return
    k = a.state[S_INDEX] - a.start
    gid = a.gbase | s
    c = a.cnt
    slot = C_WRITES if write else C_READS
    log = a.wlog if write else a.rlog
    n = c[slot]
    if n > 0 and log[n - 1, 0] == k and log[n - 1, 1] == gid:
        return
    if n == log.shape[0]:
        _flag(a, s, write, FULL)
        return
    log[n, 0] = k
    log[n, 1] = gid
    c[slot] = n + 1


@njit(inline="always")
def _own(a: Any, s: Any) -> Any:  # pragma: no cover - compiled
    """RECORD: where the running body's own write of slot ``s`` is in ``ov``, or -1."""
    if a.ovk[s] != a.state[S_INDEX] - a.start:
        return -1
    return a.ovp[s]


@njit(inline="always")
def _keep(a: Any, s: Any, v: Any) -> None:  # pragma: no cover - compiled
    """RECORD: the running body writes ``v`` to slot ``s``: into its overlay, not the
    replica (a full overlay is doubled on the spot)."""
    k = a.state[S_INDEX] - a.start
    c = a.cnt
    if c[C_OVBODY] != k:  # a new body: its overlay starts empty
        c[C_OVBODY] = k
        c[C_OV] = 0
    if a.ovk[s] == k:
        p = a.ovp[s]
    else:
        p = c[C_OV]
        if p == a.ov.shape[0]:  # grown here: a dropped write could change what the body does
            grown = np.empty((2 * p + 8,) + a.arr.shape[1:], dtype=a.arr.dtype)
            grown[:p] = a.ov
            a.ov = grown
        a.ovk[s] = k
        a.ovp[s] = p
        c[C_OV] = p + 1
    a.ov[p] = v


# The functions below are compiled once per Rows type and kept in numba's own disk cache
# (keyed by this file's stamp, and they call nothing outside it): a kernel that has never
# been compiled then compiles its body only, about 1 s of a core instead of 5.5 s for the
# smallest kernel, since the CHECKED and RECORD paths each kernel calls are loaded.
def _disk_cached(fn: Any) -> Any:
    try:
        return njit(cache=True)(fn)
    except RuntimeError:  # no writable cache directory anywhere: compiled in each process
        return njit(fn)


def _rows_ctor(  # pragma: no cover - compiled
    arr: Any,
    gm: Any,
    code: Any,
    mode: Any,
    arg: Any,
    state: Any,
    rp: Any,
    ri: Any,
    wp: Any,
    wi: Any,
    start: Any,
    gbase: Any,
    rlog: Any,
    wlog: Any,
    cnt: Any,
    ov: Any,
    ovk: Any,
    ovp: Any,
) -> Any:
    return Rows(  # type: ignore[call-arg]  # numba's constructor takes every field
        arr, gm, code, mode, arg, state, rp, ri, wp, wi, start, gbase,
        rlog, wlog, cnt, ov, ovk, ovp,
    )  # fmt: skip


#: ``Rows`` made by compiled code kept in numba's disk cache: the constructor numba
#: makes for a proxy class (``StructRefProxy.__new__``) is compiled again in every
#: process, 0.7 s of every run that uses a kernel (a ``replay run sgdmf``, now that its
#: compiled body is the default); this one is loaded from the cache after the first.
_new_rows = _disk_cached(_rows_ctor)


@_disk_cached
def _checked_ok(a: Any, s: Any, write: bool) -> bool:  # pragma: no cover - compiled
    """CHECKED: the access is inside the running body's own reconnaissance sets."""
    k = a.state[S_INDEX] - a.start
    gid = a.gbase | s
    if _in_row(a.wp, a.wi, k, gid):
        return True
    return not write and _in_row(a.rp, a.ri, k, gid)


@njit(inline="always")
def _allowed(a: Any, s: Any, write: bool, mode: Any) -> bool:  # pragma: no cover - compiled
    if mode == EXEC:
        return True
    if mode == GUARD or mode == ANY_OWN:
        gm = _gm(a)
        c = gm[s] if s < gm.shape[0] else _FREE
        if mode == ANY_OWN:
            return c != _OTHER and (c != _FREE or not write)
        if write:
            return c == a.code
        return c == _FREE or c == a.code
    if mode == GUARD_RO:
        return not write
    return _checked_ok(a, s, write)


# The RECORD paths are functions of their own (not inlined): the other modes' accesses
# stay a short straight line, which is what a kernel epoch spends its time in.
@_disk_cached
def _recorded_scalar(a: Any, s: Any) -> Any:  # pragma: no cover - compiled
    _log(a, s, False)
    p = _own(a, s)
    if p >= 0:
        return a.ov[p]
    return a.arr[s]


@_disk_cached
def _recorded_row(a: Any, s: Any) -> Any:  # pragma: no cover - compiled
    _log(a, s, False)
    p = _own(a, s)
    if p >= 0:
        return a.ov[p].copy()
    return a.arr[s].copy()


@_disk_cached
def _recorded_write(a: Any, s: Any, v: Any) -> None:  # pragma: no cover - compiled
    _log(a, s, True)
    _keep(a, s, v)


@overload(operator.getitem)
def _getitem(a: Any, i: Any) -> Any:
    if not (isinstance(a, RowsType) and isinstance(i, types.Integer)):
        return None
    if a.field_dict["arr"].ndim == 1:

        def scalar(a: Any, i: Any) -> Any:  # pragma: no cover - compiled
            arr = _arr(a)
            n = arr.shape[0]
            s = i + n if i < 0 else i
            if s < 0 or s >= n:
                _flag(a, i, 0, 2)
                return arr[0]
            mode = a.mode
            if mode >= RECORD:
                return _recorded_scalar(a, s)
            if not _allowed(a, s, False, mode):
                _flag(a, s, 0, 1)
            return arr[s]

        return scalar

    def row(a: Any, i: Any) -> Any:  # pragma: no cover - compiled
        arr = _arr(a)
        n = arr.shape[0]
        s = i + n if i < 0 else i
        if s < 0 or s >= n:
            _flag(a, i, 0, 2)
            return arr[0].copy()
        mode = a.mode
        if mode >= RECORD:
            return _recorded_row(a, s)
        if not _allowed(a, s, False, mode):
            _flag(a, s, 0, 1)
        return arr[s].copy()

    return row


@overload(operator.setitem)
def _setitem(a: Any, i: Any, v: Any) -> Any:
    if not (isinstance(a, RowsType) and isinstance(i, types.Integer)):
        return None

    def impl(a: Any, i: Any, v: Any) -> None:  # pragma: no cover - compiled
        arr = _arr(a)
        n = arr.shape[0]
        s = i + n if i < 0 else i
        if s < 0 or s >= n:
            _flag(a, i, 1, 2)
            return
        mode = a.mode
        if mode >= RECORD:
            _recorded_write(a, s, v)
        elif _allowed(a, s, True, mode):
            arr[s] = v
        else:
            _flag(a, s, 1, 1)

    return impl


@overload(len)
def _len(a: Any) -> Any:
    if not isinstance(a, RowsType):
        return None

    def impl(a: Any) -> Any:  # pragma: no cover - compiled
        return a.arr.shape[0]

    return impl


@overload_attribute(RowsType, "shape")
def _shape(a: Any) -> Any:
    def impl(a: Any) -> Any:  # pragma: no cover - compiled
        return a.arr.shape

    return impl


@overload_method(RowsType, "take")
def _take(a: Any, ids: Any) -> Any:
    if not (isinstance(ids, types.Array) and isinstance(ids.dtype, types.Integer)):
        return None
    scalar = a.field_dict["arr"].ndim == 1

    def impl(a: Any, ids: Any) -> Any:  # pragma: no cover - compiled
        arr = _arr(a)
        n = arr.shape[0]
        out = np.empty((ids.shape[0],) + arr.shape[1:], dtype=arr.dtype)
        mode = a.mode
        for t in range(ids.shape[0]):
            i = ids[t]
            s = i + n if i < 0 else i
            if s < 0 or s >= n:
                _flag(a, i, 0, 2)
                return out
            if mode >= RECORD:
                if scalar:
                    out[t] = _recorded_scalar(a, s)
                else:
                    out[t] = _recorded_row(a, s)
                continue
            if not _allowed(a, s, False, mode):
                _flag(a, s, 0, 1)
            out[t] = arr[s]
        return out

    return impl


@overload_method(RowsType, "put")
def _put(a: Any, ids: Any, rows: Any) -> Any:
    if not (isinstance(ids, types.Array) and isinstance(ids.dtype, types.Integer)):
        return None

    def impl(a: Any, ids: Any, rows: Any) -> None:  # pragma: no cover - compiled
        arr = _arr(a)
        n = arr.shape[0]
        if rows.shape[0] != ids.shape[0]:
            raise ValueError("put: rows and ids differ in length")
        mode = a.mode
        for t in range(ids.shape[0]):
            i = ids[t]
            s = i + n if i < 0 else i
            if s < 0 or s >= n:
                _flag(a, i, 1, 2)
                return
            if mode >= RECORD:
                _recorded_write(a, s, rows[t])
            elif _allowed(a, s, True, mode):
                arr[s] = rows[t]
            else:
                _flag(a, s, 1, 1)

    return impl


# ==================================================================== per-index random streams
# ``engine.rng()`` in a loop body is ``Generator(Philox(key=K, counter=[j, 0, 0, 0]))``:
# K from (run seed, operator, invocation), j the loop index (``Session.body_rng``).
# Philox is counter-based, so the stream of index j is a pure function of (K, j) that
# compiled code computes as numpy does: the counter is incremented before each block of
# four 64-bit words, every block is ten Philox-4x64 rounds, and a double is the top 53
# bits of a word times 2**-53 (numpy's ``next_double``).  ``uniform()`` is ``0 + 1 * x``
# of those doubles: the same bits.
_M0 = np.uint64(0xD2E7470EE14C6C93)
_M1 = np.uint64(0xCA5A826395121157)
_W0 = np.uint64(0x9E3779B97F4A7C15)
_W1 = np.uint64(0xBB67AE8584CAA73B)
_U11 = np.uint64(11)
_ONE = np.uint64(1)
_ZERO = np.uint64(0)
_TWO_M53 = 1.0 / 9007199254740992.0
#: Philox rounds per block (numpy's ``philox4x64_rounds``).
PHILOX_ROUNDS = 10


@intrinsic
def _mulhilo_ir(typingctx: Any, a: Any, b: Any) -> Any:
    """(high, low) 64-bit words of the 128-bit product of uint64 ``a`` and ``b``: one
    widening multiply (numba has no 128-bit integers; four 32-bit products and their
    carries made the stream cost more than the LDA sweep it feeds)."""
    u64 = types.uint64

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        i128 = _ir.IntType(128)
        wide = builder.mul(builder.zext(args[0], i128), builder.zext(args[1], i128))
        hi = builder.trunc(builder.lshr(wide, _ir.Constant(i128, 64)), _ir.IntType(64))
        lo = builder.trunc(wide, _ir.IntType(64))
        return context.make_tuple(builder, sig.return_type, (hi, lo))

    return types.UniTuple(u64, 2)(u64, u64), codegen  # type: ignore[no-untyped-call]


_mulhilo: Any = _mulhilo_ir


@_disk_cached
def philox_uniform(k0: Any, k1: Any, counter: Any, n: Any) -> Any:  # pragma: no cover
    """``Generator(Philox(key=[k0, k1] as numpy stores it, counter=[counter, 0, 0,
    0])).uniform(size=n)``, bit for bit (all arguments but ``n`` uint64)."""
    out = np.empty(n)
    c0, c1, c2, c3 = counter, _ZERO, _ZERO, _ZERO
    t = 0
    while t < n:
        c0 += _ONE
        if c0 == _ZERO:
            c1 += _ONE
            if c1 == _ZERO:
                c2 += _ONE
                if c2 == _ZERO:
                    c3 += _ONE
        x0, x1, x2, x3 = c0, c1, c2, c3
        y0, y1 = k0, k1
        for r in range(PHILOX_ROUNDS):
            if r > 0:
                y0 += _W0
                y1 += _W1
            hi0, lo0 = _mulhilo(_M0, x0)
            hi1, lo1 = _mulhilo(_M1, x2)
            x0, x1, x2, x3 = hi1 ^ x1 ^ y0, lo1, hi0 ^ x3 ^ y1, lo0
        for v in (x0, x1, x2, x3):
            if t < n:
                out[t] = (v >> _U11) * _TWO_M53
                t += 1
    return out


@structref.register
class StreamType(types.StructRef):
    """numba type of :class:`Stream`."""

    def preprocess_fields(self, fields: Any) -> Any:
        return tuple((name, types.unliteral(typ)) for name, typ in fields)  # type: ignore[no-untyped-call]


class Stream(structref.StructRefProxy):
    """``engine.index_rng`` as a kernel argument: the invocation's Philox key (two
    uint64) and the task loop's ``state``, whose ``S_INDEX`` is the running index."""

    def __new__(cls, key: np.ndarray, state: np.ndarray) -> Stream:
        return _new_stream(key, state)


structref.define_proxy(Stream, StreamType, ["key", "state"])  # type: ignore[no-untyped-call]


def _stream_ctor(key: Any, state: Any) -> Any:  # pragma: no cover - compiled
    return Stream(key, state)


_new_stream = _disk_cached(_stream_ctor)


@overload_method(StreamType, "uniform")
def _uniform(st: Any, n: Any) -> Any:
    if not isinstance(n, types.Integer):
        return None

    def impl(st: Any, n: Any) -> Any:  # pragma: no cover - compiled
        key = st.key
        return philox_uniform(key[0], key[1], np.uint64(st.state[S_INDEX]), n)

    return impl


#: numba's on-disk cache notices a change to a function's own file only, but a kernel
#: body's machine code also holds this module's checks: bodies are cached in a directory
#: named after this module's content and the numba version, so a changed engine never
#: runs a body compiled against the old checks.
_CACHE_LOCK = threading.Lock()
_NB_CONFIG: Any = _numba_config  # numba's settings module (NUMBA_CACHE_DIR and friends)


@functools.cache
def _module_digest() -> str:
    """blake2b of this module's file, read once per process (a kernel compile asks for
    the cache directory three times; the file does not change under a running engine)."""
    return hashlib.blake2b(Path(__file__).read_bytes(), digest_size=8).hexdigest()


def _cache_dir() -> str:
    # the base is looked up on every call: NUMBA_CACHE_DIR may be set at run time
    base = _NB_CONFIG.CACHE_DIR or platformdirs.user_cache_dir("strads-replay")
    return os.path.join(base, "kernels", f"{_module_digest()}-numba{numba.__version__}")


@contextlib.contextmanager
def host_compile_lock(fn: Any) -> Iterator[None]:
    """Held around the first call of kernel ``fn``'s loop: of the processes of one host
    (MPI ranks, other ``replay`` commands) that compile ``fn`` at the same time, one
    compiles it and saves it to numba's disk cache while the others wait, then load it
    from there, all at once, instead of compiling it again.  A cold kernel costs
    several seconds of a core per process (about 9 s for the README's SGDMF kernel):
    on 2 ranks this halves that CPU, and where ranks outnumber cores it saves wall
    time as well.  ``flock`` on a file named after ``fn`` in the cache directory: the
    first process takes it exclusively; one that finds it taken waits for a shared
    lock (the compile done) and goes on without holding it.  The kernel releases the
    lock of a process that exits however it exits; where it cannot be taken (no cache
    directory, a file system without locks) each process compiles on its own."""
    name = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}"
    tag = hashlib.blake2b(name.encode(), digest_size=8).hexdigest()
    try:
        os.makedirs(_cache_dir(), exist_ok=True)
        fd = os.open(os.path.join(_cache_dir(), f".{tag}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process compiles it: wait, then load its result
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_SH)
                fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError:
            pass
        yield
    finally:
        os.close(fd)


def body_cache_dir(fn: Any, frozen: str) -> str:
    """Where kernel ``fn``'s machine code is cached: a directory per module name and
    digest of what compiling it freezes (``frozen``, see ``engine._asyncfor.frozen``).

    numba keys a cached function by its file and name only, but loading it imports the
    module by the name it was compiled under.  The same file is ``replay_user_<hash>``
    under ``replay run FILE:FUNC`` and ``train`` when a test imports it, so each loaded
    the other's entry and stopped with ``does not compile with numba: No module named
    ...``.  Module names of ``replay`` commands change with the file's content, so this
    keeps one entry per version of a file those commands ran (a few hundred kB each),
    and one per set of global values the kernel read (numba's key sees none of them).
    """
    module = str(getattr(fn, "__module__", None) or "_")
    return os.path.join(_cache_dir(), "modules", module, frozen)


def compile_body(fn: Any, frozen: str) -> Any:
    """``fn`` as a numba dispatcher (nopython, releases the GIL, cached on disk, see
    ``body_cache_dir``); compiled on first call.  ``frozen``: the digest of what it
    freezes (``engine._asyncfor.frozen.digest(fn)``)."""
    with _CACHE_LOCK:  # numba reads CACHE_DIR when the dispatcher is made
        old = _NB_CONFIG.CACHE_DIR
        _NB_CONFIG.CACHE_DIR = body_cache_dir(fn, frozen)
        try:
            return njit(nogil=True, cache=True)(fn)
        except RuntimeError:  # no file to key a cache by (a REPL, exec): compile every run
            return njit(nogil=True)(fn)
        finally:
            _NB_CONFIG.CACHE_DIR = old


# One task loop per kernel and number of arguments, each argument passed on its own:
# unpacking a tuple of them per body (``body(j, *args)``) cost 8% of a kernel SGDMF epoch.
# Each kernel gets a loop of its own that calls it as a global, in a file of its own
# (:func:`_kernel_loop`), kept in numba's disk cache like the body: about 1 s of a core
# per process that runs a kernel.  (A loop given the body as an argument cannot be
# cached: numba's cache key would hold the body's dispatcher, a new object in every
# process, so every process would miss and add an entry.)
_LOOP_SOURCE = """
def loop(idx, state, {params}):
    for t in range(idx.shape[0]):
        j = idx[t]
        state[{s_index}] = j
        body(j, {params})
        if state[{s_flag}] != 0:
            return
"""
_LOOPS: dict[Any, Any] = {}


def _loop_source(n: int) -> str:
    params = ", ".join(f"a{k}" for k in range(n))
    return _LOOP_SOURCE.format(params=params, s_index=S_INDEX, s_flag=S_FLAG)


def loop_file(fn: Any, n: int, frozen: str) -> Path | None:
    """Where the disk-cached task loop of kernel function ``fn`` with ``n`` arguments is
    kept, or None where it cannot be (no source file, closure cells numba cannot pickle).

    The name is made of what the body's own cache entry is keyed by (its module, name,
    source file and, for a closure, its cells, as numba does; ``frozen``, the digest of
    the globals, defaults and called functions compiling it freezes) and the template: a
    changed kernel file or global value, or another closure made by the same code, gets
    a loop of its own, so a cached loop never runs another body or an old copy of it
    (the loop calls the body as a global, which numba's key for the loop does not see)."""
    try:
        kernel_file = inspect.getsourcefile(fn)
        text = Path(kernel_file).read_bytes() if kernel_file else None
        cells = tuple(c.cell_contents for c in fn.__closure__ or ())
        cell_bytes = _numba_dumps(cells) if cells else b""  # type: ignore[no-untyped-call]
    except Exception:  # noqa: BLE001 - no file, an empty cell, cells numba cannot pickle
        return None
    if text is None:
        return None
    ident = f"{fn.__module__}\0{fn.__qualname__}\0{kernel_file}\0{frozen}\0".encode()
    digest = hashlib.blake2b(ident + text + _loop_source(n).encode(), digest_size=10)
    digest.update(hashlib.sha256(cell_bytes).digest())
    return Path(_cache_dir()) / "loops" / f"loop_{digest.hexdigest()}.py"


def _kernel_loop(body: Any, n: int, frozen: str) -> Any | None:
    """The disk-cached task loop of the compiled kernel ``body`` with ``n`` arguments
    (:func:`loop_file`), or None where it cannot be cached.  What runs is always the
    template here: the file is only what numba keys the cache by."""
    path = loop_file(body.py_func, n, frozen)
    if path is None:
        return None
    source = _loop_source(n)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text() != source:  # (rewritten: a new stamp)
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            tmp.write_text(source)
            os.replace(tmp, path)
    except OSError:
        return None
    # a module of its own, importable while it lives: loading the cache looks it up
    module = types_mod.ModuleType(f"_strads_replay_{path.stem}")
    module.__file__ = str(path)
    module.body = body  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    exec(compile(source, str(path), "exec"), module.__dict__)  # noqa: S102 - our own template
    with _CACHE_LOCK:
        old = _NB_CONFIG.CACHE_DIR
        _NB_CONFIG.CACHE_DIR = _cache_dir()
        try:
            return njit(nogil=True, cache=True)(module.loop)
        except RuntimeError:  # numba found no cache for it after all
            return None
        finally:
            _NB_CONFIG.CACHE_DIR = old


def _loop(body: Any, n: int, frozen: str) -> Any:
    key = (body, n)
    fn = _LOOPS.get(key)
    if fn is None:  # made outside the lock (a compile); the first one stored wins
        fn = _kernel_loop(body, n, frozen)
        if fn is None:  # compiled in each process
            scope: dict[str, Any] = {"body": body}
            exec(_loop_source(n), scope)  # noqa: S102 - our own template
            fn = njit(nogil=True)(scope["loop"])
        with _CACHE_LOCK:
            fn = _LOOPS.setdefault(key, fn)
    return fn


def run_loop(
    body: Any, frozen: str, idx: np.ndarray, state: np.ndarray, args: tuple[Any, ...]
) -> None:
    """``body(j, *args)`` for every ``j`` in ``idx`` in order; stops after a body that set
    ``state[S_FLAG]`` (the compiled task loop of ``body``, compiled with what digest
    ``frozen`` stands for, for its number of arguments)."""
    _loop(body, len(args), frozen)(idx, state, *args)


__all__ = [
    "ANY_OWN",
    "CHECKED",
    "EXEC",
    "FULL",
    "GUARD",
    "GUARD_RO",
    "RECORD",
    "RECORD_RELAXED",
    "STATE_LEN",
    "C_OV",
    "C_OVBODY",
    "C_READS",
    "C_WRITES",
    "S_ARG",
    "S_FLAG",
    "S_INDEX",
    "S_SLOT",
    "S_WRITE",
    "Rows",
    "Stream",
    "body_cache_dir",
    "compile_body",
    "record_buffers",
    "no_sets",
    "loop_file",
    "philox_uniform",
    "run_loop",
]
