"""Inputs that once gave exit 70 or a traceback: each is now one line on stderr and exit 2."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import sqlite3
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracer
from tests import cli as tcli
from tests.conftest import ROOT
from tests.tracer.tracehelp import reseal
from tests.traces import MLR_1

DATA = ROOT / "tests" / "data"


def readme_app() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Writing an app") :]
    return re.search(r"```python\n(# train.py\n.*?)```", section, re.S).group(1)


@pytest.fixture
def mlr1(trace_library) -> Path:
    """A 1-rank MLR trace, shared read-only (tests damage copies of it)."""
    return trace_library.get(*MLR_1)


def one_line_exit_2(args: list[str], *needles: str, **kw) -> str:
    res = tcli.invoke(args, **kw)
    err = res.stderr.strip()
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert len(err.splitlines()) == 1 and err.startswith("replay: error: "), err
    assert "Traceback" not in res.stderr and "internal error" not in err, err
    for n in needles:
        assert n in err, err
    return err


def damaged(src: Path, tmp_path: Path, sql: str, *params: object) -> Path:
    dst = tmp_path / "t.sqlite"
    shutil.copyfile(src, dst)
    with sqlite3.connect(dst) as con:
        con.execute(sql, params)
    con.close()
    if sql.upper().startswith("UPDATE RUN "):
        reseal(dst)  # the chain would refuse it first: exercise the checks behind it
    return dst


def test_schema_version_that_is_not_a_number(mlr1: Path, tmp_path: Path, cli) -> None:
    t = damaged(mlr1, tmp_path, "UPDATE schema_info SET version = 'abc'")
    one_line_exit_2(["show", str(t)], "invalid trace schema version 'abc'")
    res = cli("ls", str(tmp_path))
    assert res.returncode == 0 and "invalid trace schema version" in res.stdout
    assert res.stderr == "replay: note: skipped 1 unreadable file(s)\n"


@pytest.mark.parametrize(
    ("sql", "cmd", "needle"),
    [
        ("UPDATE run SET params = '[1, 2]'", "show", "column params is not a JSON object"),
        ("UPDATE run SET threads = 0", "show", "column threads holds 0"),
        ("UPDATE run SET ranks = -1", "cluster", "column ranks holds -1"),
        ("UPDATE run SET ranks = 'two'", "single", "column ranks holds 'two'"),
        ("UPDATE run SET params = '{\"nope\": 1}'", "single", "parameter 'nope' that"),
        ('UPDATE run SET params = \'{"epochs": "2"}\'', "cluster", "epochs='2' (str)"),
        ("UPDATE verdict SET detail = '[]'", "show", None),
    ],
)
def test_damaged_run_rows(mlr1: Path, tmp_path: Path, sql: str, cmd: str, needle: str, cli) -> None:
    t = damaged(mlr1, tmp_path, sql)
    if needle is None:  # show does not read verdicts: a bad one does not stop it
        assert cli(cmd, str(t)).returncode == 0
        return
    one_line_exit_2([cmd, str(t)], needle)


def test_message_sources_that_are_not_ranks(tmp_path: Path) -> None:
    # a schema-6 trace: its routed arrivals name their sources (schema 7 counts them)
    t = tmp_path / "sgdmf4.sqlite"
    t.write_bytes(gzip.decompress((DATA / "sgdmf_rot_4.sqlite.gz").read_bytes()))
    with sqlite3.connect(t) as con:
        for row_id, count in con.execute("SELECT id, count FROM message_block").fetchall():
            blob = np.full(count, 7, np.uint8).tobytes()
            con.execute(
                "UPDATE message_block SET sources = ?, sources_codec = 'raw-u8' WHERE id = ?",
                (blob, row_id),
            )
    con.close()
    # the hash chain sees the edit first; without it, the source check before launch would
    one_line_exit_2(["cluster", str(t)], "message_block node 0")
    from replay._replay import check_replayable, open_run

    with pytest.raises(tracer.TraceFormatError, match="from rank 7, but the run had 4 rank"):
        check_replayable(open_run(str(t), None))


@pytest.mark.parametrize("cmd", ["run", "dual"])
def test_negative_seed(cmd: str) -> None:
    one_line_exit_2([cmd, "mlr", "--seed", "-1", "--no-trace"], "--seed must be")


@pytest.mark.parametrize(
    ("content", "needle"),
    [("", "reduce of empty 'A'"), ("1,2,3.0\n99999999999999999999,1,2.0\n", "check the data")],
)
def test_bad_data_for_the_readme_app(tmp_path: Path, content: str, needle: str) -> None:
    (tmp_path / "train.py").write_text(readme_app())
    (tmp_path / "ratings.csv").write_text(content)
    one_line_exit_2(["run", "train.py:train", "--no-trace", "-p", "epochs=1"], needle, cwd=tmp_path)


@pytest.mark.parametrize(
    ("content", "needle"),
    [("", "no ratings"), ("1\t2\t3\t0\n99999999999999\t1\t2\t0\n", "check the data")],
)
def test_bad_data_for_sgdmf(tmp_path: Path, content: str, needle: str) -> None:
    data = tmp_path / "r.tsv"
    data.write_text(content)
    one_line_exit_2(["run", "sgdmf", "--no-trace", "-p", f"data={data}", "-p", "epochs=1"], needle)


@pytest.mark.parametrize(
    "args,kind,status",
    [
        (["show", "missing.sqlite", "--json"], "usage", 2),
        (["cluster", "--json", "missing.sqlite"], "usage", 2),
        (["single", "missing.sqlite", "--json", "--timeout", "0"], "usage", 2),
        (["run", "no_such_app", "--json"], "usage", 2),
        (["verify", "missing.sqlite", "--json"], "usage", 2),
    ],
)
def test_json_errors_are_one_object_on_stdout(
    tmp_path: Path, args: list[str], kind: str, status: int, cli
) -> None:
    res = cli(*args, cwd=tmp_path)
    assert res.returncode == status, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr
    (line,) = res.stdout.splitlines()
    err = json.loads(line)["error"]
    assert err["kind"] == kind and err["message"] and "\n" not in err["message"]


def test_a_json_success_carries_no_error_object(tmp_path: Path, mlr1: Path, cli) -> None:
    res = cli("show", str(mlr1), "--json")
    assert res.returncode == 0 and "error" not in json.loads(res.stdout)


def test_a_reader_that_goes_away_is_not_an_internal_error(tmp_path: Path) -> None:
    """``replay ls | head``: the reader closes the pipe before the command writes; the
    command ends as one killed by SIGPIPE would (141), saying nothing."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "replay", "ls", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # long before the interpreter has started and written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert err == ""


