"""Traces of runs the plan guard re-planned replay bit for bit, in both modes.

The recorded run undid and re-planned invocations (and ran one serially on every node);
only the attempts that completed are in the trace, and replay follows the plans the run
made at each invocation instead of repeating the failed attempts.

The commands run in this process (tests/cli.py); on more than one rank they still start
``mpiexec`` (those tests are marked ``mpi``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

APP = """
import numpy as np
import engine as ap


def train(epochs: int = 3, n: int = 30):
    X = ap.dvector(n + 1, shape=(2,), init=ap.init.normal(0, 1), name="X")
    flag = ap.dvector(1, shape=(), init=ap.init.zeros(), name="flag")

    def body(j):
        x = X[j]
        X[j] = x * 0.5 + 1.0
        if flag[0] > 0:
            X[j + 1] = X[j + 1] * 0.9 + np.tanh(x)

    def chain(j):
        if X[j][0] > 1.5:
            X[j + 1] = X[j] + 1.0

    for _ in range(epochs):
        ap.async_for(0, n, body, name="flip")
        ap.async_for(0, n, chain, name="chain")
        flag[0] = 1.0
        ap.log_objective("total", float(X.gather().sum()))
"""


@pytest.mark.parametrize(
    "ranks", [1, pytest.param(2, marks=pytest.mark.mpi), pytest.param(3, marks=pytest.mark.mpi)]
)
def test_a_replanned_run_replays_identically(tmp_path: Path, ranks: int, cli) -> None:
    app = tmp_path / "flip.py"
    app.write_text(APP)
    trace = tmp_path / "t.sqlite"
    run = cli("run", f"{app}:train", "--ranks", str(ranks), "--trace", trace, "--json")
    assert run.returncode == 0, run.stderr
    if ranks > 1:
        assert run.stderr.count("note: async_for 'flip' invocation 1") == 1, run.stderr
    for mode in ("cluster", "single"):
        rep = cli(mode, trace, "--json")
        assert rep.returncode == 0, rep.stdout + rep.stderr
        assert json.loads(rep.stdout)["identical"] is True
        assert "note:" not in rep.stderr  # replay follows the recorded plans: no new attempt


@pytest.mark.mpi
def test_replan_never_exits_1_naming_the_element(tmp_path: Path, cli) -> None:
    app = tmp_path / "flip.py"
    app.write_text(APP.replace('name="flip")', 'name="flip", replan="never")'))
    res = cli("run", f"{app}:train", "--ranks", "2", "--no-trace")
    assert res.returncode == 1, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert "'flip' invocation 1 index" in last and "X[" in last and "replan='never'" in last
