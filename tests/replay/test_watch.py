"""``replay watch`` never claims what it did not check (issue 34, points 4 and 5).

A family of small user programs whose DDS elements follow generated sequences, monotone
or not, with a DDS created late; the test knows after which invocation the predicate
first holds and demands that ``watch`` says exactly that, or says what it did not check.
"""

from __future__ import annotations

import itertools
import json
import operator
import shlex
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracer
from replay._cli import cli as group
from tests.conftest import run_cli

pytestmark = pytest.mark.filterwarnings("ignore::replay._environment.ReplayEnvironmentWarning")

ROWS = 4
OPS: dict[str, Callable[[float, float], bool]] = {"==": operator.eq, ">": operator.gt}

PROGRAM = """\
import engine as ap

SEQ = {seq!r}


def train(epochs: int = {epochs}) -> None:
    X = ap.dvector({rows}, shape=(2,), init=ap.init.zeros(), name="X")
    W = None
    for e in range(epochs):
        v = float(SEQ[e])
        if e == {birth}:
            W = ap.dvector({rows}, shape=(2,), init=ap.init.zeros(), name="W")

        def set_x(j: int) -> None:
            if j == {i}:
                row = list(X[j])
                row[{j}] = v  # noqa: B023
                X[j] = row

        ap.async_for(0, {rows}, set_x, name="set")
        if W is not None:

            def set_w(j: int) -> None:
                if j == {i}:
                    row = list(W[j])  # noqa: B023
                    row[{j}] = v + 1.0  # noqa: B023
                    W[j] = row  # noqa: B023

            ap.async_for(0, {rows}, set_w, name="late")
"""

_names = itertools.count()


