"""The closure rule through calls, from the command line, in-process and under mpiexec.

A loop body that mutates captured Python state through a call (a helper appending to a
module-level list) would be applied a different number of times on each node, thread,
replay or serial run.  Reconnaissance catches it on the first invocation; a mutation that
only starts later is caught at the end of that invocation by a normal run (which names no
index), and body by body by ``--checked`` and the dual tests, on 1, 2 and 3 ranks.
"""

from __future__ import annotations

from pathlib import Path

import pytest

APP = """
import time

import numpy as np
import engine as ap

SEEN = []


def note(j):
    SEEN.append(j)


def train(epochs: int = 2, late: bool = False, slow: bool = False):
    X = ap.dvector(12, shape=(), init=ap.init.zeros(), name="X")
    counts = np.zeros(12)

    def body(j):
        X[j] = X[j] + 1.0
        if not late or X[j] > 1.0:
            if j == 5:
                if slow:
                    time.sleep(1.0)  # the rank with the later index fails first
                note(j)
            if j == 7:
                np.add.at(counts, [j], 1)

    for _ in range(epochs):
        ap.async_for(0, 12, body, name="count")
        ap.log_objective("sum", float(X.gather().sum()))
"""


@pytest.fixture
def app(tmp_path: Path) -> str:
    path = tmp_path / "seen.py"
    path.write_text(APP)
    return f"{path}:train"


#: Runs on more than one rank start mpiexec (in-process commands: mark them).
MPI = pytest.mark.mpi


@pytest.mark.parametrize(
    "ranks,slow",
    [
        (1, "false"),
        pytest.param(2, "false", marks=MPI),
        pytest.param(3, "false", marks=MPI),
        pytest.param(2, "true", marks=MPI),
    ],
)
def test_reconnaissance_catches_a_helper_that_appends(app: str, ranks: int, slow: str, cli) -> None:
    """The error names the first violation in index order (``SEEN`` at index 5, not
    ``counts`` at 7) whichever rank fails first: the ranks agree before one reports."""
    res = cli("run", app, "--ranks", str(ranks), "--no-trace", "-p", f"slow={slow}")
    assert res.returncode == 2, res.stdout + res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert "'count'" in last and "'SEEN'" in last and "closure rule" in last, last


@pytest.mark.parametrize("ranks", [2, 3])
@MPI
def test_a_mutation_after_reconnaissance_stops_every_kind_of_run(app: str, ranks: int, cli) -> None:
    """Before, a normal run checked reconnaissance only and ended with exit 0."""
    plain = cli("run", app, "-p", "late=true", "--ranks", str(ranks), "--no-trace")
    assert plain.returncode == 2, plain.stdout + plain.stderr
    last = plain.stderr.strip().splitlines()[-1]
    assert "async_for 'count': the loop body changed" in last and "closure rule" in last, last
    assert "at one of the calls (invocation 1)" in last and "--checked to name" in last, last
    checked = cli("run", app, "-p", "late=true", "--ranks", str(ranks), "--no-trace", "--checked")
    assert checked.returncode == 2, checked.stderr
    assert "invocation 1" in checked.stderr and "'count'" in checked.stderr
    dual = cli("dual", app, "-p", "late=true", "--ranks", str(ranks), "--no-trace")
    assert dual.returncode != 0, dual.stdout + dual.stderr
    assert "'count'" in dual.stderr and "closure rule" in dual.stderr


LAZY = """
import numpy as np
import engine as ap

BIG = np.arange(200_000, dtype=float)  # 1.6 MB: contents compared every 24 bodies
SEEN = []
TOKEN = None


def note(j):
    SEEN.append(BIG[j])


def rebind(j):
    globals()["TOKEN"] = (j,)


def train():
    X = ap.dvector(12, shape=(), init=ap.init.zeros(), name="X")

    def body(j):
        X[j] = X[j] + 1.0 if TOKEN is None else 2.0
        if j == 5:
            note(j)  # a change to contents: seen by the check after rank 0's last body
        if j == 7:
            rebind(j)  # a rebinding of a name the body reads: seen at once, on rank 1

    ap.async_for(0, 12, body, name="count")
"""


@pytest.mark.parametrize("ranks", [1, pytest.param(2, marks=MPI), pytest.param(3, marks=MPI)])
def test_a_change_seen_by_a_deferred_comparison_is_not_hidden_by_a_later_one(
    tmp_path: Path, ranks: int, cli
) -> None:
    """The change at index 5 shows only when contents are compared (every 24 bodies here,
    and after a share's last body); the rebinding at index 7 shows at once.  The error
    names index 5's change: on one node the comparison runs before the rebinding is
    reported, and on 2 ranks the comparison after rank 0's last body is rank 0's, which
    comes first in index order, not a check after every rank has finished."""
    path = tmp_path / "lazy.py"
    path.write_text(LAZY)
    res = cli("run", f"{path}:train", "--ranks", str(ranks), "--no-trace")
    assert res.returncode == 2, res.stdout + res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert "'SEEN'" in last and "'TOKEN'" not in last, last
    assert "between index" in last or "at index 5" in last, last
