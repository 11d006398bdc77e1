"""Fuzzing the CLI with damaged traces: never a traceback, never exit 70, never a changed file.

The in-process tests at the end (click's CliRunner, fast) also forge run-row values and
give commands odd paths (symlink loops, a file where a directory belongs) and odd database
URLs (unencoded password characters, unknown dialects, no host, absurd ports): each must
be refused in one line, exit 2 (3 for a divergence), in bounded time, changing no file.

Valid traces come from the session's trace library (tests/traces.py); each example copies
one, damages it with sqlite3
(deleted rows, flipped blob bytes, JSON of the wrong type, out-of-range numbers, wrong-typed
text) and runs one command on the copy, in this process (tests/cli.py: what a command
prints and returns, not that it is a process).  Every command must exit 0, 2 or 3 with at
most one line on stderr, within a bounded time, and leave every file as it was, except the
verdict a replay writes.

``STRADS_FUZZ_EXAMPLES=N`` runs N examples per test instead of the small CI budget.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracer
from tests import cli as tcli
from tests.traces import MLR_1, SGDMF_2, settle

#: Examples per test in CI (each one ran a ``replay`` process of about 2 s before they
#: ran in this process; the budget was set then).
CI_READ_EXAMPLES = 16
CI_REPLAY_EXAMPLES = 6
_LOCAL = int(os.environ.get("STRADS_FUZZ_EXAMPLES", "0"))
#: A long local run may take longer than the suite's per-test timeout.
pytestmark = pytest.mark.timeout(0 if _LOCAL else 300)

#: Text columns that hold JSON objects.
JSON_COLUMNS = {("run", "params"), ("run", "versions"), ("verdict", "detail")}
JSON_VALUES = [[1, 2], {"x": [1]}, "text", 7, 1.5, None, {}, {"epochs": "two"}, {"nope": 1}]
NUMBERS: list[Any] = [-1, 0, -(2**40), 2**62, float("nan"), 1e308, -1e308, 0.5, 2]
TEXTS: list[Any] = [5, 1.5, b"\xff\x00", "", "two", "zlib-u8", "rotation", None]


def _settings(ci: int) -> settings:
    return settings(
        max_examples=_LOCAL or ci,
        deadline=None,
        derandomize=not _LOCAL,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        database=None,
    )


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _files(root: Path, skip: set[str]) -> dict[str, str]:
    """Hashes of every file under ``root`` except ``skip`` and SQLite's own side files.

    Opening a WAL trace read-only leaves a ``-shm`` index and an empty ``-wal``: the trace's
    content is unchanged.  A ``-wal`` that holds anything counts.
    """
    return {
        p.name: _sha(p)
        for p in root.iterdir()
        if p.is_file()
        and p.name not in skip
        and not p.name.endswith("-shm")
        and not (p.name.endswith("-wal") and p.stat().st_size == 0)
    }


def _schema(path: Path) -> dict[str, dict[str, str]]:
    """Per table: column name -> declared type."""
    con = sqlite3.connect(path)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {
            t: {r[1]: r[2].upper() for r in con.execute(f"PRAGMA table_info({t})")} for t in tables
        }
    finally:
        con.close()


def _contents(path: Path, skip: str = "verdict") -> dict[str, list[Any]]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        out = {}
        for t in tables:
            rows = con.execute(f"SELECT rowid, * FROM {t} ORDER BY rowid").fetchall()
            out[t] = [len(rows)] if t == skip else [repr(r) for r in rows]
        return out
    finally:
        con.close()


#: Seconds one command may take on a damaged trace (it ran under this timeout as a process).
COMMAND_S = 60
#: Seconds one replay command may take (its ``--timeout`` is 60 s).
REPLAY_S = 90


def _run(cmd: list[str], limit: float) -> Any:
    """``replay CMD`` in this process, failing the test if it took longer than ``limit``."""
    t0 = time.monotonic()
    res = tcli.invoke(cmd)
    took = time.monotonic() - t0
    assert took < limit, f"replay {' '.join(cmd)} took {took:.1f} s (limit {limit} s)"
    return res


@pytest.fixture(scope="module")
def one_rank(trace_library: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mlr's sync_for on 1 rank, with a verdict (a private copy of the library's trace)."""
    one = trace_library.copy(tmp_path_factory.mktemp("fuzz-base") / "mlr1.sqlite", *MLR_1)
    res = tcli.invoke(["single", one])  # a verdict row to damage too
    assert res.returncode == 0, res.stderr
    settle(one)  # each example copies the file alone: no pages may wait in a WAL
    return one


