"""Chaos mode: seeded legal schedules, recorded, reproducible and checked."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tracer
from engine.lowlevel import Chaos
from replay import chaos
from tests import mutants
from tests.replay.chaos_apps import bsp_mix, hybrid_mix, mini_mf, ssp_mix
from tests.replay.dual_apps import hot_rows

#: A small program with lock-split groups on 2 threads (bodies share four hot rows).
HOT = {"epochs": 2, "n": 40}


# ====================================================================== the seed
def test_a_choice_is_keyed_by_the_seed_run_and_its_place() -> None:
    from engine._machines.chaos import LOCKS

    draw = Chaos(5, 1).rng("op", 0, LOCKS, 1, 2, 0).random(8)
    assert np.array_equal(draw, Chaos(5, 1).rng("op", 0, LOCKS, 1, 2, 0).random(8))
    others = {tuple(Chaos(5, run).rng("op", 0, LOCKS, 1, 2, 0).random(4)) for run in range(2, 12)}
    assert len(others) == 10  # the run number changes the draw
    assert not np.array_equal(draw, Chaos(5, 1).rng("op", 0, LOCKS, 1, 3, 0).random(8))
    assert Chaos(5, 1).dispatch("op", 0, 0, 0, 3) != [] and sorted(
        Chaos(5, 1).dispatch("op", 0, 0, 0, 3)
    ) == [0, 1, 2]
    with pytest.raises(ValueError, match="chaos seed"):
        Chaos(-1, 0)


# ====================================================================== explore
def test_same_seed_and_run_give_the_same_digests_and_runs_differ() -> None:
    a = chaos.explore(hot_rows, HOT, runs=6, chaos_seed=3, nodes=2, threads=2)
    b = chaos.explore(hot_rows, HOT, runs=6, chaos_seed=3, nodes=2, threads=2)
    assert [r.digests for r in a.runs] == [r.digests for r in b.runs]
    assert [r.outcome for r in a.runs] == [r.outcome for r in b.runs]
    assert a.distinct > 1  # lock-split merges really vary with the run number
    only = chaos.explore(hot_rows, HOT, runs=6, chaos_seed=3, nodes=2, threads=2, only=4)
    assert [r.run for r in only.runs] == [4]
    assert only.runs[0].outcome == a.runs[4].outcome
    other = chaos.explore(hot_rows, HOT, runs=6, chaos_seed=4, nodes=2, threads=2)
    assert [r.outcome for r in other.runs] != [r.outcome for r in a.runs]


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**63 - 1), nodes=st.integers(1, 3))
def test_one_thread_per_node_gives_one_outcome(seed: int, nodes: int) -> None:
    report = chaos.explore(hot_rows, HOT, runs=4, chaos_seed=seed, nodes=nodes, threads=1)
    assert report.distinct == 1, report.lines()


def test_every_distinct_outcome_passes_the_backward_dual_test() -> None:
    report = chaos.explore(hot_rows, HOT, runs=6, chaos_seed=11, nodes=2, threads=3, check="dual")
    assert report.failed is None, report.lines()
    assert report.distinct > 1
    assert len(report.runs) == 6


def test_every_run_is_recorded_with_its_labels_and_replays(tmp_path) -> None:
    from replay._replay import replay_here

    path = str(tmp_path / "chaos.sqlite")
    report = chaos.explore(hot_rows, HOT, runs=3, chaos_seed=9, nodes=2, threads=2, trace=path)
    with tracer.open(path) as store:
        infos = {r.run_id: r for r in store.runs()}
    assert set(infos) == {r.run_id for r in report.runs}
    for r in report.runs:
        assert infos[r.run_id].labels == {
            "chaos_seed": 9,
            "chaos_run": r.run,
            "exact_reduce": True,
            "coalesced_sends": True,
            "ring_routes": True,
            "exact_seed_keys": True,
        }
        rep = replay_here({"kind": "replay", "mode": "single", "trace": path, "run_id": r.run_id})
        assert rep["identical"], rep


def test_an_objective_check_stops_at_the_first_failing_run(tmp_path) -> None:
    path = str(tmp_path / "chaos.sqlite")
    report = chaos.explore(
        hot_rows,
        HOT,
        runs=5,
        chaos_seed=3,
        nodes=2,
        threads=2,
        check="objective:norm<=0.5",
        trace=path,
    )
    f = report.failed
    assert f is not None and f.run == 0 and len(report.runs) == 1
    assert "norm" in f.message and f.check == "objective:norm<=0.5"
    assert f.replay_command == f"replay single {path} --run {report.runs[0].run_id}"
    going = chaos.explore(
        hot_rows,
        HOT,
        runs=3,
        chaos_seed=3,
        nodes=2,
        threads=2,
        check="objective:norm<=0.5",
        keep_going=True,
    )
    assert len(going.runs) == 3 and going.failures == 3 and going.failed.run == 0
    ok = chaos.explore(
        hot_rows, HOT, runs=2, chaos_seed=3, nodes=2, threads=2, check="objective:norm>0"
    )
    assert ok.failed is None


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"runs": 0}, "--runs"),
        ({"runs": 2, "only": 2}, "--only"),
        ({"runs": 2, "check": "objective:norm=1"}, "--check"),
        ({"runs": 2, "check": "objective:nope<=1"}, "never logged"),
        ({"runs": 2, "check": "sometimes"}, "--check"),
        # a comparison without its bound was "'=' is not a number"
        ({"runs": 2, "check": "objective:norm<="}, "objective:NAME<=VALUE"),
        ({"runs": 2, "check": "objective:norm>="}, "objective:NAME<=VALUE"),
        ({"runs": 2, "check": "objective:norm<=>1"}, "objective:NAME<=VALUE"),
    ],
)
def test_bad_input_is_one_usage_error(kw: dict, match: str) -> None:
    from replay._errors import UsageError

    with pytest.raises(UsageError, match=match):
        chaos.explore(hot_rows, HOT, chaos_seed=1, nodes=2, threads=2, **kw)


# ====================================================================== the command
HOT_APP = str(Path(__file__).with_name("dual_apps.py")) + ":hot_rows"


def test_chaos_command_prints_one_json_object_and_replays(tmp_path: Path, cli) -> None:
    path = tmp_path / "c.sqlite"
    args = ["chaos", HOT_APP, "-p", "n=40", "--in-process", "--threads", "2"]
    res = cli(*args, "--runs", "4", "--chaos-seed", "5", "--trace", str(path), "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert set(out) == {"runs", "distinct", "failed"} and out["failed"] is None
    assert [r["run"] for r in out["runs"]] == [0, 1, 2, 3]
    assert set(out["runs"][0]) == {"run", "seed", "run_id", "trace", "outcome"}
    assert out["distinct"] == len({r["outcome"] for r in out["runs"]}) > 1
    assert all(r["seed"] == 5 for r in out["runs"])
    # --only re-runs one schedule: the same outcome, appended to a new store
    again = cli(*args, "--runs", "4", "--chaos-seed", "5", "--only", "2", "--no-trace", "--json")
    assert again.returncode == 0, again.stderr
    (only,) = json.loads(again.stdout)["runs"]
    assert only["run"] == 2 and only["outcome"] == out["runs"][2]["outcome"]
    rep = cli("single", str(path), "--run", out["runs"][3]["run_id"])
    assert rep.returncode == 0 and "identical" in rep.stdout, rep.stderr


def test_a_failing_check_exits_1_with_the_replay_command(tmp_path: Path, cli) -> None:
    path = tmp_path / "c.sqlite"
    res = cli(  # no --ranks: 2 nodes in this process
        *["chaos", HOT_APP, "--threads", "2", "--runs", "3"],
        *["--chaos-seed", "1", "--check", "objective:norm<=1", "--trace", str(path)],
    )
    assert res.returncode == 1, res.stderr
    assert "on 2 in-process node(s) x 2 thread(s)" in res.stdout
    assert "FAILED check objective:norm<=1 in run 0 (chaos seed 1)" in res.stdout
    m = re.search(r"replay it: (replay single \S+ --run ([0-9a-f]{32}))", res.stdout)
    assert m is not None, res.stdout
    rep = cli(*m.group(1).split()[1:])
    assert rep.returncode == 0 and "identical" in rep.stdout, rep.stderr
    js = cli(
        *["chaos", HOT_APP, "--in-process", "--threads", "2", "--runs", "3", "--keep-going"],
        *["--chaos-seed", "1", "--check", "objective:norm<=1", "--no-trace", "--json"],
    )
    assert js.returncode == 1
    out = json.loads(js.stdout)
    assert len(out["runs"]) == 3 and out["failed"]["run"] == 0
    assert out["failed"]["check"] == "objective:norm<=1" and out["failed"]["replay_command"] is None


def test_the_replay_command_of_a_failure_reads_back_as_its_trace(tmp_path: Path, cli) -> None:
    """A trace in a directory whose name needs quoting and holds a letter outside ASCII:
    the printed command quoted it as JSON does (``"my r\\u00e9sum\\u00e9"``), which a
    shell reads as another path (as it expands a ``$`` inside those quotes).  Split as a
    shell splits it, the command names the trace and replays the failing run."""
    d = tmp_path / "my résumé"
    d.mkdir()
    path = d / "c.sqlite"
    res = cli(
        *["chaos", HOT_APP, "--threads", "2", "--runs", "1"],
        *["--chaos-seed", "1", "--check", "objective:norm<=1", "--trace", str(path)],
    )
    assert res.returncode == 1, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if "replay it: " in ln)
    words = shlex.split(line.split("replay it: ", 1)[1])
    assert words[:3] == ["replay", "single", str(path)], words
    rep = cli(*words[1:])
    assert rep.returncode == 0 and "identical" in rep.stdout, rep.stderr


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--runs", "0", "--chaos-seed", "1"], "--runs must be >= 1"),
        (["--runs", "2", "--chaos-seed", "-3"], "--chaos-seed"),
        (["--runs", "2", "--chaos-seed", "1", "--only", "5"], "--only"),
        (["--runs", "2", "--chaos-seed", "1", "--check", "often"], "--check"),
        (["--runs", "2", "--chaos-seed", "1", "--ranks", "0"], "--ranks"),
        (["--runs", "2", "--chaos-seed", "1", "-p", "n=many"], "n"),
    ],
)
def test_chaos_bad_input_is_one_line_and_exit_2(extra: list[str], needle: str, cli) -> None:
    res = cli("chaos", HOT_APP, "--in-process", "--no-trace", *extra)
    err = res.stderr.strip()
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert len(err.splitlines()) == 1 and err.startswith("replay: error: "), err
    assert needle in err and "Traceback" not in err, err


@pytest.mark.mpi  # in-process, but --ranks 2 and cluster start mpiexec
def test_under_mpiexec_the_same_seed_gives_the_in_process_outcomes(tmp_path: Path, cli) -> None:
    path = tmp_path / "m.sqlite"
    args = ["chaos", HOT_APP, "-p", "n=40", "--threads", "2", "--runs", "2", "--chaos-seed", "1"]
    mpi = cli(*args, "--ranks", "2", "--trace", str(path), "--json")
    assert mpi.returncode == 0, mpi.stderr
    here = chaos.explore(hot_rows, {"n": 40}, runs=2, chaos_seed=1, nodes=2, threads=2)
    got = json.loads(mpi.stdout)["runs"]
    assert [r["outcome"] for r in got] == [r.outcome for r in here.runs]
    with tracer.open(path) as store:
        assert [r.labels["chaos_run"] for r in store.runs()] == [0, 1]
    rep = cli("cluster", str(path), "--run", got[1]["run_id"])
    assert rep.returncode == 0 and "identical" in rep.stdout, rep.stderr


# ====================================================================== sync_for
@pytest.mark.parametrize(("app", "threads"), [(ssp_mix, 1), (hybrid_mix, 2)])
def test_ssp_visibility_and_hybrid_mutex_orders_are_drawn_and_replay(
    app, threads: int, tmp_path: Path
) -> None:
    from replay._replay import replay_here

    path = str(tmp_path / "s.sqlite")
    a = chaos.explore(app, {}, runs=5, chaos_seed=2, nodes=3, threads=threads, trace=path)
    b = chaos.explore(app, {}, runs=5, chaos_seed=2, nodes=3, threads=threads)
    assert [r.outcome for r in a.runs] == [r.outcome for r in b.runs]
    assert a.distinct > 1, a.lines()
    spread = a.spread()["sum"]
    assert len(spread) == 2 and all(lo <= med <= hi for lo, med, hi in spread)
    assert any(lo < hi for lo, _, hi in spread)
    for r in a.runs[:2]:
        rep = replay_here({"kind": "replay", "mode": "single", "trace": path, "run_id": r.run_id})
        assert rep["identical"], rep


def test_ssp_chaos_stays_within_the_staleness_bound() -> None:
    from engine.lowlevel import Chaos

    for run in range(20):
        script = Chaos(4, run).visibility("ssp", 0, 1, 3, 2)
        prev = (-1, -1, -1)
        for c in range(12):
            cap = script(c)
            assert cap[1] == c - 1  # own entry: its own update of the last clock
            for q in (0, 2):
                assert max(prev[q], c - 3) <= cap[q] <= c - 1
            prev = cap


def test_hybrid_chaos_runs_pass_the_backward_dual_test() -> None:
    report = chaos.explore(hybrid_mix, {}, runs=4, chaos_seed=5, nodes=2, threads=2, check="dual")
    assert report.failed is None, report.lines()
    assert report.distinct > 1


# ====================================================================== mutants
#: Chaos runs a mutant hunt may use before its test fails (each run: a few tens of ms).
MUTANT_RUNS = 10

#: Per mutant: a program that exercises it and its cluster shape (nodes, threads).
MUTANT_PROGRAMS = {
    "skip_writeback": (mini_mf, 2, 2),
    "stale_prefetch": (mini_mf, 2, 2),
    "drop_barrier": (mini_mf, 2, 2),
    "aggregate_twice": (bsp_mix, 3, 1),
    "reorder_aggregation": (bsp_mix, 3, 1),
    "wrong_lock_order": (hot_rows, 1, 2),
}


@pytest.mark.parametrize("mutant", sorted(MUTANT_PROGRAMS))
def test_chaos_with_the_dual_check_finds_each_mutant(mutant: str, tmp_path: Path) -> None:
    app, nodes, threads = MUTANT_PROGRAMS[mutant]
    clean = chaos.explore(app, {}, runs=3, chaos_seed=0, nodes=nodes, threads=threads, check="dual")
    assert clean.failed is None, clean.lines()  # the program itself is fine
    path = str(tmp_path / "m.sqlite")
    with mutants.active(mutant):
        report = chaos.explore(
            app,
            {},
            runs=MUTANT_RUNS,
            chaos_seed=0,
            nodes=nodes,
            threads=threads,
            check="dual",
            trace=path,
        )
    assert not mutants.ACTIVE
    f = report.failed
    assert f is not None, f"{mutant}: not found in {MUTANT_RUNS} chaos runs"
    print(f"{mutant}: found by chaos run {f.run} ({len(report.runs)} run(s))")
    assert f.check == "dual" and "backward: FAIL" in f.message
    assert len(report.runs) == f.run + 1  # exploration stopped at the first failure
    assert f.replay_command == f"replay single {path} --run {report.runs[-1].run_id}"
    if f.location is not None:
        op, inv, index = f.location
        assert f.break_command == f"{f.replay_command} --break {op}:{inv}:{index}"


#: Chaos runs that find wrong_lock_order (chaos seed 0, 1 node x 2 threads, HOT): the
#: first run already does (benchmarks/mutant_hunts.py reports the figure).
LOCK_RUNS = 3


def test_chaos_overlaps_lock_split_bodies_so_a_wrong_lock_set_shows(tmp_path: Path) -> None:
    """The bodies of a lock-split round overlap at every access to an element the group
    writes (the baton gate), so a body that reads an element it did not lock
    (wrong_lock_order) sees another body mid-way and the backward dual test fails; with
    the right locks the same exploration is some serial order in every run, each run
    replays bit for bit and the same seed gives the same digests."""
    path = str(tmp_path / "locks.sqlite")
    with mutants.active("wrong_lock_order"):
        bad = chaos.explore(
            hot_rows,
            HOT,
            runs=LOCK_RUNS,
            chaos_seed=0,
            nodes=1,
            threads=2,
            check="dual",
            trace=path,
        )
    f = bad.failed
    assert f is not None, bad.lines()
    print(f"wrong_lock_order: found by chaos run {f.run} of {LOCK_RUNS}")
    assert f.check == "dual" and "backward: FAIL" in f.message and "op hot" in f.message
    assert f.replay_command == f"replay single {path} --run {bad.runs[-1].run_id}"

    from replay._replay import replay_here

    good_path = str(tmp_path / "good.sqlite")
    good = chaos.explore(
        hot_rows,
        HOT,
        runs=LOCK_RUNS,
        chaos_seed=0,
        nodes=1,
        threads=2,
        check="dual",
        trace=good_path,
    )
    assert good.failed is None and good.distinct > 1, good.lines()
    for r in good.runs:
        rep = replay_here(
            {"kind": "replay", "mode": "single", "trace": good_path, "run_id": r.run_id}
        )
        assert rep["identical"], rep
    again = chaos.explore(hot_rows, HOT, runs=LOCK_RUNS, chaos_seed=0, nodes=1, threads=2)
    assert [r.digests for r in again.runs] == [r.digests for r in good.runs]
    assert [r.outcome for r in again.runs] == [r.outcome for r in good.runs]


# ====================================================================== faults
def test_a_stopped_node_leaves_a_crashed_trace_that_replays_up_to_the_crash(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "f.sqlite")
    report = chaos.explore(
        mini_mf, {}, runs=4, chaos_seed=1, nodes=2, threads=2, trace=path, faults=True
    )
    assert report.failed is None, report.lines()
    crashed = [r for r in report.runs if r.crash is not None]
    assert crashed, report.lines()  # the seed stops a node in some runs
    with tracer.open(path) as store:
        status = {r.run_id: r.status for r in store.runs()}
    for r in report.runs:
        assert status[r.run_id] == ("crashed" if r.crash is not None else "finished")
    for r in crashed:
        assert r.crash["identical"] and r.crash["op"] == "sgd"
    again = chaos.explore(mini_mf, {}, runs=4, chaos_seed=1, nodes=2, threads=2, faults=True)
    assert [
        r.crash and (r.crash["node"], r.crash["invocation"], r.crash["after"]) for r in again.runs
    ] == [
        r.crash and (r.crash["node"], r.crash["invocation"], r.crash["after"]) for r in report.runs
    ]
    text = "\n".join(report.lines())
    assert "trace status crashed, replayed up to the crash: identical" in text


def test_faults_need_the_in_process_cluster_and_no_dual_check() -> None:
    from replay._errors import UsageError

    with pytest.raises(UsageError, match="--faults"):
        chaos.explore(mini_mf, {}, runs=1, chaos_seed=1, faults=True, check="dual")


# ====================================================================== README
def test_readme_chaos_commands_are_chaos_commands_and_the_ssp_one_runs(tmp_path: Path, cli) -> None:
    import shlex

    from tests.conftest import ROOT

    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Chaos mode") : text.index("## Benchmarks")]
    block = re.search(r"```bash\n(.*?)\n```", section, re.S).group(1)
    lines = block.splitlines()
    assert lines and all(line.startswith("replay chaos ") for line in lines)
    (ssp,) = [line for line in lines if "sync=ssp" in line]
    res = cli(*shlex.split(ssp)[1:], "--trace", str(tmp_path / "r.sqlite"), cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert "5 chaos run(s) with chaos seed 1" in res.stdout
    assert "loss per iteration (min / median / max):" in res.stdout


def test_check_app_uses_the_app_modules_check_function(tmp_path: Path, cli) -> None:
    ok_app = str(Path(__file__).with_name("chaos_apps.py")) + ":ssp_mix"
    args = ["chaos", ok_app, "--runs", "2", "--chaos-seed", "1", "--no-trace", "--check", "app"]
    res = cli(*args)
    assert res.returncode == 0, res.stdout + res.stderr
    bad = tmp_path / "bad_check.py"
    bad.write_text(
        "import engine as ap\n\n"
        "def train():\n"
        "    ap.log_objective('x', 1.0)\n\n"
        "def check(run):\n"
        "    x = run.objectives['x'][-1]\n"
        "    return f'x is {x}, above 0.5' if x > 0.5 else None\n"
    )
    args = ["chaos", f"{bad}:train", "--runs", "3", "--chaos-seed", "1", "--no-trace"]
    res = cli(*args, "--check", "app")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "x is 1.0, above 0.5" in res.stdout + res.stderr
    res = cli("chaos", HOT_APP, "--runs", "1", "--chaos-seed", "1", "--check", "app")
    assert res.returncode == 2, res.stdout + res.stderr
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and "defines no function check(run)" in err[0]


# ====================================================================== task placement
def _placement(plan: object) -> list[list[list[tuple[int, tuple[int, ...]]]]]:
    return [
        [[(t.thread, tuple(t.indices.tolist())) for t in tasks] for tasks in rnd]
        for rnd in plan.rounds  # type: ignore[attr-defined]
    ]


@pytest.mark.parametrize("strategy,threads", [("rotation", 1), ("components", 2)])
def test_task_placement_is_drawn_recorded_and_replayed(
    tmp_path: Path, strategy: str, threads: int
) -> None:
    """Each run puts the plan's work on another of its equally good placements (nodes
    permuted, thread labels renamed); the trace keeps the placement, a replay follows it
    (and still checks that its own planning made the same tasks), and with one thread
    per node the outcome is the plan's serial one whatever the placement."""
    from replay._replay import replay_here

    path = str(tmp_path / "chaos.sqlite")
    params = {"strategy": strategy}
    report = chaos.explore(
        mini_mf, params, runs=5, chaos_seed=2, nodes=3, threads=threads, trace=path
    )
    with tracer.open(path) as store:
        placements = {
            json.dumps(_placement(store.run(r.run_id).plan("sgd", 0))) for r in report.runs
        }
    assert len(placements) > 1, "every run used the same placement"
    if threads == 1:
        assert report.distinct == 1, report.lines()
    for r in report.runs[:3]:
        rep = replay_here({"kind": "replay", "mode": "single", "trace": path, "run_id": r.run_id})
        assert rep["identical"], rep


