"""The hash chain: any damage to a chained row is found by ``verify`` and refused on open."""

from __future__ import annotations

import shutil
import sqlite3
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_trace_mpi import HERE, mpirun
from tracehelp import record, reseal

import tracer
from replay._cli import cli
from tests.traces import settle
from tracer._chain import CHAINED, KEY_ENV
from tracer._schema import OLDEST_READABLE

#: Tables whose rows the chain covers, plus the chain itself.
TABLES = [m.__tablename__ for m, _ in CHAINED] + ["chain_link"]


@pytest.fixture(scope="session")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Undamaged traces of the toy run on 1, 2 and 3 nodes (copy before damaging)."""
    out = {}
    for nodes in (1, 2, 3):
        path = tmp_path_factory.mktemp(f"chain{nodes}") / "t.sqlite"
        record(path, nodes=nodes, threads=2, run_id=f"r{nodes}")
        settle(path)
        out[nodes] = path
    return out


def _copy(src: Path, dst_dir: Path) -> Path:
    """A byte copy of the whole trace: the write-ahead log folded in first, so that every
    example of a hypothesis test sees the same rows (else its draws are not replayable)."""
    settle(src)
    dst = dst_dir / f"copy-{len(list(dst_dir.iterdir()))}.sqlite"
    shutil.copyfile(src, dst)
    return dst


def _problem(path: Path, *, full: bool) -> tracer.Problem | None:
    with tracer.open(path, assume_finished=True) as trace:
        return trace.verify(full=full).problem


@pytest.mark.parametrize("nodes", [1, 2, 3])
def test_undamaged_traces_verify(traces: dict[int, Path], nodes: int) -> None:
    with tracer.open(traces[nodes]) as trace:
        rep = trace.verify(full=True)
        assert rep.ok, rep.problem
        assert rep.nodes == nodes and rep.tail == 0 and not rep.keyed
        assert rep.blocks >= 2 * nodes + 3  # invocations of every node, digests, objectives
        assert trace.verify(full=False).ok
        trace.ensure_intact()


# --------------------------------------------------------------------- damage
def _columns(con: sqlite3.Connection, table: str) -> list[tuple[str, str]]:
    return [(r[1], r[2].upper()) for r in con.execute(f"PRAGMA table_info({table})")]


@st.composite
def damage(draw: st.DrawFn, path: Path) -> tuple[str, int, str, str | None]:
    """(table, row id, mutation, column): one class of damage to one row."""
    with sqlite3.connect(path) as con:
        table = draw(st.sampled_from([t for t in TABLES if _count(con, t)]))
        ids = [r[0] for r in con.execute(f"SELECT id FROM {table} ORDER BY id")]
        cols = _columns(con, table)
    row = draw(st.sampled_from(ids))
    kinds = {"delete": [None]}
    for name, typ in cols:
        if name == "id":  # the database's row id is not content
            continue
        key = {"BLOB": "flip", "FLOAT": "float", "REAL": "float"}.get(typ, "int")
        if "CHAR" in typ or "TEXT" in typ:
            key = "text"
        kinds.setdefault(key, []).append(name)
    kind = draw(st.sampled_from(sorted(kinds)))
    return table, row, kind, draw(st.sampled_from(kinds[kind]))


def _count(con: sqlite3.Connection, table: str) -> int:
    return int(con.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def apply(path: Path, table: str, row: int, kind: str, col: str | None) -> None:
    """Apply one mutation with sqlite3 (what a bad disk or an editor would do)."""
    with sqlite3.connect(path) as con:
        if kind == "delete":
            con.execute(f"DELETE FROM {table} WHERE id = ?", (row,))
            return
        (val,) = con.execute(f"SELECT {col} FROM {table} WHERE id = ?", (row,)).fetchone()
        if kind == "flip":
            b = bytearray(val or b"")
            if not b:
                b = bytearray(b"\x00")  # an empty blob becomes a one-byte one
            else:
                b[len(b) // 2] ^= 0x5A
            new: object = bytes(b)
        elif kind == "int":
            new = int(val) + 1
        elif kind == "float":
            bits = struct.unpack("<q", struct.pack("<d", float(val)))[0]
            new = struct.unpack("<d", struct.pack("<q", bits ^ 1))[0]  # last bit only
        else:
            new = f"{val}x"
        try:
            con.execute(f"UPDATE {table} SET {col} = ? WHERE id = ?", (new, row))
        except sqlite3.IntegrityError:  # +1 collides with a unique key: go far instead
            con.execute(f"UPDATE {table} SET {col} = ? WHERE id = ?", (int(val) + 10**6, row))


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data(), nodes=st.sampled_from([2, 3]))
def test_any_damaged_row_is_found(
    traces: dict[int, Path], tmp_path: Path, data: st.DataObject, nodes: int
) -> None:
    path = _copy(traces[nodes], tmp_path)
    table, row, kind, col = data.draw(damage(path))
    apply(path, table, row, kind, col)
    full = _problem(path, full=True)
    cheap = _problem(path, full=False)
    assert full is not None, (table, row, kind, col)
    assert cheap is not None, (table, row, kind, col)  # the open check refuses it too
    assert "\n" not in full.line()


def _run_cli(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli, list(args))
    return res.exit_code, res.stdout, res.stderr


@pytest.mark.parametrize(
    ("sql", "table"),
    [
        ("DELETE FROM invocation_set", "invocation_set"),
        ("UPDATE invocation_set SET routed = x'00ff00ff00ff' WHERE id = 1", "invocation_set"),
        ("UPDATE invocation_set SET counters_codec = 'zlib-i8' WHERE id = 1", "invocation_set"),
        ("UPDATE objective SET value = value + 1.0", "objective"),
    ],
)
def test_cli_refuses_damage_in_one_line(
    traces: dict[int, Path], tmp_path: Path, sql: str, table: str
) -> None:
    path = _copy(traces[2], tmp_path)
    with sqlite3.connect(path) as con:
        con.execute(sql)
    code, out, err = _run_cli("verify", str(path))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and f"table {table} node" in err
    code, out, err = _run_cli("verify", str(path), "--json")
    doc = __import__("json").loads(out)
    assert code == 2 and doc["ok"] is False and doc["problem"]["table"] == table
    for cmd in ("show", "single", "cluster"):
        code, out, err = _run_cli(cmd, str(path))
        assert code == 2, (cmd, out, err)
        assert len(err.strip().splitlines()) == 1 and "is damaged" in err, (cmd, err)


def test_cli_verifies_an_undamaged_trace(traces: dict[int, Path]) -> None:
    code, out, _ = _run_cli("verify", str(traces[3]))
    assert code == 0 and out.startswith("ok: ") and "blocks on 3 nodes verified" in out
    code, out, _ = _run_cli("verify", str(traces[3]), "--json")
    doc = __import__("json").loads(out)
    assert code == 0 and doc["ok"] is True and doc["problem"] is None and doc["blocks"] > 0


def test_browser_lists_a_damaged_trace_as_unreadable(
    traces: dict[int, Path], tmp_path: Path
) -> None:
    from tui._repo import Repository

    path = _copy(traces[2], tmp_path)
    with sqlite3.connect(path) as con:
        con.execute("DELETE FROM digest WHERE id = 2")
    repo = Repository([path])
    [entry] = repo.entries()
    assert entry.runs == () and entry.error is not None
    assert "is damaged: table digest node" in entry.error


# --------------------------------------------------------------------- keys
def test_keyed_chain_needs_its_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "keyed.sqlite"
    monkeypatch.setenv(KEY_ENV, "s3cret")
    record(path, nodes=2, threads=1, epochs=1)
    assert _problem(path, full=True) is None
    monkeypatch.setenv(KEY_ENV, "wrong")
    bad = _problem(path, full=True)
    assert bad is not None and "key is wrong" in bad.what
    monkeypatch.delenv(KEY_ENV)
    need = _problem(path, full=True)
    assert need is not None and KEY_ENV in need.what
    assert _problem(path, full=False) is None  # rows still match their manifests
    code, _, err = _run_cli("verify", str(path))
    assert code == 2 and KEY_ENV in err
    # an editor who re-hashes a row's manifest entry without the key breaks the HMAC
    with sqlite3.connect(path) as con:
        con.execute("UPDATE objective SET value = value + 1")
    assert _problem(path, full=False) is not None


def test_an_unkeyed_trace_is_not_tamper_evidence(
    traces: dict[int, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "s3cret")
    bad = _problem(traces[1], full=True)
    assert bad is not None and "recorded without a key" in bad.what


def test_older_trace_is_refused(traces: dict[int, Path], tmp_path: Path) -> None:
    path = _copy(traces[1], tmp_path)
    with sqlite3.connect(path) as con:
        con.execute("UPDATE schema_info SET version = ?", (OLDEST_READABLE - 1,))
    with pytest.raises(tracer.TraceFormatError, match="is an older trace"):
        tracer.open(path)


# --------------------------------------------------------------------- crash
def test_crashed_trace_verifies_up_to_its_last_invocation(tmp_path: Path) -> None:
    path = tmp_path / "killed.sqlite"
    tracer.start_run(path, "k", {"app": "sgd", "ranks": 2})
    res = mpirun(2, str(HERE / "mpi_trace_prog.py"), str(path), "k", "5", "2")
    assert res.returncode != 0
    with tracer.open(path, assume_finished=True) as trace:
        rep = trace.verify(full=True)
        assert rep.ok, rep.problem
        assert rep.nodes == 2
    code, out, _ = _run_cli("verify", str(path))
    assert code == 0 and "on 2 nodes verified" in out
    # the crashed run's completed invocations are still protected
    with sqlite3.connect(path) as con:
        con.execute("DELETE FROM invocation_set WHERE node = 1 AND invocation = 0")
    assert _problem(path, full=False) is not None


# --------------------------------------------------------------------- a determined editor
_rechain = reseal


def test_a_rechained_edit_passes_the_chain_but_not_the_cross_references(
    traces: dict[int, Path], tmp_path: Path
) -> None:
    path = _copy(traces[2], tmp_path)
    with sqlite3.connect(path) as con:
        con.execute("DELETE FROM invocation_set WHERE id = (SELECT min(id) FROM invocation_set)")
    _rechain(path)
    assert _problem(path, full=False) is None  # without a key the chain is no proof
    bad = _problem(path, full=True)
    assert bad is not None and "without gaps" in bad.what


# ------------------------------------------------------- every link, every field
def test_every_header_field_of_every_link_is_covered(trace_library, tmp_path: Path) -> None:
    """Each integer field of each link row, main and side (time-travel) links alike, when
    changed is found by the full check and by the check on open.  Found by hypothesis: a
    side link whose ``keyed`` flag was set skipped its own link check, so ``verify`` said
    ok for a trace whose side chain nobody could check."""
    src = trace_library.get("mlr", "-p", "synthetic=true", "-p", "epochs=1")
    with sqlite3.connect(src) as con:
        ids = [r[0] for r in con.execute("SELECT id FROM chain_link ORDER BY id")]
        sides = con.execute("SELECT count(*) FROM chain_link WHERE link_no < 0").fetchone()[0]
        cols = [n for n, t in _columns(con, "chain_link") if n != "id" and t == "INTEGER"]
    assert sides > 0 and "keyed" in cols  # the run has side links to damage
    missed = []
    for row in ids:
        for col in cols:
            path = _copy(src, tmp_path)
            apply(path, "chain_link", row, "int", col)
            if _problem(path, full=True) is None or _problem(path, full=False) is None:
                missed.append((row, col))
            path.unlink()
    assert missed == []


@given(
    bad=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: x != 5),
        st.integers().filter(lambda n: not -(2**63) <= n < 2**63),
        st.text(alphabet="abc .-", max_size=5),
    )
)
def test_a_damaged_integer_in_a_link_header_fails_to_match_never_crashes(bad) -> None:
    """Whatever a damaged store holds in a link's integer column (huge, fractional,
    text), hashing the link gives bytes no recorded header gives, not an exception."""
    from tracer._chain import link_of

    header = {"run": "r", "node": 0, "link_no": 1, "first_seq": 0, "end_seq": 5, "op": "sgd"}
    header |= {"invocation": 0, "keyed": False}
    genuine = link_of(b"", header, b"", None)
    damaged = link_of(b"", header | {"end_seq": bad}, b"", None)
    assert damaged != genuine
    assert link_of(b"", header | {"end_seq": 5.0}, b"", None) == genuine  # SQLite's 5.0


NO_LOOP = """
import engine as ap