FAILING = """
import numpy as np
import engine as ap


def train(where: str = "driver"):
    X = ap.dvector(8, shape=(), init=ap.init.zeros(), name="X")

    def body(j):
        if where == "body_reduce":
            ap.reduce(X)  # <- body_reduce
        X[j] = X[j] + 1.0

    ap.async_for(0, 8, body, name="b")
    if where == "driver":
        np.log(np.zeros(2)).sum() / {}  # <- driver
    if where == "lambda":
        ap.reduce(X, lambda x: x / "s")  # <- lambda
"""


@pytest.mark.parametrize(
    "where,ranks,needles",
    [
        ("driver", 1, ["the program failed: TypeError"]),
        # in-process, but --ranks 2 starts mpiexec
        pytest.param("driver", 2, ["the program failed: TypeError"], marks=pytest.mark.mpi),
        pytest.param("lambda", 2, ["the program failed: TypeError"], marks=pytest.mark.mpi),
        pytest.param(
            "body_reduce", 2, ["ap.reduce was called inside a loop body"], marks=pytest.mark.mpi
        ),
    ],
)
def test_the_programs_own_errors_name_its_line_not_an_internal_error(
    tmp_path: Path, where: str, ranks: int, needles: list[str], cli
) -> None:
    """An exception the program raises (in the driver, in a function it gives an operator,
    or one of our checks a body trips) is the program's failure: exit 1 and its file and
    line, never 'internal error' (exit 70), which is for our own bugs."""
    path = tmp_path / "failing.py"
    path.write_text(FAILING)
    line = next(k for k, x in enumerate(FAILING.splitlines(), 1) if x.endswith(f"<- {where}"))
    needles = [*needles, f"failing.py:{line}"]
    res = cli("run", f"{path}:train", "-p", f"where={where}", "--ranks", str(ranks))
    err = res.stderr.strip().splitlines()[-1]
    assert res.returncode == 1, (res.returncode, res.stderr)
    assert err.startswith("replay: error: ") and "internal error" not in err, err
    assert "Traceback" not in res.stderr
    for n in needles:
        assert n in err, err


