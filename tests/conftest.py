"""Shared fixtures: run scripts under mpiexec with a timeout, isolate the data cache."""

from __future__ import annotations

import ast
import compileall
import inspect
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from subprocess import Popen
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from replay import _environment
from replay._progress import PLAIN_EVERY_ENV

#: Set in the environment of the pytest process ``pytest_configure`` re-executed (once).
REEXEC_MARKER = "STRADS_REPLAY_TESTS_REEXEC"

ROOT = Path(__file__).resolve().parent.parent

# ====================================================================== hypothesis
#: Examples per ``@given`` test in CI, for every test that does not set its own (13 files
#: rely on it: the engine's async_for, planner, schedule, grants, SSP, digest, messages,
#: control and rank numbers, the trace codec and plans, lasso's coordinate choice and the
#: progress ticks; also the three dual-test properties of tests/replay/test_dual_property).
#: The mutant hunts (tests/replay/test_dual_property.py) measured how many generated
#: programs the rarest engine mutants need before one fails: stale_prefetch and
#: wrong_lock_order fail ~5% of examples once hypothesis is past its small first ones, and
#: 20 hunts each needed at most ~180.  200 is the smallest round number above that, so
#: the default-settings properties would catch those bugs on their own too.
CI_EXAMPLES = 200
#: Examples per ``@given`` test while editing (``pytest -m unit``): enough to exercise each
#: strategy's shapes, few enough to keep the unit layer fast.  CI runs ten times as many.
DEV_EXAMPLES = 20
#: CI's example database, at a fixed place in the checkout (``.hypothesis/`` is git-ignored):
#: a failure CI found is replayed first by the next run on that checkout, and
#: ``HYPOTHESIS_PROFILE=ci pytest`` reproduces it locally from a copied directory.
CI_DATABASE = ROOT / ".hypothesis" / "ci"

