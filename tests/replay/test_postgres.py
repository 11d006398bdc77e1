"""Trace stores in a real PostgreSQL server, through the ``replay`` command line.

The server comes from the ``pg_server`` fixture (tests/pg.py); each test has its own
database.  The URLs carry a real password, and no output or file name may show it.

The commands run in this process (tests/cli.py), except where a process is the point: a
writer read while it runs, a fresh interpreter without the driver, and one smoke test of
the console script.  Commands that run 2 ranks still start ``mpiexec`` (marked ``mpi``).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

import tracer
from tests import cli as tcli
from tests.conftest import ROOT, run_cli
from tests.pg import PASSWORD

pytestmark = pytest.mark.timeout(600)


def _no_password(*texts: str) -> None:
    for text in texts:
        assert PASSWORD not in text


def _files(root: Path) -> list[str]:
    return [str(p.relative_to(root)) for p in root.rglob("*")]


def _one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("replay: error: "), proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    _no_password(proc.stdout, proc.stderr)
    return lines[0]


def test_a_recorded_run_lives_in_postgres_and_nowhere_else(pg_trace: dict) -> None:
    cwd, url = pg_trace["cwd"], pg_trace["url"]
    assert _files(cwd) == []  # no SQLite file named after the URL, no traces/ directory
    assert pg_trace["trace"] == tracer.describe(url) and "***" in pg_trace["trace"]
    _no_password(json.dumps(pg_trace["trace"]), pg_trace["stderr"])
    with tracer.open(url) as trace:
        (info,) = trace.runs()
        assert info.run_id == pg_trace["run_id"]
        assert (info.status, info.ranks, info.app) == ("finished", 2, "sgdmf")
        run = trace.run(info.run_id)
        assert run.objectives()["rmse"] == pg_trace["objectives"]["rmse"]
        ops = run.operators()
        assert ops["sgd"].invocations == 2 and ops["sgd"].bodies > 0
        assert isinstance(ops["sgd"].bodies, int)
        trace.ensure_intact(info.run_id)
        assert trace.verify(info.run_id).ok


@pytest.mark.mpi
def test_cluster_and_single_replay_are_identical_and_store_verdicts(
    pg_trace: dict, tmp_path: Path, cli
) -> None:
    """Also: no command leaves a server connection open behind it (each replay opened
    the store and never closed it; a process that runs many commands kept them all)."""
    url = pg_trace["url"]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        for mode in ("cluster", "single"):
            proc = cli(mode, url, "--json", cwd=tmp_path)
            assert proc.returncode == 0, proc.stderr
            assert "ResourceWarning" not in proc.stderr, proc.stderr
            _no_password(proc.stdout, proc.stderr)
            res = json.loads(proc.stdout)
            assert res["identical"] is True and res["complete"] is True, res
            assert res["checked"]["digests"] > 0
        gc.collect()
    leaks = [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)]
    assert not [m for m in leaks if "psycopg" in m], leaks
    with tracer.open(url) as trace:
        kinds = {v.kind: v.passed for v in trace.run(pg_trace["run_id"]).verdicts()}
    assert kinds["cluster"] is True and kinds["single"] is True
    assert _files(tmp_path) == []


def test_show_ls_export_and_verify_hide_the_password(pg_trace: dict, tmp_path: Path, cli) -> None:
    url, shown = pg_trace["url"], tracer.describe(pg_trace["url"])
    proc = cli("show", url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(shown + ": 1 run(s)")
    assert "sgd" in proc.stdout and "rotation" in proc.stdout
    _no_password(proc.stdout, proc.stderr)

    proc = cli("show", url, "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["trace"] == shown and doc["store_bytes"] > 0
    (run,) = [r for r in doc["runs"] if r["run_id"] == pg_trace["run_id"]]
    assert run["operators"]["sgd"]["invocations"] == 2
    _no_password(proc.stdout, proc.stderr)

    proc = cli("ls", url, "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["errors"] == []
    assert [(t["path"], t["run_id"]) for t in doc["traces"]][0] == (shown, pg_trace["run_id"])
    proc = cli("ls", url, cwd=tmp_path)
    assert proc.returncode == 0 and "sgdmf" in proc.stdout and "2x1" in proc.stdout
    _no_password(proc.stdout, proc.stderr)

    proc = cli("export", url, "-o", "timeline.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    events = json.loads((tmp_path / "timeline.json").read_text())
    assert events and _files(tmp_path) == ["timeline.json"]
    _no_password(proc.stdout, proc.stderr, (tmp_path / "timeline.json").read_text())

    proc = cli("verify", url, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("ok:"), proc.stderr


@pytest.mark.mpi
def test_dual_test_records_into_postgres(pg_url: str, tmp_path: Path, cli) -> None:
    args = ["dual", "sgdmf", "-p", "synthetic=true", "-p", "epochs=1", "--ranks", "2"]
    proc = cli(*args, "--trace", pg_url, "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    _no_password(proc.stdout, proc.stderr)
    doc = json.loads(proc.stdout)
    assert doc["forward"]["passed"] and doc["backward"]["passed"]
    assert doc["trace"] == tracer.describe(pg_url) and doc["parallel"] == "mpi"
    with tracer.open(pg_url) as trace:
        (info,) = trace.runs()
        kinds = {v.kind: v.passed for v in trace.run(info.run_id).verdicts()}
    assert kinds == {"dual-forward": True, "dual-backward": True}
    assert _files(tmp_path) == []


def test_reading_while_a_run_writes_gives_no_errors(pg_url: str, tmp_path: Path, cli) -> None:
    """The writer is a real process (it runs while this one reads); the reads are not."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    args = ["run", "sgdmf", "-p", "synthetic=true", "-p", "epochs=8", "--ranks", "2"]
    writer = subprocess.Popen(
        [sys.executable, "-m", "replay", *args, "--trace", pg_url],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: set[str] = set()
    reads = 0
    try:
        deadline = time.monotonic() + 240
        while writer.poll() is None:
            assert time.monotonic() < deadline, "the writer did not finish"
            if not _has_schema(pg_url):
                time.sleep(0.2)  # the run has not created its store yet
                continue
            proc = cli("show", pg_url, "--json", cwd=tmp_path)
            assert proc.returncode == 0, proc.stderr
            _no_password(proc.stdout, proc.stderr)
            for run in json.loads(proc.stdout)["runs"]:
                seen.add(run["status"])
            reads += 1
        out, err = writer.communicate(timeout=60)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.communicate()
    assert writer.returncode == 0, err
    assert reads >= 1 and seen <= {"running", "finished"}
    proc = cli("show", pg_url, "--json", cwd=tmp_path)
    (run,) = json.loads(proc.stdout)["runs"]
    assert run["status"] == "finished" and len(run["objectives"]["rmse"]) == 8
    assert _files(tmp_path) == []


def _has_schema(url: str) -> bool:
    try:
        with tracer.open(url) as trace:
            return bool(trace.runs())
    except tracer.TracerError:
        return False


def test_without_the_driver_a_url_names_the_extra(pg_trace: dict, tmp_path: Path) -> None:
    # psycopg made unimportable in the child: the real import inside SQLAlchemy fails
    code = (
        "import sys; sys.modules['psycopg'] = None; "
        "from replay._cli import cli; cli(sys.argv[1:], prog_name='replay')"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run_args = ["run", "sgdmf", "-p", "synthetic=true", "--trace", pg_trace["url"]]
    for args in (["show", pg_trace["url"]], ["ls", pg_trace["url"]], run_args):
        proc = subprocess.run(
            [sys.executable, "-c", code, *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        _one_line_error(proc, "install the postgres extra", "pip install 'strads-replay[postgres]'")
    assert _files(tmp_path) == []


def test_a_driver_that_is_not_installed_is_one_line(tmp_path: Path, cli) -> None:
    try:
        import pg8000  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("pg8000 is installed here")
    url = f"postgresql+pg8000://someone:{PASSWORD}@127.0.0.1/db"
    _one_line_error(cli("show", url, cwd=tmp_path), "'pg8000'", "strads-replay[postgres]")


def test_bad_urls_are_one_line_without_the_password(pg_server, tmp_path: Path) -> None:
    refused = f"postgresql+psycopg://replay:{PASSWORD}@127.0.0.1:1/db"
    wrong_pw = pg_server.url().replace(PASSWORD, PASSWORD + "-wrong")
    unknown_db = pg_server.url("no_such_database")
    # the real console script once; the rest of the matrix in-process (same code path)
    _one_line_error(run_cli(["cluster", wrong_pw], cwd=tmp_path), "password authentication")
    for url in (refused, wrong_pw, unknown_db):
        for args in (
            ["show", url],
            ["ls", url],
            ["cluster", url],
            ["single", url],
            ["export", url, "-o", "x.json"],
            ["verify", url],
            ["run", "sgdmf", "-p", "synthetic=true", "--trace", url],
        ):
            proc = tcli.invoke(args, cwd=tmp_path)
            _one_line_error(proc, "cannot connect to", "***")
            assert PASSWORD + "-wrong" not in proc.stderr
    assert _files(tmp_path) == []


def test_a_postgres_database_of_another_application_is_refused(pg_url: str, cli) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE invoices (id integer primary key)")
    engine.dispose()
    for args in (["show", pg_url], ["run", "sgdmf", "-p", "synthetic=true", "--trace", pg_url]):
        _one_line_error(cli(*args), "no schema_info table")
