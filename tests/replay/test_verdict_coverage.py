"""A verdict says what it tested (issue 34, point 3).

Test mode runs a relaxed DDS exactly and an SSP ``sync_for`` as BSP.  Before, a relaxed
capacity counter (40 claims on 2 x 2 against 10 serially) and SSP least squares passed
``replay dual`` with a bare PASS, and ``replay chaos --check dual`` explored one outcome
of an SSP program where plain chaos found three.  Now the verdict names every relaxed DDS
and SSP operator it did not test as declared (line, JSON, stored detail), and chaos
refuses ``--check dual`` on such a program in one line (exit 2).
"""

from __future__ import annotations

import itertools
import json
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine
import tracer
from replay import chaos, testing
from replay._apps import resolve
from replay._cli import cli
from replay._errors import UsageError
from tests.replay import verdict_apps

pytest_plugins = ["pytester"]

HERE = Path(__file__).parent
CAPACITY = f"{HERE / 'verdict_apps.py'}:capacity"
LSQ = f"{HERE / 'verdict_apps.py'}:lsq"


def _cli(*args: str):
    return CliRunner().invoke(cli, list(args))


# ====================================================================== the engine reports
def test_the_engine_reports_what_test_mode_ran_exactly() -> None:
    real = engine.run(verdict_apps.capacity, {}, nodes=2, threads=2)
    test = engine.run(verdict_apps.capacity, {}, nodes=2, threads=2, test_mode=True)
    assert real.objectives["claims"] == [40.0] and real.ran_exact == []
    assert test.objectives["claims"] == [10.0]
    assert test.ran_exact == [{"kind": "relaxed", "name": "claims"}]
    got = engine.run(verdict_apps.lsq, {}, nodes=2, test_mode=True).ran_exact
    assert got == [{"kind": "ssp", "name": "fit", "staleness": 2}]
    assert engine.run(verdict_apps.lsq, {"staleness": 0}, nodes=2, test_mode=True).ran_exact == []


# ====================================================================== replay dual
def test_dual_pass_names_the_relaxed_counter_and_how_to_check_it(tmp_path: Path) -> None:
    trace = tmp_path / "c.sqlite"
    args = ["dual", CAPACITY, "--in-process", "--ranks", "2", "--threads", "2"]
    res = _cli(*args, "--trace", str(trace))
    assert res.exit_code == 0, res.output
    for d in ("forward", "backward"):
        assert f"{d}: PASS (40 bodies compared; relaxed DDS 'claims' tested exact)" in res.stdout
    assert f"replay chaos {CAPACITY} --check 'objective:claims<=VALUE'" in res.stdout
    with tracer.open(trace) as store:
        verdicts = store.runs()[0]
        details = {v.kind: v.detail for v in store.run(verdicts.run_id).verdicts()}
    want = [{"kind": "relaxed", "name": "claims", "tested_as": "exact"}]
    assert {k: d["not_tested"] for k, d in details.items()} == {
        "dual-forward": want,
        "dual-backward": want,
    }
    shown = _cli("show", str(trace))
    assert "verdict dual-backward: PASS at" in shown.stdout
    assert "(relaxed DDS 'claims' tested exact)" in shown.stdout


