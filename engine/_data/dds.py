"""Distributed data structures: ``dvector``, ``dmap`` and ``dmultimap``.

Every node keeps a full-size replica (its *cache*) of each numeric DDS; element ownership
(range partitioning for ``dvector``, hash partitioning for ``dmap``) decides which
replica is authoritative for gathers and digests (the element's *home*).  After an
``async_for`` invocation a written row's last value is sure to be only at its home and
on the nodes that touched it last; its slot is then *dirty* (``_dirty``, the same on
every rank: a function of the plans).  The next ``async_for`` fetches the dirty rows its
nodes touch from their homes; every other reader of replicas (driver reads, ``map``,
``reduce``, ``create``, ``sync_for``, reconnaissance, the serial fallback) makes the
DDS whole first, collectively (:func:`make_whole`).

A dvector of Python objects is *sharded* (``sharded=True``, its default): each node's
storage is a dict that holds only its home rows and the rows its loop tasks touch
(``engine._data.shard``); a read of a row the node does not hold is a plan violation
inside an ``async_for`` round and :class:`ShardMissError` anywhere else.

A DDS instance changes class with the engine's mode instead of testing a flag on
every access, so the hot path (``X[i]`` inside a loop body) is one numpy indexing
operation:

* driver mode (the public class): reads come from the owner's replica, writes go to
  every local replica (the driver is SPMD, so every rank performs the same write);
* exec mode: reads and writes go to the replica of the node running the body;
* recon mode: reconnaissance execution, which logs element ids and keeps writes in
  a per-body overlay instead of committing them;
* checked mode: exec mode plus a check that each access is inside the body's
  reconnaissance sets.

``X[i]`` returns a *copy* of a numeric row, and Python-object elements cross every
boundary with user code by value (``engine._data.values.detached``): changing what was
read, or what was written, never changes the DDS, and ``X[i] = v`` (or ``X[i] += v``) is
the only way to write, which is what makes every write visible to the engine.
"""

from __future__ import annotations

import hashlib
import math
import pickle
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import xxhash

from .._errors import (
    AccessOutsideReconError,
    DDSError,
    DriverStepsDivergedError,
    ShardMissError,
    _shown,
)
from .._runtime import checkpoint as _checkpoint
from .._runtime.checkpoint import collective
from .._runtime.session import _tls, current, not_seen
from . import digest as _digest
from .values import detached, stable_text

if TYPE_CHECKING:
    from .._runtime.session import Session

#: Bits reserved for the slot inside a global element id (``dds_id << SLOT_BITS | slot``).
SLOT_BITS = 40
SLOT_MASK = (1 << SLOT_BITS) - 1
_MISSING = object()
#: A row a node does not hold, in :meth:`_DDS.rows` with ``absent_ok`` (an undo snapshot
#: of a sharded dvector); :meth:`_DDS.set_rows` drops the row again.  Never sent.
_ABSENT = object()

#: Guard codes, one byte per slot and node (see ``engine._asyncfor.guard``): who may touch a
#: slot in the running round.  ``FREE``: nobody writes it, anyone may read it;
#: ``1 .. LOCKED-1``: the thread whose code this is (thread + 1) writes it;
#: ``LOCKED``: the lock-split tasks write it under per-element locks; ``OTHER``:
#: another node writes it in this round, so reading it here races with that write.
FREE = 0
LOCKED = 254
OTHER = 255
#: ``_tls.gcode`` of a body running under per-element locks: never equal to a slot's
#: code, so every access to a written slot goes through the held-lock check.
LOCKED_BODY = 253
#: ``_tls.gcode`` when one thread runs all of a node's tasks in a forced order (single
#: node replay): any slot of this node's tasks is its own.
ANY_OWN = 252
_NO_GUARD = bytearray()


def stable_hash(key: Any) -> int:
    """A process-independent hash (Python's ``hash`` of ``str`` is salted per process)."""
    if isinstance(key, (int, np.integer)):
        return int(key)
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little")


def value_bytes(value: Any) -> bytes:
    """What a driver write's value is compared by across ranks: an array's dtype, shape and
    bytes; anything else pickled (its type name alone if it cannot be pickled)."""
    if isinstance(value, np.ndarray):
        head = f"{value.dtype.str}{value.shape}".encode()
        return head + np.ascontiguousarray(value).tobytes()
    try:
        return pickle.dumps(value, protocol=5)
    except Exception:  # noqa: BLE001 - not picklable: its type is all that compares
        return type(value).__qualname__.encode()


class _Recon:
    """The access log of the body running under reconnaissance execution."""

    __slots__ = ("reads", "writes", "overlay", "later", "misses", "asked")

    def __init__(self) -> None:
        #: a body asked ``ap.reconnaissance()`` (so it may declare rows, not compute them)
        self.asked = False
        self.reads: list[int] = []
        self.writes: list[int] = []
        #: the running body's writes, by element id (read back by its later reads)
        self.overlay: dict[int, Any] = {}
        #: writes not yet in ``overlay`` (element ids, rows), oldest first: a ``put``
        #: block and every write after one wait here until the body reads (most bodies
        #: never read a row back, and a block moved row by row costs a dict entry each)
        self.later: list[tuple[list[int], Any]] = []
        #: (node, element id) of sharded rows a body read that its node does not hold
        self.misses: list[tuple[int, int]] = []

    def write(self, gid: int, value: Any) -> None:
        """The running body writes ``value`` to element ``gid``: after the waiting blocks."""
        if self.later:
            self.later.append(([gid], (value,)))
        else:
            self.overlay[gid] = value

    def flush(self) -> None:
        """Move the waiting writes into ``overlay``, in the order they came."""
        for gids, rows in self.later:
            self.overlay.update(zip(gids, rows, strict=True))
        self.later.clear()

    def clear(self) -> None:
        """Forget the running body's writes (the next body starts from the replica)."""
        self.overlay.clear()
        self.later.clear()


class _Checker:
    """Allowed element ids per loop index, for checked mode.

    A thread runs one body at a time and its accesses come together, so each thread
    keeps the sets of the body it runs now (``tls.allowed``), not those of every body of
    the invocation: memory O(threads), where a cache per index held two sets for each
    of the invocation's bodies (about 50 MB for 100,000 SGDMF bodies)."""

    def __init__(self, op: str, sets: Any, start: int, tls: Any) -> None:
        self.op = op
        self.sets = sets
        self.start = start
        self.tls = tls
        self._expanded: dict[int, Any] = {}

    def position_sets(self) -> Any:
        """The sets indexed by position, as the compiled loops read them: a node's
        kept sets (``NodeSets``) spread over every position, once per node."""
        if not hasattr(self.sets, "expanded"):
            return self.sets
        node = current().current_node
        if node not in self._expanded:
            self._expanded[node] = self.sets.expanded(node)
        return self._expanded[node]

    def allowed(self) -> tuple[int, frozenset[int], frozenset[int]]:
        tls = self.tls
        j = tls.index
        got = getattr(tls, "allowed", None)
        if got is None or got[0] is not self or got[1] != j:
            k = j - self.start
            w = frozenset(self.sets.writes_of(k).tolist())
            r = frozenset(self.sets.reads_of(k).tolist()) | w
            got = tls.allowed = (self, j, r, w)
        return got[1], got[2], got[3]


# Set by the session while a mode other than driver mode is active.
RECON: _Recon | None = None
CHECKER: _Checker | None = None
#: The plan guard of the running ``async_for`` invocation (``engine._asyncfor.guard.Guard``).
GUARD: Any = None
#: Reads of sharded rows that a node does not hold, outside an ``async_for`` round
#: (``engine._data.shard.check_missed`` raises the first after the operator).
MISSED: list[Exception] = []