def train(epochs: int = 0, collective: bool = True, log: bool = False):
    X = ap.dvector(6, shape=(), init=ap.init.zeros(), name="X")
    if collective:
        ap.reduce(X, lambda x: float(x))
    for _ in range(epochs):

        def body(j):
            X[j] = X[j] + 1.0

        ap.async_for(0, 6, body, name="add")
    if log:
        ap.log_objective("total", 0.0)
"""


@pytest.mark.parametrize(
    "params",
    [[], ["-p", "collective=false"], ["-p", "log=true"], ["-p", "epochs=1"]],
    ids=["collective-only", "nothing", "objective-only", "one-invocation"],
)
def test_a_run_without_a_loop_invocation_reads_as_intact(
    tmp_path: Path, cli, params: list[str]
) -> None:
    """A run that committed no invocation (``-p epochs=0``) used to leave its primary
    node without a chain, and every command that reads a trace called it damaged."""
    app = tmp_path / "noloop.py"
    app.write_text(NO_LOOP)
    trace = tmp_path / "t.sqlite"
    assert cli("run", f"{app}:train", *params, "--trace", trace).returncode == 0
    for cmd in (["verify", trace], ["show", trace], ["single", trace]):
        proc = cli(*cmd)
        assert proc.returncode == 0, (cmd, proc.stderr)
        assert "damaged" not in proc.stdout + proc.stderr
