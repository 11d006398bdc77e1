"""async_for under mpiexec with 2 and 3 ranks (bounded by a timeout).

The cases run in one ``mpiexec`` launch per rank count (tests/mpibatch.py); each test
reads its case's outcome, as it read its own launch's."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

import engine as ap
from tests import mpibatch
from tests.engine.trapped import trapped

HERE = Path(__file__).parent
Batches = dict[int, mpibatch.Batch]
SERIALIZABLE = [(2, 1), (2, 2), (3, 1), (3, 3)]
JITTER = [(3, 2, 0), (3, 1, 1), (2, 2, 2)]
#: (ranks, threads) of the ring cases; each runs plainly and under these jitter seeds
RING = [(2, 1), (3, 1), (3, 2)]
RING_SEEDS = (3, 4, 5)
#: jitter seeds of the deferred-receive case (run plainly too)
DEFER_SEEDS = (1, 2)


@pytest.fixture(scope="module")
def mpi(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Batches:
    """The selected tests' cases, one batch per rank count."""
    tmp = tmp_path_factory.mktemp("mpi")
    batches = {n: mpibatch.Batch(n, tmp / str(n)) for n in (2, 3)}
    for p in mpibatch.selected(request, test_serializable_under_mpiexec):
        batches[p["ranks"]].add(
            f"serializable-{p['threads']}", HERE / "mpi_serializable.py", p["threads"]
        )
    if mpibatch.selected(request, test_routed_write_back_reaches_every_destination):
        batches[3].add("rounds", HERE / "mpi_rounds.py")
    for p in mpibatch.selected(request, test_message_timing_never_changes_a_result):
        name = f"jitter-{p['threads']}-{p['seed']}"
        batches[p["ranks"]].add(name, HERE / "mpi_jitter.py", p["threads"], p["seed"])
    rings = {
        (p["ranks"], p["threads"])
        for p in mpibatch.selected(request, test_a_stop_is_reported_alike_whatever_the_timing)
    }
    if mpibatch.selected(request, test_a_failing_body_ends_every_rank_alike):
        rings.add((3, 1))  # it reads the 3-rank, 1-thread ring's "failing" runs
    for ranks, threads in sorted(rings):
        batches[ranks].add(f"ring-{threads}", HERE / "mpi_ring.py", threads, *RING_SEEDS)
    for p in mpibatch.selected(request, test_a_token_plan_defers_receives_and_keeps_the_bits):
        batches[p["ranks"]].add("defer", HERE / "mpi_defer.py", *DEFER_SEEDS)
    for p in mpibatch.selected(request, test_rows_left_at_home_reach_the_next_reader):
        batches[p["ranks"]].add("home", HERE / "mpi_home.py", *DEFER_SEEDS)
    for p in mpibatch.selected(request, test_each_rank_loads_its_share_of_a_file):
        batches[p["ranks"]].add("load", HERE / "mpi_load.py", str(tmp / f"load{p['ranks']}"))
    for p in mpibatch.selected(request, test_a_sharded_dvector_gives_whole_replicas_bits):
        batches[p["ranks"]].add("shard", HERE / "mpi_shard.py", *DEFER_SEEDS)
    for p in mpibatch.selected(request, test_replan_never_raises_on_every_rank):
        batches[p["ranks"]].add("never", HERE / "mpi_never.py")
    return batches


