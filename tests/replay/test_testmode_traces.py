"""Runs recorded in test mode replay in test mode.

The parallel side of a dual test (``replay dual --trace``) and a chaos run checked with
``--check dual`` run in test mode: relaxed DDS are in the reconnaissance sets and SSP
staleness is off, so their plans are not a normal run's.  Such a run is labelled
``test_mode`` and its replays (single, cluster) run in test mode too; before, a program
with a relaxed DDS (LDA) diverged at its first plan.

The commands run in this process (tests/cli.py); the cases whose dual test or replay runs
on MPI ranks still start ``mpiexec`` (marked ``mpi``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tracer

LDA = ["lda", "-p", "synthetic=true", "-p", "iterations=2", "--threads", "2"]
SSP = ["mlr", "-p", "synthetic=true", "-p", "sync=ssp", "-p", "epochs=1"]
BSP = ["mlr", "-p", "synthetic=true", "-p", "epochs=1"]
MPI = pytest.mark.mpi


@pytest.mark.parametrize(
    "argv,modes",
    [
        pytest.param(["dual", *LDA, "--ranks", "2"], ("single", "cluster"), marks=MPI),
        (["dual", *LDA, "--ranks", "2", "--in-process"], ("single",)),
        pytest.param(["dual", *SSP, "--ranks", "2"], ("single", "cluster"), marks=MPI),
        (
            ["chaos", *BSP, "--ranks", "2", "--in-process", "--runs", "1", "--chaos-seed", "1"]
            + ["--check", "dual"],
            ("single",),
        ),
    ],
    # chaos refuses --check dual on LDA's relaxed counts (test_verdict_coverage.py)
    ids=["dual-mpi-lda", "dual-in-process-lda", "dual-mpi-ssp", "chaos-check-dual-mlr"],
)
def test_a_test_mode_run_replays_in_test_mode(
    tmp_path: Path, argv: list[str], modes: tuple[str, ...], cli
) -> None:
    trace = tmp_path / "t.sqlite"
    res = cli(*argv, "--trace", trace)
    assert res.returncode == 0, res.stdout + res.stderr
    with tracer.open(trace) as store:
        runs = store.runs()
    assert runs and all(r.labels.get("test_mode") is True for r in runs)
    for r in runs:
        for mode in modes:
            rep = cli(mode, trace, "--run", r.run_id, "--json")
            got = json.loads(rep.stdout)
            assert rep.returncode == 0 and got["identical"], rep.stderr


def test_a_normal_run_is_not_labelled_test_mode(tmp_path: Path, cli) -> None:
    trace = tmp_path / "t.sqlite"
    res = cli("run", *LDA, "--trace", trace)
    assert res.returncode == 0, res.stderr
    with tracer.open(trace) as store:
        assert "test_mode" not in store.runs()[0].labels