settings.register_profile(
    "ci",
    max_examples=CI_EXAMPLES,
    deadline=None,
    derandomize=False,
    database=DirectoryBasedExampleDatabase(CI_DATABASE),
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=DEV_EXAMPLES, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
#: Seconds an MPI test may take before it is killed and fails (a deadlock must not hang CI).
MPI_TIMEOUT = 120


#: The directories whose modules the suite's subprocesses import.
PACKAGES = ("apps", "engine", "replay", "tracer", "tui", "tests", "benchmarks")


def pytest_configure(config: pytest.Config) -> None:
    """Record durations if asked (``--record-durations``), and run the suite under the
    hash seed, BLAS pinning and floating-point paths a ``replay`` command has.

    The console script re-executes itself under PYTHONHASHSEED (the user's number, else
    0) with BLAS pools pinned to one thread; tests that run commands in this process
    (``cli``, tests/cli.py) need the same, so pytest does it once here: after its
    conftests are loaded and with output capture stopped (the new process starts its
    own), before collection.  A seed the user set is kept, as the command keeps it."""
    # no plain progress lines off a terminal (tests read exact stderr); one test turns
    # them on (tests/replay/test_plain_progress.py).  Set before the re-exec: inherited.
    os.environ.setdefault(PLAIN_EVERY_ENV, "0")
    # two xdist workers each run 2-3 MPI ranks on 2 cores: a rank that waits in MPICH
    # busy-polls, taking the core a working rank needs; yielding there cut the CPU of
    # test_replay.py + test_replay_sync.py by 8% and their wall time by 5% (two runs
    # each, both orders).  Only scheduling changes: no message, order or bit does.
    os.environ.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")
    record = config.getoption("record_durations", None)
    if record and not hasattr(config, "workerinput"):  # the controlling process only
        config.pluginmanager.register(_Durations(Path(record)), "replay-durations")
    pinned = all(os.environ.get(k) == v for k, v in _environment.float_env().items())
    if (_environment.current_hash_seed() is not None and pinned) or os.environ.get(REEXEC_MARKER):
        return
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        capman.stop_global_capturing()
    env = dict(os.environ, **_environment.worker_env(None), **{REEXEC_MARKER: "1"})
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


@pytest.fixture
def cli() -> Any:
    """``cli(*args, env=..., cwd=..., input=...)``: ``replay ARGS`` run in this process,
    returning a ``CompletedProcess`` (``returncode``, ``stdout``, ``stderr``)."""
    from tests.cli import invoke

    return lambda *args, **kw: invoke(args, **kw)


# pytest caches the assertion-rewritten test modules beside their bytecode, but not under
# PYTHONDONTWRITEBYTECODE (set on the CI hosts): every pytest process (the controller and
# each xdist worker) then rewrote all ~350 test modules again, 10-15 s each.  Like the
# compileall below, this writes only into git-ignored __pycache__ directories.
sys.dont_write_bytecode = False


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the project's modules once, before any test starts a process.

    An editable install leaves the sources uncompiled, and with ``PYTHONDONTWRITEBYTECODE``
    set (as on the CI hosts) no process ever caches them: every ``replay`` command and MPI
    rank the suite starts (thousands) compiled some 80 modules again, ~0.2 s each.
    Processes still *read* bytecode under that variable, and ``compileall`` writes it
    regardless (into ``__pycache__``, which git ignores)."""
    for name in PACKAGES:
        compileall.compile_dir(ROOT / name, quiet=1)


# ====================================================================== layers
#: Every test is in exactly one layer (``slow`` comes on top of one of them):
#: ``unit`` runs in this process and quickly, ``e2e`` starts a ``replay`` command, another
#: program or a PostgreSQL server (or runs in this process but slowly: ``SLOW_TESTS``),
#: ``mpi`` starts ``mpiexec`` itself.  ``pytest -m unit`` is the fast layer to run while
#: editing (a unit test that starts a process fails); plain ``pytest`` runs all of them.
LAYERS = ("unit", "e2e", "mpi")
#: Code that starts ``mpiexec`` itself (checked first: such a test is ``mpi``).
MPI_CODE = re.compile(r"\brun_mpi\(|\bmpiexec\(|['\"]mpiexec['\"]")
#: Code that starts a ``replay`` command, another program or a PostgreSQL server.
E2E_CODE = re.compile(
    r"\brun_cli\(|\bunrecorded_outcomes\(|\bsubprocess\.|\bpexpect\b|\btmux\b|\bpg_server\b"
)
#: Where the code that decides a test's layer lives: the test, its fixtures, and the helpers
#: they name, followed through ``tests/`` (library code is not followed).
TESTS = ROOT / "tests"


def _unwrapped(fn: Any) -> Any:
    """The function the test author wrote (under hypothesis's and functools' wrappers)."""
    inner = getattr(getattr(fn, "hypothesis", None), "inner_test", None)
    return inspect.unwrap(inner if inner is not None else fn)


#: The fields of a statement that hold the statements inside it (a definition is a
#: statement, so it is only ever in one of these lists, never inside an expression).
_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")


def _statements(tree: ast.AST) -> Iterator[ast.AST]:
    """``tree`` and every statement inside it (``ast.walk`` without the expressions:
    finding definitions this way visits a tenth of the nodes)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for field in _BLOCKS:
            inner = getattr(node, field, None)
            if isinstance(inner, list):
                todo.extend(inner)


_DEFINITION = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


@cache
def _definitions(path: str) -> tuple[list[str], dict[int, ast.AST], dict[str, list[ast.AST]]]:
    """The lines of the file at ``path``, its function and class definitions by the
    line they start on (their first decorator's), and its classes by name: each file is
    parsed once, not once per definition (the layer scan parsed 1,200 of them one by
    one, ~5 s per xdist worker)."""
    try:
        text = Path(path).read_text()
        tree = ast.parse(text)
    except (OSError, SyntaxError, ValueError):
        return [], {}, {}
    defs: dict[int, ast.AST] = {}
    classes: dict[str, list[ast.AST]] = {}
    for node in _statements(tree):
        if isinstance(node, _DEFINITION):
            defs.setdefault(_first_line(node), node)
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, []).append(node)
    return text.splitlines(), defs, classes


def _first_line(node: Any) -> int:
    """The line a definition starts on: its first decorator's, else its own."""
    return min([node.lineno, *(d.lineno for d in node.decorator_list)])


def _definition(obj: Any) -> tuple[list[str], ast.AST] | None:
    """``obj``'s source lines (its whole file) and its definition's tree."""
    try:
        path = inspect.getsourcefile(obj)
        lines, defs, classes = _definitions(path or "")
        if inspect.isfunction(obj):
            first = obj.__code__.co_firstlineno
        elif len(classes.get(obj.__name__, ())) == 1:  # (inspect would parse the file again)
            first = _first_line(classes[obj.__name__][0])
        else:
            first = inspect.getsourcelines(obj)[1]
    except (OSError, TypeError):
        return None
    node = defs.get(first)
    return (lines, node) if node is not None else None