# ---------------------------------------------------------------- in process (CliRunner)
#: A password with every character that must be percent-encoded, unencoded; nothing
#: listens on port 1, so a connection attempt (there must be none) would fail at once.
BAD_PASSWORD_URL = "postgresql+psycopg://u:p@ss:w/rd%@127.0.0.1:1/db"


def _tree(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root``: a file's bytes, a symlink's target."""
    out: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        key = str(p.relative_to(root))
        if p.is_symlink():
            out[key] = "-> " + str(p.readlink())
        elif p.is_file():
            out[key] = p.read_bytes()
    return out


def refused_in_process(args: list[str], root: Path, *needles: str) -> str:
    """``replay ARGS`` run in this process: exit 2, one line, nothing under ``root`` changed."""
    from click.testing import CliRunner

    from replay._cli import cli

    before = _tree(root)
    res = CliRunner().invoke(cli, args)
    err = res.stderr.strip()
    assert res.exit_code == 2, (res.exit_code, res.stderr, res.exception)
    assert len(err.splitlines()) == 1 and err.startswith("replay: error: "), err
    assert "Traceback" not in res.stderr and "internal error" not in err, err
    for n in needles:
        assert n in err, err
    assert _tree(root) == before
    return err


@pytest.fixture
def loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``loop``, a symbolic link to itself, in the current directory."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "loop").symlink_to("loop")
    return tmp_path / "loop"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "args",
    [
        ["history", "loop", "W[1]"],
        ["watch", "loop", "W[1] > 0"],
        ["single", "loop"],
        ["cluster", "loop"],
        ["resume", "loop"],
        ["show", "loop"],
        ["run", "mlr", "-p", "synthetic=true", "--trace", "loop"],
        ["dual", "mlr", "--in-process", "--trace", "loop"],
        ["chaos", "mlr", "--runs", "1", "--chaos-seed", "0", "--trace", "loop"],
    ],
    ids=lambda a: "-".join(a[:1] + a[-2:-1]),
)
def test_a_symlink_loop_is_a_usage_error(args: list[str], loop: Path) -> None:
    refused_in_process(args, loop.parent, "loop is a symbolic link loop")


@pytest.mark.timeout(120)
def test_a_symlink_loop_as_trace_out_is_a_usage_error(mlr1: Path, loop: Path) -> None:
    refused_in_process(
        ["cluster", str(mlr1), "--trace-out", "loop"], loop.parent, "loop is a symbolic link loop"
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "args",
    [
        ["run", "mlr", "-p", "synthetic=true"],
        ["dual", "mlr", "--in-process"],
        ["chaos", "mlr", "--runs", "1", "--chaos-seed", "0"],
    ],
    ids=lambda a: a[0],
)
def test_a_file_named_traces_is_not_the_default_directory(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "traces").write_text("my notes\n")
    refused_in_process(args, tmp_path, "traces is not a directory", "--trace PATH")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("url", "needle"),
    [
        (BAD_PASSWORD_URL, "holds an unencoded '@'"),
        ("postgresql+psycopg://u:p@ss@127.0.0.1:1/db", "holds an unencoded '@'"),
        ("postgresql+psycopg://u:pa/ss@127.0.0.1:1/db", "holds an unencoded '/'"),
        ("postgresql+psycopg://u:pa%zz@127.0.0.1:1/db", "'%' that does not start a %XX"),
        ("postgresql+psycopg://u:pass@127.0.0.1:port/db", "its port is not a number"),
    ],
)
@pytest.mark.parametrize(
    "cmd", [["show"], ["ls"], ["cluster"], ["run", "mlr", "--trace"]], ids=lambda c: c[0]
)
def test_an_unencoded_password_is_refused_at_parsing(
    url: str, needle: str, cmd: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    err = refused_in_process([*cmd, url], tmp_path, needle)
    assert "percent-encode the user and password" in err, err
    for secret in ("ss:w", "rd%", "pa/ss", "pa%zz", "p@ss"):
        assert secret not in err, err


PARSE_RAISES = """
import engine as ap


def parse(line):
    if "x" in line:
        raise ValueError(MESSAGE)
    return int(line)


def train(path: str = "data.txt"):
    A = ap.load(path, parse=parse, name="A")
    W = ap.dvector(len(A), shape=(1,), name="W")

    def body(j):
        if A[j] == 3:
            raise RuntimeError(MESSAGE)
        W[j] = W[j] + 1.0

    ap.async_for(0, len(A), body, name="b")
"""


@pytest.mark.parametrize(
    "message", ["bad record:\n  7,x\n  expected an int", "\n\nfirst\r\nsecond\n", "a\u2028b"]
)
def test_a_users_message_of_several_lines_is_one_line(message: str, tmp_path: Path) -> None:
    """A parser's or a loop body's exception may say several lines; the CLI's error is
    still one line, with every line of the message on it."""
    prog = tmp_path / "prog.py"
    prog.write_text(PARSE_RAISES.replace("MESSAGE", repr(message)))
    words = [w for w in message.split() if w]
    (tmp_path / "data.txt").write_text("1\n2\nx\n")
    err = one_line_exit_2(["run", f"{prog}:train", "--no-trace"], "data.txt:3: ", cwd=tmp_path)
    assert all(w in err for w in words), err
    (tmp_path / "data.txt").write_text("1\n2\n3\n")
    res = tcli.invoke(["run", f"{prog}:train", "--no-trace"], cwd=tmp_path)
    err = res.stderr.strip()
    assert res.returncode == 1 and len(err.splitlines()) == 1, err
    assert err.startswith("replay: error: loop body failed: ") and all(w in err for w in words)


@pytest.mark.parametrize(
    "url", ["sqlite://", "sqlite:///:memory:", "sqlite+pysqlite://", "SQLITE:///:memory:"]
)
@pytest.mark.parametrize(
    "command",
    [
        ["run", "mlr", "-p", "synthetic=true", "-p", "epochs=1"],
        ["dual", "mlr", "-p", "synthetic=true", "-p", "epochs=1", "--in-process"],
        ["chaos", "mlr", "-p", "synthetic=true", "--runs", "1", "--chaos-seed", "1"],
    ],
)
def test_an_in_memory_trace_is_refused_before_the_run(
    command: list[str], url: str, tmp_path: Path
) -> None:
    """The run recorded into an in-memory SQLite database, printed ``trace: sqlite://``
    and exited 0: the trace it named was gone when the command ended."""
    err = one_line_exit_2([*command, "--trace", url], "in-memory SQLite", cwd=tmp_path)
    assert url in err
    assert not (tmp_path / "traces").exists()


#: Characters a terminal acts on: C0/C1 controls, line and paragraph separators, and
#: the invisible direction marks and overrides ("Trojan source").
ACTS_ON_TERMINAL = re.compile(
    "[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)
hostile_text = st.lists(
    st.characters(categories=("Cc",))
    | st.sampled_from(["\u2028", "\u2029", "\u200e", "\u202e", "\u2066", "\x1b]0;t\x07", "a"]),
    min_size=1,
    max_size=8,
).map("".join)


# mlr1 is a read-only path (each example damages its own copy): sharing it is safe
@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(text=hostile_text)
def test_text_read_from_a_trace_never_drives_the_terminal(mlr1: Path, text: str) -> None:
    """An app or operator name in a hostile trace printed raw: ``replay ls`` and
    ``show`` let it retitle, recolour or rewrite the terminal, and a newline split
    ``verify``'s one error line in two."""
    with tempfile.TemporaryDirectory() as tmp:
        named = damaged(mlr1, Path(tmp), "UPDATE run SET app = ?", "mlr" + text)
        for args in (["ls", tmp], ["show", named]):
            res = tcli.invoke(args)
            assert res.returncode == 0, res.stderr
            lines = res.stdout.splitlines()
            assert not any(ACTS_ON_TERMINAL.search(ln) for ln in lines), (args, res.stdout)
        shutil.copyfile(mlr1, named)
        with sqlite3.connect(named) as con:  # not resealed: verify and show refuse it
            con.execute("UPDATE digest SET op = op || ? WHERE id = 1", (text,))
        con.close()
        for args in (["verify", named], ["show", named]):
            res = tcli.invoke(args)
            err = res.stderr.rstrip("\n")
            assert res.returncode == 2 and "\n" not in err, (args, res.stderr)
            assert not ACTS_ON_TERMINAL.search(err + res.stdout.replace("\n", "")), (args, err)


def test_result_lines_escape_what_drives_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    """cluster, single, history and watch print their lines through ``printer``: the
    app, operator and DDS names in them come from the trace."""
    from replay._cliutil import printer

    printer(False)("replaying run 1 (app\x1b]0;t\x07, 2 rank(s))\n  sgd\u202e#0\r")
    assert capsys.readouterr().out == (
        "replaying run 1 (app\\x1b]0;t\\x07, 2 rank(s))\n  sgd\\u202e#0\\x0d\n"
    )


@pytest.mark.parametrize("path", ["", " ", "\t"])
@pytest.mark.parametrize(
    "command",
    [["run", "mlr", "-p", "synthetic=true", "--trace"], ["cluster", "{mlr1}", "--trace-out"]],
)
def test_an_empty_trace_path_says_so(mlr1: Path, command: list[str], path: str) -> None:
    """``--trace ''`` was refused as "trace '' already exists" (it named the directory)."""
    one_line_exit_2([a.format(mlr1=mlr1) for a in command] + [path], "trace path is empty")


LOOP_APP = """
import engine as ap

def train(epochs: int = 2):
    X = ap.dvector(16, shape=(2,), init=ap.init.zeros(), name="X")

    def body(j):
        X[j] = X[j] + j

    for _ in range(epochs):
        ap.async_for(0, 16, body, name="add")
"""


@pytest.fixture(scope="module")
def loop_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An async_for run on 1 rank x 2 threads (its plan is a row to forge)."""
    root = tmp_path_factory.mktemp("loop")
    (root / "loop.py").write_text(LOOP_APP)
    res = tcli.invoke(["run", "loop.py:train", "--threads", "2", "--trace", "t.sqlite"], cwd=root)
    assert res.returncode == 0, res.stderr
    return root / "t.sqlite"


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE operator_plan SET nodes = 4000",
        "UPDATE operator_plan SET nodes = 2",
        "UPDATE operator_plan SET threads = 3",
        "UPDATE operator_plan SET threads = 1",  # its tasks name thread 1
    ],
)
@pytest.mark.parametrize("command", [["single"], ["history", "X[3]"]])
def test_a_plan_for_another_cluster_is_a_damaged_trace(
    loop_trace: Path, tmp_path: Path, sql: str, command: list[str]
) -> None:
    """A plan row forged (and the chain resealed) to name more nodes than the run had
    made replay's plan comparison fail as an internal error, exit 70."""
    trace = tmp_path / "t.sqlite"
    shutil.copyfile(loop_trace, trace)
    with sqlite3.connect(trace) as con:
        con.execute(sql)
    con.close()
    reseal(trace)
    cmd = [command[0], trace, *command[1:], "--allow-changed-code", "-q"]
    one_line_exit_2(cmd, "operator_plan", "the trace is damaged", cwd=loop_trace.parent)


def test_export_to_dash_is_refused_not_a_file_named_dash(mlr1: Path, tmp_path: Path) -> None:
    """``-o -`` (stdout, by convention) wrote a file named ``-`` and exited 0."""
    one_line_exit_2(["export", mlr1, "-o", "-"], "not stdout", cwd=tmp_path)
    assert not (tmp_path / "-").exists()


# a time outside what localtime shows: beyond time_t, before 1970, or infinite (a NaN is
# stored as NULL, refused as not a number)
unshowable_times = st.floats(min_value=2.0**35, exclude_min=True) | st.floats(
    max_value=0.0, exclude_max=True
)


@settings(
    max_examples=8,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    column=st.sampled_from(["run.started_at", "run.ended_at", "verdict.created_at"]),
    value=unshowable_times,
)
def test_a_time_no_clock_shows_is_a_damaged_row(mlr1: Path, column: str, value: float) -> None:
    """A run's start (not under the hash chain) or a verdict's time edited to 1e300 or
    -1e18: ``replay show`` and ``ls`` stopped with an internal error (time_t overflow)."""
    table, col = column.split(".")
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "t.sqlite"
        shutil.copyfile(mlr1, trace)
        with tracer.open_writable(str(trace)) as t:
            t.add_verdict(t.runs()[0].run_id, "cluster", True, {"identical": True})
        with sqlite3.connect(trace) as con:
            con.execute(f"UPDATE {table} SET {col} = ?", (value,))
        con.close()
        if table == "verdict":  # the run stands; the verdict is shown as unreadable
            res = tcli.invoke(["show", trace])
            assert res.returncode == 0 and "verdict ?: unreadable" in res.stdout, res
            assert "created_at" in res.stdout and "not a wall-clock time" in res.stdout, res
        else:
            one_line_exit_2(["show", trace], col, "not a wall-clock time")
        res = tcli.invoke(["ls", tmp])
        assert res.returncode == 0 and "Traceback" not in res.stderr, res
        assert table == "verdict" or "not a wall-clock time" in res.stdout, res


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), -1.0])
@pytest.mark.parametrize("command", [["export", "-o", "out.json"], ["show", "--json"], ["verify"]])
def test_an_invocation_time_that_is_no_time_is_a_damaged_row(
    mlr1: Path, tmp_path: Path, seconds: float, command: list[str]
) -> None:
    """An ``invocation_set`` row's seconds edited to NaN (and the chain resealed) made
    ``replay export`` fail as an internal error, exit 70."""
    trace = tmp_path / "t.sqlite"
    shutil.copyfile(mlr1, trace)
    blob = np.array([seconds], "<f8").tobytes()
    with sqlite3.connect(trace) as con:
        con.execute("UPDATE invocation_set SET seconds = ?, seconds_codec = 'raw-f64'", (blob,))
    con.close()
    reseal(trace)
    one_line_exit_2([command[0], trace, *command[1:]], "invocation_set", "a time that is not")
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize(
    ("table", "column"),
    [("invocation_set", "seconds"), ("invocation_set", "round_us"), ("aggregation_block", "calls")],
)
def test_verify_names_the_row_and_column_of_a_damaged_block(
    mlr1: Path, tmp_path: Path, table: str, column: str
) -> None:
    """``replay verify`` cut a decoder's 'table T row R column C: ...' at its first
    colon, so its one line named the table but neither the row nor the column."""
    trace = tmp_path / "t.sqlite"
    shutil.copyfile(mlr1, trace)
    with sqlite3.connect(trace) as con:
        (row,) = con.execute(f"SELECT min(id) FROM {table}").fetchone()
        con.execute(f"UPDATE {table} SET {column} = X'0102', {column}_codec = 'raw-i64'")
    con.close()
    reseal(trace)
    one_line_exit_2(["verify", trace], f"table {table} ", f"row {row} column {column}: ")


