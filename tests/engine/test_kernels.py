"""Compiled loop bodies (``@ap.kernel``): bitwise equal to the serial kernel loop in the
plan's order on any placement, reconnaissance sets equal to the Python path's, the plan
guard and checked mode catching a kernel whose accesses changed, and compile failures in
one line."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine as ap
from tests.conftest import ROOT, run_cli


@ap.kernel
def sgd(j, A, W, H, g, lam):  # noqa: ANN001, ANN201 - a kernel takes what numba infers
    r = A[j]
    u = int(r[0])
    i = int(r[1])
    w = W[u]
    h = H[i]
    err = r[2] - w @ h
    W[u] = w + g * (err * h - lam * w)
    H[i] = h + g * (err * w - lam * h)


@ap.kernel
def hop(j, F, X, c):  # noqa: ANN001, ANN201
    """Writes row j, or row (j + 1) % n once F[0] is set: accesses that depend on a value."""
    k = j
    if F[0] > 0.0:
        k = (j + 1) % len(X)
    X[k] = X[k] * c + j


class _Rows:
    """Plain numpy arrays with the DDS's row semantics (a read is a copy)."""

    def __init__(self, arr: np.ndarray) -> None:
        self.arr = arr

    def __getitem__(self, i: int) -> np.ndarray:
        return self.arr[i].copy()

    def __setitem__(self, i: int, v: np.ndarray) -> None:
        self.arr[i] = v

    def __len__(self) -> int:
        return len(self.arr)


def _ratings(seed: int, nu: int, ni: int, nr: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    cols = [rng.integers(0, nu, nr), rng.integers(0, ni, nr), rng.integers(1, 6, nr)]
    return np.stack(cols, 1).astype(np.float64)


def _sgd_prog(
    data: np.ndarray, nu: int, ni: int, epochs: int, python: bool = False, strategy: str = "auto"
):
    def prog():
        A = ap.dvector(len(data), shape=(3,), data=data, name="A")
        W = ap.dvector(nu, shape=(4,), init=ap.init.normal(0.5, 0.1), name="W")
        H = ap.dvector(ni, shape=(4,), init=ap.init.normal(0.5, 0.1), name="H")
        w0, h0, orders, g = W.gather(), H.gather(), [], 0.05
        for _ in range(epochs):
            body = sgd.bind(A, W, H, g, 0.05)
            ap.async_for(0, len(A), body.python if python else body, name="sgd", strategy=strategy)
            orders.append(ap.last_order("sgd"))
            g *= 0.9
        sets = ap.current().ops["sgd"].sets.whole()  # each node's own bodies' sets, joined
        return w0, h0, orders, W.gather(), H.gather(), sets

    return prog


def _serial(data, w0, h0, orders, epochs):
    W, H, g = w0.copy(), h0.copy(), 0.05
    for order in orders[:epochs]:
        for j in order.tolist():
            sgd.py_func(j, _Rows(data), _Rows(W), _Rows(H), g, 0.05)
        g *= 0.9
    return W, H


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    nodes=st.integers(1, 3),
    threads=st.integers(1, 2),
    shape=st.sampled_from([(5, 7, 60), (30, 20, 200), (3, 40, 150)]),
    strategy=st.sampled_from(["auto", "components", "rotation"]),
)
def test_kernel_equals_serial_kernel_loop_in_plan_order(
    seed, nodes, threads, shape, strategy
) -> None:
    nu, ni, nr = shape
    data = _ratings(seed, nu, ni, nr)
    w0, h0, orders, w_end, h_end, _ = ap.run(
        _sgd_prog(data, nu, ni, 2, strategy=strategy), nodes=nodes, threads=threads, seed=seed
    ).value
    W, H = _serial(data, w0, h0, orders, 2)
    assert np.array_equal(W, w_end) and np.array_equal(H, h_end)


