"""Compiled loop bodies: ``@kernel`` functions that ``async_for`` runs as one numba loop.

A kernel is a plain Python function ``body(j, X, Y, ..., a, b)`` whose arguments after
the loop index are numeric ``dvector`` s (relaxed ones too), numpy arrays (read-only:
the closure rule), ``int`` / ``float`` / ``bool`` scalars and :data:`index_rng`::

    @ap.kernel
    def sgd(j, A, W, H, g, lam):
        r = A[j]
        u, i = int(r[0]), int(r[1])
        w = W[u]
        h = H[i]
        err = r[2] - w @ h
        W[u] = w + g * (err * h - lam * w)
        H[i] = h + g * (err * w - lam * h)

    ap.async_for(0, len(A), sgd.bind(A, W, H, g, lam), name="sgd")

``kernel.bind(...)`` returns a :class:`BoundKernel`, which is an ordinary loop body too:
called with ``j`` it runs the Python function on the DDS.  The engine uses that Python
path wherever it needs to see every access as it happens (bodies split across threads
under element locks; ``--break`` in single-node replay).  Reconnaissance is one compiled
loop too, in the ``RECORD`` access mode, which logs every access with the Python
reconnaissance's semantics (:func:`record`); it leaves a range to the Python path when
an index is out of range or compiled code raises, so errors read as they always did.
Everywhere else, a task group is *one* call of a compiled loop over its indices in the
group's order, on the node's replicas, with the plan guard's checks compiled in
(``engine._asyncfor.compiled``).  Plans, rounds, write-back, recording, replay and the
dual tests do not know the difference.

Why the Python function and the compiled one agree bit for bit: rows are copies on both
sides, elementwise numpy expressions compile to the same IEEE operations in the same
order (numba does not contract ``a * b + c`` into a fused multiply-add unless
``fastmath`` is on, and kernels never turn it on), and ``w @ h`` of two float64 vectors is
the same BLAS ``ddot`` in numpy and in numba.

Random numbers: bind :data:`index_rng` and call ``rng.uniform(n)`` in the body.  In
Python that is ``engine.rng().uniform(size=n)``; compiled, it is the same Philox stream
of the running index (``engine._asyncfor.compiled.philox_uniform``), so both paths
draw the same bits.  Each call starts the index's stream afresh, as each
``engine.rng()`` call does.

A relaxed dvector is served from what the Python body would use: the node's replica
with one thread per node, the planned thread's copy with several
(``engine._data.relaxed``); its reconnaissance logs nothing, as in Python.
"""

from __future__ import annotations

import inspect
import re
import threading
import types
from collections.abc import Callable
from typing import Any

import numpy as np

from .._data import dds as _dds
from .._data.dds import ANY_OWN as ANY_OWN_CODE
from .._data.dds import _CheckedMixin, _tls
from .._errors import DDSError, KernelError

#: Scalar argument types a kernel accepts (passed to the compiled loop as they are).
SCALARS = (bool, int, float, np.bool_, np.integer, np.floating)


class IndexRandom:
    """The random stream of the running loop index, as a kernel argument
    (:data:`index_rng`): ``rng.uniform(n)`` is ``engine.rng().uniform(size=n)``, in
    the Python body and, bit for bit, in the compiled one."""

    __slots__ = ()

    def uniform(self, n: int) -> np.ndarray:
        """``n`` doubles uniform in [0, 1): the start of the running index's stream."""
        from .._runtime.session import rng

        return rng().uniform(size=n)

    def __repr__(self) -> str:
        return "engine.index_rng"


#: Bind this where a kernel draws random numbers (see the module doc).
index_rng = IndexRandom()