class _DDS:
    """Behaviour shared by every distributed data structure."""

    __slots__ = (
        "_name",
        "_id",
        "_gbase",
        "_sess",
        "_bufs",
        "_buf",
        "_shape",
        "_dtype",
        "_numeric",
        "_version",
        "_digest",
        "_gm",
        "_gms",
        "_relaxed",
        "_rxs",
        "_rxc",
        "_dirty",
        "_holder",
        "_sharded",
        "_cache",
        "__weakref__",
    )
    _modes: dict[str, type]
    kind = "dds"

    # The slots above, as ``_setup`` and the subclasses fill them.
    _name: str
    _id: int
    _gbase: int
    _sess: Session
    _bufs: dict[int, Any]
    _buf: Any
    _shape: Any  # tuple[int, ...] for numeric elements, None for Python objects
    _dtype: np.dtype[Any]
    _numeric: bool
    _version: int
    _digest: tuple[int, str] | None
    _gm: bytearray
    _gms: dict[int, bytearray]
    #: declared ``relaxed=True`` (see ``engine._data.relaxed``); ``_rxs``: per local node,
    #: one working copy per thread while a round runs with several threads; ``_rxc``: the
    #: copies of the node the DDS is bound to
    _relaxed: bool
    _rxs: dict[int, list[np.ndarray]]
    _rxc: list[np.ndarray]
    #: sorted slots whose replicas away from home may be old (None: every replica whole)
    _dirty: np.ndarray | None
    #: per dirty slot, the node that wrote its last value (it holds it too)
    _holder: np.ndarray | None
    #: storage is a dict per node: home rows plus the rows its tasks touch
    _sharded: bool
    #: sharded: per reason (an operator's plan, a reconnaissance), per node of the
    #: cluster, the sorted slots away from home that the node holds for it
    _cache: dict[str, list[np.ndarray]]

    # Every concrete DDS (dvector, dmap) defines these; code that takes any ``_DDS``
    # relies on them.  Declared for the type checker only, so lookups stay as they were.
    if TYPE_CHECKING:

        def __len__(self) -> int: ...
        def __getitem__(self, key: Any) -> Any: ...
        def __setitem__(self, key: Any, value: Any) -> None: ...
        def owner(self, key: Any) -> int: ...
        def owned(self, node: int) -> np.ndarray: ...
        def key_of(self, slot: int) -> Any: ...
        def gather(self) -> np.ndarray: ...
        def _slot(self, key: Any) -> int: ...
        def _digest_head(self) -> bytes: ...

    def _setup(self, sess: Session, name: str | None, shape: Any, dtype: Any) -> None:
        self._sess = sess
        self._numeric = shape is not None
        if self._numeric:
            self._shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(shape)
            self._dtype = np.dtype(dtype)
        else:
            self._shape = None
            self._dtype = np.dtype(object)
        self._id = sess.register(self, name)
        self._gbase = self._id << SLOT_BITS
        self._version = 0
        self._digest = None
        self._gm = _NO_GUARD
        self._gms = {}
        self._relaxed = False
        self._rxs = {}
        self._rxc = []
        self._dirty = None
        self._holder = None
        self._sharded = False
        self._cache = {}

    # ----------------------------------------------------------------- identity
    @property
    def name(self) -> str:
        """The name used in traces, digests and error messages."""
        return self._name

    @property
    def shape(self) -> tuple[int, ...] | None:
        """Shape of one numeric element, or ``None`` for Python-object elements."""
        return self._shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """The numpy dtype of the elements (``object`` for Python-object elements)."""
        return self._dtype

    def _desc(self, key: Any) -> str:
        return f"{self._name}[{key!r}]"

    def _touch(self) -> None:
        """Every write path calls this: it is what invalidates the cached digest."""
        self._version += 1

    def _note_driver_write(self, key: Any, value: Any) -> None:
        """Under MPI, hand a driver write to the session, which compares every rank's
        writes at the next driver operation (each rank writes every replica it holds)."""
        if not self._sess.cluster.is_mpi:
            return
        if isinstance(value, np.generic):  # a row of a 1-d numeric DDS, as an array
            value = np.asarray(value)
        self._sess.note_write(self._desc(key), value_bytes(value), lambda: _shown(value))

    def _bind(self, node: int) -> None:
        """Serve accesses from ``node``'s replica, checked against its guard map."""
        self._buf = self._bufs[node]
        self._gm = self._gms.get(node, _NO_GUARD)

    def _set_mode(self, mode: str) -> None:
        set_mode(self, mode)

    # ----------------------------------------------------------------- storage
    def _new_storage(self, n: int) -> Any:
        if self._numeric:
            return np.zeros((n, *self._shape), dtype=self._dtype)
        return [None] * n

    def _read_slot(self, buf: Any, slot: int) -> Any:  # _copy_out, inlined: a hot path
        if self._numeric:
            return buf[slot].copy()
        try:
            v = buf[slot]
        except KeyError:  # a sharded dvector's row this node does not hold
            v = _absent(self, slot, buf)
        return detached(v)

    def _copy_out(self, v: Any) -> Any:
        """A stored element as user code gets it: a copy of a numeric row, an object
        element detached (:func:`~engine._data.values.detached`)."""
        return v.copy() if self._numeric else detached(v)

    def _coerce(self, value: Any) -> Any:
        if not self._numeric:
            return detached(value, self._name)
        arr = np.asarray(value, dtype=self._dtype)
        if arr.shape != self._shape:
            try:
                arr = np.broadcast_to(arr, self._shape)
            except ValueError:
                raise DDSError(
                    f"{self._name}: cannot store a value of shape {arr.shape} in an element "
                    f"of shape {self._shape}"
                ) from None
        return arr.copy()

    # ----------------------------------------------------------------- rows for transport
    def rows(self, node: int, slots: np.ndarray, *, absent_ok: bool = False) -> Any:
        """The values at ``slots`` in ``node``'s replica (numpy block or list).  A row a
        sharded node does not hold is :data:`_ABSENT` with ``absent_ok``, else an
        engine error (a sender always holds what it sends)."""
        buf = self._bufs[node]
        if self._numeric:
            return buf[slots]
        keys = range(*slots.indices(len(self))) if isinstance(slots, slice) else slots.tolist()
        if type(buf) is not dict:
            return [buf[s] for s in keys]
        if absent_ok:
            return [buf.get(s, _ABSENT) for s in keys]
        try:
            return [buf[s] for s in keys]
        except KeyError as exc:
            raise RuntimeError(
                f"engine error: node {node} does not hold {self._desc(exc.args[0])}, which "
                "it was to send"
            ) from None

    def set_rows(
        self, node: int, slots: np.ndarray, values: Any, *, held_only: bool = False
    ) -> None:
        """Overwrite ``slots`` of ``node``'s replica with ``values`` (a sharded node takes
        in the rows it is sent; an :data:`_ABSENT` value drops its row again; with
        ``held_only`` it keeps only the rows it holds already: a restored checkpoint)."""
        buf = self._bufs[node]
        if self._numeric:
            buf[slots] = values
        elif type(buf) is dict:
            for s, v in zip(slots.tolist(), values, strict=True):
                if v is _ABSENT:
                    buf.pop(s, None)
                elif not held_only or s in buf:
                    buf[s] = v
        else:
            for s, v in zip(slots.tolist(), values, strict=True):
                buf[s] = v
        self._touch()

    def row_nbytes(self) -> int:
        """Bytes of one numeric element."""
        return math.prod(self._shape) * self._dtype.itemsize

    # ----------------------------------------------------------------- digests
    def digest(self) -> str:
        """Digest of the authoritative content (owners' replicas), by the session's hash
        (``engine._data.digest``: xxh3-128 unless the run or its trace says blake2b-128);
        collective."""
        return self._sess.digests_of([self])[0]

    def _digest_fresh(self) -> bool:
        """True when the cached digest still describes this process's replicas."""
        cached = self._digest
        return cached is not None and cached[0] == self._version

    def _compute_digest(self) -> str:
        """Hash the authoritative content now (collective) and cache it under the version
        counter, which every write path bumps."""
        version = self._version
        head = self._full_digest_head()
        kind = self._sess.digest_kind
        if self._numeric:  # the owners' rows, hashed where they meet (no copy in process)
            hexd = self._sess.cluster.owned_digest(self, head, kind)
        else:
            h = _digest.new(kind, head)
            self._hash_values(h, self._sess.cluster.gather_owned(self))
            hexd = _digest.text(kind, h)
        self._digest = (version, hexd)
        return hexd

    def _runs_from_layout(self, nodes: int) -> list[tuple[int, int]] | None:
        """Each node's owned slots as (lo, hi) runs when the layout says so without
        looking at them (see ``engine._runtime.transport._owned_runs``), else None."""
        return None

    def _full_digest_head(self) -> bytes:
        """What a digest hashes before the rows: kind, name, shape, dtype and layout."""
        head = f"{self.kind}:{self._name}:{self._shape}:{self._dtype.str}".encode()
        return head + self._digest_head()

    def _hash_values(self, h: Any, values: Any) -> None:
        if self._numeric:
            h.update(np.ascontiguousarray(values).tobytes())
        else:
            for v in values:
                if isinstance(v, np.ndarray):
                    h.update(v.dtype.str.encode())
                    h.update(np.ascontiguousarray(v).tobytes())
                else:
                    h.update(stable_text(v).encode())
                h.update(b"\x00")


