"""Entry point of one MPI rank started by ``replay run --ranks N`` or ``replay dual``
(``python -m replay._worker``): the spec arrives on rank 0's stdin, the reports leave
as frames on stdout (``_wire``)."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import traceback
from typing import Any

#: Seconds a rank whose peer failed waits for that rank to abort the job (it normally
#: does within milliseconds) before aborting it itself.
PEER_WAIT_S = 60.0
#: Exit status of a rank that aborts the job for a peer that did not.
EXIT_PEER = 70


#: Seconds a rank waits after sending its report before it aborts the job, so that
#: mpiexec forwards the report before it kills the ranks (hydra reads the rank's output
#: and the abort request in one event loop: on a loaded machine 0.1 s is close).
REPORT_GRACE_S = 0.5
#: Seconds a diverged rank waits for the other ranks' reports before it stops the job:
#: every rank checks the same digest, but only the rank that owns the differing element
#: can name it (it reads no other rank's rows).
PEER_REPORT_WAIT_S = 2.0
#: Tag of the notice a diverged rank sends every other rank once it has reported.
REPORTED_TAG = 7


def _await_peer_reports(notes: Any) -> None:
    """Tell every other rank this one has reported; wait until they all have (or
    :data:`PEER_REPORT_WAIT_S`)."""
    from mpi4py import MPI

    me, size = notes.Get_rank(), notes.Get_size()
    sent = [notes.isend(me, dest=r, tag=REPORTED_TAG) for r in range(size) if r != me]
    heard = 0
    deadline = time.monotonic() + PEER_REPORT_WAIT_S
    while heard < size - 1 and time.monotonic() < deadline:
        if notes.Iprobe(source=MPI.ANY_SOURCE, tag=REPORTED_TAG):
            notes.recv(source=MPI.ANY_SOURCE, tag=REPORTED_TAG)
            heard += 1
        else:
            time.sleep(0.02)
    del sent  # never waited on: the job ends with an abort


def _receive_spec(comm: Any) -> dict[str, Any]:
    """Rank 0 reads the spec from its stdin (the parent sent it through mpiexec) and
    broadcasts it: no rank needs a file the parent wrote."""
    from ._wire import FrameError, ack_line, read_spec, write_line

    spec: dict[str, Any] | None = None
    if comm.Get_rank() == 0:
        try:
            spec = read_spec(sys.stdin.buffer, lambda k: write_line(ack_line(k)))
        except (FrameError, ValueError, OSError) as exc:
            spec = {"unreadable": str(exc)}
    got: dict[str, Any] = comm.bcast(spec, root=0)
    return got


def _watch_parent(spec: dict[str, Any], rank: int) -> None:
    """End this rank once the parent ``replay`` process is gone, wherever it runs.

    Rank 0 reads its stdin to the end: the parent holds the other end of that pipe
    (through mpiexec) until the job ends, so EOF means it died, on any host.  A rank on
    the parent's host also checks its pid (``_procs.start_watchdog``).  Rank 0 marks the
    run crashed and exits; mpiexec then ends every other rank, on every host."""
    from ._job import abandon
    from ._procs import on_this_host, start_watchdog

    parent = spec.get("parent")
    if not parent:
        return
    if on_this_host(parent):
        start_watchdog(parent, lambda: abandon(spec, rank))
    if rank != 0:
        return

    def until_eof() -> None:
        # the file descriptor, not sys.stdin: a daemon thread blocked in a buffered
        # read holds its lock, and the interpreter aborts on it when the rank exits
        try:
            while os.read(0, 65536):
                pass
        except (OSError, ValueError):
            pass
        try:
            abandon(spec, rank)
        finally:
            os._exit(1)

    threading.Thread(target=until_eof, name="replay-stdin-watch", daemon=True).start()


def main(argv: list[str]) -> int:
    """Run the job whose spec rank 0 receives on stdin as one rank of COMM_WORLD."""
    from ._environment import quiet_imports

    with quiet_imports():
        from mpi4py import MPI

        import engine
        from tracer import TraceWriteError

        from . import _wire
        from ._dualjob import dual_here
        from ._job import describe, run_here
        from ._procs import host_id, on_this_host, shm_segments
        from ._replay import replay_here

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    spec = _receive_spec(comm)
    if "unreadable" in spec:
        if rank == 0:
            _wire.emit(rank, "error", {"rank": 0, "message": spec["unreadable"], "status": 70})
            time.sleep(REPORT_GRACE_S)
        comm.Abort(70)
        return 70
    _watch_parent(spec, rank)
    # who this rank is, for the parent to name it if it dies (hydra names only pid and host)
    # and the shared-memory files it maps, which the parent removes if the job aborts
    hello = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "host_id": host_id(),  # a pid means something only on this very host
        "shm": shm_segments(),
    }
    _wire.emit(rank, "hello", hello)
    notes = comm.Dup()  # diverged ranks tell each other they have reported

    def progress(line: str) -> None:
        # always stdout: the parent forwards it to its stdout, or stderr under --json
        print(line, flush=True)

    try:
        if spec.get("kind") == "replay":
            result = replay_here(spec, comm=comm, progress=progress)
            if not result["identical"]:
                # this rank left its recorded path: stop the others, which may wait on it
                _wire.emit(rank, "diverged", result)
                _await_peer_reports(notes)
                comm.Abort(3)
        elif spec.get("kind") == "dual":
            result = dual_here(spec, comm=comm)
            if "divergence" in result:
                # this rank left the orders it was given: stop the others, which may wait on it
                _wire.emit(rank, "diverged", result)
                time.sleep(REPORT_GRACE_S)
                comm.Abort(3)
        elif spec.get("kind") == "resume":
            from ._resume import resume_here

            result = resume_here(spec, comm=comm, progress=progress)
        else:
            result = run_here(spec, comm=comm, progress=progress)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent
        # whatever happens here, the job must be aborted: other ranks may be waiting
        message, status = f"internal error on rank {rank}: {exc!r}", 70
        if isinstance(exc, engine.PeerRankFailed):
            # the failing rank reports the error and aborts the job (which ends this
            # process): an abort from here could kill it before it has reported
            time.sleep(PEER_WAIT_S)
            comm.Abort(EXIT_PEER)
            return EXIT_PEER
        try:
            message, status = describe(exc)
            if isinstance(exc, TraceWriteError) and not on_this_host(spec.get("parent") or {}):
                # the trace is written on rank 0's host, not where the user typed the path
                message = f"rank {rank} on host {hello['host']}: {message}"
            if os.environ.get("REPLAY_DEBUG"):
                traceback.print_exc()
            _wire.emit(rank, "error", {"rank": rank, "message": message, "status": status})
            time.sleep(REPORT_GRACE_S)
        finally:
            comm.Abort(status)
        return status
    if rank == 0:
        _wire.emit(rank, "result", result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
