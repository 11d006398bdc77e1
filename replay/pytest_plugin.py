"""pytest plugin: dual-test a training function inside a user's own test suite.

Registered as the ``replay`` entry point of ``pytest11``, so installing the package
activates it.  Two ways to use it:

* the ``dual_test`` fixture, a callable that runs :func:`replay.testing.dual` and fails
  the test with the divergence report::

      def test_train_is_serializable(dual_test):
          dual_test(train, {"epochs": 2}, nodes=3, threads=2)

* the ``dual`` marker: the test *returns* the driver function and the plugin
  dual-tests it on every combination of the given ``nodes`` and ``threads``, one test
  item per combination (``test_train[nodes2-threads1]``, ...)::

      @pytest.mark.dual(nodes=(2, 3), threads=(1, 2), params={"epochs": 2})
      def test_train():
          return train

Marker and fixture take the keywords of :func:`replay.testing.dual` (``params``,
``nodes``, ``threads``, ``seed``, ``order``, ``order_seed``, ``direction``,
``parallel``, ``timeout``).  ``parallel="mpi"`` runs the parallel side under
``mpiexec -n nodes`` (the driver must then be a module-level function of an
importable module, or a ``"path/to/file.py:function"`` string); the default
``"in-process"`` hosts every node in the test's process.  The engine
and :mod:`replay.testing` are imported on first use, not when pytest starts.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .testing import DualResult

MARKER_HELP = (
    "dual(nodes=2, threads=1, params=None, direction='both', order='identity', seed=0, "
    "parallel='in-process', timeout=None): "
    "dual-test (forward and backward, replay.testing) the driver function the test returns; "
    "nodes and threads may be sequences (every combination runs); parallel='mpi' runs the "
    "parallel side under mpiexec"
)
_OPTIONS = ("seed", "order", "order_seed", "direction", "parallel", "timeout")


def _values(what: str, v: int | Iterable[int]) -> list[int]:
    vals = [v] if isinstance(v, int) else list(v)
    if not vals or not all(isinstance(x, int) and x >= 1 for x in vals):
        raise ValueError(f"dual: {what} must be an int >= 1 or a sequence of them, got {v!r}")
    return vals


def reproduce_command(
    fn: Callable[..., Any] | str, params: dict[str, Any] | None, p: int, t: int, **options: Any
) -> str | None:
    """The ``replay dual`` command that runs the same test from a shell, or None when the
    driver is not a module-level function of a file or a parameter is not a number, bool
    or string (``-p`` takes only those)."""
    import os
    import shlex

    if isinstance(fn, str):
        target = fn
    else:
        name = getattr(fn, "__qualname__", "")
        try:
            source = inspect.getsourcefile(fn)
        except TypeError:
            return None
        if not source or not name.isidentifier():  # nested: <locals>, methods
            return None
        rel = os.path.relpath(source)
        target = f"{source if rel.startswith('..') else rel}:{name}"
    words = ["replay", "dual", target]
    for key, value in (params or {}).items():
        if not isinstance(value, bool | int | float | str):
            return None
        words += ["-p", f"{key}={str(value).lower() if isinstance(value, bool) else value}"]
    words += ["--ranks", str(p), "--threads", str(t)]
    if options.get("parallel", "in-process") != "mpi":
        words.append("--in-process")
    for option in ("seed", "direction", "order", "order_seed", "timeout"):
        default = {"seed": 0, "direction": "both", "order": "identity", "order_seed": 0}
        value = options.get(option)
        if value is not None and value != default.get(option):
            words += [f"--{option.replace('_', '-')}", str(value)]
    return shlex.join(words)


def run_dual(
    fn: Callable[..., Any] | str,
    params: dict[str, Any] | None = None,
    *,
    nodes: int | Iterable[int] = 2,
    threads: int | Iterable[int] = 1,
    **options: Any,
) -> dict[tuple[int, int], dict[str, DualResult]]:
    """Dual-test ``fn`` on every (nodes, threads) combination; fail the test on a divergence,
    at the line of the user's test that called this (this module's frames are hidden), with
    the command that reproduces each failure from a shell."""
    __tracebackhide__ = True
    from .testing import dual, warn_untested

    unknown = set(options) - set(_OPTIONS)
    if unknown:
        raise TypeError(
            f"dual: unknown option(s) {sorted(unknown)}; known: params, nodes, threads, "
            f"{', '.join(_OPTIONS)}"
        )
    if not callable(fn) and not isinstance(fn, str):
        raise TypeError(
            f"dual: needs the driver function (or 'path/to/file.py:function') to test, got {fn!r}"
        )
    out: dict[tuple[int, int], dict[str, DualResult]] = {}
    failed: list[str] = []
    name = getattr(fn, "__qualname__", repr(fn))
    where = " under mpiexec" if options.get("parallel") == "mpi" else ""
    for p, t in itertools.product(_values("nodes", nodes), _values("threads", threads)):
        results = dual(fn, params, nodes=p, threads=t, **options)
        out[(p, t)] = results
        bad = [r for r in results.values() if not r.passed]
        failed += [f"{name} on {p} node(s) x {t} thread(s){where}: {r.report()}" for r in bad]
        if bad:
            cmd = reproduce_command(fn, params, p, t, **options)
            failed.append(
                f"  reproduce: {cmd}"
                if cmd
                else "  (no shell command reproduces it: "
                "the driver is not a module-level function, or a parameter is not "
                "a number, bool or string)"
            )
    if failed:
        pytest.fail("dual test failed:\n" + "\n".join(failed))
    # a pass that ran relaxed DDS exactly or SSP as BSP says so in the warnings summary
    warn_untested([r for got in out.values() for r in got.values()], f" of {name}")
    return out


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``dual`` marker."""
    config.addinivalue_line("markers", MARKER_HELP)