def homes(d: _DDS, slots: np.ndarray) -> np.ndarray:
    """The home (owning node) of each of ``slots`` of ``d``, vectorised."""
    slots = np.asarray(slots, dtype=np.int64)
    if isinstance(d, dvector) and type(d).owned is dvector.owned:
        return np.searchsorted(d._bounds, slots, side="right").astype(np.int64) - 1
    if isinstance(d, dmap):
        return np.asarray(d._owners, dtype=np.int64)[slots]
    out = np.empty(len(d), dtype=np.int64)
    for p in range(d._sess.cluster.size):
        out[d.owned(p)] = p
    return out[slots]


def mark_dirty(d: _DDS, slots: np.ndarray, holders: np.ndarray) -> None:
    """``slots`` of ``d`` may now be old away from their homes and from ``holders`` (per
    slot, the node that wrote its last value): an ``async_for`` wrote them and sent the
    last values home only.  Every rank calls this alike."""
    if not len(slots) or d._sess.cluster.size == 1:
        return
    if d._dirty is None or d._holder is None:
        d._dirty, d._holder = slots.astype(np.int64), holders.astype(np.int64)
        return
    every = np.concatenate([d._dirty, slots])
    held = np.concatenate([d._holder, holders])
    order = np.lexsort((np.arange(len(every)), every))  # by slot, the newest last
    every, held = every[order], held[order]
    last = np.ones(len(every), dtype=bool)
    last[:-1] = every[1:] != every[:-1]
    d._dirty, d._holder = every[last], held[last].astype(np.int64)


def clean(d: _DDS, slots: np.ndarray | None = None) -> None:
    """Every replica of ``slots`` of ``d`` (default: all) is whole again."""
    if d._dirty is None or d._holder is None:
        return
    keep = (
        np.zeros(len(d._dirty), dtype=bool)
        if slots is None
        else ~np.isin(d._dirty, slots, assume_unique=False)
    )
    if keep.any():
        d._dirty, d._holder = d._dirty[keep], d._holder[keep]
    else:
        d._dirty = d._holder = None


def make_whole(
    dds: Iterable[_DDS] | None = None, sess: Session | None = None, *, step: str | None = None
) -> int:
    """Collective: each home sends its dirty rows of ``dds`` (default: every DDS) to every
    other node, so every replica is whole again, and the DDS are clean.  Every rank
    calls it at the same driver step (the dirty slots are the same on every rank, so
    the messages are too).  ``step`` names a driver step that is not an operator (a
    driver read): the ranks agree on it first, so a rank that reads alone gets
    :class:`DriverStepsDivergedError` (as its peers do at their next step) instead of
    waiting for rows nobody sends.  Returns the number of messages."""
    sess = sess if sess is not None else current()
    todo = [d for d in (sess.dds if dds is None else dds) if d._dirty is not None]
    if not todo:
        return 0
    if step is not None:
        sess.agree(step)
    P = sess.cluster.size
    by_pair: dict[tuple[int, int], list[tuple[_DDS, np.ndarray]]] = {}
    for d in todo:
        if d._sharded:  # nothing to send: the old copies away from home are dropped
            drop_stale(d)
            continue
        slots = d._dirty
        assert slots is not None
        h = homes(d, slots)
        for src in np.unique(h).tolist():
            rows = slots[h == src]
            for dst in range(P):
                if dst != src:
                    by_pair.setdefault((src, dst), []).append((d, rows))
        clean(d)
    messages = [(src, dst, parts) for (src, dst), parts in sorted(by_pair.items())]
    sess.cluster.exchange(messages)
    return len(messages)


def drop_stale(d: _DDS) -> None:
    """A sharded DDS made whole: each node away from home that holds an old copy of a
    dirty slot (it is not the slot's :attr:`_holder`) drops it, from its storage and from
    the record of what it holds (``_cache``), so the next operator that needs the row
    fetches it from home (``engine._data.shard.ensure_rows``).  Every rank alike."""
    dirty, holder = d._dirty, d._holder
    if dirty is None or holder is None:
        return
    for why, per_node in d._cache.items():
        for p, held in enumerate(per_node):
            if not len(held):
                continue
            k = np.minimum(np.searchsorted(dirty, held), len(dirty) - 1)
            old = (dirty[k] == held) & (holder[k] != p)
            if old.any():
                buf = d._bufs.get(p)
                if buf is not None:
                    for s in held[old].tolist():
                        buf.pop(s, None)
                per_node[p] = held[~old]
        d._cache[why] = per_node
    clean(d)


def _absent(d: _DDS, i: Any, buf: Any = None) -> Any:
    """The slow path of a read of ``d[i]`` that the node's storage could not serve
    (``buf``, default the bound one): a negative index, or a row a sharded node does not
    hold, which is a violation of the plan inside an ``async_for`` round and
    :class:`ShardMissError` anywhere else."""
    s = d._slot(i)
    b = d._buf if buf is None else buf
    v = b.get(s, _MISSING) if type(b) is dict else b[s]
    if v is _MISSING:
        _missing(d, s, False)
    return v


def _store(d: _DDS, i: Any, value: Any) -> None:
    """A sharded dvector's write of ``d[i] = value`` on the bound node (the guard, if
    any, has cleared it): only a row the node holds is written."""
    buf = d._buf
    if i not in buf:
        i = _absent_write(d, i)
    buf[i] = detached(value, d._name)


def _absent_write(d: _DDS, i: Any) -> int:
    """The slow path of a write of ``d[i]`` on a sharded node that does not hold ``i``
    (or was given a negative index): the slot to write, if the node holds it."""
    s = d._slot(i)
    if s not in d._buf:
        _missing(d, s, True)
    return s


def _missing(d: _DDS, s: int, write: bool) -> None:
    if GUARD is not None:  # inside an async_for round: the body left its plan
        GUARD.outside(d, s, write, strict="held")
    refused = not_seen(lambda: d._desc(d.key_of(s)), write, "a sharded row this node does not hold")
    if refused is not None:
        raise refused
    node = d._sess.current_node
    err = ShardMissError(d._desc(d.key_of(s)), d._name, s, node, d._gbase | s)
    if RECON is not None:  # reconnaissance fetches the row and runs again
        RECON.misses.append((node, d._gbase | s))
    else:  # noticed after the operator even if the body swallows it
        MISSED.append(err)
    raise err


def gathered(d: _DDS) -> np.ndarray:
    """Every element of ``d`` from its owners, to hand to user code (``gather``,
    ``evaluate``, ``store``): Python objects detached (:func:`detached`)."""
    out = d._sess.cluster.gather_owned(d)
    if not d._numeric:
        for k, v in enumerate(out.tolist()):
            out[k] = detached(v)
    return out


# ====================================================================== dvector
class HomeRows(list[Any]):
    """``dvector(n, data=HomeRows(rows))``: ``rows`` are this MPI rank's home rows of a
    sharded dvector, in index order (``engine._data.ops.load`` reads them per rank)."""


def _check_same_data(sess: Any, what: str, full: Any) -> None:
    """Under MPI every rank must create a DDS from the same data: each node keeps a whole
    replica, so a rank that loads its own shard, or draws unseeded random numbers, gives
    the nodes different copies of the rows they do not own, and reads of those rows would
    differ between ranks without any digest noticing.  One hash of the data per rank,
    compared in the step check every driver operation makes (:func:`value_bytes`)."""
    if not sess.cluster.is_mpi:
        return
    text = xxhash.xxh3_128_hexdigest(value_bytes(full))
    got = sess.agree(f"creating {what} from data", text)
    if len(set(got)) > 1:
        raise DriverStepsDivergedError([f"{what} from data #{t[:8]}" for t in got], verb="created")