def _invoke(*argv: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(group, list(argv))
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return res.exit_code, res.stdout, res.stderr


def _steps(seq: list[int], birth: int, i: int, j: int) -> list[tuple[str, int, dict]]:
    """Every invocation in program order with the arrays after it (W absent before birth)."""
    x = np.zeros((ROWS, 2))
    w: np.ndarray | None = None
    out: list[tuple[str, int, dict]] = []
    for e, v in enumerate(seq):
        if e == birth:
            w = np.zeros((ROWS, 2))
        x[i, j] = v
        out.append(("set", e, {"X": x.copy(), "W": None if w is None else w.copy()}))
        if w is not None:
            w[i, j] = v + 1.0
            out.append(("late", e - birth, {"X": x.copy(), "W": w.copy()}))
    return out


def _record(d: Path, seq: list[int], birth: int, i: int, j: int, every: int) -> Path:
    k = next(_names)
    prog = d / f"watched_{k}.py"
    prog.write_text(PROGRAM.format(seq=seq, epochs=len(seq), rows=ROWS, birth=birth, i=i, j=j))
    trace = d / f"watched_{k}.sqlite"
    rc, out, err = _invoke(
        "run", f"{prog}:train", "--checkpoint-every", str(every), "--trace", str(trace)
    )
    assert rc == 0, (out, err)
    return trace


@st.composite
def cases(draw: st.DrawFn) -> dict:
    epochs = draw(st.integers(2, 5))
    seq = draw(st.lists(st.integers(0, 3), min_size=epochs, max_size=epochs))
    if draw(st.booleans()):
        seq.sort()  # a monotone sequence, so ``>`` is a monotone predicate
    return {
        "seq": seq,
        "birth": draw(st.integers(1, epochs)),  # == epochs: W is never created
        "i": draw(st.integers(0, ROWS - 1)),
        "j": draw(st.integers(0, 1)),
        "dds": draw(st.sampled_from(["X", "W"])),
        "op": draw(st.sampled_from(sorted(OPS))),
        "v": draw(st.integers(0, 4)),
        "every": draw(st.sampled_from([1, 1, 2])),
    }


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=cases())
def test_watch_reports_the_first_invocation_or_what_it_did_not_check(
    tmp_path: Path, case: dict
) -> None:
    seq, birth, i, j = case["seq"], case["birth"], case["i"], case["j"]
    dds, op, v = case["dds"], case["op"], case["v"]
    if dds == "W" and birth >= len(seq):
        dds = "X"  # a DDS in no checkpoint is refused (tested below)
    trace = _record(tmp_path, seq, birth, i, j, case["every"])
    expr = f"{dds}[{i}, {j}] {op} {v}"
    steps = _steps(seq, birth, i, j)

    def truth(arrays: dict) -> bool:
        a = arrays[dds]
        return a is not None and OPS[op](float(a[i, j]), float(v))

    held = [truth(a) for _, _, a in steps]
    first = held.index(True) if True in held else None
    missing = [
        f"{o}#{n}" for o, n, a in steps[: first if first is not None else None] if a[dds] is None
    ]

    # a DDS no checkpoint holds (W written only after the last) is evaluated by replay
    # the default: every invocation is checked, and the answer is exactly the truth
    rc, out, err = _invoke("watch", str(trace), expr, "--json")
    assert rc == 0, (out, err)
    doc = json.loads(out)
    assert doc["checked"] == "every invocation" and doc["unchecked"] == 0, doc
    assert doc["invocations"] == len(steps)
    got = None if not doc["found"] else (doc["op"], doc["invocation"])
    want = None if first is None else steps[first][:2]
    assert got == want, (case, doc)
    if first is not None:
        # the state as the invocation begins: the last one's, and W once created
        began = dict(steps[first - 1][2]) if first else {"X": np.zeros((ROWS, 2)), "W": None}
        if steps[first][:2] == ("set", birth):
            began["W"] = np.zeros((ROWS, 2))
        if truth(began):  # the driver made it true: no body did
            assert doc["held_before"] and doc["index"] is None, doc
        else:
            assert (doc["index"], doc["node"]) == (i, 0), doc  # the one body that does
    assert [f"{e['op']}#{e['invocation']}" for e in doc["not_evaluable"]] == missing, doc
    rc, text, err = _invoke("watch", str(trace), expr)
    assert rc == 0, err
    if want is None:
        assert f"{expr} never holds in this run (checked after each of its" in text, text
    elif doc["held_before"]:
        assert f"{expr} first holds after {want[0]}#{want[1]} (it held before the first" in text
    else:
        assert f"{expr} first holds after {want[0]}#{want[1]}, index {i} on node 0" in text
    assert ("could not be evaluated" in text) == bool(missing), text

    # --monotone: the exact answer, or it says what it did not check; never a false hit
    rc, out, err = _invoke("watch", str(trace), expr, "--monotone", "--json")
    assert rc == 0, (out, err)
    mono = json.loads(out)
    got = None if not mono["found"] else (mono["op"], mono["invocation"])
    if got is not None:
        assert held[[s[:2] for s in steps].index(got)], (case, mono)  # it does hold there
    if mono["unchecked"] == 0:
        assert mono["checked"] == "every invocation" and got == want, (case, mono)
    else:
        assert mono["checked"] == "bisection (assumed monotone)", mono
    monotone = held == sorted(held)
    if monotone and not any(e["in"] == "checkpoint" for e in mono["not_evaluable"]):
        assert got == want, (case, mono)
    rc, text, err = _invoke("watch", str(trace), expr, "--monotone")
    assert rc == 0, err
    if mono["unchecked"] and got is None:
        assert f"{expr} was not found, but {mono['unchecked']} of the run's" in text, text
    elif mono["unchecked"]:
        assert f"{expr} first found after {mono['op']}#{mono['invocation']}" in text, text
        assert "not every invocation was checked" in text, text
    assert mono["unchecked"] == 0 or "never holds" not in text and "first holds" not in text


def test_a_predicate_true_between_checkpoints_is_found(tmp_path: Path) -> None:
    """X[1, 0] == 1 holds only after set#1, which bisection over the five checkpoints
    never looks at (it looks at 2, 3, 4); the old watch said it never holds."""
    trace = _record(tmp_path, [0, 1, 0, 0, 0], 5, 1, 0, every=1)
    rc, text, err = _invoke("watch", str(trace), "X[1, 0] == 1")
    assert rc == 0, err
    assert "X[1, 0] == 1 first holds after set#1, index 1 on node 0" in text, text
    rc, text, err = _invoke("watch", str(trace), "X[1, 0] == 1", "--monotone")
    assert rc == 0, err
    assert "X[1, 0] == 1 was not found, but 2 of the run's 5 invocations were not checked" in text