@pytest.mark.parametrize("nodes,threads", [(2, 2), (3, 2)])
def test_unsplit_groups_run_compiled_on_parallel_threads(nodes: int, threads: int) -> None:
    """Disjoint user/item blocks: components on every thread, none lock-split, so the
    threads run compiled loops at once (numba releases the GIL)."""
    rng = np.random.default_rng(1)
    blocks = [
        (b * 5 + rng.integers(0, 5), b * 6 + rng.integers(0, 6), rng.integers(1, 6))
        for b in range(8)
        for _ in range(40)
    ]
    data = np.array(blocks, dtype=np.float64)

    def prog():
        out = _sgd_prog(data, 40, 48, 2, strategy="components")()
        plan = ap.plan_of("sgd")
        tasks = [t for rnd in plan.rounds for per in rnd for t in per]
        return out, {t.thread for t in tasks}, any(t.locked for t in tasks)

    (w0, h0, orders, w_end, h_end, _), used, locked = ap.run(
        prog, nodes=nodes, threads=threads
    ).value
    assert used == {0, 1} and not locked
    W, H = _serial(data, w0, h0, orders, 2)
    assert np.array_equal(W, w_end) and np.array_equal(H, h_end)


@pytest.mark.parametrize("nodes,threads", [(1, 1), (2, 1), (3, 1)])
def test_kernel_and_python_body_are_bitwise_equal(nodes: int, threads: int) -> None:
    data = _ratings(3, 40, 60, 800)
    k = ap.run(_sgd_prog(data, 40, 60, 3), nodes=nodes, threads=threads).value
    p = ap.run(_sgd_prog(data, 40, 60, 3, python=True), nodes=nodes, threads=threads).value
    assert all(np.array_equal(a, b) for a, b in zip(k[2], p[2], strict=True))  # same orders
    assert np.array_equal(k[3], p[3]) and np.array_equal(k[4], p[4])


def test_reconnaissance_sets_are_the_python_paths() -> None:
    data = _ratings(5, 30, 50, 500)
    k = ap.run(_sgd_prog(data, 30, 50, 1), nodes=2).value[5]
    p = ap.run(_sgd_prog(data, 30, 50, 1, python=True), nodes=2).value[5]
    for name in ("r_indptr", "r_ids", "w_indptr", "w_ids"):
        assert np.array_equal(getattr(k, name), getattr(p, name)), name
    assert k.n == 500 and len(k.w_ids) == 1000  # one W row and one H row per body


def _hop_prog(flip_at: int, replan: str = "auto", checked: bool | None = None, python=False):
    def prog():
        F = ap.dvector(1, shape=(), init=ap.init.zeros(), name="F")
        X = ap.dvector(12, shape=(2,), init=ap.init.constant(1.0), name="X")
        orders = []
        for inv in range(3):
            if inv == flip_at:
                F[0] = 1.0
            body = hop.bind(F, X, 1.5)
            ap.async_for(
                0, 12, body.python if python else body, name="hop", replan=replan, checked=checked
            )
            orders.append(ap.last_order("hop"))
        return orders, X.gather(), ap.current().planner["hop"]

    return prog


def _hop_serial(orders, flip_at):
    X = np.ones((12, 2))
    for inv, order in enumerate(orders):
        for j in order.tolist():
            k = (j + 1) % 12 if inv >= flip_at else j
            X[k] = X[k] * 1.5 + j
    return X


@pytest.mark.parametrize("nodes,threads", [(1, 1), (2, 1), (3, 1), (2, 2)])
def test_guard_catches_a_kernel_whose_accesses_changed(nodes: int, threads: int) -> None:
    orders, x, _ = ap.run(_hop_prog(1), nodes=nodes, threads=threads).value
    assert np.array_equal(x, _hop_serial(orders, 1))
    py_orders, py_x, _ = ap.run(_hop_prog(1, python=True), nodes=nodes, threads=threads).value
    if nodes == 1 or threads == 1:  # no lock-split group: the orders are the plan's
        assert all(np.array_equal(a, b) for a, b in zip(orders, py_orders, strict=True))
        assert np.array_equal(x, py_x)


def test_guard_with_replan_never_names_the_index_and_element() -> None:
    with pytest.raises(ap.AccessOutsideReconError) as err:
        ap.run(_hop_prog(1, replan="never"), nodes=2)
    msg = str(err.value)
    assert "'hop' invocation 1 index" in msg and "X[" in msg, msg


def test_checked_mode_catches_a_kernel_whose_accesses_changed() -> None:
    with pytest.raises(ap.AccessOutsideReconError, match="reconnaissance"):
        ap.run(_hop_prog(1, replan="never", checked=True), nodes=1)
    orders, x, _ = ap.run(_hop_prog(1, checked=True), nodes=2).value  # replan=auto recovers
    assert np.array_equal(x, _hop_serial(orders, 1))


