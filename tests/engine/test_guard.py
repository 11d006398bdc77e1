"""The plan guard: programs whose accesses depend on values still give a serial result.

Written from the failure class, not one example: bodies whose reads and writes are
chosen by values that change after reconnaissance (a flag that flips, coefficients that
leave zero, rows drawn from the data), and bodies whose accesses depend on values
written earlier in the *same* invocation.  Each must give a result that some serial
order of the bodies gives — checked against a plain numpy loop over the order the
engine reports — on 1 to 3 nodes of 1 or 2 threads.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine as ap
from replay import strategies as rs
from replay.strategies import _apply
from tests import mpibatch, mutants

SHAPES = [(1, 1), (2, 1), (3, 1), (2, 2), (3, 2)]


# ====================================================================== generated programs
def _run_generated(program: rs.Program, nodes: int, threads: int, replan: str = "auto"):
    """Run ``program``'s async loops; return initial tables, final tables and the
    serialization order of every invocation, in program order."""

    def driver():
        T = [
            ap.dvector(t.size, shape=(t.width,), init=ap.init.normal(0, 1), name=f"T{i}")
            for i, t in enumerate(program.tables)
        ]
        init = [t.gather().copy() for t in T]
        orders = []
        for _ in range(program.invocations):
            for k, loop in enumerate(program.loops):
                accesses, start = loop.bodies, loop.start

                def body(j, accesses=accesses, start=start):
                    _apply(T, 0.5 + 0.01 * j, accesses[j - start])

                ap.async_for(start, start + len(accesses), body, name=f"a{k}", replan=replan)
                orders.append((k, ap.last_order(f"a{k}")))
        return init, [t.gather() for t in T], orders

    return ap.run(driver, nodes=nodes, threads=threads).value


def _serial(program: rs.Program, init, orders):
    T = [a.copy() for a in init]
    for k, order in orders:
        loop = program.loops[k]
        for j in order.tolist():
            _apply(T, 0.5 + 0.01 * j, loop.bodies[j - loop.start])
    return T


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(x.tobytes() == y.tobytes() for x, y in zip(a, b, strict=True))


@settings(max_examples=60)
@given(
    rs.value_dependent_programs(kinds=("async",), max_bodies=12),
    st.sampled_from(SHAPES),
)
def test_value_dependent_programs_equal_a_serial_loop(program, shape) -> None:
    init, final, orders = _run_generated(program, *shape)
    for k, order in orders:
        loop = program.loops[k]
        assert sorted(order.tolist()) == list(range(loop.start, loop.start + len(loop.bodies)))
    assert _same(final, _serial(program, init, orders))


@settings(max_examples=25)
@given(rs.value_dependent_programs(kinds=("async",), max_bodies=10), st.sampled_from(SHAPES))
def test_replan_always_equals_a_serial_loop_too(program, shape) -> None:
    init, final, orders = _run_generated(program, *shape, replan="always")
    assert _same(final, _serial(program, init, orders))


@settings(max_examples=20)
@given(
    rs.cases(
        programs=rs.value_dependent_programs(kinds=("async",), max_bodies=10),
        shapes=st.sampled_from([rs.Shape(n, t) for n, t in SHAPES]),
    )
)
def test_dual_tests_pass_on_value_dependent_programs(case) -> None:
    rs.assert_case(case)


# ====================================================================== a flag that flips
def _flag_program(n: int = 24):
    """Reconnaissance sees ``flag == 0`` (each body touches its own row); afterwards
    every body also adds its row into its right neighbour: a chain the first plan
    knows nothing about."""

    def prog():
        X = ap.dvector(n, shape=(2,), init=ap.init.normal(0, 1), name="X")
        flag = ap.dvector(1, shape=(), init=ap.init.zeros(), name="flag")

        def body(j):
            x = X[j]
            X[j] = x * 0.5 + 1.0
            if flag[0] > 0 and j + 1 < n:
                X[j + 1] = X[j + 1] * 0.9 + np.tanh(x)

        init = X.gather().copy()
        orders = []
        for it in range(3):
            ap.async_for(0, n, body, name="flip")
            orders.append(ap.last_order("flip"))
            if it == 0:
                flag[0] = 1.0
        return init, X.gather(), orders

    return prog


def _flag_serial(init, orders):
    X = init.copy()
    n = len(X)
    for inv, order in enumerate(orders):
        for j in order.tolist():
            x = X[j].copy()
            X[j] = x * 0.5 + 1.0
            if inv > 0 and j + 1 < n:
                X[j + 1] = X[j + 1] * 0.9 + np.tanh(x)
    return X


@pytest.mark.parametrize("nodes,threads", SHAPES)
def test_a_flag_that_flips_after_reconnaissance(nodes, threads, capfd) -> None:
    init, final, orders = ap.run(_flag_program(), nodes=nodes, threads=threads).value
    assert final.tobytes() == _flag_serial(init, orders).tobytes()
    err = capfd.readouterr().err
    if nodes == 1 and threads == 1:
        assert err == ""  # one node, one thread: any access is serial, nothing to re-plan
    else:
        assert err.count("note: async_for 'flip' invocation 1") == 1, err
        assert "(replan='auto')" in err


def test_replan_never_names_operator_invocation_index_and_element() -> None:
    def prog():
        X = ap.dvector(6, shape=(), init=ap.init.zeros(), name="X")
        flag = ap.dvector(1, shape=(), init=ap.init.zeros(), name="flag")

        def body(j):
            X[j] = 1.0
            if flag[0] > 0 and j == 2:
                X[5] = 7.0

        ap.async_for(0, 5, body, name="strict", replan="never")
        flag[0] = 1.0
        ap.async_for(0, 5, body, name="strict", replan="never")

    with pytest.raises(ap.AccessOutsideReconError) as info:
        ap.run(prog, nodes=2)
    msg = str(info.value)
    assert "'strict' invocation 1 index 2" in msg and "wrote X[5]" in msg
    assert "replan='never'" in msg


def test_replan_rejects_an_unknown_policy() -> None:
    def prog():
        ap.async_for(0, 1, lambda j: None, name="x", replan="sometimes")

    with pytest.raises(ValueError, match="replan must be one of auto, always, never"):
        ap.run(prog)


# ====================================================================== within one invocation
def _chain_program(n: int = 12):
    """Body j writes X[j+1] only if X[j] > 0, and body j-1 is what makes X[j] positive:
    the accesses depend on values written earlier in the same invocation, so no plan
    made before the invocation holds; it must run serially."""

    def prog():
        X = ap.dvector(n + 1, shape=(), init=ap.init.zeros(), name="X")
        X[0] = 1.0

        def body(j):
            if X[j] > 0:
                X[j + 1] = X[j] + 1.0

        ap.async_for(0, n, body, name="chain")
        return X.gather(), ap.plan_of("chain").strategy, ap.last_order("chain")

    return prog


@pytest.mark.parametrize("nodes,threads", SHAPES)
def test_accesses_that_depend_on_the_same_invocation_run_serially(nodes, threads, capfd):
    x, strategy, order = ap.run(_chain_program(), nodes=nodes, threads=threads).value
    assert x.tolist() == [float(k + 1) for k in range(13)]
    assert strategy == "replicated" and order.tolist() == list(range(12))
    assert "so it ran serially on every node" in capfd.readouterr().err


# ====================================================================== Lasso, sparse CD
def _lasso_data(seed: int = 3, n: int = 120, d: int = 40, per_col: int = 8):
    rng = np.random.default_rng(seed)
    X = np.zeros((n, d))
    for j in range(d):
        rows = rng.choice(n, per_col, replace=False)
        X[rows, j] = rng.normal(0, 1, per_col)
    beta = np.zeros(d)
    beta[rng.choice(d, 8, replace=False)] = rng.normal(0, 3, 8)
    y = X @ beta + rng.normal(0, 0.1, n)
    return X, y


def _lasso_columns(X: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray], list[float]]:
    n, d = X.shape
    cols = [np.flatnonzero(X[:, j]) for j in range(d)]
    vals = [X[c, j] for j, c in enumerate(cols)]
    return cols, vals, [float(v @ v) / n for v in vals]


def _cd_step(rho: float, alpha: float, sq: float) -> float:
    return np.sign(rho) * max(abs(rho) - alpha, 0.0) / sq


def _lasso_program(X: np.ndarray, y: np.ndarray, alpha: float, epochs: int, orders: bool = False):
    """Coordinate descent that, on most epochs, skips coefficients that are zero.  With
    ``orders``, the program also returns each invocation's serialization order."""
    n, d = X.shape
    cols, vals, sq = _lasso_columns(X)

    def prog():
        B = ap.dvector(d, shape=(), init=ap.init.zeros(), name="beta")
        R = ap.dvector(n, shape=(), data=y.copy(), name="resid")
        full = ap.dvector(1, shape=(), init=ap.init.zeros(), name="full")

        def body(j):
            b = B[j]
            if b == 0.0 and full[0] == 0.0:
                return  # an active-set pass: only non-zero coefficients move
            rows, v = cols[j], vals[j]
            r = np.array([R[i] for i in rows.tolist()])
            new = _cd_step(float(v @ r) / n + sq[j] * b, alpha, sq[j])
            if new != b:
                B[j] = new
                for i, x in zip(rows.tolist(), v.tolist(), strict=True):
                    R[i] = R[i] - x * (new - b)

        seen = []
        for epoch in range(epochs):
            full[0] = 1.0 if epoch % 2 == 1 else 0.0
            ap.async_for(0, d, body, name="cd")
            if orders:
                seen.append(ap.last_order("cd"))
        return (B.gather(), seen) if orders else B.gather()

    return prog


