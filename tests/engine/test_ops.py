"""Pre-training operators: load, create, map, reduce, evaluate, join, store."""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine as ap


def parse(line: str):
    if line.startswith("#"):
        return None
    a, b = line.split(",")
    return (int(a), float(b))


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    p = tmp_path / "data.csv"
    p.write_text("# header\n" + "".join(f"{i},{i * 0.5}\n" for i in range(10)))
    return p


@pytest.mark.parametrize("nodes", [1, 2, 3])
def test_load_map_reduce_are_identical_on_any_cluster(nodes: int, data_file: Path) -> None:
    def prog():
        A = ap.load(data_file, parse=parse, name="A")
        sq = ap.map(A, lambda r: r[1] ** 2, shape=(), name="sq")
        total = ap.reduce(sq)
        biggest = ap.reduce(A, lambda r: r[0], op=max)
        return len(A), sq.gather(), total, biggest

    n, sq, total, biggest = ap.run(prog, nodes=nodes).value
    assert n == 10 and biggest == 9
    assert sq.tolist() == [(i * 0.5) ** 2 for i in range(10)]
    assert total == sum((i * 0.5) ** 2 for i in range(10))


class _Values(ap.Recorder):
    def __init__(self) -> None:
        self.values: list[tuple[int, str, object]] = []

    def collective_value(self, k: int, kind: str, value: object) -> None:
        self.values.append((k, kind, value))


@pytest.mark.parametrize("nodes,threads", [(1, 1), (2, 1), (3, 2)])
def test_evaluate_sees_whole_arrays_and_records_only_its_result(nodes: int, threads: int) -> None:
    """``evaluate`` hands ``fn`` the whole contents of every DDS argument, after a loop
    wrote rows on every node, passes other arguments through, gives the same value on any
    cluster, and is one collective value (its result) in the trace, not the arrays."""
    seen: list[tuple[np.ndarray, np.ndarray, float]] = []

    def fn(x: np.ndarray, y: np.ndarray, scale: float) -> float:
        seen.append((x.copy(), y.copy(), scale))
        return float((x.sum(axis=1) * scale).sum() + y.sum())

    def prog() -> list[float]:
        X = ap.dvector(12, shape=(3,), init=ap.init.zeros(), name="X")
        Y = ap.dvector(5, shape=(), init=ap.init.zeros(), name="Y")
        out = []
        for epoch in range(2):

            def body(j: int, e: int = epoch) -> None:
                X[j] = X[j] + (j + e)
                if j < 5:
                    Y[j] = Y[j] + 1.0

            ap.async_for(0, 12, body, name="fill")
            out.append(ap.evaluate(fn, X, Y, 0.5))
        return out

    rec = _Values()
    res = ap.run(prog, nodes=nodes, threads=threads, recorder=rec)
    want = [0.5 * 3 * sum(range(12)) + 5.0, 0.5 * 3 * (2 * sum(range(12)) + 12) + 10.0]
    assert res.value == want
    x, y, scale = seen[-1]
    assert x.shape == (12, 3) and y.shape == (5,) and scale == 0.5
    assert x[:, 0].tolist() == [2.0 * j + 1 for j in range(12)]
    assert [(kind, value) for _, kind, value in rec.values] == [("evaluate", v) for v in want]


def test_load_reports_file_line_and_parser_message(tmp_path: Path) -> None:
    p = tmp_path / "bad.csv"
    p.write_text("1,2.0\n3,oops\n")

    def prog():
        ap.load(p, parse=parse)

    with pytest.raises(ap.DataFormatError) as info:
        ap.run(prog)
    msg = str(info.value)
    assert str(p) in msg and ":2:" in msg and "could not convert string to float: 'oops'" in msg