def test_an_index_out_of_range_is_a_body_error() -> None:
    @ap.kernel
    def shifted(j, F, Y, X):  # noqa: ANN001, ANN202
        X[j] = Y[j + int(F[0])]

    def prog():
        F = ap.dvector(1, shape=(), init=ap.init.zeros(), name="F")
        Y = ap.dvector(4, shape=(), init=ap.init.constant(2.0), name="Y")
        X = ap.dvector(4, shape=(), init=ap.init.zeros(), name="X")
        for inv in range(2):
            F[0] = float(inv)  # the compiled run of invocation 1 reads Y[4]
            ap.async_for(0, 4, shifted.bind(F, Y, X), name="shifted", replan="never")

    with pytest.raises(ap.BodyError, match=r"shifted#1 index 3 .*Y: index 4 out of range"):
        ap.run(prog, nodes=1)


def test_bind_refuses_what_a_kernel_cannot_take() -> None:
    def prog():
        X = ap.dvector(4, shape=(), init=ap.init.zeros(), name="X")
        O = ap.dvector(4, name="O")  # noqa: E741 - Python objects
        with pytest.raises(ap.KernelError, match="argument 'c' is a list"):
            hop.bind(X, X, [1.0])
        with pytest.raises(ap.KernelError, match="argument 'X' is <dvector 'O'"):
            hop.bind(X, O, 1.0)
        with pytest.raises(ap.KernelError, match="argument 'c' is a numpy array of <U1"):
            hop.bind(X, X, np.array(["a"]))
        with pytest.raises(ap.KernelError, match="missing a required argument"):
            hop.bind(X, X)

    ap.run(prog)


@given(st.lists(st.sampled_from(["given", "default"]), min_size=3, max_size=3))
def test_a_kernel_parameter_with_a_default_binds_like_one_given(how: list[str]) -> None:
    """``def k(j, X, c=2.0, d=3, e=True)``: ``bind`` takes any of them or none; what is not
    given is passed with its default, checked like the others."""

    @ap.kernel
    def k(j, X, c=2.0, d=3, e=True):  # noqa: ANN001, ANN202
        X[j] = c * d if e else 0.0

    given_ = {"c": 5.0, "d": 7, "e": False}
    kwargs = {n: v for (n, v), h in zip(given_.items(), how, strict=True) if h == "given"}
    want = {"c": 2.0, "d": 3, "e": True} | kwargs

    def prog():
        X = ap.dvector(2, shape=(), init=ap.init.zeros(), name="X")
        bound = k.bind(X, **kwargs)
        assert bound.args == (X, want["c"], want["d"], want["e"])
        ap.async_for(0, 2, bound.python, name="k")
        return X.gather().tolist()

    assert ap.run(prog).value == [want["c"] * want["d"] if want["e"] else 0.0] * 2


def test_a_default_a_kernel_cannot_take_is_refused_by_name() -> None:
    @ap.kernel
    def k(j, X, c=[1.0]):  # noqa: ANN001, ANN202, B006
        X[j] = c[0]

    def prog():
        X = ap.dvector(2, shape=(), init=ap.init.zeros(), name="X")
        with pytest.raises(ap.KernelError, match="argument 'c' is a list"):
            k.bind(X)

    ap.run(prog)


def test_a_kernel_that_does_not_compile_is_one_line() -> None:
    @ap.kernel
    def untypable(j, X):  # noqa: ANN001, ANN202
        X[j] = {"a": j}["a"] + len(str(object()))

    def prog():
        X = ap.dvector(4, shape=(), init=ap.init.zeros(), name="X")
        ap.async_for(0, 4, untypable.bind(X), name="untypable")

    with pytest.raises(ap.KernelError) as err:
        ap.run(prog)
    msg = str(err.value)
    assert "kernel" in msg and "untypable" in msg and "does not compile with numba" in msg
    assert "\n" not in msg and ".bind(...).python" in msg


def test_the_cli_reports_a_compile_failure_in_one_line_exit_2(tmp_path: Path, cli) -> None:
    app = tmp_path / "badkern.py"
    app.write_text(
        textwrap.dedent(
            """
            import engine as ap

            @ap.kernel
            def body(j, X):
                X[j] = object()

            def train(n: int = 4):
                X = ap.dvector(n, shape=(), init=ap.init.zeros(), name="X")
                ap.async_for(0, n, body.bind(X), name="body")
            """
        )
    )
    proc = cli("run", f"{app}:train", "--no-trace")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "kernel 'body'" in lines[0] and "does not compile with numba" in lines[0]
    assert "Traceback" not in proc.stderr


