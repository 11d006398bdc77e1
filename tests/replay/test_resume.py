"""``replay resume`` (issue 16 item 2): continue a crashed run from its last checkpoint.

The apps are the built-in SGDMF (``async_for``) and MLR (``sync_for``, BSP) behind a
kill switch (``resume_apps.py``): the run that must crash is recorded with
``RESUME_KILL`` set, the resume and the uninterrupted run without it.

A run that must crash or be interrupted is a real process (``crash``): the kill switch
SIGKILLs a rank or raises KeyboardInterrupt, and a 1-rank run is the command itself.
The ten SIGKILL trials on 2 ranks run their command in this process (``killed_rank``):
the killed rank is still one of mpiexec's processes.  Every other command (resume, verify, show, replays, uninterrupted runs) runs in this
process (``cli``, tests/cli.py); on 2 ranks it still starts ``mpiexec`` (``mpi``).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracer
from tests import cli as tcli
from tests.conftest import ROOT, run_cli
from tests.tracer.tracehelp import reseal

HERE = Path(__file__).parent
APPS = HERE / "resume_apps.py"
EPOCHS = 4
#: Seconds any one command may take (each MPI job also gets ``--timeout``).
TIMEOUT = 90
#: the loop bodies each rank runs per invocation are more than this (the kill index)
BODIES = {"sgdmf": 40, "mlr": 3}


def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """``replay ARGS`` in this process: (status, stdout, stderr)."""
    proc = tcli.invoke(args, env=env)
    return proc.returncode, proc.stdout, proc.stderr


def crash(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    """``replay ARGS`` as a real process, for a run the kill switch in ``env`` stops."""
    assert "RESUME_KILL" in env, env
    proc = run_cli(list(args), timeout=TIMEOUT, env=env)
    return proc.returncode, proc.stdout, proc.stderr


def runs_of(trace: Path) -> list[tracer.RunInfo]:
    """The runs of ``trace`` (the store is closed again: no connection of this process
    lingers while the next command writes it)."""
    with tracer.open(trace) as t:
        return t.runs()


def of_run(trace: Path, what: Any, run_id: str | None = None) -> Any:
    """``what(run)`` for the latest run (or ``run_id``) of ``trace``, store closed after."""
    with tracer.open(trace) as t:
        return what(t.run(run_id))


def target(app: str) -> str:
    return f"{APPS}:{app}"


def killed_rank(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    """``replay ARGS`` in this process, for a run on 2 or more ranks in which the kill
    switch SIGKILLs a rank: the ranks are ``mpiexec``'s processes, so the signal never
    reaches this one, and a separate launcher only adds its start-up.  (``crash`` keeps
    the real console script for the other kills: a 1-rank run is the command itself.)"""
    assert "RESUME_KILL" in env and "RESUME_HOW" not in env, env
    assert int(args[args.index("--ranks") + 1]) > 1, args
    return cli(*args, env=env)


def record(
    trace: Path,
    app: str,
    ranks: int,
    kill: str | None = None,
    *,
    here: bool = False,
    **env: str,
) -> int:
    """Record ``app`` into ``trace`` (checkpoints after every invocation); ``kill``:
    RANK:INVOCATION:INDEX of the body that dies; ``here``: the command of a killed run
    in this process (``killed_rank``), not as a process of its own.  Returns the exit
    status."""
    e = dict(env)
    if kill is not None:
        e["RESUME_KILL"] = kill
    args = ["run", target(app), "-p", f"epochs={EPOCHS}", "--trace", str(trace)]
    args += ["--checkpoint-every", "1", "--ranks", str(ranks), "--timeout", "60", "--json"]
    if kill is None:
        rc, _, err = cli(*args, env=e)
    else:
        rc, _, err = killed_rank(*args, env=e) if here else crash(*args, env=e)
    if kill is None:
        assert rc == 0, err
    return rc


def resume(trace: Path, *extra: str) -> dict[str, Any]:
    rc, out, err = cli("resume", str(trace), "--json", "--timeout", "60", *extra)
    assert rc == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each app's uninterrupted 2-rank run (same seed and parameters), as ``run --json``;
    ``saved`` names the model it wrote."""
    out = {}
    where = tmp_path_factory.mktemp("whole")
    for app in ("sgdmf", "mlr"):
        args = ["run", target(app), "-p", f"epochs={EPOCHS}", "--ranks", "2"]
        args += ["--save", str(where / f"{app}.npz")]
        rc, stdout, err = cli(*args, "--no-trace", "--timeout", "60", "--json")
        assert rc == 0, err
        out[app] = json.loads(stdout)
    assert len(out["sgdmf"]["objectives"]["rmse"]) == EPOCHS
    return out


