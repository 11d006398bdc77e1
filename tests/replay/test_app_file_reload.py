"""A user's app file is run as it is now, in a process that lives on.

``replay`` imported a user's file once per process, keyed by its path: a process that
ran commands on after the file changed (the browser, in-process commands, the test
suite's ``cli``) kept running the old code, so ``single --allow-changed-code`` replayed
the recording with the code it was recorded with and said *identical* for a program
that now computes something else.  The module is now keyed by path and content.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

PROGRAM = """
import engine as ap


def train(epochs: int = 2):
    X = ap.dvector(6, shape=(), init=ap.init.zeros(), name="X")
    for _ in range(epochs):

        def body(j):
            X[j] = X[j] + {step}

        ap.async_for(0, 6, body, name="add")
        ap.log_objective("total", float(X.gather().sum()))
"""


@pytest.mark.parametrize("step", ["2.0", "0.5 * j", "1e-12"])
def test_a_rewritten_file_runs_its_new_code(
    tmp_path: Path, cli, step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also when the rewrite keeps the file's size and modification time (an edit within
    the same second): Python's bytecode cache, which users have on, cannot tell."""
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    app = tmp_path / "train.py"
    app.write_text(PROGRAM.format(step="1.0"))
    first = cli("run", f"{app}:train", "--trace", tmp_path / "t.sqlite", "--json")
    assert first.returncode == 0, first.stderr
    was = app.stat()
    app.write_text(PROGRAM.format(step=step))
    os.utime(app, ns=(was.st_atime_ns, was.st_mtime_ns))
    second = cli("run", f"{app}:train", "--no-trace", "--json")
    assert second.returncode == 0, second.stderr
    before = json.loads(first.stdout)["objectives"]["total"]
    after = json.loads(second.stdout)["objectives"]["total"]
    assert before != after, (before, after)
    refused = cli("single", tmp_path / "t.sqlite")
    assert refused.returncode == 2 and "--allow-changed-code" in refused.stderr
    changed = cli("single", tmp_path / "t.sqlite", "--allow-changed-code")
    assert changed.returncode == 3, (changed.stdout, changed.stderr)  # DIVERGED, not identical