def test_a_kernel_file_imported_by_a_test_and_run_by_replay_loads_on_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One file, two module names: its own when a test imports it (``replay.testing``,
    ``engine.run``), ``replay_user_<hash>`` under ``replay run FILE:FUNC``.  numba's disk
    cache imports a cached kernel's module by the name it was compiled under, so each
    loaded the other's entry and stopped with ``does not compile with numba: No module
    named ...``.  Both must run, with the same result; the command is a real process,
    whose modules are not this one's."""
    app = tmp_path / "twonames.py"
    app.write_text(
        textwrap.dedent(
            """
            import engine as ap

            @ap.kernel
            def body(j, X, c):
                X[j] = X[j] + c * j

            def train(n: int = 6):
                X = ap.dvector(n, shape=(), init=ap.init.zeros(), name="X")
                ap.async_for(0, n, body.bind(X, 0.5), name="body")
                ap.log_objective("total", float(X.gather().sum()))
            """
        )
    )
    spec = importlib.util.spec_from_file_location("twonames", app)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "twonames", module)  # imported as a test imports it
    spec.loader.exec_module(module)
    assert ap.run(module.train, {}).objectives == {"total": [7.5]}  # compiled and cached
    proc = run_cli(["run", f"{app}:train", "--no-trace", "--json"], timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["objectives"] == {"total": [7.5]}


def _without_numba(tmp_path: Path) -> dict[str, str]:
    """An environment in which ``import numba`` fails as a broken install fails: a package
    of that name, first on the path, that raises ImportError."""
    shadow = tmp_path / "shadow" / "numba"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        'raise ImportError("Numba needs NumPy 1.0 or less (a broken install, simulated)")\n'
    )
    return {"PYTHONPATH": f"{shadow.parent}{os.pathsep}{ROOT}"}


# a broken numba install is a property of the interpreter (numba is imported in this one):
# the two tests below stay real processes, whose PYTHONPATH shadows numba
def test_without_numba_a_kernel_stops_in_one_line_naming_it_exit_2(tmp_path: Path) -> None:
    app = tmp_path / "kern.py"
    app.write_text(
        textwrap.dedent(
            """
            import engine as ap

            @ap.kernel
            def body(j, X):
                X[j] = X[j] + 1.0

            def train(n: int = 4):
                X = ap.dvector(n, shape=(), init=ap.init.zeros(), name="X")
                ap.async_for(0, n, body.bind(X), name="body")
            """
        )
    )
    env = _without_numba(tmp_path)
    runs = (
        ([f"{app}:train"], "kernel 'body' ("),
        (["sgdmf", "-p", "synthetic=true"], "sgdmf: the compiled body (kernel=true, the default)"),
        (["sgdmf", "-p", "kernel=true", "-p", "synthetic=true"], "sgdmf: the compiled body"),
    )
    for args, names in runs:
        proc = run_cli(["run", *args, "--no-trace"], env=env)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert "needs numba" in lines[0] and "Numba needs NumPy 1.0 or less" in lines[0]
        assert names in lines[0]
        # what to do instead: the Python body, in the words each user has
        advice = ".bind(...).python" if args[0] != "sgdmf" else "-p kernel=false"
        assert advice in lines[0]