@pytest.mark.mpi
def test_sigkill_a_rank_then_resume_is_bitwise_an_uninterrupted_run(
    tmp_path: Path, uninterrupted: dict[str, dict[str, Any]]
) -> None:
    """10 trials under mpiexec -n 2: SIGKILL one rank in a random body of a random
    invocation after the first checkpoint, resume, compare with the uninterrupted run.
    The commands run in this process (the ranks are mpiexec's); the tests below kill a
    rank of a real console script's job."""
    pick = random.Random(16)
    for trial in range(10):
        app = ("sgdmf", "mlr")[trial % 2]
        kill = f"{pick.randrange(2)}:{pick.randrange(1, EPOCHS)}:{pick.randrange(BODIES[app])}"
        trace = tmp_path / f"t{trial}.sqlite"
        rc = record(trace, app, 2, kill, here=True)
        assert rc != 0, f"trial {trial} ({app}, kill {kill}) did not crash"
        info, cps = of_run(trace, lambda r: (r.info, r.checkpoints()))
        assert info.status == "crashed", (trial, kill, info.status)
        assert cps, (trial, kill)
        res = resume(trace)
        whole = uninterrupted[app]
        where = f"trial {trial}: {app}, kill {kill}, resumed after {res['resumed_from']}"
        assert res["continues"] == info.run_id, where
        assert res["objectives"] == whole["objectives"], where  # bitwise: floats from JSON
        assert res["digests"] == whole["digests"], where
        assert set(res) >= set(whole) - {"op_times"}, where  # the object run --json prints
        runs = runs_of(trace)
        assert [r.status for r in runs] == ["crashed", "finished"], where
        assert runs[1].continues == runs[0].run_id and runs[1].run_id == res["run_id"], where
        # readers agree with writers: both runs verify, chaining through the checkpoint
        rc, out, err = cli("verify", str(trace))
        assert rc == 0 and out.startswith("ok:"), (where, out, err)


@pytest.mark.mpi
def test_written_rows_of_a_sharded_dvector_resume_bitwise(tmp_path: Path) -> None:
    """Python-object rows are sharded on 2 ranks: a SIGKILL after checkpoints that hold
    written rows (some held away from their home), then a resume, gives the
    uninterrupted run's digests and objectives."""
    args = ["run", target("objects"), "--ranks", "2", "--timeout", "60", "--json"]
    rc, out, err = cli(*args, "--no-trace")
    assert rc == 0, err
    whole = json.loads(out)
    trace = tmp_path / "t.sqlite"
    args += ["--checkpoint-every", "1", "--trace", str(trace)]
    rc, _, err = crash(*args, env={"RESUME_KILL": "1:5:2"})  # in s#2
    assert rc != 0 and of_run(trace, lambda r: r.checkpoints()), err
    res = resume(trace)
    where = res["resumed_from"]
    assert (where["op"], where["invocation"]) == ("b", 2), where  # the last checkpoint
    assert res["objectives"] == whole["objectives"] and res["digests"] == whole["digests"]


@pytest.mark.mpi
@pytest.mark.parametrize("rank, exchange, kernel", [(0, 0, False), (1, 1, True)])
def test_a_rank_killed_in_a_routed_exchange_is_named_and_resumes_bitwise(
    tmp_path: Path,
    uninterrupted: dict[str, dict[str, Any]],
    rank: int,
    exchange: int,
    kernel: bool,
) -> None:
    """A rank dies as it enters a routed exchange, while the other waits inside it for
    its rows: one line names the rank, the run is crashed, and a resume from the last
    checkpoint ends bitwise where the uninterrupted run did.  With ``kernel`` the body
    is SGDMF's default compiled one (the exchange kill leaves the body alone)."""
    trace = tmp_path / "t.sqlite"
    env = {"RESUME_KILL": f"{rank}:2:{exchange}", "RESUME_KILL_AT": "exchange"}
    params = ["-p", f"epochs={EPOCHS}", "-p", f"kernel={str(kernel).lower()}"]
    args = ["run", target("sgdmf"), *params, "--trace", str(trace)]
    args += ["--checkpoint-every", "1", "--ranks", "2", "--timeout", "60"]
    rc, _, err = crash(*args, env=env)
    errors = [ln for ln in err.splitlines() if ln.startswith("replay: error:")]
    assert rc != 0 and len(errors) == 1, err
    assert f"rank {rank} (pid " in errors[0] and "of the 2-rank job died" in errors[0], err
    assert "Traceback" not in err
    info = of_run(trace, lambda r: r.info)
    assert info.status == "crashed", info
    res = resume(trace, "--save", str(tmp_path / "resumed.npz"))
    whole = uninterrupted["sgdmf"]
    if kernel:  # the same numbers to the bit; the kernel's numeric ratings are one more DDS
        rc, stdout, err = cli(
            "run", target("sgdmf"), *params, "--ranks", "2", "--save", str(tmp_path / "k.npz"),
            "--no-trace", "--timeout", "60", "--json",
        )  # fmt: skip
        assert rc == 0, err
        whole = json.loads(stdout)
        assert whole["objectives"] == uninterrupted["sgdmf"]["objectives"]
    assert res["objectives"] == whole["objectives"] and res["digests"] == whole["digests"]
    same_model(res["saved"], whole["saved"])