def _lasso_serial(X: np.ndarray, y: np.ndarray, alpha: float, orders: list[np.ndarray]):
    """The bodies of ``_lasso_program`` in a plain loop over the given orders."""
    n, d = X.shape
    cols, vals, sq = _lasso_columns(X)
    B, R = np.zeros(d), y.copy()
    for epoch, order in enumerate(orders):
        for j in order.tolist():
            b = B[j]
            if b == 0.0 and epoch % 2 == 0:
                continue
            rows, v = cols[j], vals[j]
            new = _cd_step(float(v @ R[rows]) / n + sq[j] * b, alpha, sq[j])
            if new != b:
                B[j] = new
                for i, x in zip(rows.tolist(), v.tolist(), strict=True):
                    R[i] = R[i] - x * (new - b)
    return B


@pytest.mark.parametrize("nodes,threads", [(1, 1), (2, 1), (3, 1), (3, 2)])
def test_lasso_that_skips_zero_coefficients_matches_scikit_learn(nodes, threads) -> None:
    from sklearn.linear_model import Lasso

    X, y = _lasso_data()
    alpha = 0.05
    beta, orders = ap.run(
        _lasso_program(X, y, alpha, 120, True), nodes=nodes, threads=threads
    ).value
    assert beta.tobytes() == _lasso_serial(X, y, alpha, orders).tobytes()
    ref = Lasso(alpha=alpha, fit_intercept=False, tol=1e-12, max_iter=100_000).fit(X, y).coef_
    assert np.max(np.abs(beta - ref)) < 1e-6
    assert np.count_nonzero(beta) > 0


