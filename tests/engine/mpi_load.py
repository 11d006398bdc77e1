"""``ap.load`` under mpiexec: each rank parses only its share of the file's lines and
the records go to their homes, so no rank holds the whole data set.

``python mpi_load.py DIR`` on P ranks: rank 0 writes the files into DIR; each rank
returns what it saw of a good file (its rows right after loading, the gathered records,
a reduce and the digests), the error of a file with a bad line, and the error of ranks
that read files with different contents.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).parents[2]))
import engine as ap  # noqa: E402

#: a header, comments and blank lines (skipped), then 61 records of varied length
LINES = ["user,item,rating", "# exported 2026-12-06"] + [
    f"{j % 7},{(j * 5) % 11},{(j % 9) * 0.5}" + ("" if j % 10 else "\n# comment") for j in range(61)
]
GOOD = "\n".join(LINES) + "\n"
BAD_LINE = 40


#: lines this process parsed
CALLS = [0]


def parse(line: str) -> Any:
    CALLS[0] += 1
    if not line or line.startswith(("#", "user")):
        return None
    u, i, r = line.split(",")
    return int(u), int(i), float(r)


def good(path: Path) -> dict[str, Any]:
    CALLS[0] = 0
    A = ap.load(path, parse=parse, name="A")
    parsed = CALLS[0]
    held = sorted(next(iter(A._bufs.values())).keys())
    W = ap.dvector(7, shape=(), name="W")

    def body(j: int) -> None:
        u, _, r = A[j]
        W[u] = W[u] + r

    ap.async_for(0, len(A), body, name="sum")
    total = ap.reduce(A, lambda rec: rec[2], initial=0.0)
    return {
        "n": len(A),
        "held": held,
        "parsed": parsed,
        "A": [list(r) for r in A.gather()],
        "total": total,
    }


def error(fn: Any) -> str:
    try:
        fn()
    except ap.EngineError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def case(world: MPI.Comm, where: str) -> dict[str, Any]:
    d = Path(where)
    me = world.Get_rank()
    if me == 0:
        d.mkdir(parents=True, exist_ok=True)
        (d / "good.csv").write_text(GOOD)
        bad = GOOD.splitlines()
        bad[BAD_LINE - 1] = "3,4,x"
        (d / "bad.csv").write_text("\n".join(bad) + "\n")
    (d / f"mine{me}.csv").parent.mkdir(parents=True, exist_ok=True)
    (d / f"mine{me}.csv").write_text(GOOD if me == 0 else GOOD.replace("0.5", "0.75"))
    world.Barrier()
    res = ap.run(lambda: good(d / "good.csv"), comm=world)
    return {
        "good": res.value,
        "digests": res.digests,
        "bad": error(lambda: ap.run(lambda: ap.load(d / "bad.csv", parse=parse), comm=world)),
        "mine": error(
            lambda: ap.run(lambda: ap.load(d / f"mine{me}.csv", parse=parse), comm=world)
        ),
        # a file that only rank 0's host has (each rank looks under its own path)
        "lost": error(
            lambda: ap.run(
                lambda: ap.load(d / ("good.csv" if me == 0 else f"lost{me}.csv"), parse=parse),
                comm=world,
            )
        ),
    }


def main() -> int:
    case(MPI.COMM_WORLD, sys.argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