@cache
def _scan(obj: Any) -> tuple[str, tuple[Any, ...]]:
    """``obj``'s code without comments and docstrings, and the functions, classes and
    modules of ``tests/`` it names."""
    found_def = _definition(obj)
    if found_def is None:
        return "", ()
    all_lines, tree = found_def
    start = _first_line(tree)
    lines = all_lines[start - 1 : tree.end_lineno]  # line k of the file is lines[k - start]
    for node in _statements(tree):  # docstrings open definitions, which are statements
        body = getattr(node, "body", None)
        if (
            isinstance(node, _DEFINITION)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            for k in range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1):
                lines[k - start] = ""
    names = getattr(obj, "__globals__", None) or vars(inspect.getmodule(obj) or object())
    found: list[Any] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            target = names.get(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            target = getattr(names.get(node.value.id), node.attr, None)
        else:
            continue
        if _in_tests(target):
            found.append(target)
    return "\n".join(map(_uncommented, lines)), tuple(dict.fromkeys(found))


def _uncommented(line: str) -> str:
    """``line`` without its ``#`` comment (a ``#`` inside a one-line string stays)."""
    if "#" not in line:
        return line
    quote = ""
    for k, ch in enumerate(line):
        if quote:
            if ch == quote and line[k - 1] != "\\":
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#":
            return line[:k]
    return line


def _in_tests(obj: Any) -> bool:
    if not (inspect.isfunction(obj) or inspect.isclass(obj)):
        return False
    return _defined_in_tests(obj)


@cache
def _defined_in_tests(obj: Any) -> bool:
    try:
        return Path(inspect.getsourcefile(obj) or "").resolve().is_relative_to(TESTS)
    except TypeError:  # a builtin class
        return False


def _layer(item: pytest.Function) -> str:
    """The layer of ``item`` from the code it reaches: the test function, the fixtures it
    requests (with their own fixtures), and the helpers in ``tests/`` any of them names.
    An in-process test that took more than ``UNIT_SECONDS`` when last measured
    (``SLOW_TESTS``) is ``e2e`` too: the fast layer holds only quick tests."""
    todo: list[Any] = [_unwrapped(item.function)]
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info else ():
        todo += [d.func for d in defs if _in_tests(_unwrapped(d.func))]
    seen: set[Any] = set()
    code: list[str] = []
    while todo:
        obj = _unwrapped(todo.pop())
        if obj in seen:
            continue
        seen.add(obj)
        text, named = _scan(obj)
        code.append(text)
        todo += named
    joined = "\n".join(code)
    if MPI_CODE.search(joined):
        return "mpi"
    if E2E_CODE.search(joined) or "pg_server" in item.fixturenames:
        return "e2e"
    return "e2e" if item.nodeid in _slow_tests() else "unit"


# ====================================================================== measured speed
#: The most a ``unit`` test may take (setup, call and teardown, on the 2-core CI host).
UNIT_SECONDS = 2.0
#: Tests that took more than ``UNIT_SECONDS`` in a whole-suite run: ``{node id: seconds}``,
#: written by ``pytest --record-durations tests/durations.json`` (README, "Running the
#: tests").  Each is marked ``slow``; an in-process one leaves the unit layer for ``e2e``.
SLOW_TESTS = TESTS / "durations.json"


@cache
def _measured() -> dict[str, Any]:
    try:
        return dict(json.loads(SLOW_TESTS.read_text()))
    except FileNotFoundError:
        return {}


@cache
def _slow_tests() -> dict[str, float]:
    return dict(_measured().get("slow", {}))


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


#: Seconds assumed for each test of a file that the last measured run did not see.
NEW_TEST_SECONDS = 1.0


def _longest_files_first(items: list[pytest.Item]) -> None:
    """Order the files by their measured seconds, longest first (each file's tests keep
    their order), so that xdist's ``loadfile`` hands out the long files while the other
    worker still has short ones to fill in, instead of one worker starting a long file as
    the other runs out of work (longest-processing-time-first; ``--no-loadscope-reorder``
    in pyproject.toml keeps this order, which xdist would otherwise sort by test count).
    Every worker computes the same order from the same file, as xdist requires."""
    measured: dict[str, float] = _measured().get("files", {})
    counts: dict[str, int] = {}
    for item in items:
        counts[_file_of(item.nodeid)] = counts.get(_file_of(item.nodeid), 0) + 1

    def seconds(item: pytest.Item) -> float:
        f = _file_of(item.nodeid)
        return measured.get(f, counts[f] * NEW_TEST_SECONDS)

    items.sort(key=lambda item: -seconds(item))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations",
        metavar="PATH",
        help=f"write the tests that took more than {UNIT_SECONDS} s to PATH (JSON); "
        "tests/durations.json is what takes slow in-process tests out of the unit layer",
    )


