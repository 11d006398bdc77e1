"""A DDS of Python objects, from the command line, in one process and under mpiexec.

Object elements are digested and compared by text.  An object of a class without
``__repr__`` shows its address in its ``repr``, which differs between processes, so a
deterministic program with such a DDS was reported ``DIVERGED`` by ``replay single`` and
``FAIL`` by the dual tests; and a list read from a DDS and changed in place changed one
replica only (``final s`` 72 in one process, 60 on two ranks).  Both are checked here
through the CLI a user runs (in this process, tests/cli.py: the 2-rank runs still start
``mpiexec``, whose ranks are other processes, so those tests are ``mpi``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

APP = """
import engine as ap


class Box:
    def __init__(self, n, seen):
        self.n, self.seen = n, seen


def app(n: int = 8, epochs: int = 2):
    B = ap.create(n, lambda i: Box(i, [i]), name="B")
    L = ap.create(n, lambda i: [i, 0], name="L")
    S = ap.dvector(n, shape=(), name="S")

    def body(j):
        b, rec = B[j], L[j]
        rec[1] += 1  # a change to the copy read: never to the DDS
        S[j] = S[j] + b.n + rec[1]
        B[j] = Box(b.n + 1, b.seen + [j])

    for _ in range(epochs):
        ap.async_for(0, n, body, name="b")
        ap.log_objective("s", float(S.gather().sum()))
"""


@pytest.fixture
def app(tmp_path: Path) -> str:
    path = tmp_path / "boxes.py"
    path.write_text(APP)
    return f"{path}:app"


def _final(stdout: str) -> str:
    return next(ln for ln in stdout.splitlines() if ln.startswith("final s"))


@pytest.mark.mpi
def test_objects_replay_identically_and_give_one_answer_on_any_placement(
    app: str, tmp_path: Path, cli
) -> None:
    trace = str(tmp_path / "t.sqlite")
    one = cli("run", app, "--no-trace")
    two = cli("run", app, "--ranks", "2", "--trace", trace, "--timeout", "90")
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    assert _final(one.stdout) == _final(two.stdout) == "final s = 80"
    for mode in ("single", "cluster"):
        rep = cli(mode, trace)
        assert rep.returncode == 0 and "identical" in rep.stdout, rep.stdout + rep.stderr


@pytest.mark.mpi
def test_objects_pass_the_dual_tests_under_mpi(app: str, cli) -> None:
    res = cli("dual", app, "--ranks", "2", "--no-trace")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "forward: PASS" in res.stdout and "backward: PASS" in res.stdout


NUDGED = """
import os

import numpy as np

import engine as ap


def app(n: int = 6, epochs: int = 2):
    P = ap.create(n, lambda i: {"w": np.full(3, i + 1.0)}, name="P")

    def body(j):
        p = P[j]
        # state outside the trace: a change in the 15th digit the replay must report
        p["w"] = p["w"] * 1.5 * (1 + float(os.environ.get("NUDGE", "0")) * 1e-15)
        P[j] = p

    for _ in range(epochs):
        ap.async_for(0, n, body, name="b")
"""


def test_a_replay_that_differs_inside_an_array_of_an_object_element_diverges(
    tmp_path: Path, cli
) -> None:
    """Object elements were digested by ``repr``, which shows a float array to 8 digits:
    this replay said ``identical`` though every element differed (before this change)."""
    app = tmp_path / "nudged.py"
    app.write_text(NUDGED)
    trace = str(tmp_path / "t.sqlite")
    rec = cli("run", f"{app}:app", "--trace", trace, env={"NUDGE": "0"})
    assert rec.returncode == 0, rec.stderr
    for mode in ("single", "cluster"):
        same = cli(mode, trace, env={"NUDGE": "0"})
        assert same.returncode == 0 and "identical" in same.stdout, same.stdout + same.stderr
        assert "object text" not in same.stderr  # recorded with this text: no warning
        moved = cli(mode, trace, env={"NUDGE": "1"})
        assert moved.returncode == 3, moved.stdout + moved.stderr
        assert "DIVERGED on node 0 at b#0, outcome digest of P" in moved.stdout