class Kernel:
    """A loop body to be compiled with numba; :meth:`bind` gives ``async_for`` its body."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        if not inspect.isfunction(fn):
            raise KernelError(f"@kernel needs a Python function, got {type(fn).__name__}")
        params = list(inspect.signature(fn).parameters.values())
        if not params or any(
            p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params
        ):
            raise KernelError(
                f"kernel {fn.__qualname__!r}: its parameters must be the loop index and then "
                "positional DDS and scalar arguments (no *args, **kwargs or keyword-only)"
            )
        self.py_func = fn
        self.__name__ = fn.__name__
        self.__qualname__ = fn.__qualname__
        self.__doc__ = fn.__doc__
        self._sig = inspect.signature(fn)
        self._lock = threading.Lock()
        #: the digest of what compiling the function freezes (its global values, defaults,
        #: called functions: ``engine._asyncfor.frozen``) as of the last ``async_for``,
        #: and the compiled body for each digest seen
        self._frozen = ""
        self._bodies: dict[str, Any] = {}
        self._compiled: set[tuple[Any, ...]] = set()

    def __repr__(self) -> str:
        return f"<kernel {self.__qualname__}>"

    def where(self) -> str:
        """``file:line`` of the kernel's definition."""
        code = self.py_func.__code__
        return f"{code.co_filename}:{code.co_firstlineno}"

    def bind(self, *args: Any, **kwargs: Any) -> BoundKernel:
        """The loop body ``j -> kernel(j, *args)``: DDS arguments as they are, scalars by value."""
        try:
            bound = self._sig.bind(0, *args, **kwargs)
        except TypeError as exc:
            raise KernelError(f"kernel {self.__qualname__!r}: {exc}") from None
        bound.apply_defaults()  # a default is passed like any argument (and checked alike)
        values = list(bound.args[1:])
        names = list(self._sig.parameters)[1:]
        for name, v in zip(names, values, strict=True):
            if isinstance(v, _dds._DDS):
                if _dds.public_class(v) is not _dds.dvector or v.shape is None:
                    raise KernelError(
                        f"kernel {self.__qualname__!r}: argument {name!r} is {v!r}; a kernel "
                        "takes dvectors of numeric rows (shape=...) and int/float/bool scalars"
                    )
            elif isinstance(v, np.ndarray):
                if v.dtype.kind not in "biuf" or v.ndim == 0:
                    raise KernelError(
                        f"kernel {self.__qualname__!r}: argument {name!r} is a numpy array "
                        f"of {v.dtype} with {v.ndim} dimension(s); a kernel takes arrays of "
                        "numbers with at least one dimension"
                    )
                # read-only in both paths: inside a body only DDS are written (closure rule)
                ro = v.view()
                ro.flags.writeable = False
                values[names.index(name)] = ro
            elif not isinstance(v, (*SCALARS, IndexRandom)):
                raise KernelError(
                    f"kernel {self.__qualname__!r}: argument {name!r} is a "
                    f"{type(v).__name__}; a kernel takes numeric dvectors, numpy arrays, "
                    "int/float/bool scalars and engine.index_rng"
                )
        return BoundKernel(self, tuple(values))

    # ---------------------------------------------------------------- compiling
    def refreeze(self) -> str:
        """Take the current values of what compiling the kernel freezes (the driver does
        it before each ``async_for``): a global, default or called function that changed
        since the body was compiled gets a body compiled with the new ones, so the
        compiled loop computes what the Python function computes now."""
        from .frozen import digest

        self._frozen = digest(self.py_func)
        return self._frozen

    def run(self, indices: np.ndarray, state: np.ndarray, args: tuple[Any, ...]) -> None:
        """The compiled loop over ``indices`` (the body is compiled on first use)."""
        from . import compiled

        frozen = self._frozen or self.refreeze()
        body = self._bodies.get(frozen)
        if body is None:
            with self._lock:
                body = self._bodies.get(frozen)
                if body is None:
                    from .._runtime.session import current

                    # numba compiles (or loads from its disk cache) on this first call
                    current().announce(f"compiling kernel {self.__qualname__}")
                    body = self._bodies[frozen] = compiled.compile_body(self.py_func, frozen)
        compiled.run_loop(body, frozen, indices, state, args)


#: Whether reconnaissance of a kernel is compiled (:func:`record`); off inside
#: ``engine.lowlevel.python_kernel_recon()``, which runs the Python function on every body.
COMPILED_RECON = True


def kernel(fn: Callable[..., Any]) -> Kernel:
    """Mark ``fn(j, *dds_and_scalars)`` as a compiled ``async_for`` body (see the module doc).

    >>> import engine as ap
    >>> X = ap.dvector(4, shape=(), init=ap.init.zeros(), name="X")
    >>> @ap.kernel
    ... def triple(j, X, c):
    ...     X[j] = c * j
    >>> ap.async_for(0, 4, triple.bind(X, 3.0), name="triple")
    >>> X.gather().tolist()
    [0.0, 3.0, 6.0, 9.0]
    """
    return Kernel(fn)


