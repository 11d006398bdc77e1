"""Replay of untrusted, crashed and interrupted traces (issue "Hardening" 1, 3 and 7).

A trace is data: replay runs only the user's own function at the recorded target,
with the recorded digest and well-typed parameters.  A crash or a pdb quit is never a
divergence, and every report names what differs.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest

import engine
import tracer
from engine._machines.planner import Task
from replay._controller import plan_difference
from replay._errors import UsageError
from replay._target import check_params
from tests import cli as tcli
from tests.conftest import ROOT, run_cli
from tests.tracer.tracehelp import reseal
from tests.traces import SGDMF_1, settle

HERE = Path(__file__).parent
APPS = HERE / "nondet_apps.py"
CRASH = HERE / "crash_apps.py"

USER_APP = """
import engine as ap

def train(epochs: int = 2, scale: float = 1.0, tag: str = "", fast: bool = False):
    X = ap.dvector(40, shape=(2,), init=ap.init.zeros(), name="X")

    def body(j):
        X[j] = X[j] + scale * j

    for _ in range(epochs):
        ap.async_for(0, 40, body, name="add")
        ap.log_objective("total", ap.reduce(X, lambda x: float(x.sum())))

stored_lambda = lambda epochs=1: None

class Model:
    def __init__(self, epochs: int = 1):
        pass

import os
system = os.system
"""


def one_line(proc, status: int, *needles: str) -> str:
    assert proc.returncode == status, (proc.returncode, proc.stdout, proc.stderr)
    err = proc.stderr.strip()
    assert err.count("\n") == 0 and err.startswith("replay: error:"), proc.stderr
    assert "Traceback" not in proc.stderr and "replay-job-" not in proc.stderr
    for n in needles:
        assert n in err, err
    return err


def record(tmp_path: Path, app: str, *args: str, name: str = "t.sqlite", **kw) -> Path:
    trace = tmp_path / name
    proc = tcli.invoke(["run", app, *args, "--trace", str(trace), "--json"], **kw)
    assert proc.returncode == 0, proc.stderr
    return trace


def forge(src: Path, dst: Path, **columns: str) -> Path:
    """A copy of trace ``src`` whose run row says what ``columns`` say, re-sealed as a
    determined editor of an unkeyed chain could (so the checks behind the chain are
    what these tests exercise; tests/replay/test_run_row_forgery.py covers the chain)."""
    shutil.copy(src, dst)
    with sqlite3.connect(dst) as db:
        for col, value in columns.items():
            db.execute(f"UPDATE run SET {col} = ?", (value,))  # noqa: S608 - test columns
    db.close()
    reseal(dst)
    return dst


@pytest.fixture(scope="module")
def user_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("user")
    app = tmp / "train.py"
    app.write_text(USER_APP)
    return record(tmp, f"{app}:train", "--ranks", "2")


@pytest.fixture(scope="module")
def hot_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-rank, 2-thread recording of ``hot_locks``, shared: tests copy it."""
    tmp = tmp_path_factory.mktemp("hot")
    trace = record(tmp, f"{APPS}:hot_locks", "--ranks", "2", "--threads", "2")
    settle(trace)  # a byte copy is then the whole trace
    return trace