class _Durations:
    """Sums each test's setup, call and teardown times (reports reach the controlling
    process under xdist too) and writes the slow ones when the session ends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = {}
        self.failed = False

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration
        self.failed |= report.failed

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        opt = session.config.option
        whole = session.config.args_source == pytest.Config.ArgsSource.TESTPATHS
        if self.failed or opt.markexpr or opt.keyword or not whole:
            # a failed or partial run does not measure the suite: keep the file as it is
            print(f"\n--record-durations: not writing {self.path} (only a whole passing run)")
            return
        rounded = {k: round(v, 1) for k, v in sorted(self.seconds.items())}
        slow = {k: v for k, v in rounded.items() if v > UNIT_SECONDS}
        files: dict[str, float] = {}
        for k, v in self.seconds.items():
            files[_file_of(k)] = files.get(_file_of(k), 0.0) + v
        doc = {
            "unit_seconds": UNIT_SECONDS,
            "tests": len(self.seconds),
            "slow": slow,
            "files": {k: round(v, 1) for k, v in sorted(files.items())},
        }
        self.path.write_text(json.dumps(doc, indent=1) + "\n")


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by the markers added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its layer unless it carries one explicitly (which wins).

    With ``REPLAY_LAYERS_REPORT=PATH`` set, also write every collected test's layer markers
    (before ``-m`` deselects any) to PATH as JSON: ``tests/test_layers.py`` reads them."""
    for item in items:
        if isinstance(item, pytest.Function) and not any(
            item.get_closest_marker(name) for name in LAYERS
        ):
            item.add_marker(_layer(item))
        if item.nodeid in _slow_tests() and not item.get_closest_marker("slow"):
            item.add_marker("slow")
    _longest_files_first(items)
    layers = {
        item.nodeid: [m for m in (*LAYERS, "slow") if item.get_closest_marker(m)] for item in items
    }
    config.stash[_COLLECTED_LAYERS] = layers
    report = os.environ.get("REPLAY_LAYERS_REPORT")
    if report:
        Path(report).write_text(json.dumps(layers, indent=1))


#: Every collected test's layer markers, as ``pytest_collection_modifyitems`` saw them.
_COLLECTED_LAYERS = pytest.StashKey[dict[str, list[str]]]()


def collected_layers(config: pytest.Config) -> dict[str, list[str]] | None:
    """Each test's layer markers from this session's own collection, if it collected the
    whole suite (plain ``pytest``, as CI and every xdist worker of it do), else None.

    The markers are those of every collected test before ``-m``, ``-k`` or ``--deselect``
    took any out (they deselect after the hook above).  ``--lf`` and ``--ignore`` collect
    fewer files, and a run of named files or directories collects only those."""
    whole = config.args_source == pytest.Config.ArgsSource.TESTPATHS
    fewer = config.getoption("lf", False) or config.getoption("ignore", None)
    fewer = fewer or config.getoption("ignore_glob", None)
    if not whole or fewer:
        return None
    return config.stash.get(_COLLECTED_LAYERS, None)


def mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else "mpiexec"


