"""A failed ``replay dual`` says what to type next (issue 36).

The report named the element and both values but no command; the browser showed one.
Now each failed direction is followed by ``stop there with: replay single TRACE --break
OP:INVOCATION:INDEX`` (``--json``: ``next``), the same command the browser shows, and it
stops in the body that diverged.  Every engine mutant an in-process dual test catches
yields a command naming an invocation the trace holds.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

import tracer
from tests import mutants
from tests.conftest import run_cli

APPS = Path(__file__).with_name("dual_apps.py")


def _target(command: str) -> tuple[str, str, int]:
    words = shlex.split(command)
    assert words[:2] == ["replay", "single"] and words[3] in ("--break", "--until"), words
    op, inv = words[4].split("@")[0].split(":")[:2]
    return words[2], op, int(inv)


@pytest.mark.parametrize(
    "mutant", ["skip_writeback", "drop_barrier", "stale_prefetch", "wrong_lock_order"]
)
def test_a_command_for_a_caught_mutant_names_an_invocation_the_trace_holds(
    tmp_path: Path, cli, mutant: str
) -> None:
    """Three in-process nodes, two threads (the mutants need both to show).  A side that
    stopped inside an invocation it never recorded gets no command: ``single`` would
    refuse it (found here: a replica check stops the side in ``hot#0``, before any
    invocation is written, and the command said ``--until hot:0``)."""
    trace = tmp_path / "t.sqlite"
    args = ["dual", f"{APPS}:hot_rows", "--ranks", "3", "--threads", "2", "--in-process"]
    with mutants.active(mutant):
        res = cli(*args, "--trace", trace, "--json", cwd=tmp_path)
    assert res.returncode in (0, 1), res.stderr
    doc = json.loads(res.stdout)
    with tracer.open(trace) as store:
        held = {(i.op, i.invocation) for i in store.run().invocations()}
    for d in ("forward", "backward"):
        if doc[d]["passed"] or doc[d]["next"] is None:
            assert doc[d]["next"] is None or not doc[d]["passed"]
            continue
        where, op, inv = _target(doc[d]["next"])
        assert Path(tmp_path, where).resolve() == trace.resolve()
        assert (op, inv) in held, (d, doc[d]["next"], sorted(held))
    with mutants.active(mutant):
        said = cli(*args, "--trace", tmp_path / "t2.sqlite", cwd=tmp_path)
    lines = said.stdout.splitlines()
    for d in ("forward", "backward"):
        if doc[d]["next"] is not None:
            k = next(k for k, ln in enumerate(lines) if ln.startswith(f"{d}: FAIL at "))
            assert lines[k + 1].startswith("  stop there with: replay single "), lines


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_a_body_that_differs_gets_a_break_in_it(tmp_path: Path, cli, direction: str) -> None:
    trace = tmp_path / "t.sqlite"
    args = ["dual", f"{APPS}:differs_in_a_body", "--ranks", "2", "--in-process"]
    res = cli(*args, "--direction", direction, "--trace", trace, "--json", cwd=tmp_path)
    assert res.returncode == 1, res.stderr
    got = json.loads(res.stdout)[direction]
    assert got["next"] == "replay single t.sqlite --break inc:1:5", got
    res = cli(*args, "--direction", direction, "--trace", tmp_path / "u.sqlite", cwd=tmp_path)
    assert "\n  stop there with: replay single u.sqlite --break inc:1:5\n" in res.stdout


def test_a_passing_dual_test_names_no_command(tmp_path: Path, cli) -> None:
    res = cli("dual", f"{APPS}:hot_rows", "--ranks", "2", "--in-process", "--json", cwd=tmp_path)
    doc = json.loads(res.stdout)
    assert (
        res.returncode == 0 and doc["forward"]["next"] is None and doc["backward"]["next"] is None
    )


@pytest.mark.mpi
def test_the_command_stops_in_the_body_that_diverged_on_mpi_ranks(tmp_path: Path) -> None:
    """Ranks that each draw their own noise (``rank_noise``): the command, typed as
    printed in the directory the dual test ran in, stops pdb in that body."""
    res = run_cli(["dual", f"{APPS}:rank_noise", "--ranks", "2"], cwd=tmp_path)
    assert res.returncode == 1, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if "stop there with:" in ln)
    command = line.split("stop there with: ", 1)[1]
    _, op, inv = _target(command)
    words = shlex.split(command)[1:]
    res = run_cli(words, cwd=tmp_path, input="c\n")
    assert f"replay: stopped in {op}#{inv} index" in res.stdout, (res.stdout, res.stderr)