@pytest.mark.parametrize("error", [" ", "\n", " \n\t\n"])
def test_a_recorded_error_of_blank_lines_is_shown_without_one(
    mlr1: Path, tmp_path: Path, error: str
) -> None:
    """A run's error (not under the hash chain) edited to blank lines: ``replay show``
    took its last line and failed with 'internal error: IndexError', exit 70."""
    trace = tmp_path / "t.sqlite"
    shutil.copyfile(mlr1, trace)
    with sqlite3.connect(trace) as con:
        con.execute("UPDATE run SET status = 'failed', error = ?", (error,))
    con.close()
    res = tcli.invoke(["show", trace])
    assert res.returncode == 0 and res.stderr == "", res
    assert "failed" in res.stdout and "error:" not in res.stdout, res.stdout


def test_export_to_an_empty_path_says_it_is_empty(mlr1: Path, tmp_path: Path) -> None:
    """``-o ''`` got as far as the write, and its line was an errno and a temporary
    file's name: '[Errno 2] No such file or directory: './..8d8d.tmp' -> '''."""
    one_line_exit_2(["export", mlr1, "-o", ""], "-o is empty", cwd=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_one_long_app_name_leaves_the_listing_of_every_trace_narrow(
    mlr1: Path, tmp_path: Path
) -> None:
    """``replay ls`` sizes its app column to the longest app: one trace (edited, chain
    resealed) whose app is named with 100,000 characters padded every line to that."""
    for name in ("a", "b"):
        shutil.copyfile(mlr1, tmp_path / f"{name}.sqlite")
    with sqlite3.connect(tmp_path / "a.sqlite") as con:
        con.execute("UPDATE run SET app = ?", ("A" * 100_000,))
    con.close()
    reseal(tmp_path / "a.sqlite")
    res = tcli.invoke(["ls", tmp_path])
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 3 and max(map(len, lines)) < 200, [len(ln) for ln in lines]
    assert "AAAA…" in res.stdout and "mlr" in res.stdout
