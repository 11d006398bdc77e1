"""Replay under other message timing: a run recorded under one seeded perturbation of MPI
message timing (``tests/jitter.py``: late delivery, pauses) replays bit for bit on the
cluster under another.  Whatever timing decides in a run — lock grants, arrival orders,
SSP visibility, Hybrid mutex orders — must come from the trace in a replay, never from
when messages happen to arrive.

The commands run in this process (tests/cli.py); the ranks, which the jitter site module
perturbs, are the processes ``mpiexec`` starts with the command's environment.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ROOT

APPS = Path(__file__).parent / "nondet_apps.py"
SITE = ROOT / "tests" / "jitter_site"


def jittered(seed: int) -> dict[str, str]:
    return {"PYTHONPATH": f"{SITE}:{ROOT}", "STRADS_TEST_JITTER": str(seed)}


@pytest.mark.mpi
@pytest.mark.parametrize(
    "app,args",
    [
        (
            "sgdmf",
            [
                "-p",
                "synthetic=true",
                "-p",
                "synthetic_ratings=5000",
                "-p",
                "epochs=2",
                "-p",
                "rank=4",
                "--ranks",
                "3",
            ],
        ),
        (f"{APPS}:hot_locks", ["--ranks", "3", "--threads", "2"]),
        (f"{APPS}:ssp_delays", ["--ranks", "3"]),
        (f"{APPS}:hybrid_threads", ["--ranks", "2", "--threads", "3"]),
        ("mlr", ["-p", "synthetic=true", "-p", "epochs=2", "--ranks", "3", "--threads", "2"]),
    ],
    ids=["sgdmf", "hot_locks", "ssp_delays", "hybrid_threads", "mlr"],  # no checkout path
)
def test_a_run_recorded_under_one_timing_replays_under_another(
    tmp_path: Path, app: str, args: list[str], cli
) -> None:
    trace = tmp_path / "t.sqlite"
    proc = cli("run", app, *args, "--trace", trace, "--json", env=jittered(11))
    assert proc.returncode == 0, proc.stderr
    proc = cli("cluster", trace, "--json", env=jittered(12))
    assert proc.stdout.strip(), proc.stderr
    res = json.loads(proc.stdout)
    assert proc.returncode == 0 and res["identical"], res
    assert res["checked"]["digests"] > 0
