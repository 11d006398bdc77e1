"""Disk space held back while recording, so that a run stopped by a full disk says so.

When the disk fills up, the commit that fails leaves no room for anything else, and the
run's row would stay ``running`` — readers call it crashed only after
``CRASH_AFTER_S``, and nothing says why it stopped.  So each recorder writing a SQLite
file holds :data:`RESERVE_BYTES` allocated in a file of the same file system that has no
name (``O_TMPFILE``, or unlinked at once): releasing it makes room for the few pages
that the run's row needs, and the system frees it by itself if the process dies.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO

#: Bytes held back per recording process: the run row's update needs one or two WAL
#: frames (4 KiB pages plus 24 bytes each); more costs disk while recording.
RESERVE_BYTES = 64 * 1024


class SpaceReserve:
    """:data:`RESERVE_BYTES` allocated beside ``path`` until :meth:`release`."""

    def __init__(self, path: Path) -> None:
        self._file: IO[bytes] | None = None
        try:
            fh = tempfile.TemporaryFile(dir=path.parent)
        except OSError:
            return  # best effort: a recording never fails for want of its reserve
        try:
            os.posix_fallocate(fh.fileno(), 0, RESERVE_BYTES)
        except (OSError, AttributeError):  # already full, or no posix_fallocate here
            fh.close()
            return
        self._file = fh

    @property
    def held(self) -> bool:
        """Whether the space is still held."""
        return self._file is not None

    def release(self) -> None:
        """Give the space back to the file system (idempotent)."""
        fh, self._file = self._file, None
        if fh is not None:
            with contextlib.suppress(OSError):
                fh.close()


__all__ = ["RESERVE_BYTES", "SpaceReserve"]