class BoundKernel:
    """A kernel with its arguments: a loop body for ``async_for``."""

    __slots__ = ("kernel", "args", "dds_pos", "__weakref__")

    def __init__(self, kernel: Kernel, args: tuple[Any, ...]) -> None:
        self.kernel = kernel
        self.args = args
        self.dds_pos = tuple(k for k, v in enumerate(args) if isinstance(v, _dds._DDS))

    def __call__(self, j: int) -> Any:
        """The Python path: one body on the DDS in whatever mode the engine put them."""
        return self.kernel.py_func(j, *self.args)

    @property
    def python(self) -> Callable[[int], Any]:
        """The same body as a plain Python function of ``j`` (never compiled): the kernel's
        own code with the bound arguments as its parameters' defaults, so that a debugger
        stepping into it is at once in the kernel's first line."""
        fn = self.kernel.py_func
        plain = types.FunctionType(
            fn.__code__, fn.__globals__, fn.__name__, self.args, fn.__closure__
        )
        plain.__qualname__ = fn.__qualname__
        return plain

    def __repr__(self) -> str:
        return f"<kernel {self.kernel.__qualname__} bound to {len(self.args)} argument(s)>"


def wrap_body(hooks: Any, op: str, inv: int, node: int, body: Any) -> Any:
    """``hooks.wrap_body`` (breakpoints): a kernel stays compiled unless the debug hooks
    wrap it, and then they get the kernel's Python function (pdb stops in its code)."""
    if not isinstance(body, BoundKernel):
        return hooks.wrap_body(op, inv, node, body)
    plain = body.python
    wrapped = hooks.wrap_body(op, inv, node, plain)
    return body if wrapped is plain else wrapped


def code_of(body: Any) -> Any:
    """What identifies a body across invocations (a plan is reused while it stays the same)."""
    if isinstance(body, BoundKernel):
        return body.kernel.py_func.__code__
    return getattr(body, "__code__", body)


def python_of(body: Any) -> Any:
    """The Python function whose source the closure rule checks."""
    return body.kernel.py_func if isinstance(body, BoundKernel) else body


# ==================================================================== compile errors
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: Longest numba message kept in a compile error (a signature can be very long).
MAX_MESSAGE = 300
_HEADERS = ("Failed in nopython mode pipeline", "Failed in object mode pipeline")


def first_line(exc: BaseException) -> str:
    """numba's first informative message line (its pipeline header and colours dropped)."""
    lines = [ln.strip() for ln in _ANSI.sub("", str(exc)).splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith(_HEADERS)]
    if not lines:
        return type(exc).__name__
    line = lines[0]
    if line.endswith(":") and len(lines) > 1:  # "No implementation ... for signature:" + it
        line = f"{line} {lines[1].lstrip('>').strip()}"
    return line if len(line) <= MAX_MESSAGE else line[: MAX_MESSAGE - 1] + "…"


def prepare(body: BoundKernel, op: str) -> None:
    """Compile ``body``'s loop for its argument types now, in the driver (every rank), so
    that a kernel numba cannot compile fails before any body runs, with one line."""
    kern = body.kernel
    key = (kern.refreeze(), len(body.args), *(_type_key(v) for v in body.args))
    if key in kern._compiled:
        return
    try:
        from . import compiled
    except ImportError as exc:  # numba missing or broken
        raise KernelError(
            f"async_for {op!r}: kernel {kern.__qualname__!r} ({kern.where()}) needs numba, "
            f"which cannot be imported ({first_line(exc)}); run the Python body instead "
            f"({kern.__name__}.bind(...).python)"
        ) from None
    state = np.zeros(compiled.STATE_LEN, dtype=np.int64)
    args = [_arg(v, k, compiled.EXEC, 0, state, None, _NO_KEY) for k, v in enumerate(body.args)]
    try:
        with compiled.host_compile_lock(kern.py_func):
            kern.run(np.empty(0, dtype=np.int64), state, tuple(args))
    except Exception as exc:  # noqa: BLE001 - any numba failure is the kernel's, said in one line
        raise KernelError(
            f"async_for {op!r}: kernel {kern.__qualname__!r} ({kern.where()}) does not compile "
            f"with numba: {first_line(exc)}; run the Python body instead "
            f"({kern.__name__}.bind(...).python)"
        ) from None
    kern._compiled.add(key)


def _type_key(v: Any) -> Any:
    if isinstance(v, _dds._DDS):
        return ("dds", v._dtype.str, len(v.shape or ()))
    if isinstance(v, np.ndarray):
        return ("array", v.dtype.str, v.ndim, v.flags.c_contiguous, v.flags.f_contiguous)
    return type(v)


