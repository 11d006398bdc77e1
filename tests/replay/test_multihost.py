"""Jobs whose ranks run on two hosts that share no files (issue 35, item 6).

Two hosts are emulated on this machine (``two_hosts.py``, passed as ``REPLAY_MPIEXEC``):
an MPMD launch whose sides run in mount namespaces of their own, with their own host
name, ``TMPDIR`` and working directory.  Neither side sees the ``replay`` process's
``TMPDIR`` (where its job directory is) or working directory; side 1 (rank 1) does not
see the trace directory either, which is on rank 0's host.  Every command must still
record, replay, dual-test and resume bitwise as a job on one host does.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import tracer
from tests.conftest import ROOT, mpiexec, run_cli
from tests.replay.test_procs import _descendants, _running
from tests.traces import SGDMF_SMALL

pytestmark = pytest.mark.mpi

HERE = Path(__file__).parent
#: Seconds any one command may take (each job also gets ``--timeout``).
TIMEOUT = 240
SGDMF = ["sgdmf", "-p", "synthetic=1", "-p", "epochs=2"]


def _unshare_refused(tmp: Path) -> str | None:
    """Why this machine cannot emulate hosts with ``unshare`` (None: it can)."""
    d = tmp / "probe"
    d.mkdir()
    script = f"hostname probe && mount -t tmpfs none {d}"
    try:
        proc = subprocess.run(
            ["unshare", "-m", "-u", "--propagation", "private", "sh", "-c", script],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare cannot run: {exc}"
    if proc.returncode != 0:
        return f"unshare -m -u is refused here: {proc.stderr.strip()}"
    return None


class Hosts:
    """The emulated two-host cluster of one test, and how to run commands on it."""

    def __init__(self, tmp: Path) -> None:
        self.cwd = tmp / "cli"  # the replay process's working directory
        self.tmp = tmp / "cli-tmp"  # its TMPDIR: its job directories go there
        self.traces = tmp / "traces"  # on rank 0's host only
        for d in (self.cwd, self.tmp, self.traces):
            d.mkdir()
        wrapper = tmp / "mpiexec-two-hosts"
        wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {HERE / "two_hosts.py"} "$@"\n')
        wrapper.chmod(0o755)
        self.env = {
            "REPLAY_MPIEXEC": str(wrapper),
            "TWO_HOSTS_MPIEXEC": mpiexec(),
            "TWO_HOSTS_ROOT": str(tmp / "hosts"),
            "TWO_HOSTS_HIDE0": os.pathsep.join(map(str, (self.tmp, self.cwd))),
            "TWO_HOSTS_HIDE1": os.pathsep.join(map(str, (self.tmp, self.cwd, self.traces))),
            "TMPDIR": str(self.tmp),
        }

    def run(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return run_cli(list(args), timeout=TIMEOUT, env={**self.env, **(env or {})}, cwd=self.cwd)


@pytest.fixture
def hosts(tmp_path: Path) -> Hosts:
    why = _unshare_refused(tmp_path)
    if why is not None:
        if os.environ.get("REPLAY_REQUIRE_UNSHARE"):
            pytest.fail(f"REPLAY_REQUIRE_UNSHARE is set, but {why}")
        pytest.skip(why)
    return Hosts(tmp_path)


def _json(proc: subprocess.CompletedProcess) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def test_a_run_on_two_hosts_records_what_one_host_records(hosts: Hosts, tmp_path: Path) -> None:
    here = tmp_path / "one-host.sqlite"
    one = _json(run_cli(["run", *SGDMF, "--ranks", "2", "--trace", str(here), "--json"]))
    trace = hosts.traces / "t.sqlite"
    two = _json(hosts.run("run", *SGDMF, "--ranks", "2", "--trace", str(trace), "--json"))
    assert two["digests"] == one["digests"] and two["objectives"] == one["objectives"]
    proc = hosts.run("verify", str(trace))
    assert proc.returncode == 0 and proc.stdout.startswith("ok:"), (proc.stdout, proc.stderr)
    with tracer.open(trace) as t:
        run = t.run(None)
        # rank 1 saw no trace directory: its checkpoints reached the store through rank 0
        assert run.checkpoints() and {c.node for c in _checkpoint_rows(trace)} == {0, 1}
    rep = _json(hosts.run("cluster", str(trace), "--json", "--timeout", "200"))
    assert rep["identical"] and rep["complete"], rep
    # rank 1 replayed from a copy rank 0 sent it, in its own TMPDIR, removed at its end
    assert not list((tmp_path / "hosts").rglob("*.sqlite"))


class _Row:
    def __init__(self, node: int) -> None:
        self.node = node


def _checkpoint_rows(trace: Path) -> list[_Row]:
    with sqlite3.connect(f"file:{trace}?mode=ro", uri=True) as db:
        return [_Row(n) for (n,) in db.execute("SELECT node FROM checkpoint")]


def test_a_trace_directory_rank_0s_host_cannot_write_names_that_host(hosts: Hosts) -> None:
    """The trace is written on rank 0's host: a directory that host cannot write is one
    line naming the rank and the host (not the user's, where the path was typed), and a
    trace already there still replays."""
    trace = hosts.traces / "t.sqlite"
    assert hosts.run("run", *SGDMF, "--ranks", "2", "--trace", str(trace)).returncode == 0
    readonly = {"TWO_HOSTS_RO0": str(hosts.traces)}
    new = hosts.traces / "new.sqlite"
    proc = hosts.run("run", *SGDMF, "--ranks", "2", "--trace", str(new), env=readonly)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("replay: error: rank 0 on host emulated-host-0: "), proc.stderr
    assert "readonly" in proc.stderr, proc.stderr
    assert not new.exists()
    rep = _json(hosts.run("cluster", str(trace), "--json", "--timeout", "200", env=readonly))
    assert rep["identical"] and rep["complete"], rep


def test_a_dual_test_on_two_hosts_passes(hosts: Hosts) -> None:
    trace = hosts.traces / "dual.sqlite"
    params = SGDMF_SMALL
    proc = hosts.run("dual", "sgdmf", *params, "--ranks", "2", "--trace", str(trace), "--json")
    res = _json(proc)
    assert res["forward"]["passed"] and res["backward"]["passed"], res


def test_chaos_runs_on_two_hosts_are_recorded(hosts: Hosts) -> None:
    trace = hosts.traces / "chaos.sqlite"
    params = SGDMF_SMALL
    argv = ["chaos", "sgdmf", *params, "--ranks", "2", "--runs", "2", "--chaos-seed", "3"]
    proc = hosts.run(*argv, "--trace", str(trace), "--timeout", "200")
    assert proc.returncode == 0, proc.stderr
    with tracer.open(trace) as t:
        runs = t.runs()
    assert [r.status for r in runs] == ["finished", "finished"] and runs[0].ranks == 2
    proc = hosts.run("verify", str(trace))
    assert proc.returncode == 0 and proc.stdout.startswith("ok:"), (proc.stdout, proc.stderr)


def test_a_killed_rank_on_two_hosts_resumes_bitwise(hosts: Hosts) -> None:
    app = f"{HERE / 'resume_apps.py'}:sgdmf"
    args = ["run", app, "-p", "epochs=4", "--checkpoint-every", "1", "--ranks", "2"]
    whole = _json(run_cli([*args, "--no-trace", "--json", "--timeout", "200"]))
    trace = hosts.traces / "killed.sqlite"
    proc = hosts.run(*args, "--trace", str(trace), "--timeout", "200", env={"RESUME_KILL": "1:2:5"})
    assert proc.returncode != 0
    with tracer.open(trace) as t:
        info = t.run(None).info
    assert info.status == "crashed", info
    res = _json(hosts.run("resume", str(trace), "--json", "--timeout", "200"))
    assert res["continues"] == info.run_id
    assert res["digests"] == whole["digests"] and res["objectives"] == whole["objectives"]
    proc = hosts.run("verify", str(trace))
    assert proc.returncode == 0 and proc.stdout.startswith("ok:"), (proc.stdout, proc.stderr)


def test_ranks_on_other_hosts_end_when_the_cli_is_killed(hosts: Hosts) -> None:
    """No rank is on the CLI's host (their host names differ): none can check its pid.
    Rank 0 learns from its stdin's end, marks the run crashed, and mpiexec ends rank 1."""
    trace = hosts.traces / "orphan.sqlite"
    env = dict(os.environ, PYTHONPATH=str(ROOT), **hosts.env)
    argv = ["run", "sgdmf", "-p", "synthetic=true", "-p", "epochs=200", "--ranks", "2"]
    cli = subprocess.Popen(
        [sys.executable, "-m", "replay", *argv, "--trace", str(trace)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=hosts.cwd,
    )
    pids: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert cli.poll() is None
            pids = _descendants(cli.pid)
            try:
                with sqlite3.connect(f"file:{trace}?mode=ro", uri=True) as db:
                    row = db.execute("SELECT status FROM run").fetchone()
                if row is not None and row[0] == "running":
                    break
            except sqlite3.Error:
                pass
            time.sleep(0.2)
        else:
            pytest.fail("the run did not start in time")
        time.sleep(1.0)
        pids = _descendants(cli.pid)
        workers = [p for p in pids if b"replay._worker" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(workers) >= 2, workers
        cli.kill()
        cli.wait(timeout=10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(_running(p) for p in pids):
            time.sleep(0.1)
        assert not [p for p in pids if _running(p)]
        with sqlite3.connect(f"file:{trace}?mode=ro", uri=True) as db:
            status, error = db.execute("SELECT status, error FROM run").fetchone()
        assert status == "crashed" and f"pid {cli.pid}" in (error or ""), (status, error)
    finally:
        cli.kill()
        for p in pids:
            if _running(p):
                os.kill(p, signal.SIGKILL)