def same_model(got: str, want: str) -> None:
    """The two ``--save`` files hold the same arrays, bit for bit."""
    import numpy as np

    with np.load(got) as a, np.load(want) as b:
        assert sorted(a.files) == sorted(b.files) and b.files
        for name in b.files:
            assert np.array_equal(a[name], b[name]), name


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-rank SGDMF run killed in invocation 2 and resumed (after sgd#1)."""
    trace = tmp_path_factory.mktemp("resumed") / "t.sqlite"
    assert record(trace, "sgdmf", 2, "1:2:5") != 0
    resume(trace)
    return trace


def test_verify_passes_a_resumed_trace_and_refuses_a_broken_link(
    resumed: Path, tmp_path: Path
) -> None:
    rc, out, err = cli("verify", str(resumed), "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["ok"] and len(doc["runs"]) == 2 and not any(r["legacy"] for r in doc["runs"])
    # the resumed run must start where the crashed run's completed invocations end
    crashed, later = runs_of(resumed)
    bad = tmp_path / "gap.sqlite"
    shutil.copy(resumed, bad)
    with sqlite3.connect(bad) as db:
        last = db.execute(
            "SELECT max(invocation) FROM invocation_set WHERE run = ?", (crashed.run_id,)
        ).fetchone()[0]
        db.execute(
            "DELETE FROM invocation_set WHERE run = ? AND invocation = ?", (crashed.run_id, last)
        )
    reseal(bad)
    rc, out, err = cli("verify", str(bad), "--run", later.run_id)
    assert rc == 2 and "resumed run starts at invocation" in err, (out, err)


def test_show_json_lists_the_resumed_run_with_continues(resumed: Path) -> None:
    rc, out, err = cli("show", str(resumed), "--json")
    assert rc == 0, err
    runs = json.loads(out)["runs"]
    assert [r["status"] for r in runs] == ["crashed", "finished"]
    assert runs[0]["continues"] is None and runs[1]["continues"] == runs[0]["run_id"]
    # the resumed run holds the checkpoint it started from, then its own
    assert runs[1]["checkpoints"][0] == "sgd#1"


@pytest.mark.parametrize("mode", ["single", "cluster"])
def test_a_resumed_run_replays_from_the_checkpoint_it_started_at(resumed: Path, mode: str) -> None:
    limit = ["--timeout", "60"] if mode == "cluster" else []
    rc, out, err = cli(mode, str(resumed), "--json", *limit)
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["identical"] and doc["complete"], doc
    assert doc["checked"]["digests"] == 3 * (EPOCHS - 2)  # A, W, H after sgd#2 and sgd#3
    # the objective logged before sgd#1 came from values served from the trace
    assert doc["checked"]["objectives"] == EPOCHS - 1 and doc["served_objectives"] == 1
    assert "starting after the checkpoint at sgd#1" in err


def test_replay_from_inside_a_resumed_run(resumed: Path) -> None:
    rc, out, err = cli("single", str(resumed), "--from", "sgd:3", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["identical"] and doc["from"]["invocation"] == 2, doc
    rc, _, err = cli("single", str(resumed), "--from", "sgd:7")
    assert rc == 2 and "sgd#7 does not exist" in err


def test_a_resumed_run_is_not_resumed_twice(resumed: Path) -> None:
    first = runs_of(resumed)[0].run_id
    rc, out, err = cli("resume", str(resumed), "--run", first)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "already resumed as run" in err


def test_a_finished_run_is_refused(resumed: Path) -> None:
    rc, out, err = cli("resume", str(resumed))  # the latest run: the resumed one
    assert rc == 2 and out == ""
    assert err.strip().endswith(
        "there is nothing to resume (only a crashed or interrupted run can be resumed)"
    )
    assert err.count("\n") == 1


def test_in_process_interrupted_run_resumes(
    tmp_path: Path, uninterrupted: dict[str, dict[str, Any]]
) -> None:
    """One rank, stopped by Ctrl-C (KeyboardInterrupt) in invocation 2: interrupted."""
    trace = tmp_path / "t.sqlite"
    assert record(trace, "mlr", 1, "0:2:1", RESUME_HOW="interrupt") != 0
    assert of_run(trace, lambda r: r.info.status) == "interrupted"
    # plain progress lines as often as they come (a CI log): the fast-forward is named
    rc, out, err = cli("resume", str(trace), env={"STRADS_REPLAY_PROGRESS_EVERY": "1e-9"})
    assert rc == 0, err
    assert "resumed run" in out and "after the checkpoint at mlr#1" in out
    assert "fast-forward to the checkpoint after mlr#1" in err, err
    runs = runs_of(trace)
    assert runs[1].continues == runs[0].run_id and runs[1].ranks == 1
    # against an uninterrupted run on the same (one) rank
    whole = tmp_path / "whole.sqlite"
    record(whole, "mlr", 1)
    assert of_run(trace, lambda r: r.objectives()) == of_run(whole, lambda r: r.objectives())

    def digests(r: Any) -> list[tuple[str, int, str, str]]:
        return [(d.op, d.invocation, d.dds, d.digest) for d in r.digests()]

    w, r = of_run(whole, digests), of_run(trace, digests)
    assert r == [x for x in w if x[1] >= 2] and r  # mlr#2 and mlr#3: the new run's own


def test_a_resume_says_how_many_completed_invocations_run_again(tmp_path: Path) -> None:
    """Checkpoints can be sparse (``--checkpoint-every``, or the automatic policy that
    bounds their bytes): a resume says how much of what the crashed run did it redoes."""
    trace = tmp_path / "t.sqlite"
    args = ["run", target("mlr"), "-p", f"epochs={EPOCHS}", "--trace", str(trace)]
    args += ["--checkpoint-every", "3", "--timeout", "60"]
    # checkpoints after mlr#0 and mlr#3; interrupted in mlr#3 after mlr#0..2 completed
    rc, _, err = crash(*args, env={"RESUME_KILL": "0:3:1", "RESUME_HOW": "interrupt"})
    assert rc != 0, err
    rc, out, err = cli("resume", str(trace))
    assert rc == 0, err
    said = out + err
    assert "after the checkpoint at mlr#0; the 2 loop invocation(s) the crashed run " in said
    assert "completed after it run again" in said, said


def test_resume_save_writes_the_model_the_uninterrupted_run_saves(tmp_path: Path) -> None:
    """``resume --save`` writes the model the resumed run ends with: the arrays an
    uninterrupted ``run --save`` writes, bit for bit; a bad path is refused first."""

    trace = tmp_path / "t.sqlite"
    assert record(trace, "mlr", 1, "0:2:1", RESUME_HOW="interrupt") != 0
    rc, out, err = cli("resume", str(trace), "--save", str(tmp_path / "m.csv"))
    assert rc == 2 and out == "" and err.count("\n") == 1 and "--save" in err, err
    assert [r.status for r in runs_of(trace)] == ["interrupted"]  # refused before it ran
    rc, out, err = cli("resume", str(trace), "--save", str(tmp_path / "resumed.npz"), "--json")
    assert rc == 0, err
    assert json.loads(out)["saved"] == str(tmp_path / "resumed.npz")
    args = ["run", target("mlr"), "-p", f"epochs={EPOCHS}", "--no-trace"]
    rc, _, err = cli(*args, "--save", str(tmp_path / "whole.npz"))
    assert rc == 0, err
    same_model(str(tmp_path / "resumed.npz"), str(tmp_path / "whole.npz"))


def test_no_checkpoint_is_refused(tmp_path: Path) -> None:
    trace = tmp_path / "t.sqlite"
    args = ["run", target("sgdmf"), "-p", "epochs=3", "--trace", str(trace)]
    rc, _, _ = crash(
        *args, "--no-checkpoints", "--ranks", "2", "--timeout", "60", env={"RESUME_KILL": "0:1:3"}
    )
    assert rc != 0
    rc, out, err = cli("resume", str(trace))
    assert rc == 2 and out == ""
    assert "has no complete checkpoint to resume from" in err and err.count("\n") == 1


@pytest.mark.parametrize("boxed_from", [0, 2])
def test_a_resume_never_starts_at_a_checkpoint_that_leaves_out_a_written_dds(
    tmp_path: Path, boxed_from: int
) -> None:
    """A DDS of objects that are not plain data is left out of checkpoints; a resume from
    one of those would continue on its value from before the skipped bodies and finish
    with another result, exit 0.  It starts at the latest checkpoint that holds every DDS
    the bodies wrote, and says so; with none, it is refused in one line."""
    trace = tmp_path / "t.sqlite"
    args = ["run", f"{HERE / 'tt_apps.py'}:objects", "-p", "plain=false", "-p", "epochs=4"]
    rc, _, err = cli(*args, "-p", f"boxed_from={boxed_from}", "--checkpoint-every", "1",
                     "--trace", str(trace))  # fmt: skip
    assert rc == 0, err
    run_id = of_run(trace, lambda r: r.info.run_id)
    con = sqlite3.connect(trace)  # every invocation done: a resume must end where it did
    con.execute("update run set status = 'interrupted' where run_id = ?", (run_id,))
    con.commit()
    con.close()
    rc, out, err = cli("resume", str(trace), "--json")
    if boxed_from == 0:
        assert rc == 2 and err.count("\n") == 1, err
        assert json.loads(out)["error"]["kind"] == "usage", out
        assert "cannot be resumed: its checkpoints leave out DDS 'X' (it holds a Box" in err
        assert [r.status for r in runs_of(trace)] == ["interrupted"]
        return
    assert rc == 0, err
    res = json.loads(out)
    assert res["resumed_from"] == {"op": "obj", "invocation": 1, "step": 1}, res
    assert "note: the checkpoint at obj#3 leaves out DDS 'X'" in err, err
    assert "starting after obj#1" in err, err
    # the resume re-ran obj#2 and obj#3 and compared them with the run it continues
    assert res["objectives"] == of_run(trace, lambda r: r.objectives(), run_id), res


@pytest.mark.parametrize(
    "app,threads",
    [("dual_apps.py:hot_rows", 2), ("chaos_apps.py:hybrid_mix", 2), ("chaos_apps.py:mini_mf", 2)],
)
def test_a_resume_redoes_completed_invocations_in_their_recorded_orders(
    tmp_path: Path, app: str, threads: int
) -> None:
    """A resume runs again the invocations the crashed run completed after the checkpoint;
    where that run left choices to timing (lock grants of split groups, Hybrid's node
    mutex, a plan's placement), a free re-run may choose otherwise and was DIVERGED,
    blaming the program.  A chaos run draws every such choice, so it stands for any
    timing: its resume from checkpoint 0 must reproduce all of it, bit for bit."""
    trace = tmp_path / "t.sqlite"
    args = ["chaos", f"{HERE / app}", "-p", "epochs=4", "--ranks", "1", "--threads", str(threads)]
    rc, _, err = cli(*args, "--runs", "1", "--chaos-seed", "5", "--trace", str(trace))
    assert rc == 0, err
    run_id = of_run(trace, lambda r: r.info.run_id)
    assert of_run(trace, lambda r: [c.step for c in r.checkpoints()])[0] == 0
    con = sqlite3.connect(trace)  # every invocation done: a resume must end where it did
    con.execute("update run set status = 'interrupted' where run_id = ?", (run_id,))
    # only the first checkpoint, as the automatic policy leaves a run whose checkpoints
    # cost more than its invocations: the resume redoes invocations 1 to 3
    con.execute("delete from checkpoint_block where not (op || invocation) in "
                "(select op || invocation from checkpoint where step = 0)")  # fmt: skip
    con.execute("delete from checkpoint where step > 0")
    con.commit()
    con.close()
    reseal(trace)
    res = resume(trace)
    assert res["resumed_from"]["step"] == 0, res["resumed_from"]
    assert res["objectives"] == of_run(trace, lambda r: r.objectives(), run_id)
    assert [d["digest"] for d in res["digests"]] == of_run(
        trace, lambda r: [d.digest for d in r.digests()], run_id
    )


def test_a_failed_or_running_run_is_refused(tmp_path: Path) -> None:
    trace = tmp_path / "t.sqlite"
    record(trace, "mlr", 1)
    run_id = of_run(trace, lambda r: r.info.run_id)
    con = sqlite3.connect(trace)
    con.execute("update run set status = 'running', ended_at = NULL where run_id = ?", (run_id,))
    con.commit()
    rc, _, err = cli("resume", str(trace))
    assert rc == 2 and "is still running" in err and err.count("\n") == 1
    con.execute(
        "update run set status = 'failed', error = 'Traceback\n  ValueError: bad row' "
        "where run_id = ?",
        (run_id,),
    )
    con.commit()
    rc, _, err = cli("resume", str(trace), "--json")
    # a failed run raised in a loop body or in its driver: the error says which, not this
    assert (
        rc == 2 and "(the program raised: ValueError: bad row)" in err and "fix the program" in err
    )


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    rc, _, err = cli("resume", str(tmp_path / "missing.sqlite"))
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    (tmp_path / "junk.sqlite").write_bytes(b"not a database at all" * 10)
    rc, _, err = cli("resume", str(tmp_path / "junk.sqlite"))
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err


def test_browse_shows_the_crashed_and_the_resumed_run_as_one_line(resumed: Path) -> None:
    from textual.widgets import DataTable

    from tui import BrowserApp

    runs = runs_of(resumed)
    seen: dict[str, Any] = {}

    async def main() -> None:
        app = BrowserApp([resumed])
        async with app.run_test(size=(100, 24)) as pilot:
            for _ in range(100):
                await pilot.pause(0.05)
                table = app.screen.query(DataTable)
                if table and table.first().row_count:
                    break
            table = app.screen.query_one("#runs", DataTable)
            seen["rows"] = [[str(c) for c in table.get_row_at(k)] for k in range(table.row_count)]
            seen["detail"] = str(app.screen.query_one("#runs-detail").render())

    asyncio.run(main())
    assert len(seen["rows"]) == 1, seen
    row = seen["rows"][0]
    assert "finished ↻" in row
    assert f"resumes run {runs[0].run_id[:12]} (crashed)" in seen["detail"]
    assert runs[1].run_id in seen["detail"]  # the line opens the resumed run


def test_readme_resume_commands_run_as_written(tmp_path: Path) -> None:
    """The README's Resume block, with Ctrl-C (SIGINT) pressed after the first checkpoint."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("#### Resume") : text.index("## Benchmarks")]
    lines = re.search(r"```bash\n(.*?)\n```", section, re.S).group(1).splitlines()
    assert [ln.split()[1] for ln in lines] == ["run", "resume", "show"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "replay", *shlex.split(lines[0])[1:]]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    trace = tmp_path / "traces" / "long.sqlite"
    seen = []
    try:
        # "iter 0" is logged after the rmse reduce, which every rank reaches only after
        # writing its part of the checkpoint at sgd#0: press Ctrl-C then, as the README says
        for line in proc.stdout:  # type: ignore[union-attr]
            seen.append(line)
            if line.split()[:2] == ["iter", "0"]:
                break
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert any(ln.split()[:2] == ["iter", "0"] for ln in seen), seen
    assert proc.returncode == 128 + signal.SIGINT, err
    assert of_run(trace, lambda r: r.info.status) == "interrupted"
    for line in lines[1:]:
        got = tcli.invoke(shlex.split(line)[1:], cwd=tmp_path)  # resume, show: in-process
        assert got.returncode == 0, got.stderr
        if " resume " in f" {line} ":
            assert "resumed run" in got.stdout and "after the checkpoint at sgd#" in got.stdout
            assert "final rmse" in got.stdout
        if " show " in f" {line} ":
            assert (
                "continues run " in got.stdout
                and "(resumed after the checkpoint at sgd#" in got.stdout
            )
    runs = runs_of(trace)
    assert [r.status for r in runs] == ["interrupted", "finished"]
    assert runs[1].continues == runs[0].run_id
    assert len(of_run(trace, lambda r: r.objectives())["rmse"]) == 30


def test_history_and_watch_of_a_resumed_run_start_at_its_checkpoint(resumed: Path) -> None:
    rc, out, err = cli("history", str(resumed), "W[3]", "--json")
    assert rc == 0, err
    hist = json.loads(out)["history"]
    assert [(e["op"], e["invocation"]) for e in hist] == [("sgd", 2), ("sgd", 3)]
    crashed = runs_of(resumed)[0].run_id
    rc, out, err = cli("history", str(resumed), "W[3]", "--run", crashed, "--json")
    assert rc == 0, err
    before = json.loads(out)["history"]
    assert [(e["op"], e["invocation"]) for e in before][:2] == [("sgd", 0), ("sgd", 1)]
    # a watch that first holds after the start checkpoint is found in the resumed run
    rc, out, err = cli("watch", str(resumed), "abs(W).max() > 0", "--json")
    assert rc == 2 and "already holds at sgd#1" in err and f"--run {crashed}" in err
    rc, out, err = cli("watch", str(resumed), "np.isnan(W).any()", "--json")
    assert rc == 0 and json.loads(out)["found"] is False, err


@pytest.mark.mpi
def test_a_resumed_run_that_crashes_is_resumed_again(
    tmp_path: Path, uninterrupted: dict[str, dict[str, Any]]
) -> None:
    """Killed in sgd#1, resumed and killed again in sgd#3 (the kill switch counts the
    skipped invocations too), resumed again: still the uninterrupted run, bitwise."""
    trace = tmp_path / "t.sqlite"
    assert record(trace, "sgdmf", 2, "0:1:7") != 0
    rc, _, err = crash("resume", str(trace), "--timeout", "60", env={"RESUME_KILL": "1:3:7"})
    assert rc != 0, err
    first, second = runs_of(trace)
    assert second.status == "crashed" and second.continues == first.run_id
    # the resume kept the crashed run's --checkpoint-every 1: after the checkpoint it
    # started from (sgd#0), one after each invocation it completed (sgd#1, sgd#2), not
    # the measured default's fewer
    cps = of_run(trace, lambda r: [(c.op, c.invocation) for c in r.checkpoints()], second.run_id)
    assert [c for c in cps if c[0] == "sgd"] == [("sgd", 0), ("sgd", 1), ("sgd", 2)], cps
    assert second.labels.get("checkpoint_every") == 1, second.labels
    res = resume(trace)  # the latest run: the resumed one that crashed
    assert res["continues"] == second.run_id
    assert res["objectives"] == uninterrupted["sgdmf"]["objectives"]
    assert res["digests"] == uninterrupted["sgdmf"]["digests"]
    # the chain of three runs verifies: the second started after the first's checkpoint
    # and the third after the second's, whose invocations do not start at 0
    rc, out, err = cli("verify", str(trace))
    assert rc == 0 and out.startswith("ok:"), err
    rc, _, err = cli("resume", str(trace), "--run", first.run_id)
    assert rc == 2 and f"already resumed as run {second.run_id[:12]}" in err


def test_an_objective_the_fast_forward_cannot_reproduce_stops_the_resume(tmp_path: Path) -> None:
    trace = tmp_path / "t.sqlite"
    args = ["run", target("stale"), "--trace", str(trace), "--checkpoint-every", "1"]
    rc, _, _ = crash(*args, env={"RESUME_KILL": "0:2:1", "RESUME_HOW": "interrupt"})
    assert rc != 0
    rc, out, err = cli("resume", str(trace))
    assert rc == 2, err
    # the driver reads X[0] while fast-forwarding: refused before a stale value is used
    assert err.count("\n") == 1 and "reads an element of DDS 'X' directly" in err
    first, second = runs_of(trace)
    assert second.status == "failed" and second.continues == first.run_id
    rc, _, err = cli("resume", str(trace), "--run", first.run_id)  # no branch was left
    assert rc == 2 and "directly" in err


def test_an_objective_read_back_as_the_trace_keeps_it_does_not_stop_the_resume(
    tmp_path: Path,
) -> None:
    # the trace (SQLite) keeps -0.0 as 0.0: the check compares as replay does
    trace = tmp_path / "t.sqlite"
    args = ["run", target("signed_zero"), "--trace", str(trace), "--checkpoint-every", "1"]
    rc, _, _ = crash(*args, env={"RESUME_KILL": "0:2:1", "RESUME_HOW": "interrupt"})
    assert rc != 0
    rc, out, err = cli("resume", str(trace))
    assert rc == 0, err
    assert [r.status for r in runs_of(trace)] == ["interrupted", "finished"]


# ------------------------------------------------------------ resume is verified
#: uninterrupted outcomes of ``driver_reads`` by ``how`` (one run each per session)
_WHOLE: dict[str, dict[str, Any]] = {}


def _whole(how: str) -> dict[str, Any]:
    if how not in _WHOLE:
        args = ["run", target("driver_reads"), "-p", f"how={how}", "--no-trace", "--json"]
        rc, out, err = cli(*args)
        assert rc == 0, err
        _WHOLE[how] = json.loads(out)
    return _WHOLE[how]


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    how=st.sampled_from(["direct", "reduce", "gather", "late"]),
    kill=st.integers(1, 4),
    every=st.sampled_from([1, 2]),
)
def test_a_resumed_driver_is_bitwise_the_uninterrupted_one_or_refused(
    tmp_path_factory: pytest.TempPathFactory, how: str, kill: int, every: int
) -> None:
    """Drivers that read DDS elements (directly, by reduce, by gather, after the loop) and
    branch on them, interrupted at a generated invocation and resumed: the result equals
    the uninterrupted run bit for bit, or resume refuses in one line naming the read."""
    trace = tmp_path_factory.mktemp("driver") / "t.sqlite"
    args = ["run", target("driver_reads"), "-p", f"how={how}", "--trace", str(trace)]
    args += ["--checkpoint-every", str(every)]
    rc, _, _ = crash(*args, env={"RESUME_KILL": f"0:{kill}:2", "RESUME_HOW": "interrupt"})
    assert rc != 0
    if not of_run(trace, lambda r: r.checkpoints()):
        return  # interrupted before the first checkpoint: nothing to resume from
    rc, out, err = cli("resume", str(trace), "--json")
    if how == "direct" and rc == 2:  # a stale read while fast-forwarding: refused
        (line,) = [ln for ln in err.splitlines() if ln.startswith("replay: error")]
        assert "reads an element of DDS 'X' directly" in line, err
        return
    assert rc == 0, (how, kill, every, err)
    res, whole = json.loads(out), _whole(how)
    assert res["objectives"] == whole["objectives"], (how, kill, every)
    assert res["digests"] == whole["digests"], (how, kill, every)


def test_a_resume_that_computes_another_history_is_diverged(tmp_path: Path) -> None:
    """The issue's program: a driver total built from a direct read, killed after the
    third epoch, resumed from the checkpoint of the second: refused, never a new history
    with exit 0; and an edited (re-sealed) crashed digest is a divergence (exit 3)."""
    trace = tmp_path / "t.sqlite"
    args = ["run", target("driver_reads"), "-p", "how=direct", "--trace", str(trace)]
    rc, _, _ = crash(
        *args, "--checkpoint-every", "2", env={"RESUME_KILL": "0:3:1", "RESUME_HOW": "interrupt"}
    )
    assert rc != 0
    rc, out, err = cli("resume", str(trace))
    assert rc == 2 and "directly" in err and "ap.reduce" in err, (out, err)
    # a run whose completed invocations come out different when resumed: exit 3
    trace2 = tmp_path / "r.sqlite"
    args = ["run", target("driver_reads"), "-p", "how=reduce", "--trace", str(trace2)]
    rc, _, _ = crash(
        *args, "--checkpoint-every", "2", env={"RESUME_KILL": "0:4:1", "RESUME_HOW": "interrupt"}
    )
    assert rc != 0
    with sqlite3.connect(trace2) as db:
        db.execute(
            "UPDATE digest SET digest = 'xc:' || substr('0000000000000000', 1, 16) "
            "WHERE id = (SELECT max(id) FROM digest)"
        )
    db.close()
    reseal(trace2)
    rc, out, err = cli("resume", str(trace2))
    assert rc == 3 and "the crashed run's" in err, (out, err)


@pytest.mark.parametrize(
    "params,needle",
    [
        ({"epochs": 1}, "not reach it: it ended first"),  # ends before the checkpoint
        ({"every": 1}, "as loop invocation"),  # another program order before it
    ],
)
def test_forged_parameters_do_not_steer_a_resume(
    tmp_path: Path, params: dict[str, int], needle: str
) -> None:
    """A re-sealed (unkeyed) trace whose parameters were edited: the fast-forward is
    bounded by the recorded run's progress, and a resume that cannot reach the checkpoint
    the way the recorded run did is a divergence (exit 3), never a success."""
    trace = tmp_path / "t.sqlite"
    args = ["run", target("driver_reads"), "-p", "how=reduce", "-p", "every=2"]
    args += ["--trace", str(trace), "--checkpoint-every", "1"]
    rc, _, _ = crash(*args, env={"RESUME_KILL": "0:5:1", "RESUME_HOW": "interrupt"})
    assert rc != 0
    with sqlite3.connect(trace) as db:
        (text,) = db.execute("SELECT params FROM run").fetchone()
        db.execute("UPDATE run SET params = ?", (json.dumps(json.loads(text) | params),))
    db.close()
    reseal(trace)
    rc, out, err = cli("resume", str(trace))
    assert rc == 3 and needle in err, (out, err)


@pytest.mark.mpi
def test_a_rank_that_dies_in_a_cluster_replay_says_the_replay_did_not_finish(
    tmp_path: Path,
) -> None:
    """A rank killed during ``replay cluster`` ended with "the run did not finish", as
    if the recorded run were at stake; the replay is what did not finish, and the
    trace still verifies."""
    trace = tmp_path / "t.sqlite"
    record(trace, "sgdmf", 2)
    rc, _, err = crash("cluster", str(trace), "--timeout", "60", env={"RESUME_KILL": "1:1:3"})
    assert rc != 0, err
    last = err.strip().splitlines()[-1]
    assert "rank 1" in last and "the replay did not finish (the trace is unchanged)" in last
    assert "the run did not finish" not in err, err
    rc, out, err = cli("verify", str(trace))
    assert rc == 0 and out.startswith("ok:"), err
