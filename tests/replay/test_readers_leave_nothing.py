"""Reading a trace leaves nothing beside it (issue 36).

SQLite keeps a trace in WAL mode while it is written; a reader that opens a WAL file
read-only creates ``T.sqlite-wal`` and ``T.sqlite-shm`` and cannot remove them, so every
``show`` or ``verify`` left two files next to the user's trace (and a copy of the
``.sqlite`` alone then looked incomplete).  Writers now switch the file back to a
rollback journal when the last of them closes it; readers then create nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.traces import MLR_1

#: Commands that read a trace (``{t}``) or add to it (verdicts), run in any order.
COMMANDS = [
    ("show", "{t}"),
    ("show", "{t}", "--json"),
    ("verify", "{t}"),
    ("history", "{t}", "W[1]"),
    ("watch", "{t}", "W[1][0] > 0"),
    ("single", "{t}"),
    ("cluster", "{t}"),
    ("export", "{t}", "-o", "{d}/t.json", "--force"),
    ("ls", "{d}"),
]
SIDECARS = ("-wal", "-shm", "-journal")


def _beside(trace: Path) -> list[str]:
    return sorted(p.name for p in trace.parent.iterdir() if p.name.startswith(trace.name + "-"))


@pytest.fixture(scope="module")
def recorded(trace_library, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trace_library.get(*MLR_1)


# in-process, but `run --ranks 2` starts mpiexec
@pytest.mark.mpi
def test_a_recorded_trace_is_one_file(tmp_path: Path, cli) -> None:
    for ranks in ("1", "2"):
        trace = tmp_path / f"r{ranks}.sqlite"
        res = cli("run", *MLR_1, "--ranks", ranks, "--trace", trace)
        assert res.returncode == 0, res.stderr
        assert _beside(trace) == [], ranks


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(st.sampled_from(COMMANDS), min_size=1, max_size=3))
def test_commands_on_a_trace_leave_nothing_beside_it(
    recorded: Path,
    tmp_path_factory: pytest.TempPathFactory,
    cli,
    steps: list[tuple[str, ...]],
) -> None:
    d = tmp_path_factory.mktemp("t")
    trace = d / "t.sqlite"
    shutil.copyfile(recorded, trace)
    for step in steps:
        args = [a.format(t=trace, d=d) for a in step]
        res = cli(*args)
        assert res.returncode == 0, (args, res.stderr)
        assert _beside(trace) == [], args