def test_without_numba_the_python_sgdmf_still_runs(tmp_path: Path) -> None:
    """Only the kernel version needs numba: ``-p kernel=false`` runs the Python app."""
    args = ["sgdmf", "-p", "synthetic=true", "-p", "epochs=2", "-p", "kernel=false"]
    proc = run_cli(["run", *args, "--no-trace", "--json"], env=_without_numba(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["objectives"]["rmse"]) == 2


@pytest.mark.mpi  # in-process commands whose ranks start under mpiexec
def test_the_readme_kernel_example_runs_and_matches_its_python_body(tmp_path: Path, cli) -> None:
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    code = re.search(r"```python\n(# train_fast.py\n.*?)```", text, re.S).group(1)
    (tmp_path / "train_fast.py").write_text(code)
    rows = [
        f"{u},{i},{1 + (u * 7 + i * 3) % 5}" for u in range(30) for i in range(20) if (u + i) % 3
    ]
    (tmp_path / "ratings.csv").write_text("\n".join(rows) + "\n")
    args = ["train_fast.py:train", "--ranks", "2", "-p", "epochs=3", "-p", "path=ratings.csv"]
    # a cold kernel: one rank compiles it and its task loop and saves both to numba's disk
    # cache, the other waits for that and loads the loop, which holds the body
    # (compiled.host_compile_lock, compiled.loop_file), as numba's cache log says
    cold = {"NUMBA_CACHE_DIR": str(tmp_path / "cache"), "NUMBA_DEBUG_CACHE": "1"}
    proc = cli("run", *args, "--no-trace", "--json", cwd=tmp_path, env=cold)
    assert proc.returncode == 0, proc.stderr
    log = proc.stderr.splitlines()
    for what, saved, loaded in (("train_fast.sgd", 1, 0), ("/loop_", 1, 1)):
        mine = [ln for ln in log if what in ln]
        assert sum("data saved" in ln for ln in mine) == saved, proc.stderr
        assert sum("data loaded" in ln for ln in mine) == loaded, proc.stderr
    rmse = json.loads(proc.stdout)["objectives"]["rmse"]
    assert len(rmse) == 3 and rmse[-1] < rmse[0]
    # the same driver with the kernel's Python function as the body: the same bits
    py = code.replace("sgd.bind(A, W, H, g, 0.05)", "sgd.bind(A, W, H, g, 0.05).python")
    assert py != code
    (tmp_path / "train_py.py").write_text(py)
    args[0] = "train_py.py:train"
    proc = cli("run", *args, "--no-trace", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["objectives"]["rmse"] == rmse


def test_an_exception_in_compiled_code_names_the_index() -> None:
    @ap.kernel
    def divide(j, X, Y):  # noqa: ANN001, ANN202
        X[j] = 1 // (int(Y[j]) - 3)  # integer division by zero at j == 3 once Y[j] == j

    def prog():
        X = ap.dvector(6, shape=(), init=ap.init.zeros(), name="X")
        Y = ap.dvector(6, shape=(), init=ap.init.zeros(), name="Y")
        ap.async_for(0, 6, divide.bind(X, Y), name="divide")
        for j in range(6):
            Y[j] = float(j)
        ap.async_for(0, 6, divide.bind(X, Y), name="divide")

    with pytest.raises(ap.BodyError, match=r"divide#1 index 3 .*ZeroDivisionError"):
        ap.run(prog, nodes=1)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**64 - 1),
    op_key=st.integers(0, 2**64 - 1),
    index=st.integers(-(2**63), 2**63 - 1),
    n=st.integers(0, 11),
)
def test_the_compiled_stream_of_an_index_is_its_rng(seed, op_key, index, n) -> None:  # noqa: ANN001
    """``index_rng`` compiled draws what ``ap.rng()`` draws in body ``index``, bit for bit."""
    from engine._asyncfor.compiled import philox_uniform
    from engine._runtime.session import Session
    from engine._runtime.transport import InProcessCluster

    sess = Session(InProcessCluster(1, 1))
    sess.seed = seed
    want = sess.body_rng(op_key, index).uniform(size=n)
    key = sess.rng_key(op_key)
    got = philox_uniform(key[0], key[1], np.uint64(index & (2**64 - 1)), n)
    assert want.view(np.uint64).tolist() == got.view(np.uint64).tolist()


@ap.kernel
def spread(j, X, T, S, rows, rng, c):  # noqa: ANN001, ANN201
    """Row j of X, relaxed rows of T (``take``/``put``) and scalars of S, random draws."""
    u = rng.uniform(3)
    ids = rows[j % rows.shape[0] :]
    t = T.take(ids)
    T.put(ids, t + u[0])
    S[j % len(S)] = S[j % len(S)] + u[2]
    X[j] = X[j] * c + u[1] + T[ids[0]].sum() + S[0]


def _spread_prog(n: int, m: int, rows: np.ndarray, python: bool, epochs: int = 2):
    def prog():
        X = ap.dvector(n, shape=(2,), init=ap.init.constant(1.0), name="X")
        T = ap.dvector(m, shape=(3,), init=ap.init.zeros(), relaxed=True, name="T")
        S = ap.dvector(2, shape=(), init=ap.init.zeros(), relaxed=True, name="S")
        orders = []
        for _ in range(epochs):
            body = spread.bind(X, T, S, rows, ap.index_rng, 0.5)
            ap.async_for(0, n, body.python if python else body, name="spread")
            orders.append(ap.last_order("spread"))
        sets = ap.current().ops["spread"].sets.whole()
        return orders, X.gather(), T.gather(), S.gather(), sets

    return prog


