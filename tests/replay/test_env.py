"""Replays reproduce the interpreter's environment: hash seed, BLAS threads, versions."""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tracer
from replay import _environment
from replay._replay import replay_here
from tests import cli as tcli
from tests.conftest import run_cli, run_mpi
from tests.tracer.tracehelp import reseal

APPS = Path(__file__).parent / "env_apps.py"
APP = f"{APPS}:hash_order"


def record(trace: Path, *args: str, hash_seed: str, words: str = "", op: str = "set") -> None:
    params = ["-p", f"words={words}"] if words else []
    proc = run_cli(
        ["run", APP, *params, "-p", f"op={op}", *args, "--trace", str(trace), "--json"],
        env={"PYTHONHASHSEED": hash_seed},
    )
    assert proc.returncode == 0, proc.stderr


def replay(mode: str, trace: Path, hash_seed: str) -> tuple[int, dict, str]:
    proc = run_cli([mode, str(trace), "--json"], env={"PYTHONHASHSEED": hash_seed})
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def show(trace: Path) -> dict:
    proc = tcli.invoke(["show", str(trace), "--json"])  # reads the trace: no re-exec
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["runs"][-1]


words = st.sets(st.text("abcdefghij", min_size=1, max_size=5), min_size=3, max_size=9)
ops = st.sampled_from(["set", "dict", "setops"])
seeds = st.one_of(st.just("random"), st.integers(1, 2**32 - 1).map(str))


