"""What a ``sync_for`` body sees: its minibatch (:class:`Batch`) and DDS in *sync mode*.

In sync mode a DDS serves each worker thread from the buffers that thread was given
(:func:`bind_thread`): a parameter (a DDS the body writes) resolves to the thread's
own cache, any other DDS to the node's replica, read-only.  The lookup is one
thread-local dictionary access, so threads of one node never see each other's writes
inside a clock; the engine turns the cache changes into deltas between clocks.
With reconnaissance sets, every parameter access is also checked against the rows of
the running minibatch (one more dictionary and mask lookup; see ``_syncguard``).
Like every other mode, sync mode is a class switch (see ``_dds``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .._data import dds as _dds
from .._data.dds import _DDS, _Moded, dmap, dmultimap, dvector
from .._data.values import detached
from .._errors import DDSError

_stls = threading.local()


class Batch:
    """One minibatch of a ``sync_for``'s data DDS, as passed to the body.

    ``number`` is the minibatch index m (minibatch m holds the elements in slots
    ``m*size .. min((m+1)*size, n) - 1``, i.e. indices of a dvector, keys of a dmap in
    insertion order); ``keys`` are their indices (int64 array) or keys (list);
    ``values`` their elements: a read-only ``(len, *shape)`` numpy block for numeric
    elements, a list for Python objects.  Iterating yields ``(key, value)`` pairs.
    """

    __slots__ = ("number", "_keys", "values", "_lo")

    def __init__(self, number: int, keys: Any, values: Any, lo: int = 0) -> None:
        self.number = number
        self._keys = keys  # None: slots ``lo ..`` of a dvector, made on first use
        self.values = values
        self._lo = lo

    @property
    def keys(self) -> Any:
        """The elements' indices (int64 array) or keys (list)."""
        keys = self._keys
        if keys is None:
            keys = self._keys = np.arange(self._lo, self._lo + len(self.values), dtype=np.int64)
        return keys

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        keys = self.keys.tolist() if isinstance(self.keys, np.ndarray) else self.keys
        return iter(zip(keys, self.values, strict=True))

    def __repr__(self) -> str:
        return f"<Batch {self.number} of {len(self)} element(s)>"


def make_batch(data: _DDS, buf: Any, number: int, lo: int, hi: int) -> Batch:
    """Minibatch ``number`` = slots ``lo .. hi-1`` of ``data`` read from replica ``buf``."""
    return batch_maker(data, buf)(number, lo, hi)


def batch_maker(data: _DDS, buf: Any) -> Callable[[int, int, int], Batch]:
    """``make(number, lo, hi)``: :func:`make_batch` for many minibatches of one replica (the
    read-only view of ``buf`` is made once; dvector keys are made only if the body asks)."""
    if data._numeric:
        buf = buf.view()
        buf.flags.writeable = False  # so every slice of it is read-only too

    def values(lo: int, hi: int) -> Any:
        if data._numeric:
            return buf[lo:hi]
        if type(buf) is dict:  # a sharded dvector: the rows this node holds
            return [data._read_slot(buf, s) for s in range(lo, hi)]
        return [detached(v) for v in buf[lo:hi]]  # Python objects: by value, as X[i]

    if isinstance(data, dmap):
        keys = data._keys

        def make_keyed(number: int, lo: int, hi: int) -> Batch:
            return Batch(number, keys[lo:hi], values(lo, hi), lo)

        return make_keyed

    def make(number: int, lo: int, hi: int) -> Batch:
        return Batch(number, None, values(lo, hi), lo)

    return make


_NO_MASKS: dict[int, np.ndarray] = {}


def bind_thread(rbufs: dict[int, Any], wbufs: dict[int, Any], guard: Any = None) -> None:
    """Serve this thread's DDS accesses: reads from ``rbufs``, writes to ``wbufs`` (by DDS id);
    with ``guard`` (a ``_syncguard.LaneGuard``) every parameter access is checked against
    the masks of the minibatch it is running."""
    _stls.rbufs = rbufs
    _stls.wbufs = wbufs
    _stls.guard = guard
    _stls.rmask = _NO_MASKS if guard is None else guard.rmask
    _stls.wmask = _NO_MASKS if guard is None else guard.wmask


def unbind_thread() -> None:
    """Forget what :func:`bind_thread` served this thread: the buffers and the guard
    belong to one loop of one run, and a thread that outlives it (the main thread, in
    a process that runs one program after another) must not keep them alive."""
    bind_thread({}, {})