@pytest.fixture(scope="module")
def bases(trace_library: Any, one_rank: Path) -> Any:
    """Two valid traces: sgdmf on 2 ranks (2 epochs, the library's, read only: examples
    copy it), mlr's sync_for on 1 rank with a verdict."""
    has_verify = "verify" in tcli.invoke(["--help"]).stdout
    return {"two": trace_library.get(*SGDMF_2), "one": one_rank, "verify": has_verify}


def _fits(kind: str, table: str, col: str, ty: str) -> bool:
    """Whether a mutation of ``kind`` applies to a column of declared type ``ty``."""
    if kind == "blob":
        return ty == "BLOB"
    if kind == "json":
        return (table, col) in JSON_COLUMNS
    if kind == "number":
        return ty in ("INTEGER", "FLOAT", "BOOLEAN")
    return ty.startswith(("VARCHAR", "TEXT"))


@st.composite
def mutations(draw: Any, path: Path) -> list[tuple[str, ...]]:
    """1-3 damaging SQL statements (with parameters) for the trace at ``path``."""
    schema = _schema(path)
    con = sqlite3.connect(path)
    try:
        rowids = {t: [r[0] for r in con.execute(f"SELECT rowid FROM {t}")] for t in schema}
    finally:
        con.close()
    tables = sorted(t for t in schema if rowids[t])
    out = []
    for _ in range(draw(st.integers(1, 3))):
        table = draw(st.sampled_from(tables))
        rowid = draw(st.sampled_from(rowids[table]))
        cols = schema[table]
        kind = draw(st.sampled_from(["delete", "blob", "json", "number", "text"]))
        if kind == "delete":
            out.append((f"DELETE FROM {table} WHERE rowid = ?", rowid))
            continue
        names = sorted(c for c, ty in cols.items() if _fits(kind, table, c, ty))
        if not names:
            names, kind = sorted(cols), "number"
        col = draw(st.sampled_from(names))
        sql = f"UPDATE {table} SET {col} = ? WHERE rowid = ?"
        if kind == "blob":
            pos, bit = draw(st.integers(0, 4095)), draw(st.integers(0, 7))
            out.append(("flip", table, col, rowid, pos, bit))
        elif kind == "json":
            value = draw(st.sampled_from(JSON_VALUES))
            raw = draw(st.sampled_from([json.dumps(value), "{not json", json.dumps(value)[:-1]]))
            out.append((sql, raw, rowid))
        elif kind == "number":
            out.append((sql, draw(st.sampled_from(NUMBERS)), rowid))
        else:
            out.append((sql, draw(st.sampled_from(TEXTS)), rowid))
    return out


def _nan_as_null(v: Any) -> Any:
    return None if isinstance(v, float) and math.isnan(v) else v  # what SQLite stores anyway


def _damage(path: Path, muts: list[tuple[Any, ...]]) -> None:
    con = sqlite3.connect(path)
    try:
        for m in muts:
            if m[0] == "flip":
                _, table, col, rowid, pos, bit = m
                got = con.execute(f"SELECT {col} FROM {table} WHERE rowid = ?", (rowid,)).fetchone()
                if got is None:
                    continue  # an earlier mutation deleted the row
                blob = bytearray(got[0] or b"\x00")
                blob[pos % len(blob)] ^= 1 << bit
                con.execute(f"UPDATE {table} SET {col} = ? WHERE rowid = ?", (bytes(blob), rowid))
            else:
                try:
                    con.execute(m[0], [_nan_as_null(v) for v in m[1:]])
                except sqlite3.IntegrityError:
                    pass  # NOT NULL and CHECK constraints: SQLite itself keeps these out
        con.commit()
    finally:
        con.close()


def _check_output(res: Any, cmd: list[str], muts: Any) -> None:
    where = f"replay {' '.join(cmd)} after {muts}"
    text = res.stdout + res.stderr
    assert res.returncode in (0, 2, 3), f"{where}: exit {res.returncode}: {res.stderr}"
    assert "Traceback" not in text, f"{where}: {text}"
    assert "internal error" not in text, f"{where}: {res.stderr}"
    lines = res.stderr.strip().splitlines()
    assert len(lines) <= 1, f"{where}: {len(lines)} lines on stderr: {res.stderr}"