# ====================================================================== honest digests
def test_every_write_path_changes_the_digest() -> None:
    def prog():
        X = ap.dvector(6, shape=(2,), init=ap.init.zeros(), name="X")
        M = ap.dmap(shape=(), keys=["a", "b"], name="M")
        seen = [X.digest()]
        X[1] = 3.0  # driver write
        seen.append(X.digest())

        def body(j):
            X[j] = X[j] + 1.0

        ap.async_for(0, 6, body, name="inc")  # bodies and write-back
        seen.append(X.digest())
        X.set_rows(0, np.array([2]), np.full((1, 2), 9.0))  # a transport write
        seen.append(X.digest())
        m = [M.digest()]
        M["a"] = 1.0
        m.append(M.digest())
        M["c"] = 2.0  # insertion
        m.append(M.digest())
        return seen, m

    seen, m = ap.run(prog, nodes=2).value
    assert len(set(seen)) == len(seen) and len(set(m)) == len(m)


def test_a_write_outside_the_plan_still_changes_the_digest() -> None:
    """The case the issue found: Y is not written at reconnaissance, so the first plan
    does not list it; a later write to it must not leave Y's cached digest in place."""

    def prog():
        X = ap.dvector(4, shape=(), init=ap.init.zeros(), name="X")
        Y = ap.dvector(4, shape=(), init=ap.init.zeros(), name="Y")

        def body(j):
            X[j] = X[j] + 1.0
            if X[j] > 1.0:
                Y[j] = Y[j] + X[j]

        out = []
        for _ in range(3):
            ap.async_for(0, 4, body, name="late")
            out.append(Y.digest())
        return out, Y.gather()

    for nodes in (1, 2):
        digests, y = ap.run(prog, nodes=nodes).value
        assert len(set(digests)) == 3
        assert y.tolist() == [5.0] * 4


def test_checked_mode_finds_a_replica_that_missed_a_write() -> None:
    def prog():
        X = ap.dvector(8, shape=(), init=ap.init.zeros(), name="X")

        def body(j):
            X[j] = float(j) + 1.0

        ap.async_for(0, 8, body, name="w")

    with mutants.active("skip_writeback"):
        with pytest.raises(ap.ReplicaMismatchError) as info:
            ap.run(prog, nodes=2, checked=True)
    msg = str(info.value)
    assert "after w#0" in msg and "replica of X[" in msg and "its owner, node" in msg


