"""``traces/latest`` names only a trace that exists (issue 36).

A command without ``--trace`` reserves ``traces/<app>-<time>.sqlite`` and points
``latest`` at it before anything runs, so that the link names the run in progress.  A
command that then failed before recording (an unknown parameter, a value of the wrong
type, a file that is not there) removed its empty file but left ``latest`` naming it:
every later ``replay show traces/latest`` said the trace did not exist.  Now ``latest``
goes back to what it named before, or away when it named nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

#: Commands that record (a new trace, which ``latest`` must then name).
GOOD = [
    ("run", "mlr", "-p", "synthetic=true", "-p", "epochs=1", "-p", "minibatch=100"),
]
#: Commands that fail after the default path is reserved, before anything is recorded.
BAD = [
    ("run", "mlr", "-p", "synthetic=true", "-p", "nope=1"),
    ("run", "mlr", "-p", "epochs=many"),
    ("run", "missing_app_file.py:train"),
    ("chaos", "mlr", "-p", "nope=1", "--runs", "2"),
    ("dual", "mlr", "-p", "epochs=many"),
]


def _latest(folder: Path) -> str | None:
    link = folder / "latest"
    assert not os.path.lexists(link) or link.is_symlink(), "latest is not a link"
    if not os.path.lexists(link):
        return None
    assert link.exists(), f"latest names {os.readlink(link)}, which does not exist"
    return os.readlink(link)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(st.sampled_from(GOOD + BAD), min_size=1, max_size=4))
def test_latest_names_the_newest_trace_that_exists(
    tmp_path_factory: pytest.TempPathFactory, cli, steps: list[tuple[str, ...]]
) -> None:
    here = tmp_path_factory.mktemp("cwd")
    folder = here / "traces"
    newest = None
    for args in steps:
        before = set(os.listdir(folder)) if folder.exists() else set()
        res = cli(*args, cwd=here)
        if args in GOOD:
            assert res.returncode == 0, res.stderr
            [made] = {n for n in os.listdir(folder) if n.endswith(".sqlite")} - before
            newest = made
        else:
            assert res.returncode == 2 and len(res.stderr.strip().splitlines()) >= 1
            after = set(os.listdir(folder)) if folder.exists() else set()
            assert after == before, args  # nothing new left behind
        assert _latest(folder) == newest, (args, res.stderr)


def test_a_users_own_latest_file_is_never_replaced(tmp_path: Path, cli) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / "latest").write_text("mine")
    assert cli(*BAD[0], cwd=tmp_path).returncode == 2
    assert cli(*GOOD[0], cwd=tmp_path).returncode == 0
    assert (folder / "latest").read_text() == "mine"
