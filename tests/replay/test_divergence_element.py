"""A replay divergence is a diagnosis: the first differing element with both values (where
the trace keeps a checkpoint at that invocation), and the command that stops before it.

Generated programs add 1 to every element of X in each invocation; the replayed version
adds ``DELTA`` more to one element in one invocation.  The report must name exactly that
element, invocation and both values, for any size, target and shape of the change.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracer

PROGRAM = """
import engine as ap


def train(epochs: int = {epochs}):
    X = ap.dvector({n}, shape=(), init=ap.init.zeros(), name="X")
    for epoch in range(epochs):

        def body(j):
            X[j] = X[j] + (1.0 + {delta!r} if (j == {e} and epoch == {k}) else 1.0)

        ap.async_for(0, {n}, body, name="add")
    ap.log_objective("total", float(X.gather().sum()))
"""


def record_then_change(
    where: Path, cli, n: int, epochs: int, e: int, k: int, delta: float, *flags: str
) -> Path:
    app = where / "train.py"
    app.write_text(PROGRAM.format(n=n, epochs=epochs, e=e, k=k, delta=0.0))
    trace = where / "t.sqlite"
    proc = cli("run", f"{app}:train", "--trace", trace, *flags)
    assert proc.returncode == 0, proc.stderr
    app.write_text(PROGRAM.format(n=n, epochs=epochs, e=e, k=k, delta=delta))
    return trace


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(1, 40),
    epochs=st.integers(1, 4),
    data=st.data(),
    delta=st.sampled_from([1.0, -0.5, 1e-12, 2.0**-40, -2.0]),
)
def test_the_report_names_the_changed_element_and_both_values(
    tmp_path_factory: pytest.TempPathFactory, cli, n: int, epochs: int, data, delta: float
) -> None:
    e = data.draw(st.integers(0, n - 1), label="element")
    k = data.draw(st.integers(0, epochs - 1), label="invocation")
    where = tmp_path_factory.mktemp("div")
    trace = record_then_change(where, cli, n, epochs, e, k, delta, "--checkpoint-every", "1")
    proc = cli("single", trace, "--allow-changed-code", "--json")
    assert proc.returncode == 3, proc.stderr
    doc = json.loads(proc.stdout)
    d = doc["first_difference"]
    assert (d["op"], d["invocation"], d["dds"], d["element"]) == ("add", k, "X", e), d
    assert d["trace_value"] == repr(float(k + 1)), d
    assert d["program_value"] == repr(float(k + 1) + delta), d
    assert (d["elements_differ"], d["elements_compared"]) == (1, n), d
    # the command stops after the invocation before, or for the first, in its first body
    stop = f"--until add:{k - 1}" if k else f"--break add:0:{_first_body(trace)}@0"
    want = f"replay single {trace} {stop} --allow-changed-code"
    assert doc["next"] == want
    text = cli("single", trace, "--allow-changed-code")
    assert text.returncode == 3
    assert f"first differing element: X[{e}]: the trace has {float(k + 1)!r}, " in text.stdout
    assert f"the program has {float(k + 1) + delta!r}" in text.stdout
    assert f"stop there with: {want}" in text.stdout, text.stdout


def _first_body(trace: Path) -> int:
    """The first loop index the recorded plan of add#0 gives a node."""
    with tracer.open(trace) as store:
        plan = store.run().plan("add", 0)
    return next(int(t.indices[0]) for rnd in plan.rounds for ts in rnd for t in ts)