#: The hidden parameter that makes one test item per (nodes, threads) of a ``dual`` marker.
COMBINATION = "_replay_dual_combination"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A ``@pytest.mark.dual`` test with several (nodes, threads) combinations becomes one
    item per combination (``test_x[nodes2-threads1]``): each passes or fails on its own,
    and ``-k`` or a node id runs one.  A bad marker is left whole, to fail when it runs."""
    marker = metafunc.definition.get_closest_marker("dual")
    if marker is None or marker.args:
        return
    try:
        combos = list(
            itertools.product(
                _values("nodes", marker.kwargs.get("nodes", 2)),
                _values("threads", marker.kwargs.get("threads", 1)),
            )
        )
    except (TypeError, ValueError):
        return
    if len(combos) < 2:
        return
    metafunc.fixturenames.append(COMBINATION)  # a parameter the function does not take
    metafunc.parametrize(COMBINATION, combos, ids=[f"nodes{p}-threads{t}" for p, t in combos])


@pytest.fixture
def dual_test() -> Callable[..., dict[tuple[int, int], dict[str, DualResult]]]:
    """``dual_test(fn, params=None, nodes=2, threads=1, direction="both", ...)``: dual-test
    ``fn``, failing the test with the report; returns the results per (nodes, threads)."""
    return run_dual


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run a ``@pytest.mark.dual`` test, then dual-test the function it returned."""
    marker = pyfuncitem.get_closest_marker("dual")
    if marker is None:
        return None
    if marker.args:
        pytest.fail(
            f"{pyfuncitem.nodeid}: @pytest.mark.dual takes keywords only "
            f"(nodes=, threads=, params=, ...), got positional {marker.args!r}",
            pytrace=False,
        )
    test = pyfuncitem.obj
    if inspect.iscoroutinefunction(test):
        pytest.fail(f"{pyfuncitem.nodeid}: @pytest.mark.dual needs a plain function", pytrace=False)
    names = pyfuncitem._fixtureinfo.argnames
    fn = test(**{k: pyfuncitem.funcargs[k] for k in names})
    if not callable(fn) and not isinstance(fn, str):
        pytest.fail(
            f"{pyfuncitem.nodeid} is marked @pytest.mark.dual, so it must return the driver "
            f"function to dual-test; it returned {fn!r}",
            pytrace=False,
        )
    kw = dict(marker.kwargs)
    callspec = getattr(pyfuncitem, "callspec", None)
    if callspec is not None and COMBINATION in callspec.params:
        kw["nodes"], kw["threads"] = callspec.params[COMBINATION]  # this item's combination
    try:
        run_dual(fn, kw.pop("params", None), **kw)
    except pytest.fail.Exception as exc:
        # the test only returned the driver: point at its definition and marker instead
        import os

        _, line = inspect.getsourcelines(test)  # the first line: its marker
        source = inspect.getsourcefile(test) or "?"
        rel = os.path.relpath(source)
        where = f"{source if rel.startswith('..') else rel}:{line}"
        pytest.fail(f"{where}: {pyfuncitem.name} (@pytest.mark.dual): {exc.msg}", pytrace=False)
    return True


__all__ = [
    "MARKER_HELP",
    "reproduce_command",
    "dual_test",
    "pytest_configure",
    "pytest_generate_tests",
    "pytest_pyfunc_call",
    "run_dual",
]