class dvector(_DDS):  # noqa: N801 - the name is part of the user API
    """A distributed vector of ``n`` elements, range-partitioned over the nodes.

    Elements are fixed-shape numeric rows (give ``shape``) or Python objects.

    ``relaxed=True`` declares values that many bodies update and that tolerate bounded
    staleness (LDA's topic totals).  A relaxed dvector is left out of ``async_for``'s
    conflict analysis: reconnaissance records none of its accesses, so it never makes
    two bodies conflict.  Inside a round a body reads *the value at the start of the
    round plus the changes made by the bodies that ran before it on its own node and
    thread* (each thread of a node works on its own copy, so there is no data race);
    what it writes is kept as a delta against the round's start.  At every round end
    every node gets the start value plus the sum of all deltas, summed in node order
    (a node's delta being the sum of its threads' deltas in thread order), so replay is
    bitwise with nothing to record.  Test mode (``--checked``, dual tests) turns
    relaxation off: the dvector is then an ordinary one.  Only numeric dvectors can be
    relaxed, and ``sync_for`` bodies may read but not write them (``sync_for``'s
    reconnaissance refuses the write; with ``re=False``, which skips it, a body that
    references the dvector is refused).

    >>> import engine as ap
    >>> W = ap.dvector(4, shape=(2,), init=ap.init.constant(1.0), name="W")
    >>> W[1] += 2.0
    >>> W.gather()[:, 0].tolist()
    [1.0, 3.0, 1.0, 1.0]
    >>> total = ap.dvector(1, shape=(), dtype=np.int64, relaxed=True, name="total")
    >>> def count(j):
    ...     total[0] += 1
    >>> ap.async_for(0, 10, count, name="count")
    >>> int(total[0])
    10
    """

    __slots__ = ("_n", "_bounds")
    kind = "dvector"

    def __init__(
        self,
        n: int,
        *,
        shape: int | tuple[int, ...] | None = None,
        dtype: Any = np.float64,
        init: Callable[..., np.ndarray] | None = None,
        data: Iterable[Any] | np.ndarray | None = None,
        name: str | None = None,
        relaxed: bool = False,
        sharded: bool | None = None,
    ) -> None:
        sess = current()
        n = int(n)
        if n < 0:
            raise DDSError(f"dvector length must be >= 0, got {n}")
        self._n = n
        if relaxed:
            _check_relaxable(name, shape, dtype)
        if sharded and shape is not None:
            what = f"dvector {name}" if name else "dvector"
            raise DDSError(
                f"{what}: sharded=True holds Python-object rows only (no shape=...); "
                "numeric rows are kept whole on every node"
            )
        self._setup(sess, name, shape, dtype)
        self._relaxed = bool(relaxed)
        # one node holds every row at home: a list then, cheaper than a dict
        self._sharded = shape is None and sharded is not False and sess.cluster.size > 1
        if relaxed and not relaxing(self):
            sess.note_exact("relaxed", self.name)
        try:
            self._allocate(sess, n, init, data)
        except (MemoryError, OverflowError) as exc:
            # a length computed from a bad input line (a huge id) must not be an internal error
            raise DDSError(
                f"dvector {self._name}: cannot allocate {n} elements ({type(exc).__name__}); "
                "check the data its length was computed from"
            ) from None

    def _allocate(self, sess: Any, n: int, init: Any, data: Any) -> None:
        full: Any  # numpy block, list of objects, or None (fresh storage)
        P = sess.cluster.size
        self._bounds = np.array([n * p // P for p in range(P + 1)], dtype=np.int64)
        if isinstance(data, HomeRows):  # ``load`` under MPI: this rank's home rows only
            node = sess.cluster.local_nodes[0]
            lo, hi = int(self._bounds[node]), int(self._bounds[node + 1])
            if not self._sharded or len(sess.cluster.local_nodes) != 1 or len(data) != hi - lo:
                raise RuntimeError("engine error: home rows for a dvector that is not sharded")
            rows = [detached(v, self._name) for v in data]
            self._bufs = {node: dict(zip(range(lo, hi), rows, strict=True))}
            self._buf = self._bufs[node]
            return
        if self._numeric:
            _check_memory(
                self, n, len(sess.cluster.local_nodes) + (data is None and init is not None)
            )
        if data is not None:
            if self._numeric:
                full = np.asarray(data, dtype=self._dtype).reshape((n, *self._shape))
            else:
                full = [detached(v, self._name) for v in data]
                if len(full) != n:
                    raise DDSError(f"dvector {self._name}: data has {len(full)} items, n={n}")
            _check_same_data(sess, f"dvector {self._name!r}", full)
        elif self._numeric and init is not None:
            full = init(sess.init_rng(self._name), (n, *self._shape), self._dtype)
        else:
            full = None
        self._bufs = {}
        for node in sess.cluster.local_nodes:
            if self._sharded:  # its home rows only
                lo, hi = int(self._bounds[node]), int(self._bounds[node + 1])
                rows = full[lo:hi] if full is not None else [None] * (hi - lo)
                self._bufs[node] = dict(zip(range(lo, hi), rows, strict=True))
            elif full is None:
                self._bufs[node] = self._new_storage(n)
            elif self._numeric:
                self._bufs[node] = np.array(full, dtype=self._dtype, copy=True)
            else:
                self._bufs[node] = list(full)
        self._buf = self._bufs[sess.cluster.local_nodes[0]]

    # ---------------------------------------------------------------- partitioning
    def owner(self, i: int) -> int:
        """The node that owns element ``i``."""
        return int(np.searchsorted(self._bounds, i, side="right") - 1)

    def owned(self, node: int) -> np.ndarray:
        """Slots owned by ``node``."""
        return np.arange(self._bounds[node], self._bounds[node + 1], dtype=np.int64)

    def _runs_from_layout(self, nodes: int) -> list[tuple[int, int]] | None:
        if type(self).owned is not dvector.owned:  # a subclass may own otherwise
            return None
        b = self._bounds.tolist()
        if len(b) != nodes + 1 or b[0] != 0 or b[-1] != self._n:
            return None
        return list(zip(b[:-1], b[1:], strict=True))

    def _slot(self, i: Any) -> int:
        try:
            s = int(i)
        except (TypeError, ValueError):
            raise DDSError(f"{self._name}: index must be an integer, got {i!r}") from None
        if s < 0:
            s += self._n
        if not 0 <= s < self._n:
            raise DDSError(f"{self._name}: index {i} out of range for length {self._n}")
        return s

    def key_of(self, slot: int) -> Any:
        """The user-facing index of ``slot``."""
        return slot

    def __len__(self) -> int:
        return self._n

    # ---------------------------------------------------------------- driver access
    def _auth_buf(self, slot: int) -> Any:
        bufs = self._bufs
        owner = self.owner(slot)
        return bufs[owner] if owner in bufs else self._buf

    def __getitem__(self, i: Any) -> Any:
        if _checkpoint.STALE is not None:  # fast-forwarding: the value may be stale
            _checkpoint.STALE(self)
        if self._dirty is not None:  # an MPI rank reads its own replica: whole first
            make_whole([self], step=f"a driver read of {self._name}")
        s = self._slot(i)
        if self._sharded and self._sess.cluster.is_mpi:
            return self._read_remote(s)
        return self._read_slot(self._auth_buf(s), s)

    def _read_remote(self, s: int) -> Any:
        """A driver read of a sharded row under MPI: the home's value, from one allgather
        that every rank makes (the driver is SPMD; rank p hosts node p)."""
        home = self.owner(s)
        buf = self._bufs.get(home)
        got = self._sess.agree(f"a driver read of {self._desc(s)}", None if buf is None else buf[s])
        return detached(got[home])

    def __setitem__(self, i: Any, value: Any) -> None:
        s = self._slot(i)
        v = self._coerce(value)
        home = self.owner(s) if self._sharded else -1
        for node, buf in self._bufs.items():
            if home < 0 or node == home or s in buf:
                buf[s] = v
        self._touch()
        self._note_driver_write(s, v)

    # ---------------------------------------------------------------- many rows at once
    # The definitions here go row by row through ``X[i]``, so they are right in every
    # mode; the hot modes below override them with one numpy operation, taken only when
    # no per-row check could fire (else they fall back to these), so the two agree bit
    # for bit.  Measured on LDA (lee, 10 topics): ~12,000 row accesses per iteration at
    # ~2 us each were 25 ms of an iteration whose compiled sweep is 1.4 ms.
    def take(self, ids: Any) -> np.ndarray:
        """Rows ``ids`` of a numeric dvector as one ``(len(ids), *shape)`` array: what
        ``np.array([X[i] for i in ids])`` gives, with every check ``X[i]`` makes.

        >>> import engine as ap
        >>> X = ap.dvector(4, shape=(2,), data=np.arange(8.0), name="X")
        >>> X.take([3, 1]).tolist()
        [[6.0, 7.0], [2.0, 3.0]]
        """
        keys = _row_ids(self, ids)
        out = np.empty((len(keys), *self._shape), dtype=self._dtype)
        for n, i in enumerate(keys.tolist()):
            out[n] = self[i]
        return out

    def put(self, ids: Any, rows: Any) -> None:
        """Write ``rows[n]`` to element ``ids[n]`` for every ``n`` of a numeric dvector:
        what ``X[i] = row`` does, row by row in order (a repeated id keeps its last row).

        >>> import engine as ap
        >>> Y = ap.dvector(3, shape=(2,), name="Y")
        >>> Y.put([2, 0], [[1.0, 2.0], [3.0, 4.0]])
        >>> Y.gather().tolist()
        [[3.0, 4.0], [0.0, 0.0], [1.0, 2.0]]
        """
        keys = _row_ids(self, ids)
        for i, v in zip(keys.tolist(), _rows_of(self, rows, len(keys)), strict=True):
            self[i] = v

    def __iter__(self) -> Iterator[Any]:
        if self._sharded and self._sess.cluster.is_mpi:  # one allgather, not one per row
            if _checkpoint.STALE is not None:
                _checkpoint.STALE(self)
            make_whole([self], step=f"a driver read of {self._name}")
            self._sess.agree(f"iterating over {self._name}")
            yield from gathered(self).tolist()
            return
        for s in range(self._n):
            yield self[s]

    def gather(self) -> np.ndarray:
        """All elements as one numpy array (object dtype for Python elements), in index order."""
        return collective(self._sess, "gather", lambda: gathered(self))

    def _digest_head(self) -> bytes:
        return str(self._n).encode()

    def __repr__(self) -> str:
        what = f"shape={self._shape}, dtype={self._dtype}" if self._numeric else "objects"
        return f"<dvector {self._name!r} n={self._n} {what}>"


def available_memory() -> int | None:
    """Bytes this machine can still give a process (``MemAvailable`` plus ``SwapFree`` of
    ``/proc/meminfo``), or None where that is unknown."""
    try:
        with open("/proc/meminfo", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    got: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        value = rest.split()
        if value and value[0].isdigit():
            got[key] = int(value[0]) * 1024
    if "MemAvailable" not in got:
        return None
    return got["MemAvailable"] + got.get("SwapFree", 0)


def _check_memory(d: _DDS, n: int, copies: int) -> None:
    """Refuse, in one line, a numeric dvector whose ``copies`` replicas (one per node of
    this process, and its initial values) need more memory than the machine has free:
    numpy would hand out the pages lazily and the machine would thrash or kill the run
    later.  Its size may come from a parameter a trace chose (hostile input)."""
    need = n * d.row_nbytes() * copies
    have = available_memory()
    if have is not None and need > have:
        raise DDSError(
            f"dvector {d._name}: {n:,} rows of shape {d._shape} ({d._dtype}) need "
            f"{need / 2**30:.1f} GiB here ({copies} cop{'y' if copies == 1 else 'ies'}), more "
            f"than the {have / 2**30:.1f} GiB of memory this machine has free; check the "
            "data or parameters its length and shape come from"
        )


def _row_ids(d: dvector, ids: Any) -> np.ndarray:
    """``ids`` of :meth:`dvector.take` / :meth:`dvector.put` as slots (int64, negative
    ids counted from the end), or a one-line :class:`DDSError`."""
    if not d._numeric:
        raise DDSError(
            f"{d._name}: take and put need a dvector of numeric rows (shape=...); "
            "index a dvector of Python objects one element at a time"
        )
    keys = np.asarray(ids)
    if keys.ndim != 1 or (keys.size and keys.dtype.kind not in "iu"):
        raise DDSError(f"{d._name}: ids must be a 1-d sequence of integers, got {_shown(ids)}")
    keys = keys.astype(np.int64, copy=False)
    if keys.size:
        lo, hi = int(keys.min()), int(keys.max())
        if lo < -d._n or hi >= d._n:
            bad = lo if lo < -d._n else hi
            raise DDSError(f"{d._name}: index {bad} out of range for length {d._n}")
        if lo < 0:
            keys = np.where(keys < 0, keys + d._n, keys)
    return keys


def _rows_of(d: dvector, rows: Any, n: int) -> np.ndarray:
    """``rows`` of :meth:`dvector.put` as an ``(n, *shape)`` array of the dtype."""
    arr = np.asarray(rows, dtype=d._dtype)
    want = (n, *d._shape)
    if arr.shape != want:
        try:
            arr = np.broadcast_to(arr, want)
        except ValueError:
            raise DDSError(
                f"{d._name}: cannot put values of shape {arr.shape} in {n} element(s) of "
                f"shape {d._shape}"
            ) from None
    return arr


def _ids(d: dvector, ids: Any) -> np.ndarray:
    """``ids`` as int64 slots for a fast path: a 1-d int64 array as it is (its range is
    left to the indexing, which raises ``IndexError``, and the fast paths then fall back
    to the row-by-row definition, which names the bad id), anything else through
    :func:`_row_ids`.  (Checking the range up front cost ~6 us a call.)"""
    if type(ids) is np.ndarray and ids.dtype == _INT64 and ids.ndim == 1 and d._numeric:
        return ids
    return _row_ids(d, ids)


def _slots(d: dvector, keys: np.ndarray) -> bool:
    """Strictly increasing slots of ``d``: distinct and in range, so one fancy
    assignment equals the writes row by row, in order."""
    if not keys.size:
        return True
    if keys[0] < 0 or keys[-1] >= d._n:
        return False
    return keys.size < 2 or bool((keys[1:] > keys[:-1]).all())


def _codes(d: dvector, keys: np.ndarray) -> bytes | None:
    """The guard codes of ``keys`` on the bound node, one byte each (None: no guard map,
    or an id out of range).  Bytes, because ``codes.translate(None, allowed)`` is empty
    exactly when every code is allowed, ~8x faster than a numpy comparison and ``any``."""
    gm = d._gm
    if len(gm) != d._n:
        return None
    try:
        return np.frombuffer(gm, dtype=np.uint8)[keys].tobytes()
    except IndexError:
        return None


def _take_from(d: dvector, buf: np.ndarray, ids: Any) -> np.ndarray:
    """:meth:`dvector.take` from ``buf`` where no row is checked (exec and relaxed modes):
    one fancy index (a copy), or row by row for an id out of range (which names it)."""
    keys = _ids(d, ids)
    try:
        return buf[keys]  # (a copy)
    except IndexError:
        return dvector.take(d, keys)


def _put_into(d: dvector, buf: np.ndarray, ids: Any, rows: Any) -> None:
    """:meth:`dvector.put` into ``buf`` where no row is checked: one assignment when the
    ids increase within range (so they are distinct), else row by row."""
    keys = _ids(d, ids)
    if not _slots(d, keys):
        dvector.put(d, keys, rows)
        return
    buf[keys] = _rows_of(d, rows, len(keys))


def _guarded_take(d: dvector, ids: Any, allowed: bytes) -> np.ndarray:
    """:meth:`dvector.take` under the plan guard: one fancy index when every row's code
    is one of ``allowed`` (those a read of the mode lets through), else row by row, where
    the first row the guard stops is reported."""
    keys = _ids(d, ids)
    c = _codes(d, keys)
    if c is None or c.translate(None, allowed):
        return dvector.take(d, keys)
    return d._buf[keys]  # (a copy)


def _guarded_put(d: dvector, ids: Any, rows: Any, allowed: bytes) -> None:
    """:meth:`dvector.put` under the plan guard: one assignment when the ids increase
    within range and every row's code is one of ``allowed`` (those a write of the mode
    lets through), else row by row."""
    keys = _ids(d, ids)
    c = _codes(d, keys) if _slots(d, keys) else None
    if c is None or c.translate(None, allowed):
        dvector.put(d, keys, rows)
        return
    d._buf[keys] = _rows_of(d, rows, len(keys))


#: The codes a guarded read with one thread lets through (see ``_DVecNumGuard``).
_READ_OK = bytes((FREE, 1))
_INT64 = np.dtype(np.int64)


class _DVecNumExec(dvector):
    __slots__ = ()

    def __getitem__(self, i: Any) -> Any:
        return self._buf[i].copy()

    def __setitem__(self, i: Any, value: Any) -> None:
        self._buf[i] = value

    def take(self, ids: Any) -> np.ndarray:
        return _take_from(self, self._buf, ids)

    def put(self, ids: Any, rows: Any) -> None:
        _put_into(self, self._buf, ids, rows)


class _DVecObjExec(dvector):
    __slots__ = ()

    def __getitem__(self, i: Any) -> Any:
        return detached(self._buf[i])

    def __setitem__(self, i: Any, value: Any) -> None:
        self._buf[i] = detached(value, self._name)


def _check_relaxable(name: str | None, shape: Any, dtype: Any) -> None:
    """A relaxed dvector sums deltas, so its elements must be numbers."""
    what = f"dvector {name}" if name else "dvector"
    if shape is None:
        raise DDSError(
            f"{what}: relaxed=True needs numeric rows (give shape=...); Python-object "
            "elements cannot be reconciled by summing deltas"
        )
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise DDSError(f"{what}: relaxed=True needs a numeric dtype, got {dtype!r}") from None
    if not (np.issubdtype(dt, np.number) and dt.kind != "b"):
        raise DDSError(
            f"{what}: relaxed=True needs a numeric dtype (integer, float or complex), "
            f"got {dt}; its deltas are summed"
        )


# ====================================================================== dmap
class dmap(_DDS):  # noqa: N801 - the name is part of the user API
    """A distributed map from hashable keys to elements, hash-partitioned over the nodes.

    Keys are inserted by the driver (``M[k] = v`` outside loop bodies, or ``keys=``);
    loop bodies read and write existing keys.
    """

    __slots__ = ("_slots", "_keys", "_owners", "_init", "_cap")
    kind = "dmap"

    def __init__(
        self,
        *,
        shape: int | tuple[int, ...] | None = None,
        dtype: Any = np.float64,
        keys: Iterable[Any] = (),
        init: Callable[..., np.ndarray] | None = None,
        name: str | None = None,
        relaxed: bool = False,
    ) -> None:
        if relaxed:
            what = f"{self.kind} {name}" if name else self.kind
            raise DDSError(
                f"{what}: relaxed=True is only supported for a numeric dvector; give the "
                "values integer positions (ap.dvector(n, shape=..., relaxed=True))"
            )
        sess = current()
        self._setup(sess, name, shape, dtype)
        self._slots: dict[Any, int] = {}
        self._keys: list[Any] = []
        self._owners: list[int] = []
        self._init = init
        self._cap = 0
        self._bufs = {node: self._new_storage(0) for node in sess.cluster.local_nodes}
        self._buf = self._bufs[sess.cluster.local_nodes[0]]
        keys = list(keys)
        if keys:
            self._insert_many(keys, self._default_values(len(keys)))

    def _default_values(self, k: int) -> Any:
        if not self._numeric:
            return [self._empty_value()] * k
        if self._init is None:
            return np.zeros((k, *self._shape), dtype=self._dtype)
        rng = self._sess.init_rng(f"{self._name}#{len(self._keys)}")
        return self._init(rng, (k, *self._shape), self._dtype)

    def _empty_value(self) -> Any:
        return None

    def _insert_many(self, keys: list[Any], values: Any) -> None:
        P = self._sess.cluster.size
        start = len(self._keys)
        for k in keys:
            if k in self._slots:
                raise DDSError(f"{self._name}: duplicate key {k!r}")
            self._slots[k] = len(self._keys)
            self._keys.append(k)
            self._owners.append(stable_hash(k) % P)
        end = len(self._keys)
        if self._numeric and end > self._cap:
            cap = max(end, 2 * self._cap, 16)
            for node, buf in self._bufs.items():
                grown = np.zeros((cap, *self._shape), dtype=self._dtype)
                grown[: buf.shape[0]] = buf[: buf.shape[0]]
                self._bufs[node] = grown
            self._cap = cap
        for buf in self._bufs.values():
            if self._numeric:
                buf[start:end] = values
            else:
                buf.extend(values)
        self._buf = self._bufs[self._sess.current_node]
        self._touch()
        if self._sess.cluster.is_mpi:
            rows = self._bufs[self._sess.current_node]
            for k, key in enumerate(keys):
                self._note_driver_write(key, rows[start + k])

    def owner(self, key: Any) -> int:
        """The node that owns ``key``."""
        return self._owners[self._slot(key)]

    def owned(self, node: int) -> np.ndarray:
        """Slots owned by ``node``."""
        own = np.asarray(self._owners, dtype=np.int64)
        return np.flatnonzero(own == node).astype(np.int64)

    def _slot(self, key: Any) -> int:
        try:
            return self._slots[key]
        except KeyError:
            raise DDSError(f"{self._name}: no key {key!r}") from None
        except TypeError:
            raise DDSError(f"{self._name}: key {key!r} is not hashable") from None

    def key_of(self, slot: int) -> Any:
        """The key stored at ``slot``."""
        return self._keys[slot]

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: Any) -> bool:
        return key in self._slots

    def keys(self) -> list[Any]:
        """The keys in insertion order."""
        return list(self._keys)

    def items(self) -> Iterator[tuple[Any, Any]]:
        """(key, value) pairs in insertion order."""
        for k in self._keys:
            yield k, self[k]

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._keys))

    def __getitem__(self, key: Any) -> Any:
        if _checkpoint.STALE is not None:  # fast-forwarding: the value may be stale
            _checkpoint.STALE(self)
        if self._dirty is not None:  # an MPI rank reads its own replica: whole first
            make_whole([self], step=f"a driver read of {self._name}")
        s = self._slot(key)
        owner = self._owners[s]
        buf = self._bufs.get(owner, self._buf)
        return self._read_slot(buf, s)

    def __setitem__(self, key: Any, value: Any) -> None:
        v = self._coerce(value)
        s = self._slots.get(key)
        if s is None:
            self._insert_many([key], [v] if not self._numeric else v[None])
            return
        for buf in self._bufs.values():
            buf[s] = v
        self._touch()
        self._note_driver_write(key, v)

    def gather(self) -> np.ndarray:
        """All values in key insertion order (object dtype for Python elements)."""
        return collective(self._sess, "gather", lambda: gathered(self))

    def _digest_head(self) -> bytes:
        return repr(self._keys).encode()

    def __repr__(self) -> str:
        return f"<{self.kind} {self._name!r} keys={len(self._keys)}>"


