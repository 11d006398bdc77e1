"""Many MPI test cases in one ``mpiexec`` launch.

Each launch pays process start-up and imports on every rank (1 to several seconds on 2
cores, with 2 or 3 ranks, more under load), once per case when a module started one
launch per case.  Here the cases of a module that need the same number of ranks run one
after another in a single launch:

- a case is a script (``tests/engine/mpi_*.py``, ``tests/replay/mpi_dual.py``) that
  exposes ``case(comm, *args)`` and its arguments (JSON values).  The script's own
  ``main`` runs one case as before, so ``mpiexec -n 3 python SCRIPT ARGS`` still works;
- ``python -m tests.mpibatch CASES OUT`` (:func:`main`, on every rank) runs the cases of
  the JSON file CASES in order on ``COMM_WORLD``, each with its stdout and stderr
  captured, and writes one JSON file per case per rank into OUT: what ``case`` returned,
  what it printed, and the traceback when it raised.  A case that raises does not stop
  the later ones; one that raised on some ranks while the others wait in it can only
  end the job (``Abort``), after its result is written;
- :class:`Batch` (the pytest side) launches on first use, bounded by
  ``LAUNCH_TIMEOUT + CASE_TIMEOUT`` per case, and turns each case's results into a
  :class:`subprocess.CompletedProcess` of its own, as ``run_mpi`` returned for a launch of
  that case alone; a case that did not finish fails with a message that names it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
import time
import traceback
from pathlib import Path
from subprocess import CompletedProcess  # by name: the layer scan reads `subprocess.` as e2e
from types import ModuleType
from typing import Any

#: Seconds a launch may take whatever its cases (start-up of the ranks and imports).
LAUNCH_TIMEOUT = 120
#: Seconds each case adds to its launch's bound (the slowest case takes ~20 s on a loaded
#: 2-core machine; a deadlocked one must fail the tests, not hang CI).
CASE_TIMEOUT = 45
#: Seconds a rank whose case raised waits for the others to finish that case before it
#: ends the job: they may be blocked in the case waiting for it.
GRACE = 20


# ====================================================================== in the ranks
def _script(path: str) -> ModuleType:
    """The module of a case script, imported once per process under its file's stem (its
    neighbours import each other by that name, e.g. ``from mpi_syncfor import program``)."""
    name = Path(path).stem
    mod = sys.modules.get(name)
    if mod is not None and Path(getattr(mod, "__file__", "") or "").resolve() == Path(path):
        return mod
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _run_one(comm: Any, script: str, args: list[Any]) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    start = time.monotonic()
    value: Any = None
    error = None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            value = _script(script).case(comm, *args)
        json.dumps(value)
    except SystemExit as exc:  # a script's ``raise SystemExit(message)``, as Python exits
        value = exc.code if isinstance(exc.code, int) or exc.code is None else 1
        error = None if value == exc.code else f"SystemExit: {exc.code}"
    except Exception:  # noqa: BLE001 - reported as the case's failure
        error = traceback.format_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    return {
        "value": value,
        "stdout": out.getvalue(),
        "stderr": err.getvalue(),
        "error": error,
        "seconds": round(time.monotonic() - start, 3),
    }


def main() -> int:
    """``python -m tests.mpibatch CASES OUT`` on every rank (see the module docstring)."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    # the batch's own barriers go on a communicator of their own: a rank that left a case
    # early must not meet the others' collectives inside it
    control = world.Dup()
    rank = world.Get_rank()
    spec = json.loads(Path(sys.argv[1]).read_text())
    cases, grace = spec["cases"], spec["grace"]
    out = Path(sys.argv[2])
    for i, c in enumerate(cases):
        (out / f"{i}.{rank}.started").touch()
        result = dict(_run_one(world, c["script"], c["args"]), name=c["name"], rank=rank)
        tmp = out / f"{i}.{rank}.tmp"
        tmp.write_text(json.dumps(result, default=repr))
        tmp.rename(out / f"{i}.{rank}.json")
        # one case at a time, as separate launches were; a rank whose case raised may
        # have left the others blocked in it, so it waits for them only so long
        done = control.Ibarrier()
        if result["error"] is None:
            done.Wait()
            continue
        deadline = time.monotonic() + grace
        while not done.Test():
            if time.monotonic() > deadline:
                world.Abort(1)
            time.sleep(0.05)
    return 0


# ====================================================================== in pytest
def selected(request: Any, test: Any) -> list[dict[str, Any]]:
    """The parameters of each of ``test``'s items this session runs (``request`` is a
    fixture's): a batch that adds only those cases launches for what ``-k`` or a node id
    picked, not for the whole module."""
    return [
        dict(item.callspec.params) if hasattr(item, "callspec") else {}
        for item in request.session.items
        if getattr(item, "function", None) is test
    ]


