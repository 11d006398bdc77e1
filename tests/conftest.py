"""Shared fixtures: run scripts under mpiexec with a timeout, isolate the data cache."""

from __future__ import annotations

import compileall
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=50, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

ROOT = Path(__file__).resolve().parent.parent
#: Seconds an MPI test may take before it is killed and fails (a deadlock must not hang CI).
MPI_TIMEOUT = 120


#: The directories whose modules the suite's subprocesses import.
PACKAGES = ("apps", "engine", "replay", "tracer", "tui", "tests", "benchmarks")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the project's modules once, before any test starts a process.

    An editable install leaves the sources uncompiled, and with ``PYTHONDONTWRITEBYTECODE``
    set (as on the CI hosts) no process ever caches them: every ``replay`` command and MPI
    rank the suite starts (thousands) compiled some 80 modules again, ~0.2 s each.
    Processes still *read* bytecode under that variable, and ``compileall`` writes it
    regardless (into ``__pycache__``, which git ignores)."""
    for name in PACKAGES:
        compileall.compile_dir(ROOT / name, quiet=1)


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
    differ (enough to show the app non-deterministic)."""
    outcomes: set[tuple[str, ...]] = set()
    for _ in range(runs):
        proc = run_cli(["run", app, "--ranks", "2", *args, "--no-trace", "--json"])
        assert proc.returncode == 0, proc.stderr
        outcomes.add(tuple(d["digest"] for d in json.loads(proc.stdout)["digests"]))
        if len(outcomes) >= 2:
            break
    return outcomes


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