class dmultimap(dmap):  # noqa: N801 - the name is part of the user API
    """A distributed map from keys to tuples of values (hash-partitioned).

    ``M.add(k, v)`` appends in the driver; loop bodies use ``M[k] += (v,)``.
    """

    __slots__ = ()
    kind = "dmultimap"

    def __init__(self, *, keys: Iterable[Any] = (), name: str | None = None) -> None:
        super().__init__(shape=None, keys=keys, name=name)

    def _empty_value(self) -> Any:
        return ()

    def _coerce(self, value: Any) -> Any:
        return detached(tuple(value), self._name)

    def add(self, key: Any, value: Any) -> None:
        """Append ``value`` to the tuple stored under ``key`` (driver only)."""
        if key in self._slots:
            self[key] = self[key] + (value,)
        else:
            self[key] = (value,)


class _Moded(Protocol):
    """What the mode mixins below use of ``self``: ``_make_modes`` (and ``_syncdds``) put
    each mixin before a public class, so ``self`` is always a live dvector or dmap."""

    kind: str
    _name: str
    _id: int
    _gbase: int
    _numeric: bool
    _dtype: np.dtype[Any]
    _shape: Any
    _buf: Any
    _gm: bytearray
    _sharded: bool
    _slots: dict[Any, int]  # dmap only: read after checking ``kind``

    @property
    def name(self) -> str: ...
    def _slot(self, key: Any) -> int: ...
    def _desc(self, key: Any) -> str: ...
    def _read_slot(self, buf: Any, slot: int) -> Any: ...
    def _copy_out(self, v: Any) -> Any: ...
    def _coerce(self, value: Any) -> Any: ...


