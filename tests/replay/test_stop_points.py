"""``--break`` and ``--until`` are checked against the trace before anything runs, and
``--until`` stops in the driver (issue 36).

A stop at an operator or invocation the run never had used to be noticed only after a
whole replay (``note: breakpoint ... was never reached``, exit 0), and ``--until``
stopped inside the engine (``engine/_asyncfor/loop.py``), where the user had to type
``u`` to see their variables.  Generated stop points that the trace cannot reach are
refused in one line with exit 2, with no replay and no verdict stored; ``--until``'s
pdb session starts in the driver's frame.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracer
from tests.conftest import run_cli

HERE = Path(__file__).parent
APP = f"{HERE / 'nondet_apps.py'}:hot_locks"
EPOCHS = 3
#: loop indices of each ``hot`` invocation
N = 60


@pytest.fixture(scope="module")
def hot(trace_library) -> Path:
    """A 2-rank run of three ``hot`` invocations, a checkpoint after each (read-only)."""
    args = ["-p", f"epochs={EPOCHS}", "-p", f"n={N}", "--ranks", "2", "--checkpoint-every", "1"]
    return trace_library.get(APP, *args)


def _unreachable(draw: st.DrawFn) -> list[str]:
    """The options of one stop point the run of ``hot`` never reaches."""
    kind = draw(st.sampled_from(["op", "invocation", "node", "index", "before-from"]))
    how = draw(st.sampled_from(["--break", "--until"]))
    op, inv = "hot", draw(st.integers(0, EPOCHS - 1))
    index = 5
    extra: list[str] = []
    node = ""
    if kind == "op":
        op = draw(st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8))
        if op == "hot":
            op = "hotter"
    elif kind == "invocation":
        inv = draw(st.one_of(st.integers(EPOCHS, 10**6), st.integers(-5, -1)))
    elif kind == "node":
        how = "--break"
        node = f"@{draw(st.integers(2, 64))}"
    elif kind == "index":  # outside the loop's range, 0..N-1
        how = "--break"
        index = draw(st.one_of(st.integers(N, 10**9), st.integers(-(10**9), -1)))
    else:
        inv = draw(st.integers(0, EPOCHS - 2))
        extra = ["--from", f"hot:{draw(st.integers(inv + 1, EPOCHS - 1))}"]
    where = f"{op}:{inv}:{index}{node}" if how == "--break" else f"{op}:{inv}"
    return [how, where, *extra]


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_a_stop_the_run_never_reaches_is_refused_before_anything_runs(
    hot: Path, tmp_path: Path, data: st.DataObject, cli
) -> None:
    trace = tmp_path / "t.sqlite"
    shutil.copyfile(hot, trace)
    opts = data.draw(st.composite(_unreachable)())
    res = cli("single", trace, *opts)
    err = res.stderr.strip()
    assert res.returncode == 2, (opts, res.returncode, res.stdout, res.stderr)
    assert len(err.splitlines()) == 1 and err.startswith("replay: error: "), err
    assert opts[0] in err and "Traceback" not in err, err
    assert "replaying" not in res.stdout  # refused before the replay started
    with tracer.open(trace) as store:
        assert store.run().verdicts() == []


def test_a_break_on_a_node_that_never_runs_the_index_names_the_node_that_does(
    hot: Path, tmp_path: Path, cli
) -> None:
    """The plan in the trace says where each index ran: a breakpoint on another node
    would never stop, which used to show only after the whole replay."""
    with tracer.open(hot) as store:
        plan = store.run().plan("hot", 1)
    where = {j: k for rnd in plan.rounds for k, ts in enumerate(rnd) for t in ts for j in t.indices}
    index = 7
    ran, other = where[index], 1 - where[index]
    trace = tmp_path / "t.sqlite"
    shutil.copyfile(hot, trace)
    res = cli("single", trace, "--break", f"hot:1:{index}@{other}")
    assert res.returncode == 2 and "replaying" not in res.stdout, (res.stdout, res.stderr)
    assert res.stderr.strip() == (
        f"replay: error: --break hot:1:{index}@{other}: index {index} of hot#1 ran on node "
        f"{ran}, never on node {other}; stop there with --break hot:1:{index}@{ran}"
    )


def test_until_stops_in_the_driver_frame(hot: Path, tmp_path: Path) -> None:
    """A real process: pytest takes pdb over in its own process."""
    trace = tmp_path / "t.sqlite"
    shutil.copyfile(hot, trace)
    # ``epochs`` and ``X`` are the driver's locals; ``__file__`` is the driver's module
    res = run_cli(
        ["single", str(trace), "--until", "hot:1"], input="p __file__, epochs, X.name\nc\n"
    )
    assert res.returncode == 0, res.stderr
    assert "stopped after hot#1" in res.stdout
    assert f"('{HERE / 'nondet_apps.py'}', {EPOCHS}, 'X')" in res.stdout, res.stdout
    assert "identical" in res.stdout


RESUMED = """\
import os

import engine as ap