_NO_KEY = np.zeros(2, dtype=np.uint64)


def _stream_key(op_key: int | None) -> np.ndarray:
    """The Philox key of the running invocation's body streams (``Session.rng_key``)."""
    if op_key is None:
        return _NO_KEY
    from .._runtime.session import current

    return current().rng_key(op_key)


# ==================================================================== running a task group
def _mode_of(d: Any) -> str:
    """The access mode the engine put DDS ``d`` in (``guard``, ``guard_ro``, ``exec``, ...)."""
    cls = type(d)
    for name, klass in cls._modes.items():
        if klass is cls and name != "exec_obj":
            return name
    return "driver"


def _arg(
    v: Any,
    k: int,
    mode: int,
    code: int,
    state: np.ndarray,
    checker: Any,
    key: np.ndarray,
    arr: np.ndarray | None = None,
) -> Any:
    """Argument ``k`` as the compiled loop takes it; ``arr``: the rows a DDS is served
    from, if not its replica ``v._buf`` (a relaxed dvector's copy of the planned thread)."""
    from . import compiled

    if isinstance(v, IndexRandom):
        return compiled.Stream(key, state)
    if not isinstance(v, _dds._DDS):
        return v

    sets = compiled.no_sets()
    start = 0
    if mode == compiled.CHECKED:
        s = checker.position_sets()
        sets = (s.r_indptr, s.r_ids, s.w_indptr, s.w_ids)
        start = checker.start
    gm = np.frombuffer(v._gm, dtype=np.uint8) if len(v._gm) else np.zeros(0, dtype=np.uint8)
    buf = v._buf if arr is None else arr
    return compiled.Rows(buf, gm, code, mode, k, state, sets, start, v._gbase)


def run_group(body: BoundKernel, indices: np.ndarray) -> None:
    """Run ``body`` for ``indices`` in order as one compiled loop on the bound node's
    replicas, checking every access as the DDS's current mode would in Python."""
    from . import compiled

    if not len(indices):
        return
    kern = body.kernel
    gcode = getattr(_tls, "gcode", 1)
    state = np.zeros(compiled.STATE_LEN, dtype=np.int64)
    key = _stream_key(getattr(_tls, "op_key", None))
    args = []
    for k, v in enumerate(body.args):
        if not isinstance(v, _dds._DDS):
            args.append(_arg(v, k, compiled.EXEC, 0, state, None, key))
            continue
        m = _mode_of(v)
        arr = None
        if m == "relaxed_t":  # several threads: the planned thread's copy (relaxed.py)
            mode, code = compiled.EXEC, 0
            arr = v._rxc[_tls.rthread]
        elif m == "checked":
            mode, code = compiled.CHECKED, 0
        elif m == "guard_ro":
            mode, code = compiled.GUARD_RO, 0
        elif m == "guard":
            mode, code = compiled.GUARD, 1
        elif m == "guard_t":
            mode, code = (compiled.ANY_OWN, 0) if gcode == ANY_OWN_CODE else (compiled.GUARD, gcode)
        elif m == "exec":
            mode, code = compiled.EXEC, 0
        else:
            raise KernelError(
                f"kernel {kern.__qualname__!r}: argument {v.name} is in {m} mode; a kernel runs "
                "only as an async_for body"
            )
        args.append(_arg(v, k, mode, code, state, _dds.CHECKER, key, arr))
    idx = np.ascontiguousarray(indices, dtype=np.int64)
    try:
        kern.run(idx, state, tuple(args))
    except Exception:
        _tls.index = int(state[compiled.S_INDEX])  # the BodyError names the body that raised
        raise
    flag = int(state[compiled.S_FLAG])
    if flag == 0:
        return
    j = int(state[compiled.S_INDEX])
    _tls.index = j
    d = body.args[int(state[compiled.S_ARG])]
    slot, write = int(state[compiled.S_SLOT]), bool(state[compiled.S_WRITE])
    if flag == 2:
        raise DDSError(f"{d.name}: index {slot} out of range for length {len(d)}")
    # the same verdict, message and replan= behaviour as the Python path
    if _dds.CHECKER is not None:
        _CheckedMixin._check(d, slot, write)
    elif _dds.GUARD is not None:
        _dds.GUARD.outside(d, slot, write)
    raise KernelError(  # pragma: no cover - the compiled checks mirror the Python ones
        f"kernel {kern.__qualname__!r}: index {j} touched {d.name}[{slot}], which the compiled "
        "guard refused and the Python guard allows (an engine bug; please report it)"
    )


