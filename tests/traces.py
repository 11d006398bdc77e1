"""A library of recorded traces, shared by the whole test run (the ``trace_library``
fixture of tests/conftest.py).

Many modules recorded the same small runs (synthetic SGDMF or MLR, one or two ranks) in
their own fixtures, each paying a recording.  Here a run is recorded once per test run,
keyed by its ``replay run`` arguments, in this process (``tests/cli.py``; a run on more
than one rank still starts ``mpiexec`` for its ranks).

A shared trace is read-only.  A test that damages, extends or resumes a trace takes a
private copy (:meth:`TraceLibrary.copy`), and so does one that replays it: ``single``
and ``cluster`` store their verdict in the trace, and ``resume`` appends a run.  Sharing is a shortcut, so it is checked: each
trace's bytes are hashed when it is recorded and again when the session ends, and a trace
that changed fails the run, naming it (a test wrote to a shared trace, or a read-only
command wrote to its file).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

from tests.cli import invoke

#: Common runs, by name (the arguments of ``replay run`` after the command).
SGDMF_1 = ("sgdmf", "-p", "synthetic=true", "-p", "synthetic_ratings=5000", "-p", "epochs=2")
SGDMF_2 = (*SGDMF_1, "--ranks", "2")
#: Small SGDMF parameters for a quick one-epoch run (5,000 synthetic ratings, rank 4).
SGDMF_SMALL = (
    "-p",
    "synthetic=true",
    "-p",
    "synthetic_ratings=5000",
    "-p",
    "epochs=1",
    "-p",
    "rank=4",
)
MLR_1 = ("mlr", "-p", "synthetic=true", "-p", "epochs=1")
MLR_2 = (*MLR_1, "--ranks", "2")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class TraceLibrary:
    """Traces recorded once per test run, keyed by their ``replay run`` arguments."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._made: dict[tuple[str, ...], tuple[Path, str, dict[str, Any]]] = {}

    def get(self, *run_args: str) -> Path:
        """The trace of ``replay run RUN_ARGS`` (recorded on first use).  Read it only:
        copy it (:meth:`copy`) to change it."""
        return self._entry(run_args)[0]

    def result(self, *run_args: str) -> dict[str, Any]:
        """The ``run --json`` object of that run (its digests, objectives, run id)."""
        return self._entry(run_args)[2]

    def copy(self, dst: Path, *run_args: str) -> Path:
        """A private copy of the trace at ``dst`` (a file path, or a directory to put
        ``trace.sqlite`` in), safe to damage or extend."""
        src = self.get(*run_args)
        if dst.is_dir():
            dst = dst / "trace.sqlite"
        shutil.copyfile(src, dst)
        return dst

    def _entry(self, run_args: tuple[str, ...]) -> tuple[Path, str, dict[str, Any]]:
        key = tuple(str(a) for a in run_args)
        if key not in self._made:
            path = self.root / f"t{len(self._made)}.sqlite"
            proc = invoke(["run", *key, "--trace", path, "--json"])
            assert proc.returncode == 0, (key, proc.returncode, proc.stderr)
            settle(path)
            self._made[key] = (path, _digest(path), json.loads(proc.stdout))
        return self._made[key]

    def changed(self) -> list[str]:
        """The shared traces whose bytes differ from when they were recorded."""
        return [
            " ".join(key)
            for key, (path, digest, _) in self._made.items()
            if not path.exists() or _digest(path) != digest or _sidecars(path)
        ]


def _sidecars(path: Path) -> list[Path]:
    """Journal files that hold pages not yet in the trace file."""
    files = (Path(f"{path}-wal"), Path(f"{path}-journal"))
    return [p for p in files if p.exists() and p.stat().st_size > 0]


def settle(path: Path) -> None:
    """Fold any write-ahead log into the file, so that a plain byte copy is the whole
    trace and the hash covers everything."""
    if _sidecars(path):
        con = sqlite3.connect(path)
        try:
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            con.close()
    Path(f"{path}-shm").unlink(missing_ok=True)