def test_a_divergence_at_an_operators_first_invocation_stops_after_the_one_before(
    tmp_path: Path, cli
) -> None:
    """A changed program diverges at its first invocation more often than not; the
    command then stops after whatever loop ran before it, where its state is the trace's."""
    app = tmp_path / "train.py"
    pre = """
    def bump(j):
        X[j] = X[j] * 2.0

    ap.async_for(0, 6, bump, name="pre")
    for epoch in range(2):"""
    program = PROGRAM.replace("\n    for epoch in range(epochs):", pre)
    app.write_text(program.format(n=6, epochs=2, e=3, k=0, delta=0.0))
    trace = tmp_path / "t.sqlite"
    assert cli("run", f"{app}:train", "--trace", trace).returncode == 0
    app.write_text(program.format(n=6, epochs=2, e=3, k=0, delta=1.0))
    proc = cli("single", trace, "--allow-changed-code")
    assert proc.returncode == 3 and "DIVERGED on node 0 at add#0" in proc.stdout, proc.stdout
    want = f"replay single {trace} --until pre:0 --allow-changed-code"
    assert f"  stop there with: {want}\n" in proc.stdout, proc.stdout
    # the verdict keeps that stop, so the browser offers the same command
    from tui._verdict import explain

    with tracer.open(trace) as store:
        (verdict,) = store.run().verdicts()
    said = explain(verdict.detail, str(trace))
    assert said is not None and said.command == f"replay single {trace} --until pre:0"


def test_without_a_checkpoint_there_it_says_why_no_element_is_named(tmp_path: Path, cli) -> None:
    trace = record_then_change(tmp_path, cli, 6, 3, 4, 1, 1.0, "--no-checkpoints")
    proc = cli("single", trace, "--allow-changed-code")
    assert proc.returncode == 3
    assert "first differing element" not in proc.stdout
    assert "values of X: not compared: the trace keeps no checkpoint at add#1" in proc.stdout
    assert "--checkpoint-every 1" in proc.stdout
    assert f"stop there with: replay single {trace} --until add:0 --allow-changed-code" in (
        proc.stdout
    )


@pytest.mark.mpi  # cluster replay under mpiexec: each rank compares the rows it owns
def test_under_mpi_a_rank_names_the_element_from_its_own_rows(tmp_path: Path, cli) -> None:
    trace = record_then_change(
        tmp_path, cli, 6, 3, 4, 1, 1.0, "--ranks", "2", "--checkpoint-every", "1"
    )
    proc = cli("cluster", trace, "--allow-changed-code", "--json")
    assert proc.returncode == 3, proc.stderr
    d = json.loads(proc.stdout)["first_difference"]
    assert (d["element"], d["trace_value"], d["program_value"]) == (4, "2.0", "3.0"), d
    assert d["elements_differ"] == 1 and d["elements_compared"] in (3, 6), d


@pytest.mark.parametrize(
    ("lengths", "slots", "values"),
    [
        ({"X": 10**12}, [0, 1], [1.0, 2.0]),  # a forged size: never allocated
        ({"X": 4}, [0, 9], [1.0, 2.0]),  # a slot outside the DDS
        ({"X": 4}, [-1, 0], [1.0, 2.0]),
        ({"X": 4}, [0, 1], [1.0, 2.0, 3.0]),  # more values than slots
        ({}, [0], [1.0]),
    ],
)
def test_a_forged_checkpoint_is_not_compared_and_nothing_crashes(
    monkeypatch: pytest.MonkeyPatch, lengths: dict, slots: list, values: list
) -> None:
    import numpy as np

    from replay import _elements
    from tracer._run import CheckpointState

    class Live:
        def __len__(self) -> int:
            return 4

        def key_of(self, slot: int) -> int:
            return slot

    state = CheckpointState("add", 0, {"X": (np.array(slots), np.array(values))}, dict(lengths), {})

    class Run:
        def checkpoint_state(self, op: str, invocation: int) -> CheckpointState:
            return state

    monkeypatch.setattr(_elements, "find_dds", lambda name: Live())
    rows = [(np.arange(4), np.zeros(4))]
    monkeypatch.setattr(_elements, "local_owned_rows", lambda d: rows)
    got = _elements.first_difference(Run(), "X", "add", 0)
    assert "element" not in got and got["values"].startswith("not compared"), got