# ---------------------------------------------------------------- 1. what replay runs
@pytest.mark.parametrize(
    "target,params",
    [
        ("os:system", {"command": "touch {marker}"}),  # C function in a stdlib module
        ("subprocess:getoutput", {"cmd": "touch {marker}"}),  # Python function, stdlib
        ("builtins:exec", {}),  # built-in module
        ("posix:system", {"command": "touch {marker}"}),  # built-in C module
        ("{app}:stored_lambda", {}),  # a lambda stored in the user's module
        ("{app}:Model", {}),  # a class
        ("{app}:system", {"command": "touch {marker}"}),  # os.system re-exported
        ("{app}.txt:train", {}),  # not a .py file
    ],
)
@pytest.mark.mpi  # in-process, but the 2-rank recording or cluster starts mpiexec
def test_a_target_that_is_not_a_python_function_is_refused(
    tmp_path: Path, user_trace: Path, target: str, params: dict[str, str], cli
) -> None:
    marker = tmp_path / "ran"
    app = user_trace.parent / "train.py"
    shutil.copy(app, str(app) + ".txt")
    target = target.format(app=app)
    values = {k: v.format(marker=marker) for k, v in params.items()}
    bad = forge(
        user_trace, tmp_path / "forged.sqlite", app=target, target=target, params=json.dumps(values)
    )
    for mode in ("single", "cluster"):
        proc = cli(mode, str(bad))
        one_line(proc, 2)
        assert not marker.exists(), f"replay {mode} ran {target}"


@pytest.mark.mpi  # in-process, but the 2-rank recording or cluster starts mpiexec
def test_a_file_target_with_another_digest_is_not_even_imported(
    tmp_path: Path, user_trace: Path, cli
) -> None:
    marker = tmp_path / "imported"
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'w').close()\ndef train(epochs: int = 1): pass\n")
    bad = forge(user_trace, tmp_path / "f.sqlite", app=f"{evil}:train", target=f"{evil}:train")
    for mode in ("single", "cluster"):
        one_line(cli(mode, str(bad)), 2, "--allow-changed-code")
        assert not marker.exists()


def test_a_builtin_app_is_checked_against_its_digest_too(
    tmp_path: Path, trace_library, cli
) -> None:
    bad = forge(trace_library.get(*SGDMF_1), tmp_path / "b.sqlite", code_digest="0" * 32)
    for mode in ("single", "cluster"):
        one_line(cli(mode, str(bad)), 2, "000000000000 recorded")


@pytest.mark.parametrize(
    "params,needle",
    [
        ({"epochs": [1, 2]}, "epochs=[1, 2] (list)"),
        ({"epochs": "3"}, "epochs='3' (str)"),
        ({"epochs": True}, "epochs=True (bool)"),
        ({"epochs": 2.5}, "epochs=2.5 (float)"),
        ({"scale": "x"}, "scale='x'"),
        ({"scale": None}, "scale=None"),
        ({"tag": 3}, "tag=3"),
        ({"fast": 1}, "fast=1"),
        ({"bogus": 1}, "parameter 'bogus'"),
        ([1, 2], "are a list"),
        ("epochs=3", "are a str"),
    ],
)
def test_recorded_params_must_fit_the_annotations(params: object, needle: str) -> None:
    ns: dict[str, object] = {}
    exec(USER_APP.split("stored_lambda")[0].replace("import engine as ap", ""), ns)  # noqa: S102
    with pytest.raises(UsageError, match=None) as info:
        check_params(ns["train"], params, "train.py:train")
    assert needle in str(info.value)


def test_well_typed_params_pass() -> None:
    ns: dict[str, object] = {}
    exec(USER_APP.split("stored_lambda")[0].replace("import engine as ap", ""), ns)  # noqa: S102
    ok = {"epochs": 3, "scale": 2, "tag": "a", "fast": True}
    assert check_params(ns["train"], ok, "t") == ok


@pytest.mark.mpi  # in-process, but the 2-rank recording or cluster starts mpiexec
def test_wrong_recorded_params_exit_2_before_running(tmp_path: Path, user_trace: Path, cli) -> None:
    for k, values in enumerate(({"epochs": [1, 2]}, [3], {"scale": "fast"})):
        bad = forge(user_trace, tmp_path / f"p{k}.sqlite", params=json.dumps(values))
        for mode in ("single", "cluster"):
            one_line(cli(mode, str(bad)), 2, "the trace")