class _MapExec:
    __slots__ = ()

    def __getitem__(self: _Moded, key: Any) -> Any:
        try:
            s = self._slots[key]
        except KeyError:
            raise DDSError(f"{self._name}: no key {key!r}") from None
        return self._read_slot(self._buf, s)

    def __setitem__(self: _Moded, key: Any, value: Any) -> None:
        s = self._slots.get(key)
        if s is None:
            raise _insert_refused(self, key)
        self._buf[s] = self._coerce(value)


def _insert_refused(dds: _Moded, key: Any) -> DDSError:
    """The error for inserting a key into a dmap from inside a loop body."""
    return DDSError(
        f"{dds._name}: cannot insert key {key!r} inside a loop body; "
        "insert keys in the driver before the loop"
    )


# ====================================================================== plan guard
# The guard runs in every async_for execution (not only checked mode).  Before each
# round, the driver writes one code per slot into ``_gm`` (see FREE .. OTHER above);
# an access whose code says it could break serializability — a write to a slot the
# running task does not own, a read of a slot another node writes in this round —
# goes to ``GUARD.outside``, which decides (replan or fail).  The common case costs
# one bytearray lookup per access, and DDS that nobody writes in an invocation use
# the read-only variants whose reads are not checked at all.
class _DVecNumGuard(dvector):
    __slots__ = ()

    def __getitem__(self, i: Any) -> Any:
        if self._gm[i] > 1:
            GUARD.outside(self, self._slot(i), False)
        return self._buf[i].copy()

    def __setitem__(self, i: Any, value: Any) -> None:
        if self._gm[i] != 1:
            GUARD.outside(self, self._slot(i), True)
        self._buf[i] = value

    def take(self, ids: Any) -> np.ndarray:
        return _guarded_take(self, ids, _READ_OK)

    def put(self, ids: Any, rows: Any) -> None:
        _guarded_put(self, ids, rows, b"\x01")