@settings(max_examples=25, deadline=None)
@given(
    bad_line=st.integers(min_value=1, max_value=3000),
    total=st.integers(min_value=0, max_value=200),
    bad=st.sampled_from([b"\xff", b"\xfe", b"\x80", b"\xc3(", b"\xe2\x82", b"\xed\xa0\x80"]),
    column=st.integers(min_value=0, max_value=3),
)
def test_load_names_the_physical_line_of_a_non_utf8_byte(
    tmp_path_factory: pytest.TempPathFactory, bad_line: int, total: int, bad: bytes, column: int
) -> None:
    """Whatever the line and the bad byte, the error names that physical line."""
    p = tmp_path_factory.mktemp("utf8") / "bad.csv"
    lines = [f"{k},{k * 0.5}".encode() for k in range(bad_line + total)]
    good = lines[bad_line - 1]
    lines[bad_line - 1] = good[:column] + bad + good[column:]
    p.write_bytes(b"\n".join(lines) + b"\n")

    with pytest.raises(ap.DataFormatError) as info:
        ap.run(lambda: ap.load(p, parse=parse))
    msg = str(info.value)
    assert f"{p}:{bad_line}: not UTF-8" in msg, msg


def test_load_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ap.InputFileError, match="does not exist"):
        ap.run(lambda: ap.load(tmp_path / "nope.csv", parse=parse))


@pytest.mark.parametrize("nodes", [1, 2])
def test_create_join_store(nodes: int, tmp_path: Path) -> None:
    out = tmp_path / "out.txt"

    def prog():
        X = ap.create(4, lambda i: [i, i * 10.0], shape=(2,), name="X")
        Y = ap.create(3, lambda i: f"y{i}", name="Y")
        J = ap.join(X, Y, name="J")
        ap.store(X, out)
        return X.gather(), dict(J.items())

    x, j = ap.run(prog, nodes=nodes).value
    assert x.tolist() == [[0, 0], [1, 10], [2, 20], [3, 30]]
    assert sorted(j) == [0, 1, 2] and j[2][1] == "y2" and j[2][0].tolist() == [2.0, 20.0]
    assert out.read_text().splitlines()[3] == "3\t3.0 30.0"


def test_reduce_with_initial_and_empty() -> None:
    def prog():
        E = ap.dvector(0, name="E")
        with pytest.raises(ValueError, match="needs initial="):
            ap.reduce(E)
        return ap.reduce(E, op=operator.add, initial=5)

    assert ap.run(prog).value == 5


def test_rng_outside_bodies_is_identical_per_seed() -> None:
    a = ap.run(lambda: ap.rng().random(3), seed=1).value
    b = ap.run(lambda: ap.rng().random(3), seed=1).value
    assert np.array_equal(a, b)


#: driver operations a loop body might call, as a user would write them
_DRIVER_OPS: dict[str, Any] = {
    "ap.reduce": lambda X, tmp: ap.reduce(X),
    "gather()": lambda X, tmp: X.gather(),
    "ap.evaluate": lambda X, tmp: ap.evaluate(lambda x: x.sum(), X),
    "ap.log_objective": lambda X, tmp: ap.log_objective("x", 1.0),
    "creating a dvector": lambda X, tmp: ap.dvector(3, shape=(), name=None),
    "ap.store": lambda X, tmp: ap.store(X, tmp / "x.txt"),
    "ap.save": lambda X, tmp: ap.save(tmp / "x.npz", X=X),
}


@pytest.mark.parametrize("loop", ["async_for", "sync_for"])
@pytest.mark.parametrize("what", sorted(_DRIVER_OPS))
def test_a_driver_operation_inside_a_loop_body_is_refused(
    what: str, loop: str, tmp_path: Path
) -> None:
    """Every rank runs a driver operation once, in the same order; a body runs on one node,
    maybe twice (reconnaissance) or never (a replay from a checkpoint).  Called from a body
    it gave a wrong answer with no error (``ap.reduce`` in an async_for body on 2 nodes)."""
    op = _DRIVER_OPS[what]

    def prog() -> None:
        X = ap.dvector(6, shape=(), init=ap.init.zeros(), name="X")
        if loop == "async_for":

            def body(j: int) -> None:
                op(X, tmp_path)
                X[j] = X[j] + 1.0

            ap.async_for(0, 6, body, name="b")
        else:
            data = ap.dvector(6, shape=(1,), init=ap.init.zeros(), name="data")

            def batch_body(batch: ap.Batch) -> None:
                op(X, tmp_path)
                X[batch.number] = X[batch.number] + 1.0

            ap.sync_for(data, 2, batch_body, name="b")

    with pytest.raises(ap.BodyError) as info:
        ap.run(prog, nodes=2)
    cause = info.value.cause
    assert isinstance(cause, ap.SessionError), cause
    assert f"{what} was called inside a loop body" in str(cause)