@pytest.mark.parametrize("strategy,threads", [("rotation", 1), ("components", 2)])
def test_a_chaos_run_replays_from_any_checkpoint(
    tmp_path: Path, strategy: str, threads: int
) -> None:
    """After a fast-forward the replay plans afresh at an invocation the recorded run did
    not plan at; that plan must take the recorded placement, as a plan start's does, or
    every ``--from`` of a chaos run was DIVERGED on a thread or node it had drawn."""
    from replay._replay import replay_here

    path = str(tmp_path / "chaos.sqlite")
    params = {"strategy": strategy}
    report = chaos.explore(
        mini_mf, params, runs=3, chaos_seed=2, nodes=3, threads=threads, trace=path
    )
    for r in report.runs:  # checkpoint 0 only: sgd#1 is planned afresh, not recorded so
        spec = {"kind": "replay", "mode": "single", "trace": path, "run_id": r.run_id}
        rep = replay_here(spec | {"from": ["sgd", 1]})
        assert rep["identical"], (r.run_id, rep["first_difference"])
        assert rep["from"] == {"op": "sgd", "invocation": 0, "step": 0}, rep["from"]


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_plan_is_recognised_on_any_of_its_placements(data: st.DataObject) -> None:
    from engine._machines.planner import Plan, Task, placed, placement_like

    nodes = data.draw(st.integers(1, 4))
    threads = data.draw(st.integers(1, 3))
    n_rounds = data.draw(st.integers(1, 3))
    n = data.draw(st.integers(0, 30))
    where = data.draw(
        st.lists(st.integers(0, n_rounds * nodes * threads - 1), min_size=n, max_size=n)
    )
    rounds = [[[] for _ in range(nodes)] for _ in range(n_rounds)]
    for j, slot in enumerate(where):
        r, rest = divmod(slot, nodes * threads)
        p, t = divmod(rest, threads)
        rounds[r][p].append(Task(t, np.array([j], dtype=np.int64), bool(j % 3 == 0)))
    plan = Plan("components", 0, n, nodes, threads, rounds)
    perm = data.draw(st.permutations(range(nodes)))
    names = {
        (r, p): data.draw(st.permutations(range(threads)))
        for r in range(n_rounds)
        for p in range(nodes)
    }
    moved = placed(plan, list(perm), names)
    got = placement_like(plan, moved)
    assert got is not None and _placement(got) == _placement(moved)
    assert sorted(moved.bodies_per_node().tolist()) == sorted(plan.bodies_per_node().tolist())
    if n >= 1 and nodes * n_rounds > 1:  # one index moved elsewhere: not a placement
        j = data.draw(st.integers(0, n - 1))
        other = [[list(tasks) for tasks in rnd] for rnd in plan.rounds]
        for rnd in other:
            for tasks in rnd:
                tasks[:] = [t for t in tasks if t.indices[0] != j]
        r, p = divmod(data.draw(st.integers(0, n_rounds * nodes - 1)), nodes)
        other[r][p].append(Task(0, np.array([j], dtype=np.int64)))
        changed = Plan("components", 0, n, nodes, threads, other)
        if _canon(changed) != _canon(plan):
            assert placement_like(plan, changed) is None