# the commands run in this process, but the 2-rank base is recorded under mpiexec (the
# layer scan cannot see it)
@pytest.mark.mpi
@_settings(CI_READ_EXAMPLES)
@given(data=st.data())
def test_read_commands_on_damaged_traces(bases: Any, data: Any) -> None:
    base = bases[data.draw(st.sampled_from(["two", "one"]), label="base")]
    muts = data.draw(mutations(base), label="mutations")
    commands = ["show", "show --json", "ls", "export"] + (["verify"] if bases["verify"] else [])
    which = data.draw(st.sampled_from(commands), label="command")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        trace = root / "t.sqlite"
        shutil.copyfile(base, trace)
        _damage(trace, muts)
        cmd = which.split() + [str(root if which == "ls" else trace)]
        if which == "export":
            cmd += ["-o", str(root / "out.json")]
        before = _files(root, set())
        res = _run(cmd, COMMAND_S)
        _check_output(res, cmd, muts)
        after = _files(root, {"out.json"})
        assert after == before, f"replay {' '.join(cmd)} changed files after {muts}"


@_settings(CI_REPLAY_EXAMPLES)
@given(data=st.data())
def test_replay_commands_on_damaged_traces(one_rank: Path, data: Any) -> None:
    base = one_rank
    muts = data.draw(mutations(base), label="mutations")
    which = data.draw(st.sampled_from(["cluster", "single"]), label="command")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        trace = root / "t.sqlite"
        shutil.copyfile(base, trace)
        _damage(trace, muts)
        before_files = _files(root, {"t.sqlite", "t.sqlite-wal"})
        before = _contents(trace)
        cmd = [which, str(trace), "--timeout", "60"] if which == "cluster" else [which, str(trace)]
        res = _run(cmd, REPLAY_S)
        _check_output(res, cmd, muts)
        assert _files(root, {"t.sqlite", "t.sqlite-wal"}) == before_files
        after = _contents(trace)
        grew = after.pop("verdict")[0] - before.pop("verdict")[0]
        assert after == before, f"replay {' '.join(cmd)} changed the trace after {muts}"
        assert grew in (0, 1)


# ------------------------------------------------------------ in process: rows, paths, URLs
#: Examples per in-process test in CI (each takes well under a second); the ``ci``
#: hypothesis profile or ``STRADS_FUZZ_EXAMPLES`` raise it.
CI_INPROCESS_EXAMPLES = 25
#: Seconds one in-process command may take: a hang must fail the test, not CI.
INPROCESS_S = 30
#: Run-row values; those a column may hold (a seed of 0 or 10**12) are left out for it.
FORGED = [0, -1, 10**12, 2**63, "9" * 400, "x" * 100_000, 1.5, None]
#: What a forged ``epochs`` parameter becomes in the run's params JSON.
FORGED_EPOCHS = [0, -1, 10**12, -(10**12), "9" * 400, "x" * 100_000, 1.5, None, [1]]


def _inprocess_settings() -> settings:
    """The small CI budget, raised by the ``ci`` profile or ``STRADS_FUZZ_EXAMPLES``."""
    profile = os.environ.get("HYPOTHESIS_PROFILE")
    ci = settings.get_profile(profile).max_examples if profile == "ci" else 0
    return settings(
        max_examples=_LOCAL or max(CI_INPROCESS_EXAMPLES, ci),
        deadline=None,
        derandomize=not _LOCAL,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        database=None,
    )


def _invoke(args: list[str]) -> Any:
    """``replay ARGS`` in this process; the result, with ``seconds`` it took."""
    import time

    from click.testing import CliRunner

    from replay._cli import cli

    t0 = time.monotonic()
    res = CliRunner().invoke(cli, args)
    res.seconds = time.monotonic() - t0
    return res


def _refused(res: Any, args: list[str], codes: tuple[int, ...] = (2,)) -> None:
    where = f"replay {' '.join(args)[:300]}"
    assert res.exit_code in codes, f"{where}: exit {res.exit_code}: {res.stderr} {res.exception!r}"
    assert "Traceback" not in res.stderr + res.stdout, f"{where}: {res.stderr}"
    assert "internal error" not in res.stderr, f"{where}: {res.stderr}"
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("replay: error: "), f"{where}: {res.stderr}"
    assert res.seconds < INPROCESS_S, f"{where}: took {res.seconds:.1f} s"


def _fits_row(col: str, value: Any) -> bool:
    lo, hi = tracer.RUN_LIMITS[col]
    return isinstance(value, int) and lo <= value <= hi


@pytest.fixture(scope="module")
def small_trace(trace_library: Any) -> Path:
    """One epoch of mlr on one rank, from the trace library: read only, tests copy it."""
    return trace_library.get(*MLR_1)