# ==================================================================== reconnaissance
def record(
    body: BoundKernel, lo: int, hi: int, op_key: int | None = None
) -> tuple[np.ndarray, np.ndarray] | None:
    """Reconnaissance of indices ``lo .. hi-1`` as one compiled loop on the bound node's
    replicas (``RECORD`` mode): the (body position, element id) pairs read and written,
    in the semantics of the Python reconnaissance (reads served from the replica or the
    body's own writes, writes kept from the replica and from every other body).  A
    relaxed dvector is served alike and logged never (``RECORD_RELAXED``); ``op_key``
    names the invocation whose random streams :data:`index_rng` draws.

    ``None`` leaves the range to the Python path: when an index is out of range or the
    compiled code raises (the Python reconnaissance then raises what it always raised,
    naming the body, or, where numba and Python disagree, decides the sets), and inside
    ``python_kernel_recon()``."""
    if not COMPILED_RECON:
        return None
    from . import compiled

    n = hi - lo
    state = np.zeros(compiled.STATE_LEN, dtype=np.int64)
    bufs: dict[int, list[np.ndarray]] = {}  # one set of buffers per DDS, however often passed
    first: dict[int, int] = {}  # the argument position of each DDS's first occurrence
    for k, v in enumerate(body.args):
        if isinstance(v, _dds._DDS) and id(v) not in bufs:
            bufs[id(v)] = list(compiled.record_buffers(v._buf, *_room(n)))
            first[id(v)] = k
    idx = np.arange(lo, hi, dtype=np.int64)
    key = _stream_key(op_key)
    t = 0
    while True:
        made: dict[int, Any] = {}
        args = []
        for v in body.args:
            if not isinstance(v, _dds._DDS):
                args.append(_arg(v, 0, compiled.RECORD, 0, state, None, key))
                continue
            if id(v) not in made:
                mode = compiled.RECORD_RELAXED if _dds.relaxing(v) else compiled.RECORD
                made[id(v)] = compiled.Rows(
                    v._buf, _NO_GM, 0, mode, first[id(v)], state,
                    compiled.no_sets(), lo, v._gbase, tuple(bufs[id(v)]),
                )  # fmt: skip
            args.append(made[id(v)])
        try:
            body.kernel.run(idx[t:], state, tuple(args))
        except Exception:  # noqa: BLE001 - the Python reconnaissance raises it, as it always did
            return None
        flag = int(state[compiled.S_FLAG])
        if flag == 0:
            break
        if flag != compiled.FULL:
            return None
        t = int(state[compiled.S_INDEX]) - lo  # run this body again, with room
        for b in bufs.values():
            _regrow(b, t, compiled)
        state[:] = 0
    reads = [b[0][: b[2][compiled.C_READS]] for b in bufs.values()]
    writes = [b[1][: b[2][compiled.C_WRITES]] for b in bufs.values()]
    empty = np.zeros((0, 2), dtype=np.int64)
    return np.concatenate([empty, *reads]), np.concatenate([empty, *writes])


_NO_GM = np.zeros(0, dtype=np.uint8)


def _room(n: int) -> tuple[int, int]:
    """First room of the RECORD buffers for ``n`` bodies: log entries (one access per body,
    most kernels touch a DDS once or twice; a full log is doubled), overlay rows."""
    return n + 64, 8


def _regrow(b: list[np.ndarray], t: int, compiled: Any) -> None:
    """Drop what body position ``t`` logged, double a full log, empty the overlay."""
    cnt, ovk = b[2], b[4]
    for which, at in ((compiled.C_READS, 0), (compiled.C_WRITES, 1)):
        log, used = b[at], int(cnt[which])
        cnt[which] = int(np.searchsorted(log[:used, 0], t))
        if used == len(log):
            grown = np.empty((2 * len(log), 2), dtype=np.int64)
            grown[: cnt[which]] = log[: cnt[which]]
            b[at] = grown
    ovk[ovk == t] = -1
    cnt[compiled.C_OV] = 0
    cnt[compiled.C_OVBODY] = -1


__all__ = [
    "BoundKernel",
    "IndexRandom",
    "Kernel",
    "kernel",
    "code_of",
    "first_line",
    "index_rng",
    "prepare",
    "python_of",
    "record",
    "run_group",
    "wrap_body",
]