@settings(max_examples=5, deadline=None)
@given(words=words, op=ops, rec=seeds, other=st.integers(1, 2**32 - 1))
def test_set_order_replays_under_another_hash_seed(
    words: set[str], op: str, rec: str, other: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "t.sqlite"
        record(trace, hash_seed=rec, words=",".join(sorted(words)), op=op)
        recorded = "0" if rec == "random" else rec
        env = tracer.open(trace).run().info.environment
        assert env["PYTHONHASHSEED"] == recorded
        caller = str(other) if str(other) != recorded else "random"
        for mode in ("single", "cluster"):
            rc, res, err = replay(mode, trace, caller)
            assert rc == 0 and res["identical"], (mode, res, err)
            assert "warning" not in err


@pytest.fixture(scope="module")
def two_rank_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    trace = tmp_path_factory.mktemp("env") / "two.sqlite"
    record(trace, "--ranks", "2", hash_seed="random", words="ant,bee,cat,dog,eel,fox,gnu")
    return trace


def test_two_rank_run_records_its_environment(two_rank_trace: Path) -> None:
    run = show(two_rank_trace)
    env = run["environment"]
    assert env["PYTHONHASHSEED"] == "0"  # unset / random: the run chooses 0
    assert {env[v] for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")} == {"1"}
    assert env["blas_threads"] in (1, None)
    assert "_environment" not in run["versions"] and "python" in run["versions"]


@pytest.mark.parametrize("mode", ["cluster", "single"])
def test_two_rank_run_replays_under_another_hash_seed(two_rank_trace: Path, mode: str) -> None:
    rc, res, err = replay(mode, two_rank_trace, "4242")
    assert rc == 0 and res["identical"], (res, err)


def test_user_started_mpiexec_ranks_reexecute_with_one_seed(tmp_path: Path) -> None:
    trace = tmp_path / "u.sqlite"
    args = ["-m", "replay", "run", APP, "--trace", str(trace), "--json"]
    proc = run_mpi(args, 2, env={"PYTHONHASHSEED": "random"})  # each rank would differ
    assert proc.returncode == 0, proc.stderr
    assert tracer.open(trace).run().info.environment["PYTHONHASHSEED"] == "0"
    args = ["-m", "replay", "cluster", str(trace), "--json"]
    proc = run_mpi(args, 2, env={"PYTHONHASHSEED": "99"})
    assert proc.returncode == 0 and json.loads(proc.stdout)["identical"], proc.stderr


def _cli_loads(stderr: str) -> int:
    """How many times a process of this command imported the CLI (PYTHONPROFILEIMPORTTIME)."""
    return sum(line.rstrip().endswith("| replay._cli") for line in stderr.splitlines())


@pytest.mark.parametrize("caller", ["random", "0", "31"])
def test_a_command_that_runs_here_loads_the_cli_once(tmp_path: Path, caller: str) -> None:
    """The CLI re-executes itself for the hash seed before loading its modules (~1.5 s),
    not after (every in-process run would start twice); a replay whose recorded seed
    differs from the caller's re-executes once more, still correctly."""
    trace = tmp_path / "t.sqlite"
    env = {"PYTHONHASHSEED": caller, "PYTHONPROFILEIMPORTTIME": "1"}
    proc = run_cli(["run", APP, "--trace", str(trace), "--json"], env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _cli_loads(proc.stderr) == 1
    recorded = "0" if caller == "random" else caller
    assert tracer.open(trace).run().info.environment["PYTHONHASHSEED"] == recorded
    proc = run_cli(["single", str(trace), "--json"], env=dict(env, PYTHONHASHSEED="random"))
    assert proc.returncode == 0 and json.loads(proc.stdout)["identical"], proc.stderr[-2000:]
    assert _cli_loads(proc.stderr) == (1 if recorded == "0" else 2)


def _set_versions(trace: Path, **changed: str) -> None:
    with sqlite3.connect(trace) as con:
        (text,) = con.execute("SELECT versions FROM run").fetchone()
        versions = json.loads(text)
        versions.update(changed)
        con.execute("UPDATE run SET versions = ?", (json.dumps(versions),))
    con.close()
    reseal(trace)  # the chain covers versions: test the warning behind it


@pytest.mark.parametrize("ranks", [1, 2])
def test_replay_under_other_versions_warns_once(
    ranks: int, two_rank_trace: Path, tmp_path: Path
) -> None:
    trace = tmp_path / "old.sqlite"
    if ranks == 2:
        shutil.copy(two_rank_trace, trace)
    else:
        record(trace, hash_seed="7")
    _set_versions(trace, python="2.7.18", numpy="1.0.0")
    current = _environment.versions()
    expected = (
        "replay: warning: the trace was recorded under other versions "
        f"(python 2.7.18 → {current['python']}, numpy 1.0.0 → {current['numpy']}); "
        "the replay may diverge for that reason"
    )
    for mode in ("cluster", "single"):
        rc, res, err = replay(mode, trace, "random")
        assert rc == 0 and res["identical"], (mode, res, err)
        warnings = [ln for ln in err.splitlines() if "warning" in ln]
        assert warnings == [expected], err
    assert show(trace)["environment"]["PYTHONHASHSEED"] == ("7" if ranks == 1 else "0")


def test_library_replay_warns_when_the_hash_seed_differs(tmp_path: Path) -> None:
    here = _environment.current_hash_seed()
    seed = "4243" if here != "4243" else "4244"
    trace = tmp_path / "lib.sqlite"
    record(trace, hash_seed=seed, words="solo")  # one word: identical under any seed
    spec = {"kind": "replay", "mode": "single", "trace": str(trace), "run_id": None}
    with pytest.warns(_environment.ReplayEnvironmentWarning, match=f"the run had {seed}"):
        res = replay_here(spec)
    assert res["identical"]


def test_hash_seed_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    for given_, chosen in (("17", "17"), ("random", "0"), ("-3", "0"), ("4294967296", "0")):
        monkeypatch.setenv("PYTHONHASHSEED", given_)
        assert _environment.choose_hash_seed() == chosen
    monkeypatch.delenv("PYTHONHASHSEED")
    assert _environment.choose_hash_seed() == "0"
    assert _environment.hash_seed_problem({}) is None  # a trace from before the record
    assert "random" in (_environment.hash_seed_problem({"PYTHONHASHSEED": "random"}) or "")
    assert _environment.version_change({"python": "3.11.7"}, {"python": "3.11.7"}) is None


def test_a_trace_from_before_exact_object_texts_is_named_when_replayed() -> None:
    """Runs recorded before 2026-11-28 digested object elements by ``repr``: a replay of
    one says so before it can report a DIVERGED that is only the change of text."""
    assert _environment.object_text_change({}) is None  # nothing recorded: nothing known
    assert _environment.object_text_change(_environment.versions()) is None
    old = _environment.object_text_change({"python": "3.11.7", "numpy": "2.2.6"})
    assert old is not None and "by their repr (object text 1" in old and "re-record" in old


class _World:
    """A communicator whose ``allgather`` returns what each rank would send: this rank's
    value, with each other rank's app digest and host replaced as given."""

    def __init__(self, others: list[tuple[str | None, str]]) -> None:
        self.others = others

    def allgather(self, mine: tuple[str, tuple[str, str] | None, str, object]) -> list[object]:
        seed, code, _, paths = mine
        out: list[object] = [mine]
        for digest, host in self.others:
            out.append((seed, None if code is None else (code[0], digest), host, paths))
        return out


@given(
    others=st.lists(
        st.tuples(st.sampled_from(["same", "other", ""]), st.sampled_from(["vm", "node02"])),
        min_size=1,
        max_size=3,
    )
)
@settings(max_examples=30, deadline=None)
def test_ranks_with_another_copy_of_the_app_file_are_refused(
    others: list[tuple[str, str]],
) -> None:
    """A host whose copy of the app file differs runs another program: the ranks compare
    the file's digest before they start, and refuse in one line naming each rank."""
    from replay._errors import UsageError
    from replay._job import app_source

    source = app_source(test_ranks_with_another_copy_of_the_app_file_are_refused)
    digests = [source[1] if d == "same" else d for d, _ in others]
    world = _World([(d, host) for d, (_, host) in zip(digests, others, strict=True)])
    if all(d == source[1] for d in digests):
        _environment.check_ranks_agree(world, source)
        return
    with pytest.raises(UsageError) as err:
        _environment.check_ranks_agree(world, source)
    message = str(err.value)
    assert "\n" not in message and source[0] in message, message
    for r, (d, (_, host)) in enumerate(zip(digests, others, strict=True), start=1):
        assert f"rank {r} on {host}: {d[:12] or 'missing'}" in message, message


def test_installing_the_one_line_warning_format_again_does_not_nest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CLI installs its warning format on every in-process command (tests, notebooks):
    once installed, installing again must not wrap it again (a CI worker that ran about
    a thousand commands hit the recursion limit while formatting a warning)."""
    import sys
    import warnings

    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)
    for _ in range(sys.getrecursionlimit() + 10):
        _environment.one_line_warnings()
    line = warnings.formatwarning("differs", _environment.ReplayEnvironmentWarning, "f.py", 1)
    assert line == "replay: warning: differs\n"
    other = warnings.formatwarning("plain", UserWarning, "f.py", 7)
    assert "f.py:7: UserWarning: plain" in other
