"""``replay run``: MPI launch, user apps, JSON output and one-line errors."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli, run_mpi

SYN = ["-p", "synthetic=true", "-p", "synthetic_ratings=5000", "-p", "rank=4"]

USER_APP = """
import engine as ap

def train(epochs: int = 2, scale: float = 1.0, die_on_rank: int = -1):
    X = ap.dvector(40, shape=(2,), init=ap.init.zeros(), name="X")

    def body(j):
        X[j] = X[j] + scale * j

    for _ in range(epochs):
        ap.async_for(0, 40, body, name="add")
        if die_on_rank >= 0:
            import os, signal
            from mpi4py import MPI
            if MPI.COMM_WORLD.Get_rank() == die_on_rank:
                os.kill(os.getpid(), signal.SIGKILL)
        ap.log_objective("total", ap.reduce(X, lambda x: float(x.sum())))

def crash(epochs: int = 1):
    X = ap.dvector(4, shape=(), name="X")

    def body(j):
        X[j] = 1.0 / (j - 2)

    ap.async_for(0, 4, body, name="div")
"""


@pytest.fixture
def user_app(tmp_path: Path) -> Path:
    p = tmp_path / "train.py"
    p.write_text(USER_APP)
    return p


def one_line_error(proc, status: int, *needles: str) -> None:
    assert proc.returncode == status, (proc.returncode, proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert err.count("\n") == 0, f"expected one line on stderr, got:\n{proc.stderr}"
    assert err.startswith("replay: error:")
    assert "Traceback" not in proc.stderr
    for n in needles:
        assert n in err, err


@pytest.mark.mpi  # in-process, but --ranks 2 starts mpiexec
def test_run_two_ranks_json_has_the_design_fields(cli) -> None:
    proc = cli("run", "sgdmf", "--ranks", "2", "-p", "epochs=2", *SYN, "--json")
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    for key in (
        "run_id",
        "trace",
        "app",
        "params",
        "ranks",
        "threads",
        "seed",
        "objectives",
        "digests",
        "planner",
        "wall_s",
    ):
        assert key in res
    assert res["ranks"] == 2 and res["app"] == "sgdmf" and res["params"]["epochs"] == 2
    assert len(res["objectives"]["rmse"]) == 2
    assert res["planner"]["sgd"]["strategy"] == "rotation"
    assert res["planner"]["sgd"]["rounds"] == 2
    assert {d["dds"] for d in res["digests"]} >= {"W", "H", "ratings"}
    assert "iter" in proc.stderr  # progress goes to stderr with --json
    # timings: one digest time per invocation, one time per logged objective, rising
    assert len(res["digest_times"]) == 2 and all(t >= 0 for t in res["digest_times"])
    t = res["objective_times"]["rmse"]
    assert len(t) == 2 and 0 < t[0] <= t[1] <= res["wall_s"]


def test_run_prints_progress_and_rmse_per_epoch(cli) -> None:
    proc = cli("run", "sgdmf", "-p", "epochs=3", *SYN)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("  rmse =") == 3 and "final rmse =" in proc.stdout
    assert "plan sgd: rotation" in proc.stdout


@pytest.mark.mpi  # in-process, but --ranks 2 starts mpiexec
def test_same_outcome_in_process_and_on_two_ranks_for_a_conflict_free_app(
    user_app: Path, cli
) -> None:
    one = json.loads(cli("run", f"{user_app}:train", "-p", "epochs=3", "--json").stdout)
    two = cli("run", f"{user_app}:train", "--ranks", "2", "-p", "epochs=3", "--json")
    assert two.returncode == 0, two.stderr
    two = json.loads(two.stdout)
    assert one["objectives"] == two["objectives"]
    assert one["objectives"]["total"][-1] == 3 * 2 * sum(range(40))
    assert [d["digest"] for d in one["digests"]] == [d["digest"] for d in two["digests"]]


def test_user_launched_mpiexec_does_not_start_a_second_one() -> None:
    proc = run_mpi(["-m", "replay", "run", "sgdmf", "-p", "epochs=1", *SYN, "--json"], 2)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)  # exactly one JSON object: only rank 0 prints
    assert res["ranks"] == 2


def test_unknown_app(cli) -> None:
    one_line_error(cli("run", "nope"), 2, "unknown app 'nope'", "sgdmf")


def test_missing_app_file(tmp_path: Path, cli) -> None:
    one_line_error(cli("run", f"{tmp_path}/x.py:train"), 2, "does not exist")


def test_bad_param_value_and_unknown_param(cli) -> None:
    one_line_error(cli("run", "sgdmf", "-p", "epochs=abc"), 2, "epochs", "'abc' is not an integer")
    one_line_error(cli("run", "sgdmf", "-p", "nope=1"), 2, "unknown parameter 'nope'", "epochs")
    one_line_error(cli("run", "sgdmf", "-p", "epochs"), 2, "NAME=VALUE")


@pytest.mark.mpi  # the ranks find the file missing: mpiexec starts them
def test_missing_data_file(tmp_path: Path, cli) -> None:
    proc = cli("run", "sgdmf", "-p", f"data={tmp_path}/none.inter", "--ranks", "2")
    one_line_error(proc, 2, "none.inter", "does not exist")


def test_malformed_data_line(tmp_path: Path, cli) -> None:
    p = tmp_path / "bad.inter"
    p.write_text(
        "user_id:token\titem_id:token\trating:float\ttimestamp:float\n1\t2\t3\t4\n1\tx\t3\t4\n"
    )
    one_line_error(cli("run", "sgdmf", "-p", f"data={p}"), 2, f"{p}:3", "item id 'x'")


def test_missing_mpiexec(cli) -> None:
    proc = cli("run", "sgdmf", "--ranks", "2", *SYN, env={"REPLAY_MPIEXEC": "/nonexistent/mpiexec"})
    one_line_error(proc, 2, "mpiexec not found")


def test_a_rank_that_dies_is_reported_and_nothing_hangs(user_app: Path) -> None:
    # a real process: a SIGKILLed rank, and the timeout must fail the test if the
    # launcher hangs (an in-process command has no timeout to stop it)
    proc = run_cli(
        ["run", f"{user_app}:train", "--ranks", "2", "-p", "die_on_rank=1", "-p", "epochs=3"],
        timeout=60,
    )
    assert proc.returncode != 0
    one_line_error(proc, 2, "died", "signal 9")


@pytest.mark.mpi  # in-process, but --ranks 2 starts mpiexec
def test_a_failing_body_exits_1_with_its_location(user_app: Path, cli) -> None:
    for ranks in ("1", "2"):
        proc = cli("run", f"{user_app}:crash", "--ranks", ranks)
        one_line_error(proc, 1, "div#0 index 2", "ZeroDivisionError", "train.py:")


def test_help_lists_commands(cli) -> None:
    proc = cli("--help")
    assert proc.returncode == 0 and "run" in proc.stdout and "demo" in proc.stdout


def test_python_version_guard() -> None:
    assert sys.version_info >= (3, 11)


@pytest.mark.mpi  # in-process, but the demo runs its ranks under mpiexec
def test_demo_records_replays_both_ways_and_suggests_browse(tmp_path: Path, cli) -> None:
    proc = cli("demo", "--epochs", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "replay-progress" not in out + proc.stderr and "\x1b" not in out + proc.stderr
    assert "cluster replay: identical" in out and "single replay: identical" in out
    assert "browse it: replay browse traces/" in out
    assert len(list((tmp_path / "traces").glob("sgdmf-*.sqlite"))) == 1
    latest = tmp_path / "traces" / "latest"
    assert latest.is_symlink() and latest.resolve().name.startswith("sgdmf-")
    proc = cli("show", "traces/latest", cwd=tmp_path)  # the quick start, literally
    assert proc.returncode == 0 and "app sgdmf" in proc.stdout, proc.stderr


def test_user_traces_are_named_after_the_module_and_latest_follows(
    tmp_path: Path, user_app: Path, cli
) -> None:
    for _ in range(2):
        proc = cli("run", f"{user_app}:train", "-p", "epochs=1", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    traces = sorted((tmp_path / "traces").glob("*.sqlite"))
    assert len(traces) == 2 and all(t.name.startswith("train-") for t in traces)
    latest = tmp_path / "traces" / "latest"
    assert os.readlink(latest) in {t.name for t in traces}
    newest = max(traces, key=lambda t: t.stat().st_mtime_ns)
    assert latest.resolve() == newest.resolve()
    proc = cli("single", "traces/latest", cwd=tmp_path)
    assert proc.returncode == 0 and "identical" in proc.stdout, proc.stderr


@pytest.mark.parametrize("epochs", ["0", "-1"])
def test_demo_refuses_a_run_with_no_epoch_before_recording(
    tmp_path: Path, cli, epochs: str
) -> None:
    """0 epochs ran no loop body, and the demo then summarised 'identical' and 'PASS'
    from nothing compared; now it is one line and exit 2, and nothing is recorded."""
    proc = cli("demo", "--epochs", epochs, cwd=tmp_path)
    assert proc.returncode == 2
    assert "--epochs" in proc.stderr and "x>=1" in proc.stderr, proc.stderr
    assert "PASS" not in proc.stdout and not (tmp_path / "traces").exists()


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.4, "0 s"), (21.0, "21 s"), (89.4, "89 s"), (90.0, "2 min"), (600.0, "10 min")],
)
def test_the_demos_estimate_of_a_full_dual_test_is_never_0_min(seconds: float, text: str) -> None:
    """The demo estimated 3 epochs of 7 s as "about 0 min here"."""
    from replay._runcmds import duration_text

    assert duration_text(seconds) == text