# ====================================================================== under mpiexec
MPI_SHAPES = [(2, 1), (3, 1), (3, 2)]


@pytest.fixture(scope="module")
def guard_mpi(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[int, mpibatch.Batch]:
    """tests/engine/mpi_guard.py for each selected shape, one mpiexec launch per rank count."""
    tmp = tmp_path_factory.mktemp("guard-mpi")
    batches = {n: mpibatch.Batch(n, tmp / str(n)) for n in (2, 3)}
    for p in mpibatch.selected(
        request, test_the_guard_under_mpiexec_matches_the_in_process_cluster
    ):
        batches[p["ranks"]].add(
            f"guard-{p['threads']}", Path(__file__).parent / "mpi_guard.py", p["threads"]
        )
    return batches


@pytest.mark.parametrize("ranks,threads", MPI_SHAPES)
def test_the_guard_under_mpiexec_matches_the_in_process_cluster(
    ranks, threads, guard_mpi: dict[int, mpibatch.Batch]
) -> None:
    """The ranks give a result some serial order gives (the order they report), and the
    in-process cluster's bits wherever it reports the same order.  Under threads the
    order of lock-split bodies is the order their locks were granted in: free in a run
    (and recorded), so two runs may differ and only the serial check applies."""
    proc = guard_mpi[ranks].result(f"guard-{threads}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = guard_mpi[ranks].values(f"guard-{threads}")[0]  # what rank 0 printed as JSON
    assert got["flag"]["serial"]
    _, final, orders = ap.run(_flag_program(), nodes=ranks, threads=threads).value
    same = [o.tolist() for o in orders] == got["flag"]["orders"]
    assert same or threads > 1
    if same:
        assert got["flag"]["bytes"] == final.tobytes().hex()
    assert got["chain"]["values"] == [float(k + 1) for k in range(13)]
    assert got["chain"]["strategy"] == "replicated"
    X, y = _lasso_data()
    mpi_orders = [np.array(o, dtype=np.int64) for o in got["lasso"]["orders"]]
    assert got["lasso"]["bytes"] == _lasso_serial(X, y, 0.05, mpi_orders).tobytes().hex()
    beta, orders = ap.run(_lasso_program(X, y, 0.05, 120, True), nodes=ranks, threads=threads).value
    same = [o.tolist() for o in orders] == got["lasso"]["orders"]
    assert same or threads > 1
    if same:
        assert got["lasso"]["bytes"] == beta.tobytes().hex()
    assert "note: async_for 'flip' invocation 1" in proc.stderr


@pytest.mark.parametrize("nodes", [2, 3])
def test_a_stop_before_a_failure_in_the_same_round_re_plans_first(nodes: int) -> None:
    """In one round, a node's body leaves the plan and a higher node's body raises.  The
    ranks of an MPI job agree on the earliest event by (round, node), so they re-plan
    first (``loop._agree``); the in-process cluster must decide the same, not raise the
    later node's error straight away: the re-plan is noted, then the error comes from
    the new attempt."""
    from engine._asyncfor import loop

    n = 12

    def prog() -> None:
        X = ap.dvector(n, shape=(), init=ap.init.zeros(), name="X")
        role = ap.dvector(n, shape=(), init=ap.init.zeros(), name="role")
        Z = ap.dvector(1, shape=(), init=ap.init.zeros(), name="Z")

        def body(j: int) -> None:
            X[j] = X[j] + 1.0
            r = role[j]
            if r == 1.0:
                Z[0] = Z[0] + 1.0  # outside its reconnaissance sets: leaves the plan
            elif r == 2.0:
                raise ValueError(f"body {j} fails")

        ap.async_for(0, n, body, name="b")
        first = ap.plan_of("b").rounds[0]
        role[int(first[0][0].indices[0])] = 1.0
        role[int(first[nodes - 1][0].indices[0])] = 2.0
        ap.async_for(0, n, body, name="b")

    notes: list[tuple[int, int]] = []
    note = loop._note

    def noted(sess: object, v: object, what: str) -> None:
        notes.append((v.round, v.node))  # type: ignore[attr-defined]
        note(sess, v, what)  # type: ignore[arg-type]

    loop._note = noted  # type: ignore[assignment]
    try:
        with pytest.raises(ap.BodyError, match="fails"):
            ap.run(prog, nodes=nodes)
    finally:
        loop._note = note  # type: ignore[assignment]
    assert notes == [(0, 0)]
