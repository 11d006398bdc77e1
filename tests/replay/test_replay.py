"""Cluster and single-node replay: identical outcomes, breakpoints, divergence reports.

Commands run in this process (tests/cli.py) unless a process is the point (pdb driven
through a terminal or stdin, ``mpiexec`` started by the user); a command that runs more
than one rank still starts ``mpiexec``, so those tests are marked ``mpi``.  The 2-rank,
3-thread lock app is recorded once per session (``trace_library``); a test that replays
it takes a copy (``single``/``cluster`` store their verdict in the trace).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

import tracer
from tests import cli as tcli
from tests.conftest import run_cli, run_mpi, unrecorded_outcomes

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
APPS = HERE / "nondet_apps.py"
SYN = ["-p", "synthetic=true", "-p", "synthetic_ratings=5000", "-p", "rank=4"]
#: The lock app on 2 ranks of 3 threads: its lock orders differ between unrecorded runs.
HOT_LOCKS = (f"{APPS}:hot_locks", "--ranks", "2", "--threads", "3")


def record(tmp_path: Path, app: str, *args: str, name: str = "t.sqlite") -> Path:
    trace = tmp_path / name
    proc = tcli.invoke(["run", app, *args, "--trace", trace, "--json"])
    assert proc.returncode == 0, proc.stderr
    return trace


def replay(mode: str, trace: Path, *args: str, **kw) -> tuple[int, dict]:
    proc = tcli.invoke([mode, trace, *args, "--json"], **kw)
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.mpi
@pytest.mark.parametrize("ranks,threads", [(2, 1), (2, 2), (3, 1)])
def test_sgdmf_replays_identically_both_ways(tmp_path: Path, ranks: int, threads: int) -> None:
    trace = record(
        tmp_path, "sgdmf", "--ranks", str(ranks), "--threads", str(threads), "-p", "epochs=2", *SYN
    )
    for mode in ("cluster", "single"):
        rc, res = replay(mode, trace)
        assert rc == 0 and res["identical"] and res["first_difference"] is None, res
        # ratings, their numeric rows (the compiled body's), W, H per epoch
        assert res["checked"]["digests"] == 2 * 4 and res["checked"]["objectives"] == 2
        t = res["objective_times"]["rmse"]  # when the replay logged each epoch's rmse
        assert len(t) == 2 and 0 < t[0] <= t[1] <= res["wall_s"]
    kinds = [v.kind for v in tracer.open(trace).run().verdicts()]
    assert kinds == ["cluster", "single"]


@pytest.mark.mpi
def test_lock_app_is_nondeterministic_unrecorded_but_replays_exactly(
    tmp_path: Path, trace_library
) -> None:
    app = f"{APPS}:hot_locks"
    outcomes = unrecorded_outcomes(app, "--threads", "3", runs=6)
    assert len(outcomes) >= 2, "six unrecorded runs gave the same result: nothing to replay"
    trace = trace_library.copy(tmp_path, *HOT_LOCKS)
    for mode in ("cluster", "single"):
        for _ in range(4):
            rc, res = replay(mode, trace)
            assert rc == 0 and res["identical"], res


@pytest.mark.mpi
def test_traced_replay_has_the_same_orders_and_digests(tmp_path: Path, trace_library) -> None:
    trace = trace_library.copy(tmp_path, *HOT_LOCKS)
    out = tmp_path / "again.sqlite"
    rc, res = replay("cluster", trace, "--trace-out", str(out))
    assert rc == 0 and res["identical"]
    a, b = tracer.open(trace).run(), tracer.open(out).run()
    assert [(d.op, d.invocation, d.dds, d.digest) for d in a.digests()] == [
        (d.op, d.invocation, d.dds, d.digest) for d in b.digests()
    ]
    for node in (0, 1):
        for inv in (0, 1):
            ga, gb = a.lock_grants("hot", inv, node), b.lock_grants("hot", inv, node)
            assert ga.grants.sum() > 0
            for f in ("round", "bodies", "grants", "offset", "position", "thread"):
                assert getattr(ga, f).tolist() == getattr(gb, f).tolist(), f
        ma, mb = a.messages(node), b.messages(node)
        assert ma.source.tolist() == mb.source.tolist()


@pytest.mark.mpi
def test_lock_heavy_gauss_seidel_replays_identically_both_ways(tmp_path: Path) -> None:
    app = f"{ROOT / 'benchmarks' / 'gauss_seidel.py'}:train"
    params = ["-p", "vertices=900", "-p", "degree=3", "-p", "sweeps=2"]
    trace = record(tmp_path, app, *params, "--ranks", "3", "--threads", "2")
    run = tracer.open(trace).run()
    op = run.operators()["gs"]
    assert op.lock_grants > 2 * op.bodies  # a body locks itself and its neighbours
    assert op.store_bytes < op.bodies  # under a byte per body, lock grants included
    for mode in ("cluster", "single"):
        rc, res = replay(mode, trace)
        assert rc == 0 and res["identical"], res
        assert res["checked"]["digests"] == 2


def _tamper_first_handover(path: Path) -> None:
    """Give the first recorded hand-over of a lock-ticket order to another thread."""
    from tracer._codec import decode, encode

    with sqlite3.connect(path) as con:
        rid, blob, codec, n = con.execute(
            "SELECT id, deviations, deviations_codec, n_values FROM lock_grant_block "
            "WHERE n_values > 0 ORDER BY id LIMIT 1"
        ).fetchone()
        dev = decode(blob, codec, n, "test").copy()
        dev[1] = (dev[1] + 1) % 3
        new, new_codec = encode(dev)
        con.execute(
            "UPDATE lock_grant_block SET deviations = ?, deviations_codec = ? WHERE id = ?",
            (new, new_codec, rid),
        )


@pytest.mark.mpi
def test_a_tampered_lock_order_is_caught_by_the_chain_and_by_replay(
    tmp_path: Path, trace_library
) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "tracer"))
    from test_trace_chain import _rechain

    trace = trace_library.get(*HOT_LOCKS)  # read only: the edits go to a copy
    edited = tmp_path / "edited.sqlite"
    shutil.copyfile(trace, edited)
    _tamper_first_handover(edited)
    with tracer.open(edited, assume_finished=True) as t:
        bad = t.verify(full=True).problem
    assert bad is not None and bad.table == "lock_grant_block", bad
    _rechain(edited)  # an editor who recomputes the chain is stopped by replay itself
    rc, res = replay("cluster", edited)
    assert rc == 3 and not res["identical"], res
    assert res["first_difference"]["op"] == "hot", res


@pytest.mark.mpi
def test_changed_code_exits_2_naming_both_digests_unless_allowed(tmp_path: Path, cli) -> None:
    app = tmp_path / "app.py"
    shutil.copy(APPS, app)
    trace = record(tmp_path, f"{app}:hot_locks", "--ranks", "2", "--threads", "2")
    recorded = tracer.open(trace).run().info.code_digest
    app.write_text(app.read_text().replace("v * 0.99", "v * 0.98"))
    for mode in ("cluster", "single"):
        proc = cli(mode, trace)
        err = proc.stderr.strip()
        assert proc.returncode == 2 and err.count("\n") == 0, proc.stderr
        assert recorded[:12] in err and str(app) in err and "--allow-changed-code" in err
        proc = cli(mode, trace, "--allow-changed-code", "--json")
        assert proc.returncode == 3, proc.stderr
        d = json.loads(proc.stdout)["first_difference"]
        assert d["op"] == "hot" and d["invocation"] == 0 and d["what"] == "outcome"
    assert [v.kind for v in tracer.open(trace).run().verdicts()] == ["cluster", "single"]


@pytest.mark.mpi
def test_changed_data_diverges(tmp_path: Path) -> None:
    data = tmp_path / "r.inter"
    lines = ["user_id:token\titem_id:token\trating:float\ttimestamp:float"]
    lines += [
        f"{1 + u}\t{1 + (u * 7 + k) % 40}\t{1 + (u + k) % 5}\t0"
        for u in range(30)
        for k in range(20)
    ]
    data.write_text("\n".join(lines) + "\n")
    trace = record(
        tmp_path, "sgdmf", "--ranks", "2", "-p", f"data={data}", "-p", "epochs=2", "-p", "rank=4"
    )
    data.write_text("\n".join(lines[:-50]) + "\n")
    rc, res = replay("cluster", trace)
    assert rc == 3 and res["first_difference"]["what"] in ("plan", "outcome")


@pytest.mark.mpi
def test_nondeterministic_body_diverges(tmp_path: Path) -> None:
    trace = record(tmp_path, f"{APPS}:uses_wall_clock", "--ranks", "2")
    rc, res = replay("single", trace)
    assert rc == 3 and res["first_difference"]["op"] == "clock"


def test_wrong_rank_count_and_missing_app_exit_2(tmp_path: Path, cli) -> None:
    trace = record(tmp_path, "sgdmf", "--ranks", "2", "-p", "epochs=1", *SYN)
    proc = run_mpi(["-m", "replay", "cluster", str(trace)], 3)
    assert proc.returncode != 0 and "recorded on 2 rank(s) but this replay has 3" in proc.stderr
    app = tmp_path / "gone.py"
    shutil.copy(APPS, app)
    trace2 = record(tmp_path, f"{app}:hot_locks", "-p", "epochs=1", name="t2.sqlite")
    app.unlink()
    for mode in ("cluster", "single"):
        proc = cli(mode, trace2)
        assert proc.returncode == 2 and "app cannot be found" in proc.stderr
        assert proc.stderr.strip().count("\n") == 0


def test_not_a_trace_exits_2(tmp_path: Path, cli) -> None:
    bad = tmp_path / "x.sqlite"
    bad.write_bytes(b"not a database at all" * 10)
    for mode in ("cluster", "single"):
        proc = cli(mode, bad)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert bad.read_bytes() == b"not a database at all" * 10


def test_break_stops_in_pdb_inside_the_body(tmp_path: Path) -> None:
    pexpect = pytest.importorskip("pexpect")
    trace = record(tmp_path, f"{APPS}:hot_locks", "--ranks", "2", "--threads", "2")
    child = pexpect.spawn(
        sys.executable,
        ["-m", "replay", "single", str(trace), "--break", "hot:1:17@1"],
        encoding="utf-8",
        timeout=60,
        cwd=str(tmp_path),
    )
    child.expect(r"stopped in hot#1 index 17 on node 1")
    child.expect(r"\(Pdb\)")
    child.sendline("p j, k if 'k' in dir() else None")
    child.expect(r"\(17, ")
    child.sendline("n")
    child.sendline("n")
    child.expect(r"\(Pdb\)")
    child.sendline("p X[k].shape")
    child.expect(r"\(3,\)")
    child.sendline("c")
    child.expect(r"identical")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_until_stops_in_the_driver(tmp_path: Path) -> None:
    """A real process: pdb reads its commands from the command's stdin."""
    trace = record(tmp_path, f"{APPS}:hot_locks", "-p", "epochs=3")
    proc = run_cli(["single", str(trace), "--until", "hot:1"], input="p _ is None\nc\n")
    assert proc.returncode == 0, proc.stderr
    assert "stopped after hot#1" in proc.stdout and "(Pdb)" in proc.stdout
    assert "identical" in proc.stdout


def test_bad_break_spec_exits_2(tmp_path: Path, cli) -> None:
    trace = record(tmp_path, f"{APPS}:hot_locks", "-p", "epochs=1")
    proc = cli("single", trace, "--break", "hot:x:1")
    assert proc.returncode == 2 and "INVOCATION" in proc.stderr