class _DVecObjGuard(dvector):
    __slots__ = ()

    def __getitem__(self, i: Any) -> Any:
        if self._gm[i] > 1:
            GUARD.outside(self, self._slot(i), False)
        return detached(self._buf[i])

    def __setitem__(self, i: Any, value: Any) -> None:
        if self._gm[i] != 1:
            GUARD.outside(self, self._slot(i), True)
        self._buf[i] = detached(value, self._name)


class _DVecNumGuardT(dvector):
    """Several threads per node: the running task's code comes from the thread."""

    __slots__ = ()

    def __getitem__(self, i: Any) -> Any:
        c = self._gm[i]
        if c and c != _tls.gcode:
            GUARD.outside(self, self._slot(i), False)
        return self._buf[i].copy()

    def __setitem__(self, i: Any, value: Any) -> None:
        if self._gm[i] != _tls.gcode:
            GUARD.outside(self, self._slot(i), True)
        self._buf[i] = value

    def take(self, ids: Any) -> np.ndarray:
        return _guarded_take(self, ids, bytes((FREE, _tls.gcode)))

    def put(self, ids: Any, rows: Any) -> None:
        _guarded_put(self, ids, rows, bytes((_tls.gcode,)))


class _DVecObjGuardT(dvector):
    __slots__ = ()

    def __getitem__(self, i: Any) -> Any:
        c = self._gm[i]
        if c and c != _tls.gcode:
            GUARD.outside(self, self._slot(i), False)
        return detached(self._buf[i])

    def __setitem__(self, i: Any, value: Any) -> None:
        if self._gm[i] != _tls.gcode:
            GUARD.outside(self, self._slot(i), True)
        self._buf[i] = detached(value, self._name)


class _DVecNumGuardRO(_DVecNumExec):
    """No task writes this DDS in the invocation: reads are safe, writes are not."""

    __slots__ = ()

    def __setitem__(self, i: Any, value: Any) -> None:
        GUARD.outside(self, self._slot(i), True)

    put = dvector.put  # row by row: the first write is reported


class _DVecObjGuardRO(_DVecObjExec):
    __slots__ = ()

    def __setitem__(self, i: Any, value: Any) -> None:
        GUARD.outside(self, self._slot(i), True)


# A sharded dvector's node holds a dict of rows: the same modes, with a slow path for a
# key it lacks (a row it does not hold, or a negative index): :func:`_absent`.  Reads
# are written out in each class, as for the other modes (a hot path); writes share
# :func:`_store`.
class _DVecShardExec(dvector):
    __slots__ = ()

    def __getitem__(self, i: Any) -> Any:
        try:
            v = self._buf[i]
        except KeyError:
            v = _absent(self, i)
        return detached(v)

    def __setitem__(self, i: Any, value: Any) -> None:
        _store(self, i, value)


class _DVecShardGuard(dvector):
    __slots__ = ()

    def __getitem__(self, i: Any) -> Any:
        if self._gm[i] > 1:
            GUARD.outside(self, self._slot(i), False)
        try:
            v = self._buf[i]
        except KeyError:
            v = _absent(self, i)
        return detached(v)

    def __setitem__(self, i: Any, value: Any) -> None:
        if self._gm[i] != 1:
            GUARD.outside(self, self._slot(i), True)
        _store(self, i, value)


class _DVecShardGuardT(dvector):
    __slots__ = ()

    def __getitem__(self, i: Any) -> Any:
        c = self._gm[i]
        if c and c != _tls.gcode:
            GUARD.outside(self, self._slot(i), False)
        try:
            v = self._buf[i]
        except KeyError:
            v = _absent(self, i)
        return detached(v)

    def __setitem__(self, i: Any, value: Any) -> None:
        if self._gm[i] != _tls.gcode:
            GUARD.outside(self, self._slot(i), True)
        _store(self, i, value)


class _DVecShardGuardRO(_DVecShardExec):
    __slots__ = ()

    def __setitem__(self, i: Any, value: Any) -> None:
        GUARD.outside(self, self._slot(i), True)


class _MapGuard:
    """The guard for ``dmap``/``dmultimap`` (one or several threads)."""

    __slots__ = ()

    def __getitem__(self: _Moded, key: Any) -> Any:
        try:
            s = self._slots[key]
        except KeyError:
            raise DDSError(f"{self._name}: no key {key!r}") from None
        c = self._gm[s]
        if c and c != (1 if GUARD.single else _tls.gcode):
            GUARD.outside(self, s, False)
        return self._read_slot(self._buf, s)

    def __setitem__(self: _Moded, key: Any, value: Any) -> None:
        s = self._slots.get(key)
        if s is None:
            raise _insert_refused(self, key)
        if self._gm[s] != (1 if GUARD.single else _tls.gcode):
            GUARD.outside(self, s, True)
        self._buf[s] = self._coerce(value)


class _MapGuardRO(_MapExec):
    __slots__ = ()

    def __setitem__(self: _Moded, key: Any, value: Any) -> None:
        s = self._slots.get(key)
        if s is None:
            raise _insert_refused(self, key)
        GUARD.outside(self, s, True)


# ====================================================================== relaxed modes
# A relaxed dvector (``relaxed=True``) stays out of conflict analysis; while a round runs,
# ``engine._data.relaxed`` keeps its round-start values and reconciles the deltas at the
# round's end.  With one thread per node a body works on the node's replica directly (the
# plain exec class); with several, each planned thread gets its own copy, chosen by
# ``_tls.rthread``, so threads never race and each sees only its own deltas.
def relaxing(dds: _DDS) -> bool:
    """True when ``dds`` is relaxed in this session (test and checked mode turn it off)."""
    return dds._relaxed and not (dds._sess.checked or dds._sess.test_mode)


class _DVecRelaxedT(dvector):
    """A relaxed dvector in a round with several threads per node."""

    __slots__ = ()

    def _bind(self, node: int) -> None:
        _DDS._bind(self, node)
        self._rxc = self._rxs.get(node, self._rxc)

    def __getitem__(self, i: Any) -> Any:
        return self._rxc[_tls.rthread][i].copy()

    def __setitem__(self, i: Any, value: Any) -> None:
        self._rxc[_tls.rthread][i] = value

    def take(self, ids: Any) -> np.ndarray:
        return _take_from(self, self._rxc[_tls.rthread], ids)

    def put(self, ids: Any, rows: Any) -> None:
        _put_into(self, self._rxc[_tls.rthread], ids, rows)


class _DVecRelaxedRecon(dvector):
    """Reconnaissance of a relaxed dvector: reads and writes are served as in any
    reconnaissance (writes stay in the body's overlay) but no element id is logged."""

    __slots__ = ()

    def __getitem__(self, i: Any) -> Any:
        s = self._slot(i)
        rec = RECON
        assert rec is not None
        if rec.later:
            rec.flush()
        if rec.overlay:
            v = rec.overlay.get(self._gbase | s, _MISSING)
            if v is not _MISSING:
                return v.copy()
        return self._buf[s].copy()

    def __setitem__(self, i: Any, value: Any) -> None:
        s = self._slot(i)
        rec = RECON
        assert rec is not None
        rec.write(self._gbase | s, self._coerce(value))


class _RelaxedRefused:
    """Reconnaissance outside ``async_for`` (``sync_for``): writing a relaxed dvector
    is refused, since ``sync_for`` has no relaxed reconciliation."""

    __slots__ = ()

    def __setitem__(self: _Moded, key: Any, value: Any) -> None:
        raise DDSError(
            f"{self._name} is a relaxed dvector: only async_for bodies may write it (a "
            "sync_for body may read it); use an ordinary dvector, with "
            "register_aggregation if averaging is not what you want"
        )


