"""Entry point of one MPI rank started by ``replay run --ranks N`` or ``replay dual``
(``python -m replay._worker``)."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

#: Seconds a rank whose peer failed waits for that rank to abort the job (it normally
#: does within milliseconds) before aborting it itself.
PEER_WAIT_S = 60.0
#: Exit status of a rank that aborts the job for a peer that did not.
EXIT_PEER = 70


def _write(path: Path, data: dict[str, Any]) -> None:
    # the job directory is private (mkdtemp), but a result is written like every other file
    from engine.lowlevel import write_file

    write_file(path, json.dumps(data), force=True)


#: Seconds a diverged rank waits for the other ranks' reports before it stops the job:
#: every rank checks the same digest, but only the rank that owns the differing element
#: can name it (it reads no other rank's rows).
PEER_REPORT_WAIT_S = 2.0


def _await_peer_reports(job: Path, ranks: int) -> None:
    deadline = time.monotonic() + PEER_REPORT_WAIT_S
    while len(list(job.glob("diverged.*.json"))) < ranks and time.monotonic() < deadline:
        time.sleep(0.02)


def main(argv: list[str]) -> int:
    """Run the job in ``argv[1]`` as one rank of COMM_WORLD."""
    spec = json.loads(Path(argv[1]).read_text())
    job = Path(spec["job_dir"])
    from mpi4py import MPI

    import engine

    from ._dualjob import dual_here
    from ._job import describe, run_here
    from ._replay import replay_here

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if spec.get("parent"):
        from ._job import abandon
        from ._procs import start_watchdog

        start_watchdog(spec["parent"], lambda: abandon(spec, rank))

    def progress(line: str) -> None:
        # always stdout: the parent forwards it to its stdout, or stderr under --json
        print(line, flush=True)

    try:
        if spec.get("kind") == "replay":
            result = replay_here(spec, comm=comm, progress=progress)
            if not result["identical"]:
                # this rank left its recorded path: stop the others, which may wait on it
                _write(job / f"diverged.{rank:04d}.json", result)
                _await_peer_reports(job, comm.Get_size())
                sys.stdout.flush()
                comm.Abort(3)
        elif spec.get("kind") == "dual":
            result = dual_here(spec, comm=comm)
            if "divergence" in result:
                # this rank left the orders it was given: stop the others, which may wait on it
                _write(job / f"diverged.{rank:04d}.json", result)
                sys.stdout.flush()
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
            # the failing rank writes the error and aborts the job (which ends this
            # process): an abort from here could kill it before it has written it
            time.sleep(PEER_WAIT_S)
            comm.Abort(EXIT_PEER)
            return EXIT_PEER
        try:
            message, status = describe(exc)
            if os.environ.get("REPLAY_DEBUG"):
                traceback.print_exc()
            _write(
                job / f"error.{rank:04d}.json", {"rank": rank, "message": message, "status": status}
            )
            sys.stdout.flush()
        finally:
            comm.Abort(status)
        return status
    if rank == 0:
        _write(job / "result.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