def test_a_dds_created_after_the_first_checkpoint_can_be_watched(tmp_path: Path) -> None:
    trace = _record(tmp_path, [1, 2, 3], 1, 2, 1, every=1)
    rc, out, err = _invoke("watch", str(trace), "W[2, 1] > 3", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert (doc["op"], doc["invocation"], doc["index"]) == ("late", 1, 2), doc
    assert doc["not_evaluable"] == [{"op": "set", "invocation": 0, "dds": ["W"], "in": "replay"}]
    rc, text, err = _invoke("watch", str(trace), "W[2, 1] > 3")
    assert rc == 0, err
    assert "could not be evaluated after set#0 (W did not exist there)" in text, text
    # a name the run has no DDS of is refused, naming every DDS it has
    rc, out, err = _invoke("watch", str(trace), "Q[0, 0] > 1")
    assert rc == 2 and "neither np nor a DDS of the run (X, W)" in err, err


UNWRITTEN = """\
import engine as ap


def train() -> None:
    A = ap.create(6, lambda j: (j % 3, float(j)), name="records")
    R = ap.map(A, lambda r: (r[0], r[1]), shape=(2,), name="numbers")  # no body writes it
    X = ap.dvector(3, shape=(), init=ap.init.zeros(), name="X")
    for e in range(2):

        def body(j: int) -> None:
            r = R[j]
            X[int(r[0])] = X[int(r[0])] + r[1]

        ap.async_for(0, 6, body, name="add")
"""


def test_a_dds_no_body_writes_is_watched_like_the_written_ones(tmp_path: Path, cli) -> None:
    """sgdmf's compiled body reads ``ratings3``, a numeric DDS made by ``ap.map`` that no
    body writes, so no checkpoint holds it: watch evaluates it by replay, as history does;
    a DDS of Python objects is refused in one line."""
    prog = tmp_path / "unwritten.py"
    prog.write_text(UNWRITTEN)
    trace = tmp_path / "t.sqlite"
    assert cli("run", f"{prog}:train", "--trace", trace).returncode == 0
    proc = cli("watch", trace, "numbers[4][1] == 4", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["found"], doc["op"], doc["invocation"], doc["held_before"]) == (
        True,
        "add",
        0,
        True,
    ), doc
    # with a written DDS: the body that makes it true (X[1] is 1, then 5 in add#0)
    for flag in ([], ["--monotone"]):
        proc = cli("watch", trace, "X[1] > numbers[4][1]", *flag)
        assert proc.returncode == 0, proc.stderr
        assert "X[1] > numbers[4][1] first holds after add#0, index 4 on node 0" in proc.stdout
    proc = cli("watch", trace, "records[0][1] > 1")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "replay: error: DDS 'records' holds Python objects, not numeric rows: a watch "
        "expression takes numeric DDS (use 'replay history' for one of its elements)"
    )


STOPS = """\
import engine as ap


def train(epochs: int = 4, fail_at: int = 2) -> None:
    X = ap.dvector(4, shape=(2,), init=ap.init.zeros(), name="X")
    for e in range(epochs):
        if e == fail_at:
            raise RuntimeError("the user's program stops here")

        def add(j: int) -> None:
            X[j] = X[j] + 1.0

        ap.async_for(0, 4, add, name="add")
"""


def test_a_run_that_did_not_finish_is_not_said_never_to_hold(tmp_path: Path, cli) -> None:
    """A failed run recorded only its first invocations: "never holds in this run" read as
    a claim about the whole program; the line now says where the run ended, and --json
    has ``run_status``."""
    prog = tmp_path / "stops.py"
    prog.write_text(STOPS)
    trace = tmp_path / "t.sqlite"
    assert cli("run", f"{prog}:train", "--checkpoint-every", "1", "--trace", trace).returncode
    proc = cli("watch", trace, "X[0][0] > 2", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["found"], doc["invocations"], doc["run_status"]) == (False, 2, "failed"), doc
    proc = cli("watch", trace, "X[0][0] > 2")
    assert proc.returncode == 0, proc.stderr
    assert "never holds in this run" not in proc.stdout, proc.stdout
    assert (
        "X[0][0] > 2 never holds in the 2 invocation(s) this run recorded (checked after "
        "each); the run failed there, so what it would have done next was not checked"
    ) in proc.stdout, proc.stdout
    # what did hold is still found in the part that was recorded
    proc = cli("watch", trace, "X[0][0] > 1")
    assert "X[0][0] > 1 first holds after add#1, index 0 on node 0" in proc.stdout, proc.stdout