def _canon(plan: object) -> list[list[tuple[tuple[bool, tuple[int, ...]], ...]]]:
    """Per round, the nodes' work with thread labels dropped, as a sorted list: equal
    for two plans that are placements of one another (and for a few that are not)."""
    return [
        sorted(tuple((bool(t.locked), tuple(t.indices.tolist())) for t in tasks) for tasks in rnd)
        for rnd in plan.rounds  # type: ignore[attr-defined]
    ]


def test_in_process_runs_of_a_builtin_app_replay_by_its_name(tmp_path: Path, cli) -> None:
    """The command records a built-in app by its name, in process as under mpiexec, so
    the ``replay single`` command it prints works (it was recorded as the app's module
    file, which cannot be imported on its own)."""
    trace = tmp_path / "c.sqlite"
    argv = ["chaos", "sgdmf", "-p", "synthetic=true", "-p", "epochs=1", "--in-process"]
    argv += ["--ranks", "2", "--runs", "2", "--chaos-seed", "3", "--trace", str(trace), "--json"]
    res = cli(*argv)
    assert res.returncode == 0, res.stderr
    runs = json.loads(res.stdout)["runs"]
    with tracer.open(trace) as store:
        assert {r.app for r in store.runs()} == {"sgdmf"}
    for r in runs:
        rep = cli("single", str(trace), "--run", r["run_id"], "--json")
        assert rep.returncode == 0 and json.loads(rep.stdout)["identical"], rep.stderr