@settings(max_examples=8, deadline=None)
@given(
    n=st.integers(1, 12),
    rows=st.lists(st.integers(0, 4), min_size=1, max_size=6),
    nodes=st.integers(1, 2),
    threads=st.integers(1, 2),
)
def test_relaxed_dvectors_streams_and_arrays_give_the_python_bodys_bits(
    n: int, rows: list[int], nodes: int, threads: int
) -> None:
    """A kernel reads and writes relaxed dvectors as the Python body does (the node's
    replica, or the planned thread's copy), draws the same random numbers, and its
    reconnaissance logs the same sets (none of a relaxed dvector's)."""
    ids = np.array(rows, dtype=np.int64)
    k = ap.run(_spread_prog(n, 5, ids, False), nodes=nodes, threads=threads).value
    p = ap.run(_spread_prog(n, 5, ids, True), nodes=nodes, threads=threads).value
    if threads == 1:  # with several, how the threads' orders interleave is timing
        assert all(np.array_equal(a, b) for a, b in zip(k[0], p[0], strict=True))
    for a, b in zip(k[1:4], p[1:4], strict=True):
        assert a.tobytes() == b.tobytes()
    for name in ("r_indptr", "r_ids", "w_indptr", "w_ids"):
        assert np.array_equal(getattr(k[4], name), getattr(p[4], name)), name
    assert len(k[4].w_ids) == n  # X[j] only: T and S are relaxed


def test_in_test_mode_a_kernels_relaxed_dvectors_are_ordinary() -> None:
    """Relaxation off (checked mode): T and S are in the sets and the bits still agree."""
    ids = np.array([0, 3], dtype=np.int64)
    k = ap.run(_spread_prog(6, 5, ids, False), nodes=2, checked=True).value
    p = ap.run(_spread_prog(6, 5, ids, True), nodes=2, checked=True).value
    for a, b in zip(k[1:4], p[1:4], strict=True):
        assert a.tobytes() == b.tobytes()
    assert len(k[4].w_ids) > 6 and np.array_equal(k[4].w_ids, p[4].w_ids)


@ap.kernel
def hop_rows(j, F, X, c):  # noqa: ANN001, ANN201
    """``hop`` through ``take``/``put``: row j, or row (j + 1) % n once F[0] is set."""
    ids = np.array([j])
    if F[0] > 0.0:
        ids = (ids + 1) % len(X)
    X.put(ids, X.take(ids) * c + j)


@pytest.mark.parametrize("nodes,checked", [(1, True), (2, False), (3, False)])
def test_the_guard_catches_take_and_put_outside_the_sets(nodes: int, checked: bool) -> None:
    def prog():
        F = ap.dvector(1, shape=(), init=ap.init.zeros(), name="F")
        X = ap.dvector(12, shape=(2,), init=ap.init.constant(1.0), name="X")
        for inv in range(2):
            F[0] = float(inv)
            ap.async_for(
                0, 12, hop_rows.bind(F, X, 1.5), name="hop", replan="never", checked=checked
            )

    with pytest.raises(ap.AccessOutsideReconError, match=r"'hop' invocation 1 index"):
        ap.run(prog, nodes=nodes)


def test_a_kernel_writing_a_bound_array_is_refused_in_one_line() -> None:
    """Outside DDS a body only reads (the closure rule): a bound array is read-only."""

    @ap.kernel
    def scribble(j, X, a):  # noqa: ANN001, ANN202
        a[0] = 1.0
        X[j] = a[0]

    def prog():
        X = ap.dvector(3, shape=(), init=ap.init.zeros(), name="X")
        ap.async_for(0, 3, scribble.bind(X, np.zeros(2)), name="scribble")

    with pytest.raises(ap.KernelError, match="does not compile with numba"):
        ap.run(prog)
    with pytest.raises(ap.BodyError, match="read-only"):
        ap.run(lambda: _python_scribble(scribble))


def _python_scribble(k: ap.Kernel) -> None:
    X = ap.dvector(3, shape=(), init=ap.init.zeros(), name="X")
    ap.async_for(0, 3, k.bind(X, np.zeros(2)).python, name="scribble")
