"""Everything that changes execution is in the trace (issue 34, point 2).

``replay run --checked`` turns relaxation off (as test mode does), which changes the plan
of a program with a relaxed DDS.  The trace did not say the run was checked, so every
replay ran with relaxation on and reported DIVERGED at the first plan.  A run's modes
(checked, test mode) are now run labels, covered by the run row's hash chain, and every
replay (single, cluster, --from, history, watch, resume) runs in them; a trace without
the label (recorded before it existed) replays with the mode off, as its run had.

The combinations run in-process (``--ranks 1``, CliRunner: about 30 s); the two
``cluster`` cases start MPI jobs (about 10 s each).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import tracer
from replay._cli import cli
from tests import cli as tcli

HERE = Path(__file__).parent
PROG = str(HERE / "mode_apps.py") + ":train"
KERNEL = ["sgdmf", "-p", "synthetic=true", "-p", "rank=4", "-p", "epochs=2", "-p", "kernel=true"]


def invoke(*args: str, env: dict[str, str] | None = None, status: int = 0) -> dict[str, Any]:
    res = CliRunner().invoke(cli, list(args), env=env)
    assert res.exit_code == status, (args, res.exit_code, res.stdout, res.stderr)
    return json.loads(res.stdout) if status == 0 and "--json" in args else {}


def record(trace: Path, *argv: str, env: dict[str, str] | None = None, status: int = 0) -> None:
    invoke("run", *argv, "--ranks", "1", "--trace", str(trace), "--json", env=env, status=status)


def labels(trace: Path) -> list[dict[str, Any]]:
    """The runs' mode labels besides ``exact_reduce``, ``coalesced_sends``,
    ``ring_routes`` and ``exact_seed_keys``, which every run recorded today carries (its
    reduce sums exactly, its routed rows travel coalesced and relayed, its rotations move
    the smaller space, its seed keys its streams exactly; a trace without them replays
    with the left fold, one message per round and pair, the rotations and routes and
    seed keys of before)."""
    with tracer.open(trace) as store:
        got = [dict(r.labels or {}) for r in store.runs()]
    assert all(g.pop("exact_reduce", None) is True for g in got), got
    assert all(g.pop("coalesced_sends", None) is True for g in got), got
    assert all(g.pop("ring_routes", None) is True for g in got), got
    assert all(g.pop("exact_seed_keys", None) is True for g in got), got
    return got


def identical(mode: str, trace: Path, *extra: str) -> dict[str, Any]:
    got = invoke(mode, str(trace), "--json", *extra)
    assert got["identical"] and got["complete"], got["first_difference"]
    return got


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("sync", ["ssp", "hybrid"])
@pytest.mark.parametrize("checked", [False, True], ids=["normal", "checked"])
def test_every_mode_combination_replays_identically(
    tmp_path: Path, checked: bool, sync: str, threads: int
) -> None:
    trace = tmp_path / "t.sqlite"
    flags = ["--checked"] if checked else []
    record(trace, PROG, "-p", f"sync={sync}", "--threads", str(threads), *flags)
    # a run without the mode carries no label: an old trace reads as the mode off
    assert labels(trace) == ([{"checked": True}] if checked else [{}])
    got = identical("single", trace)
    assert got["checked"]["digests"] > 0


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("checked", [False, True], ids=["normal", "checked"])
def test_a_compiled_kernel_replays_in_its_mode(tmp_path: Path, checked: bool, threads: int) -> None:
    trace = tmp_path / "t.sqlite"
    record(trace, *KERNEL, "--threads", str(threads), *(["--checked"] if checked else []))
    identical("single", trace)


def test_the_relaxed_program_plans_otherwise_when_checked(tmp_path: Path) -> None:
    """What the label protects: the checked run's plan is not a normal run's, so a replay
    in the wrong mode cannot pass (it diverges at the plan)."""
    plans = {}
    for checked in (False, True):
        trace = tmp_path / f"{checked}.sqlite"
        record(trace, PROG, "--threads", "2", *(["--checked"] if checked else []))
        with tracer.open(trace) as store:
            plans[checked] = store.run().plan("acc")
    assert len(plans[False].rounds) != len(plans[True].rounds)


@pytest.mark.parametrize("checked", [False, True], ids=["relaxed", "checked"])
def test_time_travel_and_resume_in_the_run_s_mode(tmp_path: Path, checked: bool) -> None:
    """Normal mode restores the relaxed ``S`` from checkpoints; checked mode replans."""
    trace = tmp_path / "t.sqlite"
    flags = ["--checked"] if checked else []
    argv = [PROG, "--threads", "2", *flags, "--checkpoint-every", "1"]
    record(trace, *argv)
    got = identical("single", trace, "--from", "acc:2")
    assert got["from"]["invocation"] == 1
    hist = invoke("history", str(trace), "X[5]", "--between", "acc:1", "acc:2", "--json")
    entries = hist["history"]
    assert [(e["op"], e["invocation"]) for e in entries] == [("acc", 1), ("mix", 1), ("acc", 2)]
    value = entries[2]["value"]
    found = invoke("watch", str(trace), f"(X[5] == np.array({value})).all()", "--json")
    assert found["found"] and (found["op"], found["invocation"]) == ("acc", 2)
    # stopped at the start of epoch 2, resumed in checked mode: the same as not stopped
    stopped = tmp_path / "stopped.sqlite"
    record(stopped, *argv, env={"MODE_APPS_INTERRUPT": "2"}, status=130)
    invoke("resume", str(stopped))
    # both runs in the mode, and the resumed one at the crashed one's --checkpoint-every
    modes = {"checked": True} if checked else {}
    assert labels(stopped) == [{**modes, "checkpoint_every": 1}] * 2
    with tracer.open(trace) as whole, tracer.open(stopped) as parts:
        want = whole.run().objectives()
        runs = parts.runs()
        assert parts.run(runs[-1].run_id).objectives() == want
    identical("single", stopped, "--run", runs[-1].run_id)


def test_dual_and_chaos_traces_of_the_program_replay(tmp_path: Path) -> None:
    dual = tmp_path / "dual.sqlite"
    invoke("dual", PROG, "--ranks", "2", "--in-process", "--trace", str(dual), "--json")
    assert labels(dual) == [{"test_mode": True}]
    identical("single", dual)
    chaos = tmp_path / "chaos.sqlite"
    invoke(
        "chaos", PROG, "--ranks", "2", "--threads", "2", "--in-process", "--runs", "1",
        "--chaos-seed", "3", "--trace", str(chaos), "--json",
    )  # fmt: skip
    with tracer.open(chaos) as store:
        run_id = store.runs()[0].run_id
    identical("single", chaos, "--run", run_id)


# ------------------------------------------------------------------ MPI (slower)
@pytest.mark.parametrize("sync", ["ssp", "hybrid"])
@pytest.mark.mpi  # in-process, but --ranks 2 and cluster start mpiexec
def test_a_checked_two_rank_run_replays_on_the_cluster(tmp_path: Path, sync: str) -> None:
    trace = tmp_path / "t.sqlite"
    argv = ["run", PROG, "-p", f"sync={sync}", "--ranks", "2", "--threads", "2", "--checked"]
    proc = tcli.invoke([*argv, "--trace", str(trace), "--timeout", "90"])
    assert proc.returncode == 0, proc.stderr
    assert labels(trace) == [{"checked": True}]
    for mode in ("cluster", "single"):
        rep = tcli.invoke([mode, str(trace), "--json"])
        assert rep.returncode == 0, rep.stdout + rep.stderr
        assert json.loads(rep.stdout)["identical"]