@pytest.mark.timeout(300)
@_inprocess_settings()
@given(
    col=st.sampled_from(["ranks", "threads", "seed", "epochs"]),
    data=st.data(),
    command=st.sampled_from(["show", "show --json", "verify", "cluster", "single"]),
)
def test_forged_run_row_values(
    small_trace: Path, col: str, data: Any, command: str, tmp_path_factory: Any
) -> None:
    values = FORGED_EPOCHS if col == "epochs" else [v for v in FORGED if not _fits_row(col, v)]
    value = data.draw(st.sampled_from(values), "value")
    root = tmp_path_factory.mktemp("forged")
    trace = root / "t.sqlite"
    shutil.copyfile(small_trace, trace)
    con = sqlite3.connect(trace)
    try:
        if col == "epochs":
            params = json.loads(con.execute("SELECT params FROM run").fetchone()[0])
            con.execute("UPDATE run SET params = ?", (json.dumps(dict(params, epochs=value)),))
        else:
            stored = str(value) if isinstance(value, int) and abs(value) >= 2**63 else value
            try:
                con.execute(f"UPDATE run SET {col} = ?", (stored,))
            except sqlite3.IntegrityError:
                return  # SQLite's NOT NULL keeps it out: nothing to read
        con.commit()
    finally:
        con.close()
    before = _files(root, set())
    args = [*command.split(), str(trace)]
    res = _invoke(args)
    # every run-row field that steers a run is under the hash chain: an edited value is
    # refused (exit 2) by every reader, before any range check or replay
    _refused(res, args, (2, 3))
    assert _files(root, set()) == before, f"replay {' '.join(args)} changed the trace"


@st.composite
def odd_urls(draw: Any) -> str:
    """Database URLs a user may mistype: an unencoded password, an unknown dialect, no host,
    a port no server can have (nothing listens on 127.0.0.1:1 either)."""
    kind = draw(st.sampled_from(["password", "dialect", "host", "port"]))
    password = "secret"
    dialect, host, port = "postgresql+psycopg", "127.0.0.1", "1"
    if kind == "password":
        ch = st.sampled_from(list("@:/%") + ["a", "%4", "%zz"])
        password = "".join(draw(st.lists(ch, min_size=1, max_size=6)))
        if not any(c in password for c in "@/%"):
            password += "@"
    elif kind == "dialect":
        dialect = draw(st.sampled_from(["nosuch", "postgresql+nosuch", "mysql+nosuch", "x"]))
    elif kind == "host":
        host = draw(st.sampled_from(["", ":", "[", "[::1", "@"]))
    else:
        port = str(draw(st.one_of(st.integers(65536, 10**12), st.integers(-(10**6), -1))))
    return f"{dialect}://user:{password}@{host}:{port}/db"


def _odd_path(kind: str, root: Path) -> tuple[list[str], str]:
    """(arguments, the path given) for a path that is not what a command expects."""
    if kind == "loop":
        (root / "loop").symlink_to("loop")
        return [], "loop"
    if kind == "loop-in-dir":
        (root / "d").symlink_to("d")
        return [], "d/t.sqlite"
    (root / "f").write_text("a file\n")
    return [], "f/t.sqlite"  # a file where a directory is expected


@pytest.mark.timeout(300)
@_inprocess_settings()
@given(
    target=st.one_of(
        odd_urls(), st.sampled_from(["path:loop", "path:loop-in-dir", "path:not-a-dir"])
    ),
    command=st.sampled_from(
        [
            "show {t}",
            "ls {t}",
            "cluster {t}",
            "single {t}",
            "history {t} W[0]",
            "resume {t}",
            "run mlr -p synthetic=true --trace {t}",
            "cluster {trace} --trace-out {t}",
            "dual mlr --in-process -p synthetic=true --trace {t}",
        ]
    ),
)
def test_odd_paths_and_urls(
    small_trace: Path, target: str, command: str, tmp_path_factory: Any, monkeypatch: Any
) -> None:
    root = tmp_path_factory.mktemp("odd")
    monkeypatch.chdir(root)
    if target.startswith("path:"):
        _, target = _odd_path(target[5:], root)
    trace = root / "t.sqlite"
    shutil.copyfile(small_trace, trace)
    before = _files(root, set())
    args = [a.format(t=target, trace=trace) for a in command.split()]
    res = _invoke(args)
    _refused(res, args)
    assert _files(root, set()) == before, f"replay {' '.join(args)} changed files"
    assert "secret" not in res.stderr
