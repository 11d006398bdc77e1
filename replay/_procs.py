"""Keeping MPI jobs tied to the ``replay`` process that started them.

The CLI starts ``mpiexec`` in a session of its own, so that one ``killpg`` stops it
and every rank.  Three ways the CLI can go away must not leave ranks or job
directories behind:

* it returns or raises (errors, ``--timeout``, Ctrl-C): ``launch`` kills the group and
  its ``TemporaryDirectory`` is removed on the way out;
* it receives SIGTERM or SIGHUP: :func:`install_signal_handlers` turns them into
  :class:`Interrupted`, which unwinds through the same path;
* it is killed outright (SIGKILL): nothing runs in the CLI, so each rank watches it
  (:func:`start_watchdog`; ``PR_SET_PDEATHSIG`` cannot help, a rank's parent is the
  hydra proxy, not the CLI), marks the traced run crashed, removes the job directory
  and exits.  A job directory left by a CLI that died some other way is removed by
  :func:`sweep_stale` at the next launch, once its owner is known to be dead.

Limits on what a trace may ask for (``--max-ranks``, ``--max-threads``) live here too:
a trace is input, and 999 ranks from an edited file must not start 999 processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import signal
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from ._errors import UsageError

#: Seconds between two checks of a rank's watchdog: how long orphaned ranks may run on.
WATCH_INTERVAL_S = 0.5
#: Name of the file in a job directory that names the process owning it.
OWNER_FILE = "owner.json"
#: Prefix of the job directories ``launch`` creates in the temporary directory.
JOB_PREFIX = "replay-job-"


def default_limit() -> int:
    """Default of ``--max-ranks`` and ``--max-threads``: 4 x the CPUs of this machine."""
    return 4 * (os.cpu_count() or 1)


def check_shape(ranks: int, threads: int, *, max_ranks: int, max_threads: int) -> None:
    """Refuse a trace that asks for more ranks or threads than the limits allow."""
    if ranks > max_ranks:
        raise UsageError(
            f"the trace asks for {ranks} ranks, more than the limit of {max_ranks}; "
            f"pass --max-ranks {ranks} if you really want that many processes"
        )
    if threads > max_threads:
        raise UsageError(
            f"the trace asks for {threads} threads per node, more than the limit of "
            f"{max_threads}; pass --max-threads {threads} if you really want that many"
        )
    if ranks < 1 or threads < 1:
        raise UsageError(
            f"the trace records {ranks} rank(s) x {threads} thread(s); both must be >= 1 "
            "(the trace is damaged)"
        )


# ====================================================================== signals
class Interrupted(BaseException):
    """The CLI received SIGTERM or SIGHUP (a ``BaseException``, like Ctrl-C)."""

    def __init__(self, signo: int) -> None:
        self.signo = signo
        super().__init__(f"interrupted by {signal.Signals(signo).name}")

    @property
    def status(self) -> int:
        """The conventional exit status: 128 + the signal number."""
        return 128 + self.signo


def _raise(signo: int, _frame: FrameType | None) -> None:
    raise Interrupted(signo)


def install_signal_handlers() -> None:
    """Make SIGTERM and SIGHUP unwind the CLI like Ctrl-C (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise)


def interrupt_reason(exc: BaseException) -> str:
    """``interrupted by SIGTERM`` (or SIGINT for Ctrl-C)."""
    return str(exc) if isinstance(exc, Interrupted) else "interrupted by SIGINT"