def test_dual_json_names_the_ssp_operator_tested_as_bsp() -> None:
    res = _cli("dual", LSQ, "--in-process", "--ranks", "2", "--no-trace", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    want = [{"kind": "ssp", "name": "fit", "staleness": 2, "tested_as": "bsp"}]
    assert out["forward"]["not_tested"] == want and out["backward"]["not_tested"] == want
    assert out["not_tested"] == want
    assert "SSP 'fit' as BSP" in out["note"] and "objective:loss<=VALUE" in out["note"]


def test_a_failing_verdict_also_says_what_it_did_not_test() -> None:
    r = testing.DualResult(
        "forward",
        False,
        {"what": "digest", "op": "fit", "invocation": 0, "serial": "a", "parallel": "b"},
        not_tested=[{"kind": "ssp", "name": "fit", "staleness": 2}],
    )
    assert r.report().endswith("(SSP 'fit' tested as BSP: staleness not covered)")


def test_assert_dual_and_the_plugin_warn_on_a_pass_that_did_not_test_it(pytester) -> None:
    with pytest.warns(testing.UntestedWarning, match="relaxed DDS 'claims' tested exact"):
        testing.assert_dual(verdict_apps.capacity, {}, nodes=2, threads=2)
    pytester.makepyfile(
        """
        from tests.replay.verdict_apps import lsq

        def test_lsq(dual_test):
            dual_test(lsq, {"epochs": 1}, nodes=2)
        """
    )
    got = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    got.assert_outcomes(passed=1)
    got.stdout.fnmatch_lines(["*UntestedWarning*SSP 'fit' tested as BSP*"])


# ====================================================================== replay chaos
def test_chaos_refuses_the_dual_check_on_ssp_and_objective_checks_explore() -> None:
    base = ["chaos", LSQ, "--runs", "3", "--chaos-seed", "1", "--no-trace"]
    res = _cli(*base, "--check", "dual")
    assert res.exit_code == 2, res.output
    assert "SSP 'fit' as BSP" in res.output and "--check 'objective:NAME<=VALUE'" in res.output
    assert "distinct outcome" not in res.output  # refused before any run
    res = _cli(*base, "--check", "objective:loss<=3", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout.strip().splitlines()[-1])["distinct"] == 3
    res = _cli(*base, "--check", "objective:loss<=2.1")  # the real SSP loss starts above 2.1
    assert res.exit_code == 1 and "breaks loss <= 2.1" in res.output


# ====================================================================== programs from classes
_HEAD = """import numpy as np
import engine as ap


def _mix(W, v):
    for k in range(len(W)):
        w = W[k]
        W[k] = w + 0.3 * (np.tanh(v * (k + 1) + 2.0 * w) - w)


def train(epochs: int = 1, n: int = 24):
    X = ap.dvector(n, shape=(2,), data=np.sin(np.arange(2 * n) * 0.37).reshape(n, 2), name="X")
    Y = ap.dvector(n, shape=(), name="Y")
"""


@st.composite
def programs(draw: st.DrawFn) -> tuple[str, list[str], list[str]]:
    """The source of a small driver with relaxed counters and sync_for operators, the
    relaxed DDS names and the SSP operator names with staleness > 0."""
    relaxed = [f"R{k}" for k in range(draw(st.integers(0, 2)))]
    syncs = draw(
        st.lists(
            st.tuples(st.sampled_from(["bsp", "ssp", "hybrid"]), st.integers(0, 2)), max_size=2
        )
    )
    lines = [_HEAD]
    caps = {r: draw(st.integers(1, 6)) for r in relaxed}
    for r in relaxed:
        lines.append(
            f"    {r} = ap.dvector(1, shape=(), dtype=np.int64, relaxed=True, name={r!r})\n"
        )
    lines.append("    W = ap.dvector(3, shape=(2,), name='W')\n\n    def count(j):\n")
    lines.append("        Y[j] = 1.0 + j\n")
    for r in relaxed:
        lines.append(f"        if {r}[0] < {caps[r]}:\n            {r}[0] += 1\n")
    lines.append("\n    def step(batch):\n        _mix(W, batch.values.mean(axis=0))\n\n")
    lines.append("    for _ in range(epochs):\n        ap.async_for(0, n, count, name='count')\n")
    ssp = []
    for k, (mode, stale) in enumerate(syncs):
        op = f"{mode}{k}"
        extra = f", staleness={stale}" if mode == "ssp" else ""
        lines.append(f"        ap.sync_for(X, 3, step, sync={mode!r}{extra}, name={op!r})\n")
        if mode == "ssp" and stale > 0:
            ssp.append(op)
    lines.append("        ap.log_objective('w', float(np.abs(W.gather()).sum()))\n")
    for r in relaxed:
        lines.append(f"        ap.log_objective({r!r}, float({r}.gather()[0]))\n")
    return "".join(lines), relaxed, ssp


_DIR = Path(tempfile.mkdtemp(prefix="verdict-programs-"))
_COUNT = itertools.count()


def _load(source: str):
    path = _DIR / f"prog{next(_COUNT)}.py"
    path.write_text(source)
    return resolve(f"{path}:train").fn


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.integers(1, 2))
def test_a_verdict_names_everything_it_did_not_test_as_declared(prog, threads: int) -> None:
    source, relaxed, ssp = prog
    fn = _load(source)
    results = testing.dual(fn, {}, nodes=2, threads=threads)
    for r in results.values():
        assert r.passed, r.report()
        names = {(e["kind"], e["name"]) for e in r.not_tested}
        assert names == {("relaxed", n) for n in relaxed} | {("ssp", n) for n in ssp}, source
        line = r.report()
        for n in relaxed + ssp:
            assert repr(n) in line, line
        assert ("tested exact" in line) == bool(relaxed)
        assert ("tested as BSP" in line) == bool(ssp)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_chaos_dual_refuses_or_explores_what_plain_chaos_finds(prog) -> None:
    source, relaxed, ssp = prog
    fn = _load(source)
    if relaxed or ssp:
        with pytest.raises(UsageError, match="--check dual cannot explore") as info:
            chaos.explore(fn, {}, runs=3, chaos_seed=1, nodes=2, check="dual")
        assert repr((relaxed or ssp)[0]) in str(info.value)  # the first met
        return
    plain = chaos.explore(fn, {}, runs=3, chaos_seed=1, nodes=2)
    dual = chaos.explore(fn, {}, runs=3, chaos_seed=1, nodes=2, check="dual")
    assert dual.failed is None, dual.lines()
    assert (dual.distinct > 1) == (plain.distinct > 1), source