class Batch:
    """Cases that run together in one ``mpiexec -n RANKS`` launch, on first use.

    ``add(name, script, *args)`` the cases (every one of them before the first
    ``result``), then ``result(name)`` gives that case's ``CompletedProcess``: the return
    code is the largest the ranks' ``case`` returned (an int, else 0), or 1 when one
    raised; stdout and stderr are the ranks' in rank order, a traceback included."""

    def __init__(self, ranks: int, tmp: Path) -> None:
        self.ranks, self.tmp = ranks, tmp
        self.cases: dict[str, tuple[str, list[Any]]] = {}
        self._results: dict[str, list[dict[str, Any]]] | None = None
        #: seconds a rank whose case raised waits for the others (``GRACE``)
        self.grace: float = GRACE
        self._failure = ""
        self._exit = 0
        self._output = ""

    def add(self, name: str, script: str | Path, *args: Any) -> None:
        """Queue ``case(comm, *args)`` of ``script`` under ``name``."""
        assert self._results is None, f"case {name!r} added after the batch ran"
        assert name not in self.cases, f"two cases named {name!r}"
        self.cases[name] = (str(Path(script).resolve()), list(args))

    @property
    def timeout(self) -> float:
        """The launch's bound: grows with the number of cases."""
        return LAUNCH_TIMEOUT + CASE_TIMEOUT * len(self.cases) + self.grace

    def _launch(self) -> dict[str, list[dict[str, Any]]]:
        import pytest

        from tests.conftest import run_mpi

        if self._results is not None:
            return self._results
        self.tmp.mkdir(parents=True, exist_ok=True)
        cases = [{"name": n, "script": s, "args": a} for n, (s, a) in self.cases.items()]
        spec = {"cases": cases, "grace": self.grace}
        (self.tmp / "cases.json").write_text(json.dumps(spec))
        args = ["-m", "tests.mpibatch", str(self.tmp / "cases.json"), str(self.tmp)]
        try:
            proc = run_mpi(args, self.ranks, timeout=self.timeout)
            self._exit = proc.returncode
            how, output = f"mpiexec exited with {proc.returncode}", proc.stdout + proc.stderr
        except pytest.fail.Exception as exc:  # run_mpi's timeout
            how, output = f"mpiexec timed out after {self.timeout} s", str(exc)
        self._output = output
        results: dict[str, list[dict[str, Any]]] = {}
        raised: list[str] = []
        for i, name in enumerate(self.cases):
            files = [self.tmp / f"{i}.{r}.json" for r in range(self.ranks)]
            got = [json.loads(f.read_text()) for f in files if f.exists()]
            raised += [
                f"case {name!r} raised on rank {r['rank']}:\n{r['error']}"
                for r in got
                if r["error"]
            ]
            if len(got) == self.ranks:
                results[name] = got
            elif not self._failure:
                started = [r for r in range(self.ranks) if (self.tmp / f"{i}.{r}.started").exists()]
                self._failure = (
                    f"{how}: case {name!r} did not finish (started on ranks {started}, "
                    f"finished on {[r['rank'] for r in got]}, of {self.ranks})\n"
                    + "".join(raised)
                    + output
                )
        self._results = results
        return results

    def result(self, name: str) -> CompletedProcess[str]:
        """Case ``name``'s outcome, as ``run_mpi`` returned for a launch of it alone."""
        import pytest

        assert name in self.cases, f"no case {name!r} in this batch: {list(self.cases)}"
        per_rank = self._launch().get(name)
        if per_rank is None:
            pytest.fail(f"MPI case {name!r} has no result: {self._failure}")
        code = max((r["value"] if type(r["value"]) is int else 0) for r in per_rank)
        stdout = "".join(r["stdout"] for r in per_rank)
        stderr = ""
        for r in per_rank:
            stderr += r["stderr"]
            if r["error"]:
                code = max(code, 1)
                stderr += f"case {name!r} raised on rank {r['rank']}:\n{r['error']}"
        if self._exit and not self._failure:  # every case finished, then a rank failed
            code = max(code, self._exit)
            stderr += f"mpiexec exited with {self._exit} after the batch:\n{self._output}"
        return CompletedProcess([f"mpibatch case {name!r}"], code, stdout, stderr)

    def values(self, name: str) -> list[Any]:
        """What ``case`` returned on each rank (fails the test when the case failed)."""
        proc = self.result(name)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert self._results is not None
        return [r["value"] for r in self._results[name]]


if __name__ == "__main__":
    sys.exit(main())
