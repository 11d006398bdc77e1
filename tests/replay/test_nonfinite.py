"""A training run whose loss goes NaN or infinite is recorded, replayed and dual-tested
like any other (SQLite stores a NaN REAL as NULL; comparisons treat NaN as NaN)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tracer
from replay._cliutil import strict_json
from replay._dualctl import same_value

APP = """
import math
import engine as ap

def train(epochs: int = 3):
    X = ap.dvector(20, shape=(), name="X")

    def body(j):
        X[j] = X[j] + 1.0

    for epoch in range(epochs):
        ap.async_for(0, 20, body, name="inc")
        total = ap.reduce(X, lambda x: float(x))
        ap.log_objective("loss", [total, math.nan, math.inf][epoch % 3])
        ap.log_objective("neg", -math.inf if epoch else -0.0)
"""


@pytest.mark.parametrize(
    "a,b,same",
    [
        (math.nan, math.nan, True),
        (math.nan, -math.nan, True),
        (math.nan, 1.0, False),
        (0.0, -0.0, False),
        (1.0, 1.0 + 2**-52, False),
        (math.inf, math.inf, True),
        (1.5, 1.5, True),
        ("x", "x", True),
    ],
)
def test_same_value(a: object, b: object, same: bool) -> None:
    assert same_value(a, b) is same


@pytest.mark.mpi  # in-process, but --ranks 2 and cluster start mpiexec
def test_a_nan_loss_is_recorded_replayed_and_dual_tested(tmp_path: Path, cli) -> None:
    app = tmp_path / "diverge.py"
    app.write_text(APP)
    trace = tmp_path / "t.sqlite"
    proc = cli("run", f"{app}:train", "--ranks", "2", "--trace", str(trace))
    assert proc.returncode == 0, proc.stderr
    with tracer.open(trace) as t:
        run = t.run()
        assert run.info.status == "finished"
        loss = run.objectives()["loss"]
        assert loss[0] == 20.0 and math.isnan(loss[1]) and loss[2] == math.inf
        assert run.objectives()["neg"] == [0.0, -math.inf, -math.inf]  # SQLite: -0.0 is 0
    assert cli("verify", str(trace)).returncode == 0
    for mode in ("cluster", "single"):
        proc = cli(mode, str(trace), "--json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["identical"] is True
    proc = cli("dual", f"{app}:train", "--ranks", "2", "--no-trace", "--json")
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["forward"]["passed"] and res["backward"]["passed"]


def _strict(text: str) -> Any:
    """Parse ``text`` as RFC 8259 JSON: Python's NaN and Infinity tokens are refused."""

    def refuse(token: str) -> Any:
        raise AssertionError(f"{token} is not JSON: {text[:300]}")

    return json.loads(text, parse_constant=refuse)


def test_json_output_with_a_nan_loss_is_strict_json(tmp_path: Path, cli) -> None:
    """``--json`` printed Python's bare NaN/Infinity tokens (jq and JSON.parse refuse the
    document); a value that is not finite is now null, as in the program's result."""
    app = tmp_path / "diverge.py"
    app.write_text(APP)
    trace = tmp_path / "t.sqlite"
    proc = cli("run", f"{app}:train", "--trace", str(trace), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = _strict(proc.stdout)
    assert doc["objectives"]["loss"] == [20.0, None, None]
    assert doc["objectives"]["neg"] == [-0.0, None, None]
    for args in (["show", trace], ["single", trace], ["history", trace, "X[3]"]):
        proc = cli(*args, "--json")
        assert proc.returncode == 0, proc.stderr
        _strict(proc.stdout)


finite_or_not = st.floats() | st.sampled_from([math.nan, -math.nan, math.inf, -math.inf])
documents = st.recursive(
    finite_or_not | st.integers() | st.text(max_size=3) | st.none(),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)


@given(doc=documents)
def test_strict_json_keeps_every_finite_value_and_nulls_the_others(doc: Any) -> None:
    back = _strict(json.dumps(strict_json(doc), allow_nan=False))

    def same(a: Any, b: Any) -> bool:
        if isinstance(a, float) and not math.isfinite(a):
            return b is None
        if isinstance(a, list):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        return a == b and type(a) is type(b)

    assert same(doc, back), (doc, back)
