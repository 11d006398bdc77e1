"""A trace never chooses the code that runs (issue 33, point 1).

Every field of the run row that changes what runs or how, and every time-travel row
(checkpoints, their blocks, collective values), is covered by the hash chain, and by
the key when there is one: an edit of any of them is refused by ``verify`` and by every
replaying command before anything runs.  And a target the trace names is run only if it
is the user's own source file: one in a library directory is refused even when an
editor re-seals an unkeyed chain around it.

Every command runs in this process; the module's two traces are recorded in it too
(tests/cli.py), on 2 ranks that ``mpiexec`` starts, so the tests that read them are
``mpi``.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from replay._cli import cli as group
from replay._target import file_digest
from tests import cli as tcli
from tests.tracer.tracehelp import reseal
from tracer._chain import KEY_ENV, RUN_FIELDS

USER_APP = """
import engine as ap

def train(epochs: int = 3, scale: float = 1.0):
    X = ap.dvector(24, shape=(2,), init=ap.init.zeros(), name="X")

    def body(j):
        X[j] = X[j] + scale * (j % 5)

    for _ in range(epochs):
        ap.async_for(0, 24, body, name="add")
        total = ap.reduce(X, lambda x: float(x.sum()))
        ap.log_objective("total", total)
"""

#: What a library function that runs a command looks like to replay.
EVIL = """
def train(cmd: str = ""):
    open({marker!r}, "w").write(cmd)
