"""Compiled reconnaissance of kernels (the ``RECORD`` access mode): the read and write
sets equal, element for element, the ones the kernel's Python function gives under the
Python reconnaissance, on generated access patterns; a range the compiled loop cannot
finish (an index out of range, an exception) is left to the Python path, which raises
what it always raised.

One interpreter kernel serves every generated example, so numba compiles it once: each
body runs a small program read from the read-only DDS ``P`` (read, write or update rows
of ``X`` (vector rows) and ``Y`` (scalars), read ``C``; at a constant index, negative
ones too, at ``j + c``, or at an index computed from the last value read, which may be
the body's own write)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine as ap
from engine._asyncfor import kernel as _kernel
from engine._asyncfor.loop import _recon
from engine.lowlevel import python_kernel_recon

OPS = 6  # operations per body program
NOP, READ, WRITE, UPDATE = 0, 1, 2, 3
AT_CONST, AT_J, AT_VALUE = 0, 1, 2


@ap.kernel
def interp(j, P, X, Y, C, quiet):  # noqa: ANN001, ANN201 - a kernel takes what numba infers
    if j % quiet == quiet - 1:
        return  # a body touching nothing
    prog = P[j]
    n = len(X)
    last = 0.0
    for t in range(prog.shape[0]):
        kind, which, how, val = prog[t, 0], prog[t, 1], prog[t, 2], prog[t, 3]
        if kind == NOP:
            continue
        if how == AT_CONST:
            i = val
        elif how == AT_J:
            i = (j + val) % n
        else:
            i = int(last) % n
        if which == 0:
            if kind == READ:
                last = X[i][1]
            elif kind == WRITE:
                X[i] = float(val + j)  # a write without a read
            else:
                X[i] = X[i] + val
        elif which == 1:
            if kind == READ:
                last = Y[i]
            elif kind == WRITE:
                Y[i] = float(val * 2 + j)
            else:
                Y[i] = Y[i] + val
        else:
            last = C[i]  # C is read-only


def _op(n: int) -> st.SearchStrategy[list[int]]:
    return st.tuples(
        st.sampled_from([NOP, READ, READ, WRITE, UPDATE]),
        st.integers(0, 2),
        st.sampled_from([AT_CONST, AT_J, AT_VALUE]),
        st.integers(-n, n - 1),
    ).map(list)


@contextmanager
def _small_buffers() -> Iterator[None]:
    """RECORD buffers of one entry and one overlay row: every log and overlay fills up,
    so the loop stops, grows them from Python and resumes many times."""
    real = _kernel._room
    _kernel._room = lambda n: (1, 1)
    try:
        yield
    finally:
        _kernel._room = real


def _sets_both_ways(progs, xs, ys, cs, quiet, nodes):  # noqa: ANN001, ANN202
    n = len(progs)

    def prog():
        P = ap.dvector(n, shape=(OPS, 4), dtype=np.int64, data=progs, name="P")
        X = ap.dvector(n, shape=(2,), data=xs, name="X")
        Y = ap.dvector(n, shape=(), data=ys, name="Y")
        C = ap.dvector(n, shape=(), data=cs, name="C")
        body = interp.bind(P, X, Y, C, quiet)
        sess = ap.current()
        compiled = _recon(sess, "interp", 0, body, 0, n)
        with python_kernel_recon():
            python = _recon(sess, "interp", 0, body, 0, n)
        return compiled, python, (X.gather(), Y.gather()), (xs, ys)

    return ap.run(prog, nodes=nodes).value


def _equal(a, b) -> None:  # noqa: ANN001
    assert (a.start, a.n) == (b.start, b.n)
    for name in ("r_indptr", "r_ids", "w_indptr", "w_ids"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(1, 9), nodes=st.integers(1, 3), small=st.booleans())
def test_compiled_reconnaissance_sets_equal_the_python_paths(data, n, nodes, small) -> None:  # noqa: ANN001
    progs = np.array(
        data.draw(st.lists(st.lists(_op(n), min_size=OPS, max_size=OPS), min_size=n, max_size=n)),
        dtype=np.int64,
    )
    vals = st.integers(-50, 50).map(float)
    xs = np.array(data.draw(st.lists(st.tuples(vals, vals), min_size=n, max_size=n)))
    xs = xs.reshape(n, 2)
    ys = np.array(data.draw(st.lists(vals, min_size=n, max_size=n)))
    cs = np.array(data.draw(st.lists(vals, min_size=n, max_size=n)))
    quiet = data.draw(st.integers(2, 5))
    with _small_buffers() if small else _nullctx():
        compiled, python, (x_after, y_after), (x0, y0) = _sets_both_ways(
            progs, xs, ys, cs, quiet, nodes
        )
    _equal(compiled, python)
    # reconnaissance wrote nothing to the replicas
    assert np.array_equal(x_after, x0) and np.array_equal(y_after, y0)


@contextmanager
def _nullctx() -> Iterator[None]:
    yield


def _spy_on_record(monkeypatch) -> list[bool]:  # noqa: ANN001
    """Per compiled reconnaissance from now on: whether it recorded (not fell back)."""
    got: list[bool] = []
    real = _kernel.record

    def spy(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        out = real(*a, **kw)
        got.append(out is not None)
        return out

    monkeypatch.setattr("engine._asyncfor.recon.record", spy)
    return got


def test_the_compiled_loop_records_rather_than_falling_back(monkeypatch) -> None:  # noqa: ANN001
    """The equality above is between two different paths: the compiled one really ran."""
    got = _spy_on_record(monkeypatch)
    progs = np.zeros((4, OPS, 4), dtype=np.int64)
    progs[:, 0] = (WRITE, 0, AT_J, 0)  # X[j] = j, then read it back, then Y at that value
    progs[:, 1] = (READ, 0, AT_J, 0)
    progs[:, 2] = (READ, 1, AT_VALUE, 0)
    xs = np.zeros((4, 2))
    compiled, python, _, _ = _sets_both_ways(progs, xs, np.zeros(4), np.zeros(4), 9, 1)
    assert got == [True, False]  # compiled, then left to Python by python_kernel_recon()
    _equal(compiled, python)
    reads = [compiled.reads_of(k) & ((1 << 40) - 1) for k in range(4)]
    writes = [compiled.writes_of(k) & ((1 << 40) - 1) for k in range(4)]
    # body j reads P[j], X[j] (its own write) and Y[j]: the value it wrote to X[j] is j
    assert [r.tolist() for r in reads] == [[k, k, k] for k in range(4)]
    assert [w.tolist() for w in writes] == [[k] for k in range(4)]


@ap.kernel
def shifted(j, F, Y, X):  # noqa: ANN001, ANN201
    X[j] = Y[j + int(F[0])]


@ap.kernel
def divide(j, X, Y):  # noqa: ANN001, ANN201
    X[j] = 1 // (int(Y[j]) - 3)


def _error_of(prog) -> str:  # noqa: ANN001
    with pytest.raises(ap.BodyError) as err:
        ap.run(prog, nodes=1)
    return str(err.value)


@pytest.mark.parametrize("which", ["range", "raise"])
def test_a_range_the_compiled_loop_cannot_finish_fails_as_the_python_path(which: str) -> None:
    def prog_of(python: bool):  # noqa: ANN202
        def prog() -> None:
            F = ap.dvector(1, shape=(), init=ap.init.constant(1.0), name="F")
            Y = ap.dvector(6, shape=(), data=np.arange(6.0), name="Y")
            X = ap.dvector(6, shape=(), init=ap.init.zeros(), name="X")
            body = shifted.bind(F, Y, X) if which == "range" else divide.bind(X, Y)
            ap.async_for(0, 6, body.python if python else body, name="k")

        return prog

    kernel_msg, python_msg = _error_of(prog_of(False)), _error_of(prog_of(True))
    assert kernel_msg == python_msg
    expect = "IndexError" if which == "range" else "ZeroDivisionError"
    at = "k#0 index 5" if which == "range" else "k#0 index 3"
    assert at in kernel_msg and expect in kernel_msg, kernel_msg


def test_a_dds_passed_twice_shares_one_overlay() -> None:
    """``body(j, X, X)``: a write through one argument is read back through the other,
    as in the Python reconnaissance, where both are the same DDS."""

    @ap.kernel
    def twice(j, A, B, Y):  # noqa: ANN001, ANN202
        A[j] = float(j + 1)
        Y[int(B[j]) % len(Y)] = 1.0

    def prog():  # noqa: ANN202
        X = ap.dvector(5, shape=(), init=ap.init.zeros(), name="X")
        Y = ap.dvector(5, shape=(), init=ap.init.zeros(), name="Y")
        body = twice.bind(X, X, Y)
        sess = ap.current()
        compiled = _recon(sess, "twice", 0, body, 0, 5)
        with python_kernel_recon():
            python = _recon(sess, "twice", 0, body, 0, 5)
        return compiled, python

    compiled, python = ap.run(prog).value
    _equal(compiled, python)
    writes = [(w & ((1 << 40) - 1)).tolist() for w in map(compiled.writes_of, range(5))]
    assert writes == [[j, (j + 1) % 5] for j in range(5)]  # X[j], then Y[j + 1] (ids: X < Y)


@ap.kernel
def hop(j, F, X):  # noqa: ANN001, ANN201
    k = (j + 1) % len(X) if F[0] > 0.0 else j
    X[k] = X[k] + 1.0


@pytest.mark.parametrize("nodes,checked", [(1, True), (2, False), (3, True)])
def test_the_guard_catches_a_kernel_whose_accesses_changed_after_compiled_recon(
    nodes: int, checked: bool, monkeypatch
) -> None:  # noqa: ANN001
    """Compiled reconnaissance of invocation 0 (F = 0: body j writes X[j]); F = 1 moves
    every write to X[j + 1]: the compiled plan guard (2 nodes: the row is another node's)
    or checked mode (every access against the body's own sets) refuses it with
    ``replan="never"``, and with ``replan="auto"`` the engine re-runs (compiled)
    reconnaissance and gets it right."""
    compiled_runs = _spy_on_record(monkeypatch)

    def prog_of(replan: str):  # noqa: ANN202
        def prog():  # noqa: ANN202
            F = ap.dvector(1, shape=(), init=ap.init.zeros(), name="F")
            X = ap.dvector(6, shape=(), init=ap.init.zeros(), name="X")
            for inv in range(2):
                F[0] = float(inv)
                ap.async_for(0, 6, hop.bind(F, X), name="hop", replan=replan, checked=checked)
            return X.gather()

        return prog

    with pytest.raises(ap.AccessOutsideReconError, match=r"'hop'.* index \d"):
        ap.run(prog_of("never"), nodes=nodes)
    assert compiled_runs and all(compiled_runs)
    compiled_runs.clear()
    x = ap.run(prog_of("auto"), nodes=nodes).value
    assert x.tolist() == [2.0] * 6  # each row once from invocation 0 and once from 1
    assert len(compiled_runs) == 2 * nodes and all(compiled_runs)  # recon, then the re-plan


@ap.kernel
def matrix(j, M, Y):  # noqa: ANN001, ANN201
    M[j] = M[j] * 2.0 + j  # a matrix row, read back from the overlay below
    M[(j + 2) % len(M)] = 0.5
    Y[int(M[j][1, 0] + M[(j + 2) % len(M)][0, 1] * 4) % len(Y)] = 1.0


def _both_recons(op: str, body: ap.BoundKernel, n: int) -> tuple[object, object]:
    """Invocation 0 of ``op`` over 0..n-1 reconnoitred compiled, then by the Python path."""
    sess = ap.current()
    compiled = _recon(sess, op, 0, body, 0, n)
    with python_kernel_recon():
        python = _recon(sess, op, 0, body, 0, n)
    return compiled, python


def test_matrix_rows_are_recorded_like_the_python_path() -> None:
    def prog():  # noqa: ANN202
        M = ap.dvector(5, shape=(2, 2), data=np.arange(20.0).reshape(5, 2, 2), name="M")
        Y = ap.dvector(7, shape=(), init=ap.init.zeros(), name="Y")
        return _both_recons("matrix", matrix.bind(M, Y), 5)

    with _small_buffers():
        compiled, python = ap.run(prog, nodes=2).value
    _equal(compiled, python)
    ys = [(w & ((1 << 40) - 1)).tolist()[-1] for w in map(compiled.writes_of, range(5))]
    assert ys == [(2 * (4 * j + 2) + j + 2) % 7 for j in range(5)]  # own writes read back


@ap.kernel
def climb(j, X, Y):  # noqa: ANN001, ANN201
    """Writes its own rows until it reads back what it wrote: a dropped write would loop."""
    k = 0
    while X[(j + k) % len(X)] < 1.0:
        X[(j + k) % len(X)] = 1.0
        k += 1
    Y[j] = float(k)


def test_a_body_writing_more_rows_than_the_overlay_holds_reads_every_write_back() -> None:
    def prog():  # noqa: ANN202
        X = ap.dvector(40, shape=(), init=ap.init.zeros(), name="X")
        Y = ap.dvector(40, shape=(), init=ap.init.zeros(), name="Y")
        return _both_recons("climb", climb.bind(X, Y), 40)

    with _small_buffers():  # an overlay of one row: it grows inside the loop
        compiled, python = ap.run(prog).value
    _equal(compiled, python)
    assert all(len(compiled.writes_of(k)) == 41 for k in range(40))  # every X row, and Y[j]
