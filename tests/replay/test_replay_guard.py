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

import engine as ap
from tests.conftest import ROOT
from tests.engine.trapped import trapped

#: tests/engine/trapped.py: a rotation that the last node leaves in round 0 and, on 3
#: nodes, a lower node that hears of it an exchange late leaves in round 1
TRAPPED = f"{ROOT / 'tests' / 'engine' / 'trapped.py'}:trapped"
SITE = ROOT / "tests" / "jitter_site"

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


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_a_run_with_stops_in_two_rounds_replays_identically(
    tmp_path: Path, ranks: int, cli
) -> None:
    # recorded under seeded message jitter (tests/jitter.py), so that ranks run rounds
    # apart while one of them has stopped: the stop reported is still the earliest one,
    # and the trace replays on the cluster (under other timing) and in one process
    jitter = {"PYTHONPATH": f"{SITE}:{ROOT}", "STRADS_TEST_JITTER": "21"}
    trace = tmp_path / "t.sqlite"
    run = cli("run", TRAPPED, "--ranks", str(ranks), "--trace", trace, "--json", env=jitter)
    assert run.returncode == 0, run.stderr
    notes = [line for line in run.stderr.splitlines() if line.startswith("note:")]
    first = ap.run(trapped, nodes=ranks).value["trapped"][0]  # the round-0 stop
    assert len(notes) == 1, run.stderr
    assert f"invocation 1 index {first} on node {ranks - 1} wrote Z[0]" in notes[0], notes
    for mode in ("cluster", "single"):
        env = dict(jitter, STRADS_TEST_JITTER="22") if mode == "cluster" else {}
        rep = cli(mode, trace, "--json", env=env)
        assert rep.returncode == 0, rep.stdout + rep.stderr
        assert json.loads(rep.stdout)["identical"] is True
        assert "note:" not in rep.stderr  # replay follows the recorded plans: no new attempt
