"""``replay single --json`` with a stop: stdout is exactly one JSON document (what a script
parses), and pdb's prompts, what the user prints in it and the program's own prints go
to stderr.  The replay is a real process: pdb reads the command's stdin."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli

PROGRAM = """
import engine as ap


def train():
    X = ap.dvector(6, shape=(), init=ap.init.zeros(), name="X")
    for epoch in range(2):

        def body(j):
            X[j] = X[j] + 1.0

        ap.async_for(0, 6, body, name="add")
        print("epoch done")
    ap.log_objective("total", float(X.gather().sum()))
"""


@pytest.mark.parametrize(
    ("stop", "typed", "shown"),
    [
        (["--break", "add:1:4"], "p j * 100\nc\n", "400"),
        (["--until", "add:0"], "p X.name + '!'\nc\n", "'X!'"),
    ],
)
def test_stdout_is_one_json_document(
    tmp_path: Path, cli, stop: list[str], typed: str, shown: str
) -> None:
    app = tmp_path / "train.py"
    app.write_text(PROGRAM)
    trace = tmp_path / "t.sqlite"
    assert cli("run", f"{app}:train", "--trace", trace).returncode == 0
    proc = run_cli(["single", str(trace), *stop, "--json"], input=typed)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)  # nothing before or after it
    assert doc["identical"] is True and doc["stopped"] is False, (doc, proc.stderr)
    assert "(Pdb)" in proc.stderr and shown in proc.stderr
    assert "replay: stopped" in proc.stderr and "epoch done" in proc.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["single", "{trace}"],
        ["history", "{trace}", "X[2]"],
        ["watch", "{trace}", "X[2] > 1"],
        ["run", "{app}:train", "--no-trace"],
    ],
    ids=["single", "history", "watch", "run"],
)
def test_a_programs_prints_do_not_break_the_json(tmp_path: Path, cli, args: list[str]) -> None:
    app = tmp_path / "train.py"
    app.write_text(PROGRAM)
    trace = tmp_path / "t.sqlite"
    assert cli("run", f"{app}:train", "--trace", trace).returncode == 0
    proc = cli(*(a.format(trace=trace, app=app) for a in args), "--json")
    assert proc.returncode == 0, proc.stderr
    assert isinstance(json.loads(proc.stdout), dict), proc.stdout
    assert "epoch done" in proc.stderr and "epoch done" not in proc.stdout