# ---------------------------------------------------------------- 7. crashes and pdb
@pytest.mark.parametrize(
    "kill_at,head",
    [
        (0, "identical (nothing was completed before the run crashed)"),
        (2, "identical (up to sgd#1, the run crashed after it)"),
    ],
)
@pytest.mark.mpi  # the replays run in-process, but cluster starts mpiexec
def test_a_crashed_trace_replays_what_was_completed(
    tmp_path: Path, kill_at: int, head: str, cli
) -> None:
    trace = tmp_path / "c.sqlite"
    # a real process records: a rank SIGKILLs itself and the command marks the run crashed
    proc = run_cli(
        [
            "run",
            f"{CRASH}:killed",
            "--ranks",
            "2",
            "-p",
            f"kill_at={kill_at}",
            "--trace",
            str(trace),
        ],
        env={"CRASH_APPS_KILL": "1"},
        timeout=120,
    )
    assert proc.returncode != 0 and "signal 9" in proc.stderr, proc.stderr
    assert tracer.open(trace).run().info.status == "crashed"
    for mode in ("cluster", "single"):
        proc = cli(mode, str(trace))
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        assert head in proc.stdout and "DIVERGED" not in proc.stdout
    verdicts = tracer.open(trace).run().verdicts()
    assert [(v.kind, v.passed) for v in verdicts] == [("cluster", True), ("single", True)]


def test_a_run_stopped_by_ctrl_c_is_interrupted_not_crashed(tmp_path: Path, cli) -> None:
    trace = tmp_path / "i.sqlite"
    # a real process records: a KeyboardInterrupt must not escape into pytest
    argv = ["run", f"{CRASH}:killed", "--ranks", "1", "-p", "kill_at=1", "--trace", str(trace)]
    proc = run_cli(argv, env={"CRASH_APPS_INTERRUPT": "1"}, timeout=120)
    assert proc.returncode == 130 and "Traceback" not in proc.stderr, proc.stderr
    info = tracer.open(trace).run().info
    assert (info.status, info.error) == ("interrupted", "interrupted by SIGINT")
    proc = cli("single", str(trace))
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert "identical (up to sgd#0, the run was interrupted after it)" in proc.stdout


@pytest.mark.parametrize("how", ["--break", "--until"])
@pytest.mark.mpi  # the shared recording starts mpiexec
def test_quitting_pdb_stops_the_replay_without_a_verdict(
    tmp_path: Path, hot_trace: Path, how: str
) -> None:
    # pdb reads the real process's stdin: it cannot be driven in-process under pytest
    trace = Path(shutil.copy(hot_trace, tmp_path / "t.sqlite"))
    where = "hot:1:17@1" if how == "--break" else "hot:0"
    proc = run_cli(["single", str(trace), how, where], input="q\n", timeout=60)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert "stopped by the user" in proc.stdout and "DIVERGED" not in proc.stdout
    assert tracer.open(trace).run().verdicts() == []


@pytest.mark.mpi  # the shared recording starts mpiexec
def test_quitting_pdb_interactively(tmp_path: Path, hot_trace: Path) -> None:
    pexpect = pytest.importorskip("pexpect")
    import sys

    trace = Path(shutil.copy(hot_trace, tmp_path / "t.sqlite"))
    child = pexpect.spawn(
        sys.executable,
        ["-m", "replay", "single", str(trace), "--break", "hot:1:17@1"],
        encoding="utf-8",
        timeout=60,
        cwd=str(tmp_path),
    )
    child.expect(r"\(Pdb\)")
    child.sendline("n")
    child.expect(r"\(Pdb\)")
    child.sendline("q")
    child.expect("stopped by the user")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert tracer.open(trace).run().verdicts() == []