@pytest.mark.parametrize("ranks,threads", SERIALIZABLE)
def test_serializable_under_mpiexec(ranks: int, threads: int, mpi: Batches) -> None:
    proc = mpi[ranks].result(f"serializable-{threads}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ranks={ranks} threads={threads} OK rotation" in proc.stdout


def test_routed_write_back_reaches_every_destination(mpi: Batches) -> None:
    proc = mpi[3].result("rounds")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK" in proc.stdout


@pytest.mark.parametrize("ranks,threads,seed", JITTER)
def test_message_timing_never_changes_a_result(
    ranks: int, threads: int, seed: int, mpi: Batches
) -> None:
    # seeded late deliveries and pauses (tests/engine/mpi_jitter.py); seed 0 on 3 ranks
    # broke the write-back that took a round-ahead rank's rows (fixed in 700b76b)
    proc = mpi[ranks].result(f"jitter-{threads}-{seed}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK" in proc.stdout


@pytest.mark.parametrize("ranks,threads", RING)
def test_a_stop_is_reported_alike_whatever_the_timing(
    ranks: int, threads: int, mpi: Batches
) -> None:
    # tests/engine/mpi_ring.py: the last node leaves the rotation in round 0; on 3 ranks a
    # lower node that hears of it an exchange late leaves it in round 1.  Every rank of
    # every run (plain, and under jitter that puts ranks rounds apart) must report the
    # round-0 stop, finish (no rank waits forever for a stopped one: the batch's timeout
    # bounds it), and give the in-process cluster's bits after the re-plan.
    proc = mpi[ranks].result(f"ring-{threads}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK" in proc.stdout, proc.stdout + proc.stderr
    want = ap.run(trapped, nodes=ranks, threads=threads).value
    assert want["rounds"] == ranks  # a rotation: a fast rank can be rounds ahead
    if ranks == 3:
        assert len(want["trapped"]) == 2  # the second, later stop exists
    relaxed = ap.run(lambda: trapped(relaxed=True), nodes=ranks, threads=threads).value
    for rank, got in enumerate(mpi[ranks].values(f"ring-{threads}")):
        runs = got["runs"]
        assert len(runs) == 1 + len(RING_SEEDS)
        assert got["relaxed"]["notes"] == [[0, ranks - 1, relaxed["trapped"][0]]]
        if threads == 1:
            assert got["relaxed"]["tables"] == relaxed["tables"], rank
        for run in runs:
            assert run["notes"] == [[0, ranks - 1, want["trapped"][0]]], (rank, run["notes"])
            if threads == 1:  # more threads: lock grants in arrival order, other bits
                assert run["tables"] == want["tables"], rank
            # the write-backs of an invocation agree once, not once per round
            assert run["exchange_collectives"] == [1] * len(run["exchange_collectives"])
            assert len(run["exchange_collectives"]) >= 4  # 3 invocations and one undone


def test_a_failing_body_ends_every_rank_alike(mpi: Batches) -> None:
    # tests/engine/mpi_ring.py's `failing`: on 3 ranks the round-1 body of a node that
    # hears late of the round-0 stop raises.  Alone, its error is the outcome; after the
    # round-0 stop, the stop comes first (re-plan), and the body fails again in the new
    # attempt.  Either way every rank ends (no rank waits for the failed one), the failed
    # rank raises the in-process error and the others name that rank, in every run.
    with pytest.raises(ap.BodyError) as alone:
        ap.run(lambda: trapped(first=False, fail=True), nodes=3)
    with pytest.raises(ap.BodyError) as after:
        ap.run(lambda: trapped(first=True, fail=True), nodes=3)
    want = {False: alone.value, True: after.value}
    stop = [0, 2, ap.run(trapped, nodes=3).value["trapped"][0]]
    got = [value["failing"] for value in mpi[3].values("ring-1")]
    assert all(len(runs) == 4 for runs in got)  # without and with the stop, 2 runs each
    for rank, runs in enumerate(got):
        for first, raised, notes in runs:
            err = want[first]
            if rank == err.node:
                assert raised == ["BodyError", err.index, err.node], (rank, first)
            else:
                # and what it raised, which rank 0 records as the run's error
                assert raised == ["PeerRankFailed", err.node, f"BodyError: {err}"], (rank, first)
            assert notes == ([stop] if first else []), (rank, first)


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_token_plan_defers_receives_and_keeps_the_bits(ranks: int, mpi: Batches) -> None:
    """tests/engine/mpi_defer.py: a token plan's hand-offs skip rounds, so ranks post
    those receives and complete them just before the round that touches the rows
    (``Cluster.settle``); plainly and under message jitter every rank gives the
    in-process cluster's bits, and some receive was deferred.  The rows of a pair of
    ranks travel coalesced (fewer messages than one per round and pair, the same rows),
    and the ranks together send and receive what the in-process cluster counts.  Once
    it has run the plan a rank keeps only its own node's tasks (issue 35), the in-process
    node's of the same number, and every node's body count."""
    from tests.engine.mpi_defer import program, ring

    want = ap.run(program, nodes=ranks)
    assert want.value["kept"] == list(range(ranks))  # in one process every node is local
    plain = ap.run(program, nodes=ranks, coalesce=False)
    assert plain.digests == want.digests
    assert want.value["traffic"]["sent_messages"] < plain.value["traffic"]["sent_messages"]
    deferred = 0
    every = mpi[ranks].values("defer")
    n = 2 + len(DEFER_SEEDS)  # then the ring's runs
    for rank, got in enumerate(every):
        assert len(got) == n + 1 + len(DEFER_SEEDS)  # run n - 1: not coalesced
        for run in got[:n]:
            assert run["kept"] == [rank] and run["bodies"] == want.value["bodies"]
            assert run["own"][rank] == want.value["own"][rank]
            assert run["tasks"] == want.value["tasks"]  # ap.plan_of gathers every node's
            assert run["W"] == want.value["W"] and run["H"] == want.value["H"]
            assert run["digests"] == want.digests and run["rounds"] == want.value["rounds"]
            deferred += run["deferred"]
    for k in range(n):
        total = {c: sum(got[k]["traffic"][c] for got in every) for c in want.value["traffic"]}
        assert total == (plain if k == n - 1 else want).value["traffic"], k
    assert want.value["rounds"] > ranks  # tokens: more rounds than a rotation's P
    assert deferred > 0
    # a rotation whose far rows ride the ring: the in-process bits, messages and bytes
    ringed = ap.run(ring, nodes=ranks)
    for k in range(n, n + 1 + len(DEFER_SEEDS)):
        for got in every:
            assert got[k]["W"] == ringed.value["W"] and got[k]["digests"] == ringed.digests
        total = {c: sum(got[k]["traffic"][c] for got in every) for c in ringed.value["traffic"]}
        assert total == ringed.value["traffic"], k


def test_a_ring_on_three_nodes_relays_rows_that_skip_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the MPI ring case above runs: rows relayed (fewer messages), same bits."""
    from engine._machines import routing
    from tests.engine.mpi_defer import ring

    relayed = ap.run(ring, nodes=3)
    monkeypatch.setattr(routing, "RELAY_BYTES", 0)
    plain = ap.run(ring, nodes=3)
    assert relayed.digests == plain.digests
    assert relayed.value["traffic"]["sent_messages"] < plain.value["traffic"]["sent_messages"]


@pytest.mark.parametrize("ranks", [2, 3])
def test_rows_left_at_home_reach_the_next_reader(ranks: int, mpi: Batches) -> None:
    """tests/engine/mpi_home.py: an invocation's last values go to their homes only; the
    next invocation fetches what its ranks touch (including rows another rank wrote),
    and a driver read, ``reduce`` and ``map`` make the replicas whole first; a body that
    leaves its plan to read a row it was not fetched re-plans.  Plainly and under
    message jitter every rank gives the in-process cluster's bits.  A driver read by
    one rank alone is a divergent driver step on every rank, not a wait for rows."""
    from tests.engine.mpi_home import program

    want = ap.run(program, nodes=ranks)
    for got in mpi[ranks].values("home"):
        assert len(got) == 2 + len(DEFER_SEEDS)
        for run in got[:-1]:
            assert {k: run[k] for k in want.value} == want.value
            assert run["digests"] == want.digests
        assert "a driver read of X" in got[-1]["alone"], got[-1]


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_sharded_dvector_gives_whole_replicas_bits(ranks: int, mpi: Batches) -> None:
    """tests/engine/mpi_shard.py: a Python-object dvector sharded over the ranks (each
    holds its home rows and what its tasks touch), through reconnaissance that reads
    other homes' rows, re-plans, routed and dirty object rows, ``map``, ``reduce``,
    ``sync_for`` and driver reads, writes and iteration: plainly and under message
    jitter every rank gives the bits of the in-process cluster with whole replicas, and
    holds what the in-process cluster's node of the same number holds, and keeps of the
    record of what every node holds its own node's and the rows homed at it."""
    from tests.engine import mpi_shard, shard_progs

    def inproc(steps: list[tuple[str, int]], sharded: bool | None) -> Any:
        def fn() -> dict[str, Any]:
            out = shard_progs.program(steps, sharded)
            A = next(d for d in ap.current().dds if d.name == "A")
            out["holding"] = shard_progs.holding(A)
            out["record"] = shard_progs.record(A)
            return out

        res = ap.run(fn, nodes=ranks)
        return json.loads(json.dumps({**res.value, "digests": res.digests}))

    whole = [inproc(steps, False) for steps in mpi_shard.PROGRAMS]
    sharded = [inproc(steps, None) for steps in mpi_shard.PROGRAMS]
    for rank, got in enumerate(mpi[ranks].values("shard")):
        assert len(got) == 1 + len(DEFER_SEEDS)
        for runs in got:
            for run, w, s in zip(runs, whole, sharded, strict=True):
                assert {k: run[k] for k in ("A", "W", "seen", "digests")} == {
                    k: w[k] for k in ("A", "W", "seen", "digests")
                }
                assert run["holding"] == [s["holding"][rank]]
                # of the record of which rows each node holds a rank keeps its own node's
                # and, of every other node's, the rows homed at it (issue 35)
                assert run["record"] == {
                    why: [
                        per[p] if p == rank else [x for x in per[p] if x[1] == rank]
                        for p in range(ranks)
                    ]
                    for why, per in s["record"].items()
                }


@pytest.mark.parametrize("ranks", [2, 3])
def test_each_rank_loads_its_share_of_a_file(ranks: int, mpi: Batches, tmp_path: Path) -> None:
    """tests/engine/mpi_load.py: under MPI ``ap.load`` parses on each rank only the lines
    that start in its share of the bytes and sends the records home: right after loading
    a rank holds its home rows and nothing else, and the records, a loop over them, a
    reduce and the digests are the in-process cluster's.  A bad line is reported alike
    on every rank, by its line number in the whole file; ranks whose files differ stop
    with one error naming each rank's file digest, and a file missing on one rank's host
    is one error naming that rank, on every rank."""
    from tests.engine import mpi_load

    (tmp_path / "good.csv").write_text(mpi_load.GOOD)
    want = ap.run(lambda: mpi_load.good(tmp_path / "good.csv"), nodes=ranks)
    want_value = json.loads(json.dumps(want.value))
    n = want.value["n"]
    assert n == 61
    every = mpi[ranks].values("load")
    lines = len(mpi_load.GOOD.splitlines())
    assert want.value["parsed"] == lines  # one process: every line
    assert sum(got["good"]["parsed"] for got in every) == lines  # each line on one rank
    for rank, got in enumerate(every):
        assert got["good"]["parsed"] < lines * 2 // ranks
        lo, hi = n * rank // ranks, n * (rank + 1) // ranks
        assert got["good"]["held"] == list(range(lo, hi))
        assert {k: got["good"][k] for k in ("n", "A", "total")} == {
            k: want_value[k] for k in ("n", "A", "total")
        }
        assert got["digests"] == json.loads(json.dumps(want.digests))
        assert got["bad"].startswith("DataFormatError: "), got["bad"]
        assert f"bad.csv:{mpi_load.BAD_LINE}: could not convert string to float: 'x'" in got["bad"]
        assert got["mine"].startswith("DriverStepsDivergedError"), got["mine"]
        # the cause is the files, not the driver's Python state
        assert "the ranks read different bytes" in got["mine"], got["mine"]
        assert "Python state" not in got["mine"], got["mine"]
        assert got["lost"].startswith("InputFileError: rank 1: input file "), got["lost"]
        assert got["lost"].endswith("lost1.csv' does not exist"), got["lost"]
        for r in range(ranks):  # each rank's own file and its digest
            assert re.search(
                rf"rank {r} created a dvector from \S+/mine{r}\.csv #[0-9a-f]{{8}}", got["mine"]
            )


@pytest.mark.parametrize("ranks", [2, 3])
def test_replan_never_raises_on_every_rank(ranks: int, mpi: Batches) -> None:
    """tests/engine/mpi_never.py: with ``replan="never"`` a body that leaves its plan
    raises AccessOutsideReconError on every rank, after the attempt is undone, so a
    driver that catches it goes on (raised on the violating rank alone, the others
    waited for its rows for ever); the same error, values and digests as in process."""
    from tests.engine.mpi_never import program

    want = ap.run(program, nodes=ranks)
    assert want.value["caught"] and "replan='never'" in want.value["caught"]
    for got in mpi[ranks].values("never"):
        assert got["caught"] == want.value["caught"]
        assert got["after"] == want.value["after"] and got["X"] == want.value["X"]
        assert got["digests"] == want.digests
