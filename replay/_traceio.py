"""A trace store seen from the ranks of one MPI job, which may run on several hosts.

A SQLite trace lives on rank 0's host (rank 0 writes it, through the recorder's
funnel): the other ranks may not see that file at all, or see another file at the same
path.  So a rank compares the file rank 0 has with the one it would open (same host,
same device and inode: :func:`same_store`) and

* to *write*, a rank that does not see it records without a store (everything goes
  through the funnel, ``tracer._recorder``);
* to *read* (cluster replay, resume), rank 0 reads the whole store once and broadcasts
  it; a rank that does not see the file opens that copy, in a job directory of its own
  (:func:`readable`).  Ranks that do see it open it themselves, as before.

A PostgreSQL store is reached by URL from every host: every rank connects itself.
"""

from __future__ import annotations

import atexit
import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import tracer

from . import _procs
from ._errors import LaunchError

#: Bytes per broadcast of a copied store (MPI counts are 32-bit ints).
CHUNK_BYTES = 1 << 28


def _local_file(path: str) -> Path | None:
    """The SQLite file behind ``path`` (None: a server database every host reaches)."""
    return tracer.sqlite_path(path)


def _identity(file: Path) -> tuple[str, int, int] | None:
    try:
        st = file.stat()
    except OSError:
        return None
    return (_procs.host_id(), st.st_dev, st.st_ino)


def same_store(path: str, comm: Any) -> bool:
    """Whether this rank sees the very store rank 0 has at ``path`` (collective)."""
    if comm is None or comm.Get_size() < 2:
        return True
    file = _local_file(path)
    if file is None:
        return True
    there = comm.bcast(_identity(file) if comm.Get_rank() == 0 else None, root=0)
    if comm.Get_rank() == 0:
        return True
    return there is not None and _identity(file) == tuple(there)


def readable(path: str, comm: Any) -> str:
    """A path of the trace ``path`` that this rank can open for reading (collective).

    Rank 0 reads the store and broadcasts it when any rank does not see the file; that
    rank gets a private copy (removed when the process exits, or by the next launch's
    sweep on its host if it is killed)."""
    if comm is None or comm.Get_size() < 2 or _local_file(path) is None:
        return path
    sees = same_store(path, comm)
    if not any(comm.allgather(not sees)):
        return path
    data = _broadcast_store(path, comm)
    if sees:
        return path
    job = tempfile.mkdtemp(prefix=_procs.JOB_PREFIX)
    _procs.write_owner(job)
    atexit.register(shutil.rmtree, job, True)
    copy = Path(job) / "trace.sqlite"
    data.tofile(str(copy))
    return str(copy)


def _broadcast_store(path: str, comm: Any) -> np.ndarray:
    """Rank 0's store at ``path``, as bytes on every rank."""
    head: tuple[int, str] = (0, "")
    blob = bytearray()
    if comm.Get_rank() == 0:
        try:
            with sqlite3.connect(f"file:{_local_file(path)}?mode=ro", uri=True) as db:
                blob = bytearray(db.serialize())  # with what the WAL holds
            head = (len(blob), "")
        except sqlite3.Error as exc:
            head = (0, f"rank 0 cannot read the trace {path} to send it to the other ranks: {exc}")
    size, error = comm.bcast(head, root=0)
    if error:
        raise LaunchError(error)
    buf = np.frombuffer(blob, dtype=np.uint8) if blob else np.empty(size, dtype=np.uint8)
    for k in range(0, size, CHUNK_BYTES):
        comm.Bcast(buf[k : k + CHUNK_BYTES], root=0)
    return buf


__all__ = ["readable", "same_store"]
