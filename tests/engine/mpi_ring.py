"""The write-back ring under mpiexec: a stop is reported alike whatever the timing.

``python mpi_ring.py THREADS SEED...`` on P ranks runs ``trapped`` (tests/engine/
trapped.py: a rotation plan that the last node leaves in round 0 and a lower node, which
hears of that one exchange late, in round 1) once on COMM_WORLD and once per SEED under
seeded message jitter (tests/jitter.py: a rank sleeps or delivers late, so ranks run
rounds apart).  Each rank returns, per run: the violations the engine reported (round,
node, index), the result's bytes, the trapped indices and the rounds of the plan; and
how many collectives the write-backs of each invocation made (its exchanges, rounds and
final).  Rank 0 prints ``OK`` when every rank of every run reported the same (and, on
one thread per rank, gave the same bits).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[2]))
from trapped import trapped  # noqa: E402

import engine as ap  # noqa: E402
from benchmarks._counting import Counting  # noqa: E402
from engine._asyncfor import loop  # noqa: E402
from tests.jitter import Jitter  # noqa: E402


def run(comm: Any, threads: int, relaxed: bool = False) -> dict[str, Any]:
    """One run of ``trapped``: what it returned, the violations reported, and the
    collectives of the write-backs of each invocation."""
    counts = [0]
    notes: list[list[int]] = []
    per_invocation: list[int] = []
    exchanges: list[int] = []
    note, write_back = loop._note, loop.write_back

    def noted(sess: Any, v: Any, what: str) -> None:
        notes.append([v.round, v.node, v.index])
        note(sess, v, what)

    def counted(cl: Any, ex: list, r: int, *, stopped: bool) -> bool:
        before = counts[0]
        try:
            return write_back(cl, ex, r, stopped=stopped)
        finally:
            exchanges[-1] += counts[0] - before
            if r == len(ex) - 1:  # an attempt's last exchange
                per_invocation.append(exchanges[-1])
                exchanges.append(0)

    loop._note, loop.write_back = noted, counted  # type: ignore[assignment]
    exchanges.append(0)
    try:
        prog = lambda: trapped(relaxed=relaxed)  # noqa: E731
        value = ap.run(prog, comm=Counting(comm, counts), threads=threads).value
    finally:
        loop._note, loop.write_back = note, write_back  # type: ignore[assignment]
    return {**value, "notes": notes, "exchange_collectives": per_invocation}


def _outcome(comm: Any, first: bool) -> list[Any]:
    """What one run of the failing ``trapped`` raised here, and the violations before."""
    notes: list[list[int]] = []
    note = loop._note

    def noted(sess: Any, v: Any, what: str) -> None:
        notes.append([v.round, v.node, v.index])
        note(sess, v, what)

    loop._note = noted  # type: ignore[assignment]
    try:
        ap.run(lambda: trapped(first=first, fail=True), comm=comm)
        raised: list[Any] = ["nothing"]
    except ap.BodyError as exc:
        raised = ["BodyError", exc.index, exc.node]
    except ap.PeerRankFailed as exc:
        raised = ["PeerRankFailed", exc.rank, exc.error]
    finally:
        loop._note = note  # type: ignore[assignment]
    return [first, raised, notes]


def failing(world: MPI.Comm, *seeds: int) -> list[list[Any]]:
    """``trapped`` whose round-1 body raises, without and with the round-0 stop, plainly
    and per jitter seed: per run, whether the stop was trapped, what this rank raised
    (``["BodyError", index, node]`` or ``["PeerRankFailed", rank, its error]``) and the violations
    reported before."""
    me = world.Get_rank()
    out = []
    for first in (False, True):
        out.append(_outcome(world, first))
        for s in seeds:
            out.append(_outcome(Jitter(world, np.random.default_rng([s, me])), first))
    return out


def case(world: MPI.Comm, threads: int, *seeds: int) -> dict[str, Any]:
    """Every rank returns its runs (plain first, then one per jitter seed) and one plain
    run with a relaxed DDS."""
    me = world.Get_rank()
    runs = [run(world, threads)]
    for seed in seeds:
        runs.append(run(Jitter(world, np.random.default_rng([seed, me])), threads))
    relaxed = run(world, threads, relaxed=True)
    failed = failing(world, *seeds[:1]) if threads == 1 and world.Get_size() == 3 else []
    every = world.allgather(runs)
    if me == 0:
        flat = [r for per_rank in every for r in per_rank]
        # with threads, lock-split groups take their locks in whatever order they come:
        # the bits then differ from run to run (a recorded order, not a timing bug)
        keys = ("notes", "trapped", "rounds") + (("tables",) if threads == 1 else ())
        same = all(all(r[k] == flat[0][k] for k in keys) for r in flat)
        print("OK" if same else "runs differ", flush=True)
    return {"runs": runs, "relaxed": relaxed, "failing": failed}


def main() -> int:
    case(MPI.COMM_WORLD, int(sys.argv[1]), *map(int, sys.argv[2:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