# ====================================================================== liveness
def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` ("" where /proc is missing, None if dead)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None if Path("/proc/self/stat").exists() else ""
    except OSError:
        return ""
    fields = text.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):  # a zombie has exited: its parent just has not reaped it
        return None
    return fields[19]


def host_id() -> str:
    """This host: its name and the kernel's boot id (two machines may share a name)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


#: MPICH's shared-memory file of a job on one host (Linux): ``/dev/shm/mpich_shm_<hex>_<n>``.
_SEGMENT = re.compile(r"/dev/shm/mpich_shm_[0-9a-f]{1,16}_[0-9]{1,4}")
#: The most segment files one rank reports (it maps one per communicator it shares memory in).
MAX_SEGMENTS = 8


def shm_segments() -> list[list[Any]]:
    """The MPICH shared-memory files this process maps, as ``[path, inode]`` pairs (for
    :func:`remove_segments`); empty where there are none or no ``/proc``."""
    found: dict[str, int] = {}
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                parts = line.rstrip("\n").split(None, 5)
                if len(parts) == 6 and _SEGMENT.fullmatch(parts[5]):
                    found[parts[5]] = int(parts[4])
    except (OSError, ValueError):
        return []
    return [[path, inode] for path, inode in sorted(found.items())][:MAX_SEGMENTS]


def remove_segments(hellos: list[dict[str, Any]]) -> int:
    """Unlink the shared-memory files the ranks of an ended job on this host reported
    mapping (their hello report, ``_worker``); return how many.  MPICH removes its file
    when a job ends normally, but not when a rank aborts (every failing, diverged or
    timed-out job) or is killed: each such job left 2-3 MB of memory in ``/dev/shm``
    until the next reboot.  What a report names is not trusted: only a path of MPICH's
    own pattern whose file still has the reported inode and is this user's."""
    host = socket.gethostname()
    removed = 0
    for hello in hellos:
        if not isinstance(hello, dict) or hello.get("host") != host:
            continue
        segments = hello.get("shm")
        if not isinstance(segments, list):
            continue
        for item in segments[:MAX_SEGMENTS]:
            if not (isinstance(item, list) and len(item) == 2):
                continue
            path, inode = item
            if not (isinstance(path, str) and _SEGMENT.fullmatch(path) and type(inode) is int):
                continue
            try:
                st = os.lstat(path)
                if st.st_ino == inode and st.st_uid == os.getuid() and stat.S_ISREG(st.st_mode):
                    os.unlink(path)
                    removed += 1
            except OSError:
                continue  # gone already (a normal end), or not ours to remove
    return removed


def identity(pid: int | None = None) -> dict[str, Any]:
    """What :func:`alive` needs to recognise ``pid`` (default: this process) later."""
    pid = os.getpid() if pid is None else pid
    return {"pid": pid, "start": _start_time(pid) or "", "host": host_id()}


def on_this_host(who: dict[str, Any]) -> bool:
    """Whether the process :func:`identity` described runs on this host, where its pid
    means something (an identity without a host is from this host: older job dirs)."""
    return who.get("host", host_id()) == host_id()


def alive(who: dict[str, Any]) -> bool:
    """Whether the process :func:`identity` described still runs (not a reused pid)."""
    pid = int(who["pid"])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else: a reused pid, or judge by start time
    start = _start_time(pid)
    if start is None:
        return False
    return not who.get("start") or not start or start == who["start"]


def start_watchdog(
    parent: dict[str, Any], on_orphan: Callable[[], None], interval: float = WATCH_INTERVAL_S
) -> threading.Thread:
    """A daemon thread that calls ``on_orphan`` once ``parent`` has died (and then
    ``os._exit(1)`` if ``on_orphan`` returns)."""

    def watch() -> None:
        while alive(parent):
            time.sleep(interval)
        try:
            on_orphan()
        finally:
            os._exit(1)

    t = threading.Thread(target=watch, name="replay-watchdog", daemon=True)
    t.start()
    return t


# ====================================================================== job directories
def write_owner(job_dir: str | os.PathLike[str]) -> None:
    """Record this process as the owner of ``job_dir`` (for :func:`sweep_stale`)."""
    (Path(job_dir) / OWNER_FILE).write_text(json.dumps(identity()))


@contextlib.contextmanager
def job_directory() -> Iterator[str]:
    """A new job directory owned by this process (:func:`write_owner`), removed on the
    way out.  A rank that mpiexec has not reaped yet may still write into it while it is
    removed; the removal is then tried again for up to a second, and what is left is
    never an error (a later launch's :func:`sweep_stale` removes it)."""
    tmp = tempfile.mkdtemp(prefix=JOB_PREFIX)
    try:
        write_owner(tmp)
        yield tmp
    finally:
        deadline = time.monotonic() + 1.0
        while True:
            try:
                shutil.rmtree(tmp)
                break
            except OSError:  # a file came (or went) while it was removed
                if not os.path.lexists(tmp):
                    break
                if time.monotonic() > deadline:
                    with contextlib.suppress(OSError):  # so that the sweep knows it
                        write_owner(tmp)
                    break
                time.sleep(0.05)


def sweep_stale(root: str | os.PathLike[str] | None = None) -> list[str]:
    """Remove this user's job directories whose owner process is dead; their paths."""
    base = Path(root if root is not None else tempfile.gettempdir())
    removed = []
    for d in base.glob(JOB_PREFIX + "*"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            if d.is_symlink() or not d.is_dir() or d.stat().st_uid != os.getuid():
                continue
            owner = json.loads((d / OWNER_FILE).read_text())
            if on_this_host(owner) and not alive(owner):
                shutil.rmtree(d, ignore_errors=True)
                removed.append(str(d))
    return removed


__all__ = [
    "DeathOrder",
    "Interrupted",
    "alive",
    "check_shape",
    "default_limit",
    "identity",
    "host_id",
    "install_signal_handlers",
    "interrupt_reason",
    "job_directory",
    "on_this_host",
    "start_watchdog",
    "sweep_stale",
    "write_owner",
]


class DeathOrder:
    """Which rank on this host died first, seen as it happens.

    When a rank dies, hydra kills every other rank and then names one dead process, often
    not the first (with 3 ranks, a SIGKILLed rank 2 was reported as rank 0 or 1 in about
    half the runs): its report cannot say which rank failed.  The CLI therefore watches
    the ranks on its own host with a pidfd each (Linux >= 5.3), in a thread that sleeps in
    ``poll`` and costs nothing while they run: the first pidfd that becomes readable is
    the rank that died before hydra's clean-up began.  Ranks on other hosts are not seen.
    """

    def __init__(self) -> None:
        self._poll = select.poll()
        self._ranks: dict[int, int] = {}  # pidfd -> rank
        self._first: tuple[int, ...] | None = None
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        self._poll.register(self._wake_r, select.POLLIN)
        self._closed = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def watch(self, rank: int, hello: Any) -> None:
        """Watch ``rank``, whose hello report is ``hello``, if it runs on this host."""
        if not isinstance(hello, dict) or hello.get("host_id") != host_id():
            return
        try:
            fd = os.pidfd_open(int(hello["pid"]))
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return  # gone already, or no pidfd here: hydra's report stands
        with self._lock:
            if self._closed:
                os.close(fd)
                return
            self._ranks[fd] = rank
            self._poll.register(fd, select.POLLIN)
        os.write(self._wake_w, b"w")  # a poll already waiting does not see the new fd

    def first(self) -> int | None:
        """The rank that died first, when exactly one of the watched ranks did."""
        with self._lock:
            first = self._first
        return first[0] if first is not None and len(first) == 1 else None

    def close(self) -> None:
        with self._lock:
            self._closed = True
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=5)
        with self._lock:
            for fd in self._ranks:
                os.close(fd)
            self._ranks.clear()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _run(self) -> None:
        while True:
            ready = [fd for fd, _ in self._poll.poll()]
            with self._lock:
                if self._closed:
                    return
                if self._wake_r in ready:
                    os.read(self._wake_r, 4096)
                dead = [fd for fd in ready if fd in self._ranks]
                if dead and self._first is None:
                    self._first = tuple(sorted(self._ranks[fd] for fd in dead))
                for fd in dead:
                    self._poll.unregister(fd)