# ---------------------------------------------------------------- 3. precise reports
@pytest.mark.mpi  # in-process, but the 2-rank recording or cluster starts mpiexec
def test_a_cluster_message_divergence_names_the_operator(tmp_path: Path, cli) -> None:
    app = tmp_path / "k.py"
    shutil.copy(CRASH, app)
    trace = record(tmp_path, f"{app}:killed", "--ranks", "2", "-p", "epochs=2")
    app.write_text(app.read_text().replace("range(epochs)", "range(epochs + 1)"))
    for mode in ("cluster", "single"):
        proc = cli(mode, str(trace), "--allow-changed-code")
        assert proc.returncode == 3, proc.stderr
        assert "at sgd#2," in proc.stdout and "-#-1" not in proc.stdout, proc.stdout


def _task(thread: int, *idx: int, locked: bool = False) -> Task:
    return Task(thread, np.asarray(idx, dtype=np.int64), locked)


def test_plan_difference_names_the_task_and_the_moved_indices() -> None:
    want = [[_task(0, 1, 17, 18, 5)], [_task(0, 2, 3)]]
    got = [[_task(0, 1, 5)], [_task(0, 2, 3, 17, 18)]]
    exp, act = plan_difference(0, 0, want, got)
    assert exp == "task 0 of node 0 in round 0 with 4 bodies as recorded"
    assert act == "indices 17, 18 moved to node 1"
    exp, act = plan_difference(3, 1, want, got)
    assert exp.startswith("task 0 of node 1 in round 3") and act == "indices 17, 18 joined it"
    exp, act = plan_difference(0, 0, [[_task(0, 1, 2, 3)]], [[_task(0, 1, 3, 2)]])
    assert act == "the same indices in another order (position 1: 3, not 2)"
    exp, act = plan_difference(0, 0, [[_task(0, 1, 2)]], [[_task(1, 1, 2)]])
    assert act == "thread 1, not 0"


@pytest.mark.parametrize(
    "args",
    [
        ["run", "sgdmf", "--timeout", "0"],
        ["run", "sgdmf", "--timeout", "-1"],
        ["cluster", "x.sqlite", "--timeout", "0"],
        ["dual", "sgdmf", "--timeout", "0"],
    ],
)
def test_timeout_must_be_positive(args: list[str], cli) -> None:
    proc = cli(*args)
    assert proc.returncode == 2 and "--timeout" in proc.stderr


def _divergence(actual: str) -> engine.DivergenceError:
    return engine.DivergenceError(
        node=-1,
        op="sgd",
        invocation=3,
        event="end",
        what="invocation",
        expected="this invocation",
        actual=actual,
    )


@pytest.mark.parametrize(
    ("actual", "said"),
    [
        ("the program ended before it", "the program ended before it"),
        ("run it", "the program did run it"),
    ],
)
def test_a_divergence_reads_as_one_sentence(
    actual: str, said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from replay import _replaycmds

    exc = _divergence(actual)
    assert str(exc).endswith(f"invocation end: the trace expected this invocation, {said}")
    monkeypatch.setattr(_replaycmds, "store_verdict", lambda res: None)
    monkeypatch.setattr(_replaycmds, "next_command", lambda *a: None)  # no trace here
    res = {"identical": False, "first_difference": exc.as_dict(), "checked": {}}
    with pytest.raises(SystemExit) as stop:
        _replaycmds._replay_report(res, False, "t.sqlite", "run", allow_changed=False)
    assert stop.value.code == 3
    out = capsys.readouterr().out
    assert out == (
        f"DIVERGED at sgd#3, invocation end: the trace expected this invocation, {said}\n"
    )
    assert "did the program" not in out


def test_ctrl_c_says_interrupted_by_sigint(monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's words, and exit 128 + SIGINT."""
    from click.testing import CliRunner

    from replay import _tracecmds
    from replay._cli import cli

    def ctrl_c(*_a: object, **_k: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(_tracecmds, "_ls", ctrl_c)
    res = CliRunner().invoke(cli, ["ls", "."])
    assert (res.exit_code, res.stderr) == (130, "replay: error: interrupted by SIGINT\n")
    assert '"interrupted by SIGINT/SIGTERM/SIGHUP"' in (ROOT / "README.md").read_text()