def _relaxed_mode(dds: _DDS, mode: str) -> str:
    if mode == "recon":
        return "recon_refuse"  # async_for's reconnaissance picks its own mode (relaxed.py)
    if mode in ("guard", "guard_t", "guard_ro", "checked") and relaxing(dds):
        return "relaxed" if dds._sess.cluster.threads == 1 else "relaxed_t"
    return mode


# ====================================================================== recon / checked mixins
class _ReconMixin:
    """Reconnaissance: log element ids, serve reads, keep writes in an overlay."""

    __slots__ = ()

    def __getitem__(self: _Moded, key: Any) -> Any:
        s = self._slot(key)
        gid = self._gbase | s
        rec = RECON
        assert rec is not None  # recon mode is active only while RECON is set
        rec.reads.append(gid)
        if rec.later:
            rec.flush()
        if rec.overlay:
            v = rec.overlay.get(gid, _MISSING)
            if v is not _MISSING:
                return self._copy_out(v)
        return self._read_slot(self._buf, s)

    def __setitem__(self: _Moded, key: Any, value: Any) -> None:
        if self.kind != "dvector" and key not in self._slots:
            raise _insert_refused(self, key)
        s = self._slot(key)
        gid = self._gbase | s
        rec = RECON
        assert rec is not None
        rec.writes.append(gid)
        rec.write(gid, self._coerce(value))


class _DVecRecon(_ReconMixin):
    """The dvector fast path of reconnaissance (most loops index dvectors by int)."""

    __slots__ = ()

    def __getitem__(self: _Moded, i: Any) -> Any:
        if type(i) is not int or i < 0:
            return _ReconMixin.__getitem__(self, i)
        gid = self._gbase | i
        rec = RECON
        assert rec is not None
        rec.reads.append(gid)
        if rec.later:
            rec.flush()
        if rec.overlay and gid in rec.overlay:
            return self._copy_out(rec.overlay[gid])
        if self._numeric:  # (inlined: most reconnaissance reads are numeric rows)
            return self._buf[i].copy()
        return self._read_slot(self._buf, i)

    def __setitem__(self: _Moded, i: Any, value: Any) -> None:
        if type(i) is not int or i < 0 or not self._numeric:
            _ReconMixin.__setitem__(self, i, value)
            return
        self._buf[i]  # bounds check: raises IndexError like exec mode would
        v = np.array(value, dtype=self._dtype)
        if v.shape != self._shape:
            v = self._coerce(v)
        gid = self._gbase | i
        rec = RECON
        assert rec is not None
        rec.writes.append(gid)
        if rec.later:  # (``rec.write``, inlined)
            rec.later.append(([gid], (v,)))
        else:
            rec.overlay[gid] = v

    def take(self: Any, ids: Any) -> np.ndarray:
        keys = _ids(self, ids)
        rec = RECON
        assert rec is not None
        # row by row where a row may come from the body's own writes or be out of range
        if rec.overlay or rec.later or (keys.size and (keys.min() < 0 or keys.max() >= self._n)):
            return dvector.take(self, keys)
        rec.reads.extend((keys | self._gbase).tolist())  # the order X[i] would log them
        return self._buf[keys]  # (fancy indexing copies)

    def put(self: Any, ids: Any, rows: Any) -> None:
        keys = _ids(self, ids)
        if not _slots(self, keys):
            dvector.put(self, keys, rows)
            return
        got = np.array(_rows_of(self, rows, len(keys)))  # a copy: the overlay keeps it
        rec = RECON
        assert rec is not None
        gids = (keys | self._gbase).tolist()
        rec.writes.extend(gids)
        rec.later.append((gids, got))


class _CheckedMixin:
    """Exec mode that fails on any access outside the body's reconnaissance sets."""

    __slots__ = ()

    def _check(self: _Moded, key: Any, write: bool) -> int:
        s = self._slot(key)
        gid = self._gbase | s
        checker = CHECKER
        assert checker is not None  # checked mode is active only while CHECKER is set
        baton = getattr(_tls, "baton", None)
        if baton is not None and _tls.gcode == LOCKED_BODY and s < len(self._gm):
            if self._gm[s] == LOCKED:  # a chaos run's lock-split body: the baton may pass
                baton.step()
        j, reads, writes = checker.allowed()
        if gid not in (writes if write else reads):
            if GUARD is not None:
                GUARD.outside(self, s, write, "its reconnaissance")
            refused = not_seen(lambda: self._desc(key), write, "not in its reconnaissance sets")
            if refused is not None:
                raise refused
            what = "wrote" if write else "read"
            kind = "write" if write else "read"
            raise AccessOutsideReconError(
                f"async_for {checker.op!r} index {j} {what} {self._desc(key)}, which is not in "
                f"its reconnaissance {kind} set: the body's accesses depend on values that "
                "changed since reconnaissance; make them depend only on the loop index and "
                "read-only data"
            )
        return s

    def __getitem__(self: _Moded, key: Any) -> Any:
        s = _CheckedMixin._check(self, key, False)
        return self._read_slot(self._buf, s)

    def __setitem__(self: _Moded, key: Any, value: Any) -> None:
        s = _CheckedMixin._check(self, key, True)
        if self._sharded and s not in self._buf:
            _missing(self, s, True)  # type: ignore[arg-type]
        self._buf[s] = self._coerce(value)


def _make_modes(public: type[_DDS], exec_cls: type | None, exec_obj_cls: type | None) -> None:
    def derive(mixin: type, tag: str) -> type:
        return type(f"{public.__name__}[{tag}]", (mixin, public), {"__slots__": ()})

    exec_ = exec_cls if exec_cls is not None else derive(_MapExec, "exec")
    public._modes = {
        "driver": public,
        "exec": exec_,
        "exec_obj": exec_obj_cls or exec_,
        "recon": derive(_DVecRecon if public is dvector else _ReconMixin, "recon"),
        "checked": derive(_CheckedMixin, "checked"),
    }
    if public is dvector:
        public._modes.update(
            relaxed=_DVecNumExec,
            relaxed_t=_DVecRelaxedT,
            relaxed_recon=_DVecRelaxedRecon,
            recon_plain=public._modes["recon"],
            recon_refuse=type(
                "dvector[recon_refuse]",
                (_RelaxedRefused, public._modes["recon"]),
                {"__slots__": ()},
            ),
            guard=_DVecNumGuard,
            guard_obj=_DVecObjGuard,
            guard_t=_DVecNumGuardT,
            guard_t_obj=_DVecObjGuardT,
            guard_ro=_DVecNumGuardRO,
            guard_ro_obj=_DVecObjGuardRO,
            exec_shard=_DVecShardExec,
            guard_shard=_DVecShardGuard,
            guard_t_shard=_DVecShardGuardT,
            guard_ro_shard=_DVecShardGuardRO,
        )
    else:
        g, ro = derive(_MapGuard, "guard"), derive(_MapGuardRO, "guard_ro")
        public._modes.update(
            guard=g, guard_obj=g, guard_t=g, guard_t_obj=g, guard_ro=ro, guard_ro_obj=ro
        )


_make_modes(dvector, _DVecNumExec, _DVecObjExec)
_make_modes(dmap, None, None)
_make_modes(dmultimap, None, None)


def set_mode(dds: _DDS, mode: str) -> None:
    """Switch ``dds`` to ``mode`` (driver, exec, recon or checked)."""
    modes = type(dds)._modes
    if dds._relaxed:
        mode = _relaxed_mode(dds, mode)
    if not dds._numeric and mode in ("exec", "guard", "guard_t", "guard_ro"):
        mode += "_shard" if dds._sharded else "_obj"
    dds.__class__ = modes[mode]


def public_class(dds: _DDS) -> type:
    """The user-facing class of ``dds`` whatever its current mode."""
    return type(dds)._modes["driver"]


__all__ = [
    "CHECKER",
    "FREE",
    "GUARD",
    "HomeRows",
    "LOCKED",
    "LOCKED_BODY",
    "ANY_OWN",
    "OTHER",
    "RECON",
    "SLOT_BITS",
    "SLOT_MASK",
    "dmap",
    "dmultimap",
    "dvector",
    "gathered",
    "homes",
    "clean",
    "make_whole",
    "mark_dirty",
    "public_class",
    "relaxing",
    "set_mode",
    "stable_hash",
]
