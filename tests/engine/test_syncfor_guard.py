"""sync_for never drops or stales an access outside its reconnaissance rows, and averages
over nodes (threads add up): value-dependent rows (rng draws, parameter values, a flag
that flips) under BSP, SSP and Hybrid on 1-3 nodes, replan="auto"/"always"/"never",
what the recorder sees, the CLI's exit status, and the same under mpiexec."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import engine as ap
from engine._syncfor import loop as _syncfor
from tests.conftest import run_cli, run_mpi

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from mpi_syncguard import KINDS, OP, counts_program, program, simulate  # noqa: E402

SHAPES = [(1, 1), (1, 2), (2, 1), (2, 2), (3, 1), (3, 2)]


def close(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.allclose(a, b, rtol=0, atol=1e-12))


# ---------------------------------------------------------------- the reported case
def test_rng_rows_count_every_write_in_every_epoch() -> None:
    """Ten minibatches that each add 1 to a drawn row of E: 10, 20, 30 (was 10, 10, 10)."""

    def prog(epochs: int):
        def f() -> list[float]:
            D = ap.dvector(10, shape=(1,), name="D")
            E = ap.dvector(50, shape=(), name="E")

            def body(batch: ap.Batch) -> None:
                E[int(ap.rng().integers(50))] += 1

            out = []
            for _ in range(epochs):
                ap.sync_for(D, 1, body, name="neg")
                out.append(float(E.gather().sum()))
            return out

        return f

    for epochs in (1, 2, 3):
        assert ap.run(prog(epochs)).value == [10.0, 20.0, 30.0][:epochs]


# ---------------------------------------------------------------- the failure class
@pytest.mark.parametrize("nodes,threads", SHAPES)
@pytest.mark.parametrize("kind", KINDS)
def test_bsp_with_unpredictable_rows_equals_the_definition(kind, nodes, threads) -> None:
    out = ap.run(program(kind), nodes=nodes, threads=threads).value
    e, g = simulate(kind, nodes=nodes, threads=threads)
    assert out["coherent"]
    assert np.array_equal(out["E"], e) and np.array_equal(out["G"], g)
    assert out["planner"]["replans"] >= 1  # the guard did fire
    if kind == "value":  # rows depend on values of the same invocation: moved whole
        assert out["planner"]["whole_fallbacks"] >= 1


@pytest.mark.parametrize("nodes,threads", SHAPES)
@pytest.mark.parametrize("kind", KINDS)
def test_ssp_and_hybrid_with_unpredictable_rows(kind, nodes, threads) -> None:
    """SSP reads may be stale and Hybrid's threads share a cache in a free order, so a
    value-dependent body may legitimately pick other rows; what stays fixed: the rng
    and flag bodies' deltas do not depend on values (so the result is the definition's),
    and the value body adds 1 to E[0] and 1 to some other row per minibatch."""
    e, g = simulate(kind, nodes=nodes, threads=threads)
    for sync in ("ssp", "hybrid"):
        out = ap.run(program(kind, sync=sync), nodes=nodes, threads=threads).value
        assert out["coherent"], sync
        assert out["planner"]["replans"] >= 1, sync
        if kind == "value":
            assert close(out["E"][0], e[0]), (sync, out["E"], e)
            assert close(out["E"][1:].sum(), out["E"][0]), (sync, out["E"])
        else:
            assert close(out["E"], e) and close(out["G"], g), (sync, out["E"], e)


@pytest.mark.parametrize("per_clock", [2, 3])
def test_several_minibatches_per_clock(per_clock: int) -> None:
    for kind in KINDS:
        out = ap.run(program(kind, per_clock=per_clock), nodes=2, threads=2).value
        e, g = simulate(kind, nodes=2, threads=2, per_clock=per_clock)
        assert np.array_equal(out["E"], e) and np.array_equal(out["G"], g), kind


@pytest.mark.parametrize(
    "nodes,threads,expected",
    [
        (1, 1, [5.0] * 6),
        (2, 2, [2.5] * 4 + [5.0] * 2),  # the second clock runs on node 0 alone
        (3, 1, [5.0 / 3] * 6),
    ],
)
def test_a_read_outside_the_rows_is_not_served_stale(nodes, threads, expected) -> None:
    """Epoch 0 reads A[0] only; the driver then sets A[1] = 5 and epoch 1 reads A[1],
    which no worker cache ever fetched: it must be fetched, not served from the cache."""

    def prog() -> list[float]:
        D = ap.dvector(6, shape=(1,), name="D")
        A = ap.dvector(2, shape=(), name="A")
        F = ap.dvector(1, shape=(), name="F")
        S = ap.dvector(6, shape=(), name="S")

        def body(batch: ap.Batch) -> None:
            m = batch.number
            A[0] += 1.0
            S[m] = A[1] if F[0] > 0 else A[0]

        ap.sync_for(D, 1, body, name="reads")
        F[0] = 1.0
        for m in range(6):
            S[m] = 0.0
        A[1] = 5.0
        ap.sync_for(D, 1, body, name="reads")
        return S.gather().tolist()

    # every S[m] is written by one worker: its node's delta 5, averaged over the nodes
    # that ran in its clock
    assert ap.run(prog, nodes=nodes, threads=threads).value == expected


# ---------------------------------------------------------------- aggregation arithmetic
@pytest.mark.parametrize("n,x0,y", [(12, 4.0, [1.0] * 12), (14, 6.0, [1.0] * 12 + [3.0] * 2)])
def test_threads_add_up_and_nodes_average(n, x0, y) -> None:
    """3 nodes x 2 threads, minibatch m adds 1 to X[0] and 3 to Y[m]: a clock of six
    minibatches gives X[0] += (2+2+2)/3 and Y[m] += 3/3; the last clock of n=14 runs on
    node 0 alone (2 minibatches), which is the only node averaged: X[0] += 2, Y[m] += 3."""
    x, yy = ap.run(counts_program(n), nodes=3, threads=2).value
    assert x.tolist() == [x0]
    assert yy.tolist() == y


def test_hybrid_averages_over_nodes_too() -> None:
    def prog() -> float:
        D = ap.dvector(12, shape=(1,), name="D")
        X = ap.dvector(1, shape=(), name="X")

        def body(batch: ap.Batch) -> None:
            X[0] += 1.0

        ap.sync_for(D, 1, body, sync="hybrid", name="h")
        return float(X.gather()[0])

    assert ap.run(prog, nodes=3, threads=2).value == 4.0


# ---------------------------------------------------------------- replan= modes
def test_replan_never_names_op_invocation_minibatch_and_element() -> None:
    def prog() -> None:
        D = ap.dvector(4, shape=(1,), name="D")
        E = ap.dvector(6, shape=(), name="E")
        F = ap.dvector(1, shape=(), name="F")

        def body(batch: ap.Batch) -> None:
            E[batch.number + (2 if F[0] > 0 else 0)] = 7.0  # a write, no read

        ap.sync_for(D, 1, body, replan="never", name="strict")
        before = E.gather().copy()
        F[0] = 1.0
        try:
            ap.sync_for(D, 1, body, replan="never", name="strict")
        finally:
            assert np.array_equal(E.gather(), before)  # the attempt was undone
            assert all(np.array_equal(E._bufs[p], before) for p in E._bufs)

    with pytest.raises(ap.AccessOutsideReconError) as info:
        ap.run(prog, nodes=2, threads=2)
    err = info.value
    # minibatch 0 (node 0) writes E[2] first: reconnaissance saw it write E[0]
    assert (err.op, err.invocation, err.minibatch, err.element) == ("strict", 1, 0, "E[2]")
    assert err.write
    msg = str(err)
    assert "'strict'" in msg and "invocation 1" in msg and "minibatch 0" in msg
    assert "wrote E[2]" in msg and "replan=" in msg


def test_replan_always_runs_reconnaissance_every_invocation(monkeypatch) -> None:
    calls = []
    real = _syncfor._recon

    def counting(*args, **kw):
        calls.append(args[2])  # the invocation
        return real(*args, **kw)

    monkeypatch.setattr(_syncfor, "_recon", counting)
    out = ap.run(program("rng", replan="always"), nodes=2, threads=2).value
    e, g = simulate("rng", nodes=2, threads=2)
    assert np.array_equal(out["E"], e)
    assert calls == [0, 1, 2]
    assert out["planner"]["replans"] == 0  # never had to undo anything


def test_replan_auto_undoes_once_then_plans_ahead(monkeypatch, capfd) -> None:
    calls = []
    real = _syncfor._recon

    def counting(*args, **kw):
        calls.append(args[2])
        return real(*args, **kw)

    monkeypatch.setattr(_syncfor, "_recon", counting)
    out = ap.run(program("rng", epochs=4), nodes=2).value
    # inv 0: fresh; inv 1: violates, re-plans; inv 2 and 3: reconnaissance up front
    assert calls == [0, 1, 2, 3]
    assert out["planner"]["replans"] == 1
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "'guarded' invocation 1" in err[0] and "re-ran reconnaissance" in err[0]


def test_replan_auto_goes_back_to_cached_sets_when_rows_settle(monkeypatch) -> None:
    calls = []
    real = _syncfor._recon

    def counting(*args, **kw):
        calls.append(args[2])
        return real(*args, **kw)

    monkeypatch.setattr(_syncfor, "_recon", counting)
    out = ap.run(program("flag", epochs=5), nodes=2).value
    e, g = simulate("flag", nodes=2, threads=1, epochs=5)
    assert np.array_equal(out["E"], e) and np.array_equal(out["G"], g)
    # inv 1 re-plans; inv 2 plans ahead and finds the same sets; inv 3, 4 reuse them
    assert calls == [0, 1, 2]


def test_replan_is_validated() -> None:
    def prog() -> None:
        D = ap.dvector(2, shape=(1,), name="D")
        E = ap.dvector(2, shape=(), name="E")

        def body(batch: ap.Batch) -> None:
            E[0] += 1.0

        ap.sync_for(D, 1, body, replan="sometimes", name="bad")

    with pytest.raises(ValueError, match="replan must be one of"):
        ap.run(prog)


def test_a_body_that_swallows_the_error_is_still_undone() -> None:
    def prog() -> float:
        D = ap.dvector(4, shape=(1,), name="D")
        E = ap.dvector(8, shape=(), name="E")

        def body(batch: ap.Batch) -> None:
            try:
                E[int(ap.rng().integers(8))] += 1.0
            except Exception:  # noqa: BLE001 - the point of the test
                pass

        for _ in range(3):
            ap.sync_for(D, 1, body, name="swallow")
        return float(E.gather().sum())

    assert ap.run(prog).value == 12.0


# ---------------------------------------------------------------- recorder
class Events(ap.Recorder):
    def __init__(self) -> None:
        self.log: list[tuple] = []

    def aggregation_order(self, op, invocation, node, clock, sources) -> None:  # noqa: ANN001
        self.log.append(("agg", invocation, node, clock, tuple(sources.tolist())))

    def ssp_visibility(self, op, invocation, node, clock, applied) -> None:  # noqa: ANN001
        self.log.append(("vis", invocation, node, clock))

    def body_order(self, op, invocation, node, clock, threads, minibatches) -> None:  # noqa: ANN001
        self.log.append(("body", invocation, node, clock, tuple(minibatches.tolist())))

    def message_received(self, node, channel, source, seq, nbytes) -> None:  # noqa: ANN001
        self.log.append(("msg", node, channel, source, seq))

    def invocation_done(self, op, invocation, node, info) -> None:  # noqa: ANN001
        self.log.append(("done", invocation, node, tuple(info.get("digests", ()))))


@pytest.mark.parametrize("sync", ["bsp", "ssp", "hybrid"])
def test_only_the_attempt_that_stands_is_recorded(sync: str) -> None:
    """A run that undid invocation 1 records exactly what a run that planned ahead
    (replan="always", nothing undone) records: same events, same digests."""
    undone, ahead = Events(), Events()
    a = ap.run(program("rng", sync=sync), nodes=2, threads=2, recorder=undone).value
    b = ap.run(program("rng", sync=sync, replan="always"), nodes=2, threads=2, recorder=ahead)
    assert a["planner"]["replans"] >= 1 and b.value["planner"]["replans"] == 0
    if sync == "hybrid":  # mutex orders are free: compare which bodies ran, not the order
        undone.log = [e[:4] + (tuple(sorted(e[4])),) if e[0] == "body" else e for e in undone.log]
        ahead.log = [e[:4] + (tuple(sorted(e[4])),) if e[0] == "body" else e for e in ahead.log]
    assert undone.log == ahead.log
    assert sum(e[0] == "done" for e in undone.log) == 3 * 2


# ---------------------------------------------------------------- CLI
def test_cli_exit_status_1_for_replan_never(tmp_path: Path) -> None:
    app = tmp_path / "neg.py"
    app.write_text(
        textwrap.dedent(
            """
            import engine as ap

            def train(epochs: int = 2):
                D = ap.dvector(6, shape=(1,), name="D")
                E = ap.dvector(40, shape=(), name="E")

                def body(batch):
                    E[int(ap.rng().integers(40))] += 1.0

                for _ in range(epochs):
                    ap.sync_for(D, 1, body, replan="never", name="neg")
            """
        )
    )
    proc = run_cli(["run", f"{app}:train", "--no-trace"], cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "'neg' invocation 1" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


# ---------------------------------------------------------------- MPI
@pytest.mark.parametrize("ranks,threads", [(2, 1), (3, 2)])
def test_guard_and_aggregation_under_mpiexec(ranks: int, threads: int) -> None:
    proc = run_mpi([str(HERE / "mpi_syncguard.py"), str(threads)], ranks)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ranks={ranks} threads={threads} OK" in proc.stdout, proc.stdout + proc.stderr


def test_public_names() -> None:
    assert OP == "guarded"
    assert issubclass(ap.AccessOutsideReconError, ap.EngineError)