def _refused(dds: _Moded, key: Any) -> Exception:
    """The error for a write to a DDS that is not a parameter of this layout."""
    guard = _stls.guard
    err = None if guard is None else guard.outside(dds, key, True)
    return _read_only(dds, key) if err is None else err


def _read_only(dds: _Moded, key: Any) -> DDSError:
    return DDSError(
        f"{dds._desc(key)}: a sync_for body cannot write {dds.name!r} here: it is the loop's "
        "data, holds Python objects, or was not seen to be written by reconnaissance "
        "(with re=False: is not referenced by the body); write only numeric parameter DDS"
    )


class _SyncMixin:
    """Generic sync-mode access (any key type)."""

    __slots__ = ()

    def __getitem__(self: _Moded, key: Any) -> Any:
        s = self._slot(key)
        mask = _stls.rmask.get(self._id)
        if mask is not None and not mask[s]:
            raise _stls.guard.outside(self, key, False)
        buf = _stls.rbufs[self._id]
        return self._read_slot(buf, s)

    def __setitem__(self: _Moded, key: Any, value: Any) -> None:
        if self.kind != "dvector" and key not in self._slots:
            raise _dds._insert_refused(self, key)
        s = self._slot(key)
        buf = _stls.wbufs.get(self._id)
        if buf is None:
            raise _refused(self, key)
        mask = _stls.wmask.get(self._id)
        if mask is not None and not mask[s]:
            raise _stls.guard.outside(self, key, True)
        buf[s] = self._coerce(value)


class _SyncDVec(_SyncMixin):
    """The dvector fast path (most bodies index parameters by int)."""

    __slots__ = ()

    def __getitem__(self: _Moded, i: Any) -> Any:
        if type(i) is not int or i < 0:
            return _SyncMixin.__getitem__(self, i)
        mask = _stls.rmask.get(self._id)
        if mask is not None and not mask[i]:
            raise _stls.guard.outside(self, i, False)
        return _stls.rbufs[self._id][i].copy()

    def __setitem__(self: _Moded, i: Any, value: Any) -> None:
        if type(i) is not int or i < 0:
            _SyncMixin.__setitem__(self, i, value)
            return
        buf = _stls.wbufs.get(self._id)
        if buf is None:
            raise _refused(self, i)
        mask = _stls.wmask.get(self._id)
        if mask is not None and not mask[i]:
            raise _stls.guard.outside(self, i, True)
        buf[i] = value

    # many rows at once (``dvector.take`` / ``put``): one numpy operation where no check
    # of a row could fire, else row by row through the accesses above, which report it
    def take(self: _Moded, ids: Any) -> np.ndarray:
        keys = _dds._ids(self, ids)  # type: ignore[arg-type]
        mask = _stls.rmask.get(self._id)
        try:
            if mask is None or mask[keys].all():
                return _stls.rbufs[self._id][keys]  # a copy
        except IndexError:
            pass
        return dvector.take(self, keys)  # type: ignore[arg-type]

    def put(self: _Moded, ids: Any, rows: Any) -> None:
        keys = _dds._ids(self, ids)  # type: ignore[arg-type]
        buf = _stls.wbufs.get(self._id)
        mask = _stls.wmask.get(self._id)
        if (
            buf is None
            or not _dds._slots(self, keys)  # type: ignore[arg-type]
            or (mask is not None and not mask[keys].all())
        ):
            dvector.put(self, keys, rows)  # type: ignore[arg-type]
            return
        buf[keys] = _dds._rows_of(self, rows, len(keys))  # type: ignore[arg-type]


def _derive(mixin: type, public: type) -> type:
    return type(f"{public.__name__}[sync]", (mixin, public), {"__slots__": ()})


_SYNC_CLASSES: dict[type, type] = {
    dvector: _derive(_SyncDVec, dvector),
    dmap: _derive(_SyncMixin, dmap),
    dmultimap: _derive(_SyncMixin, dmultimap),
}
_OBJ_DVEC = _derive(_SyncMixin, dvector)


def enter_sync_mode(dds: _DDS) -> None:
    """Switch ``dds`` to sync mode (leave it with ``_dds.set_mode(dds, "driver")``)."""
    public = _dds.public_class(dds)
    if public is dvector and not dds._numeric:
        dds.__class__ = _OBJ_DVEC
    else:
        dds.__class__ = _SYNC_CLASSES[public]


__all__ = [
    "Batch",
    "batch_maker",
    "bind_thread",
    "unbind_thread",
    "enter_sync_mode",
    "make_batch",
]
