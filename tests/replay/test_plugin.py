"""The pytest plugin (``replay.pytest_plugin``): ``dual_test`` fixture and ``dual`` marker."""

from __future__ import annotations

import numpy.fft  # noqa: F401 - an extension module cannot load twice (first use: a dual run)
import pytest
import scipy.sparse.csgraph  # noqa: F401 - the planner imports it on first use

import engine  # noqa: F401 - imported once here: in-process pytester runs drop new modules
import replay.testing  # noqa: F401
import tests.mutants  # noqa: F401

pytest_plugins = ["pytester"]

PROGRAMS = """
import numpy as np
import engine as ap
from tests import mutants


def hot():
    X = ap.dvector(4, shape=(2,), init=ap.init.normal(0, 1), name="X")

    def body(j):
        k = j % 4
        X[k] = X[k] * 0.9 + np.sin(j + X[(k + 1) % 4])

    for _ in range(2):
        ap.async_for(0, 40, body, name="hot")
        ap.log_objective("norm", float(np.abs(X.gather()).sum()))


def lonely(scale=0.5):
    Y = ap.dvector(1, shape=(1,), init=ap.init.normal(0, 1), name="Y")

    def body(j):
        Y[0] = Y[0] * scale + 1.0

    ap.async_for(0, 1, body, name="one")
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(programs=PROGRAMS)
    return pytester


def run(p: pytest.Pytester) -> pytest.RunResult:
    return p.runpytest("-p", "no:cacheprovider", "-q")


def test_the_entry_point_registers_the_plugin_and_its_marker(pytester: pytest.Pytester) -> None:
    res = pytester.runpytest("--markers")
    res.stdout.fnmatch_lines(["*@pytest.mark.dual(nodes=2, threads=1, params=None*"])
    assert pytester.runpytest("--fixtures").stdout.str().count("dual_test") >= 1


def test_fixture_passes_a_serializable_program(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        test_it="""
        from programs import hot

        def test_hot(dual_test):
            results = dual_test(hot, nodes=2, threads=2, order="random", order_seed=3)
            assert set(results) == {(2, 2)}
            assert all(r.passed for r in results[(2, 2)].values())

        def test_hot_forward_on_several_shapes(dual_test):
            results = dual_test(hot, nodes=(1, 3), threads=(1, 2), direction="forward")
            assert sorted(results) == [(1, 1), (1, 2), (3, 1), (3, 2)]
            assert all(set(r) == {"forward"} for r in results.values())
        """
    )
    run(suite).assert_outcomes(passed=2)


def test_fixture_fails_with_the_divergence_report(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        test_it="""
        from programs import lonely, mutants

        def test_broken_writeback(dual_test):
            with mutants.active("skip_writeback"):
                dual_test(lonely, {"scale": 0.25}, nodes=2)
        """
    )
    res = run(suite)
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(
        [
            "*dual test failed:*",
            "*lonely on 2 node(s) x 1 thread(s): forward: FAIL at iteration 0, op one, "
            "invocation 0, dds Y, element Y?0?: node 0's replica is * but its owner, "
            "node 1, has * (a write did not reach every replica)",
        ]
    )
    assert "Traceback" not in res.stdout.str()
    out = res.stdout.str()
    # the failure is at the user's line, not in the plugin, and says how to rerun it
    marked = [x for x in out.splitlines() if x.lstrip().startswith(">")]
    assert len(marked) == 1 and 'dual_test(lonely, {"scale": 0.25}, nodes=2)' in marked[0], out
    assert "test_it.py:5: Failed" in out and "pytest_plugin.py" not in out, out
    assert "reproduce: replay dual programs.py:lonely -p scale=0.25 --ranks 2 --threads 1 " in out


def test_the_reproduce_command_fails_the_same_way_from_a_shell(
    pytester: pytest.Pytester, cli
) -> None:
    """The command the failure prints, run as printed, fails with the same report."""
    import shlex

    from tests.replay import dual_apps

    pytester.makepyfile(
        test_it="""
        from tests.replay.dual_apps import differs_in_a_body

        def test_it(dual_test):
            dual_test(differs_in_a_body, {"epochs": 2, "n": 8}, nodes=2, direction="forward")
        """
    )
    res = run(pytester)
    res.assert_outcomes(failed=1)
    out = res.stdout.str()
    line = next(x for x in out.splitlines() if "reproduce: replay dual" in x)
    words = shlex.split(line.split("reproduce: ", 1)[1])
    assert words[2] == f"{dual_apps.__file__}:differs_in_a_body", words
    report = next(x for x in out.splitlines() if "forward: FAIL" in x)
    proc = cli(*words[1:], "--no-trace")
    assert proc.returncode == 1, proc.stderr
    assert report.split("forward: ", 1)[1] in proc.stdout, (report, proc.stdout)


def test_no_command_for_a_nested_driver_or_a_list_parameter() -> None:
    from replay.pytest_plugin import reproduce_command

    def inner() -> None:
        pass

    assert reproduce_command(inner, None, 2, 1) is None
    assert reproduce_command("a.py:f", {"sizes": [1, 2]}, 2, 1) is None
    cmd = reproduce_command("a.py:f", {"on": True, "lr": 0.5, "name": "a b"}, 3, 2, seed=4)
    assert cmd == (
        "replay dual a.py:f -p on=true -p lr=0.5 -p 'name=a b' --ranks 3 --threads 2 "
        "--in-process --seed 4"
    )
    assert "--in-process" not in reproduce_command("a.py:f", None, 2, 1, parallel="mpi")


def test_marker_dual_tests_the_returned_function(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        test_it="""
        import pytest
        from programs import hot, lonely, mutants

        @pytest.mark.dual(nodes=(2, 3), threads=(1, 2), order="random")
        def test_hot():
            return hot

        @pytest.mark.dual(params={"scale": 0.75})
        def test_lonely(tmp_path):  # fixtures still work
            assert tmp_path.exists()
            return lonely

        @pytest.fixture
        def broken():
            with mutants.active("skip_writeback"):
                yield

        @pytest.mark.dual(nodes=3, threads=3, direction="backward", seed=5)
        def test_hot_backward():
            return hot

        @pytest.mark.dual(nodes=2, direction="forward")
        def test_forward_sees_it(broken):
            return lonely

        @pytest.mark.dual(nodes=2)
        def test_returns_nothing():
            pass

        def test_unmarked_tests_are_untouched():
            assert True
        """
    )
    res = run(suite)
    res.assert_outcomes(passed=7, failed=2)  # test_hot: one item per (nodes, threads)
    out = res.stdout.str()
    ids = suite.runpytest("-p", "no:cacheprovider", "-q", "--collect-only").stdout.str()
    for combo in ("nodes2-threads1", "nodes2-threads2", "nodes3-threads1", "nodes3-threads2"):
        assert f"test_it.py::test_hot[{combo}]" in ids, combo
    assert "test_it.py::test_hot_backward\n" in ids  # one combination: one item, as written
    assert "test_forward_sees_it" in out and "forward: FAIL at iteration 0, op one" in out
    # the marked test only returned the driver: the failure names its definition
    assert "\ntest_it.py:22: test_forward_sees_it (@pytest.mark.dual): dual test failed" in out
    assert "must return the driver function to dual-test; it returned None" in out


def test_marker_and_fixture_reject_bad_options(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        test_it="""
        import pytest
        from programs import hot

        @pytest.mark.dual(nodes=0)
        def test_no_nodes():
            return hot

        @pytest.mark.dual(2)
        def test_positional():
            return hot

        def test_unknown_option(dual_test):
            with pytest.raises(TypeError, match="unknown option"):
                dual_test(hot, ranks=2)
        """
    )
    res = run(suite)
    res.assert_outcomes(passed=1, failed=2)
    res.stdout.fnmatch_lines(["*nodes must be an int >= 1*", "*takes keywords only*"])


# the plugin's parallel side starts mpiexec: the scan cannot see it
@pytest.mark.mpi
def test_marker_and_fixture_run_the_parallel_side_under_mpi(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        test_it="""
        import pytest
        from programs import hot

        @pytest.mark.dual(nodes=2, params={}, parallel="mpi", timeout=90, direction="forward")
        def test_hot_on_mpi():
            return hot

        def test_fixture_on_mpi(dual_test):
            results = dual_test(hot, nodes=3, parallel="mpi", timeout=90, direction="backward")
            assert results[(3, 1)]["backward"].passed

        def test_nested_driver_is_refused(dual_test):
            def inner():
                pass
            with pytest.raises(ValueError, match="module-level function"):
                dual_test(inner, parallel="mpi")
        """
    )
    run(suite).assert_outcomes(passed=3)
