"""Writing a file safely: through a temporary name created exclusively beside it.

Every file the product writes (``ap.store`` output, ``replay export``, a rank's result)
goes through :func:`replacing`.  The obvious ``open(out + ".tmp", "w")`` then
``os.replace`` writes through a symlink planted at the predictable temporary name (the
shared-``/tmp`` attack), and an unchecked target lets ``-o /dev/null`` turn a device into
a regular file or ``-o t.sqlite-wal`` clobber a trace's write-ahead log.  So:

* the temporary name has a random suffix and is created with
  ``O_CREAT|O_EXCL|O_NOFOLLOW`` in the target's directory (the final rename stays on one
  file system, so it is atomic); it is removed on any failure;
* the target is replaced only if it is absent or a regular file that is not a trace store
  (a file starting with the SQLite header) or part of one (a ``-wal``, ``-shm`` or
  ``-journal`` name beside an existing file).  A symlink, directory, FIFO, socket or
  device is refused even with ``force``: a link is never written through;
* without ``force`` an existing file is refused, and the last step is a hard link, which
  fails instead of replacing a file that appeared since the check.

This lives in the engine because it is the lowest package: ``tracer``, ``replay`` and
``apps`` all import it (through ``engine.lowlevel``), and the engine's own ``store`` uses it.

Reading is the other side (:func:`open_input`): a data file's path comes from the user's
parameters, and in a replay from the trace's, which is hostile input.  A path to a FIFO
would block the open, and ``/dev/zero`` or ``/dev/urandom`` would never end a line; so an
input must be a regular file, and a reader reads no more than its size at the open.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from typing import IO, Any

from ._errors import InputFileError, OutputPathError

#: The first 16 bytes of every SQLite database file.
SQLITE_MAGIC = b"SQLite format 3\x00"
#: Files SQLite keeps beside a database; writing one corrupts or loses the database's data.
SIDECARS = ("-wal", "-shm", "-journal")

_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


#: (device, inode) of every input :func:`open_input` opened in the current run (None:
#: outside a run).  A run may read a file that no parameter names (TransE reads
#: ``train.txt`` in its ``data`` directory): :func:`check_target` refuses to replace one.
_inputs: set[tuple[int, int]] | None = None


@contextlib.contextmanager
def tracking_inputs() -> Iterator[None]:
    """Remember the inputs opened inside the block (one run), and forget them after."""
    global _inputs
    outer, _inputs = _inputs, set()
    try:
        yield
    finally:
        _inputs = outer


def _kind(mode: int) -> str:
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def _starts_sqlite(path: str) -> bool:
    # O_NOFOLLOW|O_NONBLOCK: if the file was swapped for a link or a FIFO since lstat,
    # this fails or returns at once instead of following it or blocking
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return os.read(fd, len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False
    finally:
        os.close(fd)


def _parent(path: str) -> str:
    return os.path.dirname(path) or "."


def check_target(
    path: str | os.PathLike[str], *, force: bool = False, label: str | None = None
) -> None:
    """Raise :class:`OutputPathError` unless :func:`replacing` may write ``path``.

    ``label`` names the path in the message (``"-o out.json"``; default: the path).
    """
    p = os.fspath(path)
    shown = label or p
    parent = _parent(p)
    if not os.path.isdir(parent):
        if os.path.lexists(parent):
            raise OutputPathError(f"{shown}: {parent} is not a directory; pass another path")
        raise OutputPathError(
            f"{shown}: directory {parent} does not exist; create it or pass another path"
        )
    try:
        st: os.stat_result | None = os.lstat(p)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise OutputPathError(f"{shown}: cannot look at it: {exc.strerror}") from None
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise OutputPathError(
            f"{shown} is a symbolic link; a link is never written through: pass the path "
            "it names, or another path"
        )
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise OutputPathError(f"{shown} is a directory; pass a file path")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OutputPathError(
            f"{shown} is {_kind(st.st_mode)}; only a regular file is ever replaced: "
            "pass another path"
        )
    for suffix in SIDECARS:
        if p.endswith(suffix) and os.path.lexists(p[: -len(suffix)]):
            raise OutputPathError(
                f"{shown} belongs to the file {p[: -len(suffix)]} (SQLite's {suffix} file); "
                "it is never written: pass another path"
            )
    if st is None:
        return
    if _inputs and (st.st_dev, st.st_ino) in _inputs:
        raise OutputPathError(
            f"{shown} is a file this run reads its data from; writing there would destroy "
            "it, and its replay with it: pass another path"
        )
    if _starts_sqlite(p):
        raise OutputPathError(
            f"{shown} is a trace store; it is never overwritten, even with --force: "
            "pass another path"
        )
    if not force:
        raise OutputPathError(f"{shown} already exists; pass --force to overwrite it")


def _commit(tmp: str, path: str, *, force: bool, label: str | None) -> None:
    if not force:
        try:
            os.link(tmp, path)  # atomic and exclusive: never replaces a file made meanwhile
        except FileExistsError:
            raise OutputPathError(
                f"{label or path} already exists; pass --force to overwrite it"
            ) from None
        except OSError:
            pass  # a file system without hard links: check again, then rename
        else:
            os.unlink(tmp)
            return
    check_target(path, force=force, label=label)  # again: the window is now the rename alone
    os.replace(tmp, path)


def _temporary(path: str, label: str | None) -> tuple[str, int]:
    """(name, descriptor) of a new temporary file beside ``path``; a directory this
    process cannot write in (permissions, a read-only file system) is one
    :class:`OutputPathError` line."""
    parent = _parent(path)
    tmp = os.path.join(parent, f".{os.path.basename(path)}.{secrets.token_hex(8)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return tmp, os.open(tmp, flags, 0o666)  # 0o666: the umask decides, as for open()
    except OSError as exc:
        raise OutputPathError(
            f"{label or path}: cannot write in {parent}: {exc.strerror}; pass another path"
        ) from None


def check_writable(path: str | os.PathLike[str], *, label: str | None = None) -> None:
    """Raise :class:`OutputPathError` unless :func:`replacing` can create its temporary
    file beside ``path``: a command checks this before hours of work, not after.  The
    probe is the creation itself, since ``os.access`` says yes to root on any directory."""
    tmp, fd = _temporary(os.fspath(path), label)
    os.close(fd)
    os.unlink(tmp)


@contextlib.contextmanager
def replacing(
    path: str | os.PathLike[str],
    *,
    force: bool = False,
    label: str | None = None,
    encoding: str | None = None,
) -> Iterator[IO[Any]]:
    """A file object whose contents replace ``path`` when the block ends without error.

    Binary unless ``encoding`` is given.  ``force`` allows replacing an existing regular
    file; nothing else is ever replaced (see the module docstring)::

        with replacing("out.txt", force=True, encoding="utf-8") as fh:
            fh.write("hello\\n")
    """
    p = os.fspath(path)
    check_target(p, force=force, label=label)
    tmp, fd = _temporary(p, label)
    try:
        with os.fdopen(fd, "w" if encoding else "wb", encoding=encoding) as fh:
            yield fh
        _commit(tmp, p, force=force, label=label)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_file(
    path: str | os.PathLike[str],
    data: str | bytes,
    *,
    force: bool = False,
    label: str | None = None,
) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` through :func:`replacing`."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    with replacing(path, force=force, label=label) as fh:
        fh.write(payload)


def open_input(path: str | os.PathLike[str]) -> tuple[IO[bytes], int]:
    """``path`` opened for reading bytes, with its size: only a regular file (a symlink to
    one is followed), else one :class:`InputFileError` line.  Opened without blocking (a
    FIFO would otherwise wait for a writer) and checked on the open descriptor."""
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise _input_error(f"input file {name!r} does not exist", None) from None
    except OSError as exc:
        why = str(exc.strerror)
        raise _input_error(f"cannot read input file {name!r}: {why}", why) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            why = (
                f"it is {_kind(st.st_mode)}, not a regular file; give a file (a replay "
                "reads the same file again)"
            )
            raise _input_error(f"input file {name!r}: {why}", why)
        os.set_blocking(fd, True)
        if _inputs is not None:
            _inputs.add((st.st_dev, st.st_ino))
        return os.fdopen(fd, "rb"), st.st_size
    except BaseException:
        os.close(fd)
        raise


def _input_error(message: str, why: str | None) -> InputFileError:
    """``why``: the reason alone, for a caller that names the file its own way (None:
    the file does not exist)."""
    err = InputFileError(message)
    err.why = why  # type: ignore[attr-defined]
    return err


def grew(name: str) -> InputFileError:
    """The error of an input that holds more bytes than it did when it was opened."""
    return InputFileError(
        f"input file {name!r} grew while it was read; read it once it is complete"
    )


__all__ = [
    "SIDECARS",
    "SQLITE_MAGIC",
    "check_target",
    "check_writable",
    "grew",
    "open_input",
    "replacing",
    "write_file",
]