def train(epochs: int = 6) -> None:
    X = ap.dvector(4, shape=(), init=ap.init.zeros(), name="X")
    for e in range(epochs):
        if str(e) in os.environ.get("STOP_AT", "").split(","):
            raise KeyboardInterrupt  # what Ctrl-C does to a 1-rank run

        def add(j: int) -> None:
            X[j] = X[j] + float(e)  # noqa: B023

        ap.async_for(0, 4, add, name="add")
"""


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A run interrupted before add#3, its resume interrupted before add#5, and the
    resume of that, which finishes: three runs, checkpoints after every invocation."""
    from tests.cli import invoke

    d = tmp_path_factory.mktemp("resumed")
    (d / "resumed_prog.py").write_text(RESUMED)
    trace = d / "t.sqlite"
    app = f"{d / 'resumed_prog.py'}:train"
    args = ["--checkpoint-every", "1", "--trace", trace]
    assert invoke(["run", app, *args], env={"STOP_AT": "3"}).returncode != 0
    assert invoke(["resume", trace], env={"STOP_AT": "5"}).returncode != 0
    assert invoke(["resume", trace]).returncode == 0
    return trace, [r.run_id for r in tracer.open(trace).runs()]


@pytest.mark.parametrize(
    ("run", "stop", "ok"),
    [
        (1, ["--break", "add:5:0"], True),  # the invocation it was interrupted in
        (1, ["--until", "add:4"], True),
        (2, ["--until", "add:5"], True),
        (1, ["--break", "add:4:0"], True),
        (1, ["--break", "add:2:0"], False),  # the first run's
        (1, ["--until", "add:1"], False),
        (1, ["--break", "add:6:0"], False),  # after the one it stopped in
        (2, ["--break", "add:4:0"], False),  # the second run's
        (0, ["--break", "add:3:0"], True),
        (0, ["--break", "add:4:0"], False),
    ],
)
def test_a_stop_in_a_resumed_run_is_checked_against_the_invocations_it_ran(
    resumed: tuple[Path, list[str]], run: int, stop: list[str], ok: bool
) -> None:
    """A resumed run's invocations start after its checkpoint, not at 0: stops were
    checked against invocations 0..n-1, so a stop in the invocation the run was
    interrupted in was refused ("add#5 does not exist; the run completed add#0 to
    add#0"), and one in the run it resumed passed, and the replay ran to its end and said
    ``identical`` without stopping."""
    from replay._errors import UsageError
    from replay._replaycmds import check_stops

    trace, runs = resumed
    brk = stop[1] if stop[0] == "--break" else None
    until = stop[1] if stop[0] == "--until" else None
    if ok:
        check_stops(str(trace), runs[run], brk, until, None)
        return
    with pytest.raises(UsageError) as err:
        check_stops(str(trace), runs[run], brk, until, None)
    have = {0: "add#0 to add#2", 1: "add#3 to add#4", 2: "add#5 to add#5"}[run]
    assert f"the run completed {have}" in str(err.value), err.value
    op_inv = stop[1].rsplit(":", 1)[0] if brk else stop[1]
    if int(op_inv.split(":")[1]) < {0: 0, 1: 3, 2: 5}[run]:
        assert "resumed an earlier run of the trace" in str(err.value), err.value


def test_history_of_a_resumed_run_names_the_invocations_it_has(
    resumed: tuple[Path, list[str]], cli
) -> None:
    trace, runs = resumed
    proc = cli("history", trace, "X[0]", "--run", runs[1], "--between", "add:2", "add:4")
    assert proc.returncode == 2, proc.stderr
    assert "--between: add#2 does not exist; the run completed add#3 to add#4" in proc.stderr
    proc = cli("history", trace, "X[0]", "--run", runs[1], "--between", "add:3", "add:4")
    assert proc.returncode == 0, proc.stderr
    rows = [ln.split()[:2] for ln in proc.stdout.splitlines() if ln.startswith("  add#")]
    assert rows == [["add#3", "6"], ["add#4", "10"]], proc.stdout


@pytest.mark.parametrize(("run", "stopped_in", "last"), [(0, 3, 2), (1, 5, 4)])
def test_until_the_invocation_a_run_stopped_in_is_refused(
    resumed: tuple[Path, list[str]], run: int, stopped_in: int, last: int
) -> None:
    """A run interrupted in add#N never completed it: its trace ends there, so a replay
    ends before add#N's end and ``--until add:N`` never stopped; the replay ran and said
    ``identical (up to add#N-1 ...)`` as if nothing had been asked.  Refused first, the
    line offers the stops that the replay reaches: a body of add#N, or the last complete
    invocation (which ``check_stops`` accepts)."""
    from replay._errors import UsageError
    from replay._replaycmds import check_stops

    trace, runs = resumed
    with pytest.raises(UsageError) as err:
        check_stops(str(trace), runs[run], None, f"add:{stopped_in}", None)
    msg = str(err.value)
    assert f"the run was interrupted in add#{stopped_in} and never completed it" in msg, msg
    assert f"--break add:{stopped_in}:INDEX" in msg and f"--until add:{last}" in msg, msg
    check_stops(str(trace), runs[run], None, f"add:{last}", None)
    check_stops(str(trace), runs[run], f"add:{stopped_in}:0", None, None)