def run_mpi(
    args: list[str], n: int, timeout: float = MPI_TIMEOUT, **kw
) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` on ``n`` ranks; fail the test (not hang) past ``timeout``."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    env.update(kw.pop("env", {}))
    cmd = [mpiexec(), "-n", str(n), sys.executable, *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, **kw)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"mpiexec -n {n} timed out after {timeout} s: {exc.stderr!r}")


def run_cli(args: list[str], timeout: float = MPI_TIMEOUT, **kw) -> subprocess.CompletedProcess:
    """Run the real ``replay`` console script with a timeout."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    env.update(kw.pop("env", {}))
    cmd = [sys.executable, "-m", "replay", *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, **kw)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"replay {' '.join(args)} timed out after {timeout} s: {exc.stderr!r}")


def unrecorded_outcomes(app: str, *args: str, runs: int = 6) -> set[tuple[str, ...]]:
    """The digests of up to ``runs`` untraced 2-rank runs of ``app``, stopping once two
    differ (enough to show the app non-deterministic).

    Each command runs in this process (tests/cli.py), its two ranks under ``mpiexec``:
    the ranks are the processes whose timing differs, and a separate launcher only added
    its start-up and imports to every run.  ``--timeout`` bounds each job as
    ``run_cli``'s timeout did."""
    from tests.cli import invoke

    outcomes: set[tuple[str, ...]] = set()
    for _ in range(runs):
        cmd = ["run", app, "--ranks", "2", *args, "--no-trace", "--json"]
        proc = invoke([*cmd, "--timeout", str(MPI_TIMEOUT)])
        assert proc.returncode == 0, proc.stderr
        outcomes.add(tuple(d["digest"] for d in json.loads(proc.stdout)["digests"]))
        if len(outcomes) >= 2:
            break
    return outcomes


@contextmanager
def no_processes() -> Iterator[None]:
    """Starting a process inside fails (``OSError``, which is how a missing program shows),
    and leaving fails the test naming the first one, even if the code caught the error."""
    started: list[str] = []
    # (no "subprocess." here: the layer scan would read every test as starting processes)
    real = Popen._execute_child  # type: ignore[attr-defined]

    def refuse(self: Popen, args: Any, *rest: Any, **kw: Any) -> None:
        started.append(" ".join(map(str, args)) if isinstance(args, list) else str(args))
        raise OSError(f"a unit test may not start a process: {started[-1]}")

    Popen._execute_child = refuse  # type: ignore[attr-defined]
    try:
        yield
    finally:
        Popen._execute_child = real  # type: ignore[attr-defined]
    if started:
        pytest.fail(
            f"this unit test started a process ({started[0]!r}): mark it e2e or mpi "
            "(tests/conftest.py, layers)"
        )


@pytest.fixture(autouse=True)
def _unit_tests_start_no_process(request: pytest.FixtureRequest) -> Iterator[None]:
    """A ``unit`` test that starts a process (a ``replay`` command's ``mpiexec``, say, which
    the layer scan cannot see through library code) fails: it belongs in another layer."""
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    with no_processes():
        yield


@pytest.fixture(autouse=True)
def _isolated_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Synthetic data goes to a per-session cache, never the user's."""
    cache = os.environ.get("STRADS_REPLAY_TEST_CACHE")
    if cache is None:
        cache = str(tmp_path_factory.getbasetemp() / "cache")
        os.environ["STRADS_REPLAY_TEST_CACHE"] = cache
    monkeypatch.setenv("STRADS_REPLAY_CACHE", cache)


@pytest.fixture(scope="session")
def trace_library(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Traces recorded once per test run, keyed by their ``replay run`` arguments
    (tests/traces.py).  Read-only: a test that changes one must ``copy`` it; one that
    does not fails the run when the session ends."""
    from tests.traces import TraceLibrary

    lib = TraceLibrary(tmp_path_factory.mktemp("trace-library"))
    yield lib
    changed = lib.changed()
    assert not changed, f"shared traces changed by a test (copy them first): {changed}"


@pytest.fixture(scope="session")
def pg_server():
    """A real PostgreSQL server for the session (skips with a reason without one)."""
    from tests.pg import start_server

    yield from start_server()


@pytest.fixture
def pg_url(pg_server) -> str:
    """The URL, password included, of a new empty PostgreSQL database."""
    return pg_server.create_database()


@pytest.fixture(scope="session")
def pg_trace(pg_server, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A 2-rank SGDMF run recorded into a PostgreSQL database: the ``run --json`` result
    plus ``url`` (with the password) and ``cwd`` (where the command ran)."""
    import json

    url = pg_server.create_database()
    cwd = tmp_path_factory.mktemp("pg-run")
    args = ["run", "sgdmf", "-p", "synthetic=true", "-p", "epochs=2", "--ranks", "2"]
    proc = run_cli([*args, "--trace", url, "--json"], cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout), url=url, cwd=cwd, stderr=proc.stderr)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection made (modules, test items, fixtures' definitions): the
    cyclic collector would otherwise walk those long-lived objects in every full
    collection the in-process tests trigger."""
    import gc

    gc.collect()
    gc.freeze()