RESUMED = """\
import os

import engine as ap


def train(epochs: int = 6) -> None:
    X = ap.dvector(4, shape=(), init=ap.init.zeros(), name="X")
    for e in range(epochs):
        if str(e) in os.environ.get("STOP_AT", "").split(","):
            raise KeyboardInterrupt  # what Ctrl-C does to a 1-rank run

        def add(j: int) -> None:
            if j == e % 4:  # noqa: B023
                X[j] = X[j] + 1.0

        ap.async_for(0, 4, add, name="add")
"""


@pytest.mark.parametrize("which", ["first", "resumed"])
def test_the_offered_command_stops_in_the_body_of_the_run_watched(
    tmp_path: Path, cli, which: str
) -> None:
    """A trace holding several runs (an interrupted run and its resumes), in a directory
    whose name has a blank: watch offered ``replay single TRACE --break ...`` with the
    trace unquoted and without ``--run``, which replays the latest run, one that never
    ran that body (``--from: add#3 does not exist``).  Typed as printed, in the
    directory watch ran in, the command stops pdb in the body watch named."""
    d = tmp_path / "my runs"
    d.mkdir()
    (d / "resumed_prog.py").write_text(RESUMED)
    trace = d / "t.sqlite"
    app = f"{d / 'resumed_prog.py'}:train"
    rec = cli("run", app, "--checkpoint-every", "1", "--trace", trace, env={"STOP_AT": "4"})
    assert rec.returncode != 0, rec.stderr
    first = tracer.open(trace).run().info.run_id
    assert cli("resume", trace, env={"STOP_AT": "5"}).returncode != 0
    assert cli("resume", trace).returncode == 0
    run_id = first if which == "first" else tracer.open(trace).runs()[1].run_id
    expr = "X[3] > 0" if which == "first" else "X[0] > 1"  # add#3, add#4
    proc = cli("watch", trace, expr, "--run", run_id, "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["op"], doc["invocation"]) == ("add", 3 if which == "first" else 4), doc
    words = shlex.split(doc["break"])
    assert words[:2] == ["replay", "single"] and "--run" in words, doc["break"]
    res = run_cli(words[1:], cwd=tmp_path, input="c\n")
    assert res.returncode == 0, res.stderr
    assert f"stopped in add#{doc['invocation']} index {doc['index']}" in res.stdout, res.stdout


def test_a_resumed_run_is_not_said_never_to_hold_what_its_first_part_held(
    tmp_path: Path, cli
) -> None:
    """``X[0] == 1`` holds after add#0 to add#3, in the run that was interrupted, and no
    longer in the run that resumed it after add#4.  Watched in the resumed run it was
    "never holds in this run (checked after each of its 1 invocations)", though the
    training that run completes held it for four invocations; now the line says which
    invocations it checked and names the run that holds the earlier ones."""
    (tmp_path / "resumed_prog.py").write_text(RESUMED)
    trace = tmp_path / "t.sqlite"
    app = f"{tmp_path / 'resumed_prog.py'}:train"
    rec = cli("run", app, "--checkpoint-every", "1", "--trace", trace, env={"STOP_AT": "4"})
    assert rec.returncode != 0, rec.stderr
    assert cli("resume", trace, env={"STOP_AT": "5"}).returncode != 0
    assert cli("resume", trace).returncode == 0
    runs = [r.run_id for r in tracer.open(trace).runs()]
    proc = cli("watch", trace, "X[0] == 1")
    assert proc.returncode == 0, proc.stderr
    assert "never holds in this run" not in proc.stdout, proc.stdout
    assert (
        f"X[0] == 1 never holds in the 1 invocation(s) this run ran after resuming run "
        f"{runs[1][:12]} at add#4 (checked after each, and at add#4)"
    ) in proc.stdout, proc.stdout
    assert f"watch that run with --run {runs[1]}" in proc.stdout, proc.stdout
    doc = json.loads(cli("watch", trace, "X[0] == 1", "--json").stdout)
    assert doc["continues"] == runs[1] and doc["resumed_after"] == {"op": "add", "invocation": 4}
    # the run it names finds it, or names the one before
    proc = cli("watch", trace, "X[0] == 1", "--run", runs[0])
    assert "X[0] == 1 first holds after add#0, index 0 on node 0" in proc.stdout, proc.stdout
