"""``replay ls``, ``replay show`` and ``replay export`` on a small real trace."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from tracehelp import digest

import tracer
from replay._tracecmds import register


@pytest.fixture
def cli() -> click.Group:
    @click.group()
    def group() -> None:
        pass

    register(group)
    return group


@pytest.fixture
def traces(recorded_trace: Path, tmp_path: Path) -> Path:
    d = tmp_path / "traces"
    d.mkdir()
    shutil.copyfile(recorded_trace, d / "toy.sqlite")
    (d / "junk.sqlite").write_bytes(b"not a database at all")
    (d / "notes.txt").write_text("ignored")
    return d


def test_register_adds_the_three_commands(cli: click.Group) -> None:
    assert {"ls", "show", "export"} <= set(cli.commands)


def test_ls_lists_runs_and_skips_bad_files_with_a_note(cli: click.Group, traces: Path) -> None:
    res = CliRunner().invoke(cli, ["ls", str(traces)])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].split()[:3] == ["path", "app", "started"]
    (row,) = [ln for ln in lines if "toy.sqlite" in ln]
    assert " toy " in row and "2x3" in row and "finished" in row and "kB" in row
    (junk,) = [ln for ln in lines if "junk.sqlite" in ln]
    assert " skipped " in junk and "not a SQLite file" in junk
    assert res.stderr == "replay: note: skipped 1 unreadable file(s)\n"
    assert "notes.txt" not in res.output


def test_ls_json(cli: click.Group, traces: Path) -> None:
    res = CliRunner().invoke(cli, ["ls", str(traces), "--json"])
    doc = json.loads(res.stdout)
    (t,) = doc["traces"]
    assert (t["app"], t["ranks"], t["threads"], t["status"]) == ("toy", 2, 3, "finished")
    assert [e["path"] for e in doc["errors"]] == [str(traces / "junk.sqlite")]


def test_ls_of_a_missing_directory_names_it(cli: click.Group, tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["ls", str(tmp_path / "none")])
    assert isinstance(res.exception, tracer.TraceNotFoundError)
    assert str(res.exception).startswith(f"{tmp_path / 'none'} does not exist")


def test_ls_of_an_empty_directory(cli: click.Group, tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["ls", str(tmp_path)])
    assert res.exit_code == 0 and res.stdout.strip() == f"no traces in {tmp_path}"


def test_show_prints_the_operator_table(cli: click.Group, recorded_trace: Path) -> None:
    res = CliRunner().invoke(cli, ["show", str(recorded_trace)])
    assert res.exit_code == 0, res.output
    assert "run run-1  app toy  finished  2 rank(s) x 3 thread(s)" in res.stdout
    header = next(ln for ln in res.stdout.splitlines() if "operator" in ln).split()
    assert header == [
        "operator",
        "strategy",
        "invocations",
        "bodies",
        "rounds",
        "lock",
        "grants",
        "messages",
        "bytes",
    ]
    row = next(ln for ln in res.stdout.splitlines() if ln.strip().startswith("acc")).split()
    assert row[2:4] == ["2", "480"]


def test_show_json_is_one_object_with_operator_counts(
    cli: click.Group, recorded_trace: Path
) -> None:
    res = CliRunner().invoke(cli, ["show", str(recorded_trace), "--json"])
    assert res.exit_code == 0
    doc = json.loads(res.stdout)
    (run,) = doc["runs"]
    op = run["operators"]["acc"]
    assert {"invocations", "bodies", "rounds", "lock_grants", "messages", "store_bytes"} <= set(op)
    with tracer.open(recorded_trace) as trace:
        s = trace.run().operators()["acc"]
    assert (op["invocations"], op["bodies"], op["lock_grants"], op["messages"]) == (
        s.invocations,
        s.bodies,
        s.lock_grants,
        s.messages,
    )
    assert op["invocations"] == 2 and op["bodies"] == 480 and op["lock_grants"] > 0
    assert run["status"] == "finished" and run["params"] == {"n": 240}
    assert run["objectives"] == {"total": [0.0, 1.0]}


def test_export_writes_chrome_json(cli: click.Group, recorded_trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    res = CliRunner().invoke(
        cli, ["export", str(recorded_trace), "--format", "chrome", "-o", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("wrote ") and str(out) in res.stdout
    assert json.loads(out.read_text())["traceEvents"]


@pytest.mark.parametrize("command", [["show"], ["show", "--json"], ["export", "-o", "x.json"]])
def test_bad_input_raises_one_tracer_error_and_keeps_the_file(
    cli: click.Group, traces: Path, command: list[str], tmp_path: Path
) -> None:
    junk = traces / "junk.sqlite"
    before = digest(junk)
    res = CliRunner().invoke(cli, [command[0], str(junk), *command[1:]])
    assert isinstance(res.exception, tracer.TraceFormatError)
    assert "\n" not in str(res.exception)
    assert res.stdout == ""
    assert digest(junk) == before