"""


def invoke(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    res = CliRunner().invoke(group, list(args), env=env)
    return subprocess.CompletedProcess(list(args), res.exit_code, res.stdout, res.stderr)


def refused(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert proc.returncode == 2, (proc.args, proc.returncode, proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("replay: error")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def record(tmp: Path, name: str, **env: str) -> Path:
    app = tmp / "train.py"
    if not app.exists():
        app.write_text(USER_APP)
    trace = tmp / name
    args = ["run", f"{app}:train", "--ranks", "2", "--checkpoint-every", "1", "--trace"]
    proc = tcli.invoke([*args, trace, "--json"], env=env)
    assert proc.returncode == 0, proc.stderr
    return trace


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("forgery")
    keyed = {KEY_ENV: "a secret of the user's"}
    return {"plain": record(tmp, "plain.sqlite"), "keyed": record(tmp, "keyed.sqlite", **keyed)}


def _copy(src: Path, tmp: Path) -> Path:
    dst = tmp / f"edit-{len(list(tmp.glob('edit-*')))}.sqlite"
    shutil.copyfile(src, dst)
    return dst


@pytest.mark.mpi
def test_the_recorded_trace_verifies_and_covers_its_time_travel_rows(
    traces: dict[str, Path],
) -> None:
    doc = json.loads(invoke("verify", str(traces["plain"]), "--json").stdout)
    assert doc["ok"] and not doc["runs"][0]["legacy"]
    with sqlite3.connect(traces["plain"]) as db:
        cps = db.execute("SELECT count(*) FROM checkpoint").fetchone()[0]
        cvs = db.execute("SELECT count(*) FROM collective_value").fetchone()[0]
        side = db.execute("SELECT count(*) FROM chain_link WHERE link_no < 0").fetchone()[0]
    assert cps >= 2 and cvs >= 3 and side >= cps  # one side link per marker, more for values


#: Run-row fields and a way to change each (text or integer).
FIELDS = [name for name, _ in RUN_FIELDS if name != "run_id"]
KINDS = dict(RUN_FIELDS)


def _new_value(kind: str, old: object, draw: st.DataObject) -> object:
    if kind == "i":
        return draw.draw(st.integers(-(2**40), 2**40).filter(lambda v: v != old))
    return draw.draw(st.text(max_size=40).filter(lambda v: v != (old or "")))


#: Commands that replay or read a run: each refuses damage before anything runs.
COMMANDS = [
    ["verify", "{t}"],
    ["single", "{t}"],
    ["cluster", "{t}"],
    ["history", "{t}", "X[1]"],
    ["watch", "{t}", "X[1, 0] > 3"],
    ["resume", "{c}", "--timeout", "20"],
]


def _crashed(trace: Path) -> Path:
    """A copy of ``trace`` whose run says it crashed (the end fields are not chained
    by genesis; resume reads only crashed runs)."""
    out = trace.with_name(trace.stem + "-crashed.sqlite")
    src, db = sqlite3.connect(trace), sqlite3.connect(out)
    src.backup(db)  # the edit may still sit in the source's WAL: copy what SQLite sees
    src.close()
    with db:
        db.execute("UPDATE run SET status = 'crashed', end_node = NULL, end_seq = NULL")
    db.close()
    return out


def _args(cmd: list[str], trace: Path) -> list[str]:
    crashed = _crashed(trace) if "{c}" in cmd else trace
    return [a.format(t=trace, c=crashed) for a in cmd]


@pytest.mark.mpi
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(field=st.sampled_from(FIELDS), data=st.data(), keyed=st.booleans())
def test_an_edit_of_any_run_row_field_is_refused_everywhere(
    traces: dict[str, Path],
    tmp_path: Path,
    field: str,
    data: st.DataObject,
    keyed: bool,
) -> None:
    trace = _copy(traces["keyed" if keyed else "plain"], tmp_path)
    with sqlite3.connect(trace) as db:
        old = db.execute(f"SELECT {field} FROM run").fetchone()[0]  # noqa: S608
        db.execute(f"UPDATE run SET {field} = ?", (_new_value(KINDS[field], old, data),))
    before = trace.read_bytes()
    env = {KEY_ENV: "a secret of the user's"} if keyed else None
    for cmd in COMMANDS:
        refused(invoke(*_args(cmd, trace), env=env))
    assert trace.read_bytes() == before


def _side_edit(db: sqlite3.Connection, data: st.DataObject) -> str:
    table = data.draw(st.sampled_from(["checkpoint", "checkpoint_block", "collective_value"]))
    ids = [r[0] for r in db.execute(f"SELECT id FROM {table}")]  # noqa: S608
    rid = data.draw(st.sampled_from(ids))
    cols = [
        (r[1], r[2].upper())
        for r in db.execute(f"PRAGMA table_info({table})")
        if r[1] not in ("id", "run")
    ]
    if data.draw(st.booleans()) and table != "checkpoint_block":
        db.execute(f"DELETE FROM {table} WHERE id = ?", (rid,))  # noqa: S608
        return f"delete {table}"
    col, kind = data.draw(st.sampled_from(cols))
    old = db.execute(f'SELECT "{col}" FROM {table} WHERE id = ?', (rid,)).fetchone()[0]  # noqa: S608
    if isinstance(old, bytes):
        new: object = old[:-1] + bytes([old[-1] ^ 1]) if old else b"\x00"
    elif isinstance(old, int):
        new = old + data.draw(st.sampled_from([1, -1, 7]))
    elif isinstance(old, float):
        new = old + 1.5
    else:
        new = (old or "") + "x"
    try:
        db.execute(f'UPDATE {table} SET "{col}" = ? WHERE id = ?', (new, rid))  # noqa: S608
    except sqlite3.IntegrityError:  # a unique key (k) taken by another row
        assume(False)
    return f"{table}.{col}"


@pytest.mark.mpi
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_an_edit_of_a_checkpoint_or_collective_row_is_refused(
    traces: dict[str, Path], tmp_path: Path, data: st.DataObject
) -> None:
    trace = _copy(traces["plain"], tmp_path)
    with sqlite3.connect(trace) as db:
        what = _side_edit(db, data)
    for cmd in COMMANDS:
        line = refused(invoke(*_args(cmd, trace)))
        assert "damaged" in line or "table" in line, (what, line)


@pytest.mark.mpi
def test_a_resealed_keyed_trace_is_refused(traces: dict[str, Path], tmp_path: Path) -> None:
    """An editor without the key can recompute every manifest, but not the links."""
    trace = _copy(traces["keyed"], tmp_path)
    with sqlite3.connect(trace) as db:
        db.execute("UPDATE run SET params = ?", (json.dumps({"epochs": 2, "scale": 9.0}),))
    reseal(trace)
    env = {KEY_ENV: "a secret of the user's"}
    for cmd in COMMANDS:
        refused(invoke(*_args(cmd, trace), env=env))


@pytest.mark.mpi
@pytest.mark.parametrize("where", ["site-packages", "dist-packages", "installed"])
def test_a_library_target_is_refused_even_in_a_resealed_trace(
    traces: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A determined editor of an unkeyed trace re-seals it around a library function that
    runs a command: replay refuses the target, and nothing of it is imported."""
    marker = tmp_path / "PWNED"
    if where == "installed":  # a real module of this interpreter's site-packages
        import click.testing as lib

        path = Path(lib.__file__)
        target, params = "click.testing:make_input_stream", {}
    else:
        lib_dir = tmp_path / "lib" / "python3.11" / where / "evilpkg"
        lib_dir.mkdir(parents=True)
        path = lib_dir / "__init__.py"
        path.write_text(EVIL.format(marker=str(marker)))
        monkeypatch.syspath_prepend(str(lib_dir.parent))
        target, params = "evilpkg:train", {"cmd": "id > PWNED"}
    trace = _copy(traces["plain"], tmp_path)
    with sqlite3.connect(trace) as db:
        db.execute(
            "UPDATE run SET app = ?, target = ?, params = ?, code_digest = ?",
            (target, target, json.dumps(params), file_digest(path)),
        )
    reseal(trace)
    assert invoke("verify", str(trace)).returncode == 0  # the chain alone cannot tell
    for cmd in COMMANDS[1:]:
        line = refused(invoke(*_args(cmd, trace)))
        assert "library code" in line, line
    assert not marker.exists()


@pytest.mark.mpi
def test_replay_says_which_of_your_files_it_runs(traces: dict[str, Path]) -> None:
    proc = invoke("single", str(traces["plain"]))
    assert proc.returncode == 0, proc.stderr
    app = traces["plain"].parent / "train.py"
    assert f"the trace names your function train in {app}" in proc.stdout
