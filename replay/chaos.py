"""Chaos mode: run a program under many seeded legal schedules, record and check each.

Run ``k`` of an exploration with chaos seed ``S`` follows the schedule
:class:`~replay._chaosctl.ChaosController` draws from ``(S, k)``: the engine makes every
choice a real run leaves to timing (lock-split grant orders, thread dispatch, message
arrivals, SSP visibility within the staleness bound, Hybrid mutex orders) from that
seed, so the same ``(S, k)`` gives the same run, digest for digest.  Each run is
recorded as usual into one trace store (labels ``chaos_seed`` and ``chaos_run``), so
any run replays with ``replay single TRACE --run ID``.

The report groups the runs by *outcome*: one hex digest over all of a run's DDS digests
and logged objectives.  A check is run on every run: ``"dual"`` (the backward dual test:
the chaos run is the parallel side, and a serial run over its loop-index orders must give
its outcome exactly), ``"objective:NAME<=VALUE"`` (every logged value of NAME satisfies
the comparison; also ``<``, ``>=``, ``>``), or a callable ``check(result) -> str | None``
(a message when the run is wrong).  The first failing run stops the exploration unless
``keep_going``.

``"dual"`` runs in test mode, which runs relaxed DDS exactly and SSP as BSP: the SSP
visibility choices and relaxed rounds would not be explored, and the check would pass
schedules it never ran.  So a program that declares either is refused (before any run
is recorded), naming what and suggesting an objective check, which runs the program as
declared.

>>> from replay import chaos
>>> report = chaos.explore(train, {"epochs": 2}, runs=20, chaos_seed=7,
...                        nodes=2, threads=2, check="dual")   # doctest: +SKIP
>>> report.distinct, report.failed                              # doctest: +SKIP
(3, None)
"""

from __future__ import annotations

import inspect
import math
import operator
import re
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import engine
import tracer

from . import _environment
from ._apps import App, resolve
from ._chaosctl import ChaosController, NodeStopped, labels
from ._chaosreport import ChaosFailure, ChaosReport, ChaosRun, outcome_digest
from ._dualctl import Steering
from ._errors import UsageError

#: ``objective:NAME<op>VALUE`` checks: the comparisons understood, longest first.
_COMPARE: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
}
#: The bound may not start with a comparison's character: ``loss<=`` read as ``<`` with
#: the bound ``=`` ("'=' is not a number"), and ``loss<=>1`` as a bound of ``>1``.
_OBJECTIVE = re.compile(r"^objective:([A-Za-z_][\w.\-]*)\s*(<=|>=|<|>)\s*([^\s<>=]\S*)$")


# ====================================================================== checks
def parse_check(check: str | Callable[..., Any] | None) -> str | Callable[..., Any] | None:
    """Validate a check spec (raises :class:`UsageError` with what is accepted)."""
    if check is None or callable(check) or check == "dual":
        return check
    m = _OBJECTIVE.match(check)
    if m is None:
        raise UsageError(
            f"--check must be 'dual' or 'objective:NAME<=VALUE' (also <, >=, >), got {check!r}"
        )
    try:
        value = float(m.group(3))
    except ValueError:
        raise UsageError(f"--check {check!r}: {m.group(3)!r} is not a number") from None
    if math.isnan(value):
        raise UsageError(f"--check {check!r}: the bound may not be NaN")
    return check


def _objective_check(check: str, objectives: dict[str, list[float]]) -> str | None:
    m = _OBJECTIVE.match(check)
    assert m is not None  # parse_check accepted it
    name, op, bound = m.group(1), m.group(2), float(m.group(3))
    if name not in objectives:
        logged = ", ".join(sorted(objectives)) or "none"
        raise UsageError(
            f"--check {check!r}: the app never logged objective {name!r} (it logged: {logged})"
        )
    for it, v in enumerate(objectives[name]):
        if not _COMPARE[op](v, bound):
            return f"{name} = {v!r} at iteration {it} breaks {name} {op} {bound!r}"
    return None


def app_check(app: App) -> Callable[..., Any]:
    """``--check app``: the function ``check(run)`` of the module that defines the app's
    driver (``run``: a :class:`ChaosRun`, with ``digests`` and ``objectives``; it returns
    a message when the run is wrong, else None)."""
    module = sys.modules.get(getattr(app.fn, "__module__", ""), None)
    fn = getattr(module, "check", None)
    if not callable(fn):
        where = getattr(module, "__file__", None) or getattr(app.fn, "__module__", "?")
        raise UsageError(
            f"--check app: {where} defines no function check(run); write one that returns "
            "a message for a wrong run (else None), or use --check dual|objective:..."
        )
    return fn


# ====================================================================== dual in test mode
class _Declared(BaseException):
    """The probe met a relaxed DDS or an SSP operator (not an ``Exception``: no body or
    engine handler may swallow it)."""

    def __init__(self, entry: dict[str, Any]) -> None:
        super().__init__(entry)
        self.entry = entry


class _Probe(Steering):
    """Stops a test-mode run at the first relaxation it turns off."""

    def ran_exact(self, entry: dict[str, Any]) -> None:
        raise _Declared(entry)


def _refusal(app: App, entry: dict[str, Any]) -> UsageError:
    if entry["kind"] == "ssp":
        what = f"SSP {entry['name']!r} as BSP, so chaos would not explore its SSP visibility"
    else:
        what = f"relaxed DDS {entry['name']!r} exactly, so chaos would not explore its relaxed"
        what += " rounds"
    return UsageError(
        f"--check dual cannot explore {app.spec}: the dual test runs {what}; state a property "
        "and check it under the real schedules: --check 'objective:NAME<=VALUE'"
    )


def refuse_untested_dual(app: App, params: dict[str, Any], seed: int) -> None:
    """Raise :class:`UsageError` if ``app`` declares a relaxed DDS or an SSP operator,
    which ``--check dual`` (test mode) would run exactly: found by a one-node test-mode
    run that stops at the first one (a program with neither runs to its end)."""
    probe = _Probe()
    try:
        engine.run(
            app.fn, params, seed=seed, schedules=probe, hooks=probe, test_mode=True, digest=None
        )
    except _Declared as exc:
        raise _refusal(app, exc.entry) from None
    except Exception:  # noqa: BLE001 - the real runs report what is wrong with the program
        return


# ====================================================================== explore
def _app_of(train: Callable[..., Any] | str) -> App:
    if isinstance(train, str):
        return resolve(train)
    qual = getattr(train, "__qualname__", getattr(train, "__name__", "train"))
    try:
        where = inspect.getsourcefile(train) or getattr(train, "__module__", "?")
    except TypeError:
        where = getattr(train, "__module__", "?")
    # the file path lets ``replay single`` find a module-level driver again
    return App(spec=f"{where}:{qual}", target=f"{where}:{qual}", fn=train)


def explore(
    train: Callable[..., Any] | str,
    params: dict[str, Any] | None = None,
    *,
    runs: int,
    chaos_seed: int,
    nodes: int = 2,
    threads: int = 1,
    seed: int = 0,
    only: int | None = None,
    check: str | Callable[..., Any] | None = None,
    keep_going: bool = False,
    trace: str | None = None,
    parallel: str = "in-process",
    timeout: float | None = None,
    faults: bool = False,
    progress: Callable[[str], None] | None = None,
) -> ChaosReport:
    """Run ``train(**params)`` under ``runs`` chaos schedules (or only run ``only``) on
    ``nodes`` x ``threads``; record each into ``trace`` (None: not recorded) and check it
    with ``check``.  ``seed`` is the run seed (initialisation, ``engine.rng()``), the same
    for every run; ``chaos_seed`` draws the schedules.  ``parallel``: ``"in-process"``
    (default, fast) or ``"mpi"`` (each run under ``mpiexec -n nodes``; ``train`` must
    then be an app name or ``path/to/train.py:function``, ``timeout`` seconds per job).
    ``faults`` (in-process): stop one node of each run at a point drawn from the seed and
    check that the recorded run is marked crashed and replays up to the crash."""
    if parallel not in ("in-process", "mpi"):
        raise UsageError(f"parallel must be 'in-process' or 'mpi', got {parallel!r}")
    if parallel == "mpi" and nodes > 1 and not isinstance(train, str):
        raise UsageError(
            "chaos runs under mpiexec need the app as a name or 'path/to/train.py:function'"
        )
    if faults and (parallel == "mpi" and nodes > 1 or check == "dual"):
        raise UsageError("--faults runs in process (--in-process) and without --check dual")
    if runs < 1:
        raise UsageError(f"--runs must be >= 1, got {runs}")
    if not 0 <= chaos_seed < 2**63:
        raise UsageError(f"--chaos-seed must be an integer in [0, 2**63), got {chaos_seed}")
    if only is not None and not 0 <= only < runs:
        raise UsageError(f"--only must name a run in 0..{runs - 1}, got {only}")
    (n_lo, n_hi), (t_lo, t_hi) = tracer.RUN_LIMITS["ranks"], tracer.RUN_LIMITS["threads"]
    if not (n_lo <= nodes <= n_hi and t_lo <= threads <= t_hi):  # what a trace can hold
        raise UsageError(
            f"nodes and threads must be in [{n_lo}, {n_hi}] x [{t_lo}, {t_hi}], "
            f"got {nodes} x {threads}"
        )
    check = parse_check(check)
    app = _app_of(train)
    params = dict(params or {})
    if check == "dual":
        refuse_untested_dual(app, params, seed)
    report = ChaosReport(chaos_seed, trace)
    t0 = time.perf_counter()
    for k in [only] if only is not None else range(runs):
        got = _one_run(
            app,
            params,
            k,
            chaos_seed,
            (nodes, threads, seed),
            check,
            trace,
            parallel,
            timeout,
            faults,
        )
        report.runs.append(got[0])
        if progress is not None:
            progress(f"run {k}: outcome {got[0].outcome[:16]} ({got[0].seconds:.2f} s)")
        if got[1] is not None:
            report.failures += 1
            if report.failed is None:
                report.failed = got[1]
            if not keep_going:
                break
    report.wall_s = time.perf_counter() - t0
    return report


def _param_strings(params: dict[str, Any]) -> list[str]:
    """``NAME=VALUE`` strings an MPI rank converts back (``replay._apps.parse_params``)."""
    out = []
    for k, v in params.items():
        text = ("true" if v else "false") if isinstance(v, bool) else str(v)
        out.append(f"{k}={text}")
    return out


def _digest_rows(digests: list[dict[str, Any]]) -> list[tuple[str, int, str, str]]:
    return [(d["op"], int(d["invocation"]), d["dds"], d["digest"]) for d in digests]


def _one_run(
    app: App,
    params: dict[str, Any],
    k: int,
    chaos_seed: int,
    shape: tuple[int, int, int],
    check: str | Callable[..., Any] | None,
    trace: str | None,
    parallel: str,
    timeout: float | None,
    faults: bool = False,
) -> tuple[ChaosRun, ChaosFailure | None]:
    from . import testing
    from ._job import EXIT_DIVERGED, EXIT_FAILED, JobFailed, _recorder, launch, recording

    nodes, threads, seed = shape
    mpi = parallel == "mpi" and nodes > 1
    run_id = uuid.uuid4().hex
    recorder = None
    if trace is not None and not mpi:
        spec = {
            "trace": trace,
            "run_id": run_id,
            "nodes": nodes,
            "threads": threads,
            "seed": seed,
            "labels": labels(chaos_seed, k),
            "test_mode": check == "dual",
        }
        recorder = _recorder(spec, app, params, None)
    controller = ChaosController(chaos_seed, k, faults=faults, nodes=nodes)
    if faults:
        return _fault_run(app, params, k, chaos_seed, shape, check, trace, recorder, controller)
    failure: tuple[str, str, tuple[str, int, int] | None] | None = None
    result: Any = None
    digests: list[tuple[str, int, str, str]] = []
    objectives: dict[str, list[float]] = {}
    t0 = time.perf_counter()
    try:
        with recording(recorder):
            if check == "dual":
                dual = testing.backward(
                    app.spec if mpi else app.fn,
                    params,
                    nodes=nodes,
                    threads=threads,
                    seed=seed,
                    recorder=None if mpi else recorder,
                    controller=controller,
                    parallel="mpi" if mpi else "in-process",
                    mpi_trace=(trace, run_id) if mpi and trace is not None else None,
                    timeout=timeout,
                )
                if dual.parallel is not None and dual.parallel.ran_exact:  # shaped by ranks
                    raise _refusal(app, dual.parallel.ran_exact[0])
                if dual.parallel is not None:
                    digests = _digest_rows(dual.parallel.digests)
                    objectives = dual.parallel.objectives
                if not dual.passed:
                    d = dual.divergence or {}
                    where = None
                    if (
                        d.get("op")
                        and d.get("invocation") is not None
                        and d.get("index") is not None
                    ):
                        where = (str(d["op"]), int(d["invocation"]), int(d["index"]))
                    failure = ("dual", dual.report(), where)
            elif mpi:
                job = {
                    "app": app.spec,
                    "params": _param_strings(params),
                    "threads": threads,
                    "seed": seed,
                    "trace": trace,
                    "run_id": run_id,
                    "chaos": [chaos_seed, k],
                    "labels": labels(chaos_seed, k),
                    "hash_seed": _environment.choose_hash_seed(),
                }
                result = launch(job, nodes, timeout=timeout, out=lambda line: None)
                digests = _digest_rows(result["digests"])
                objectives = result["objectives"]
            else:
                result = engine.run(
                    app.fn,
                    params,
                    nodes=nodes,
                    threads=threads,
                    seed=seed,
                    recorder=recorder,
                    schedules=controller,
                    hooks=controller,
                )
                digests = _digest_rows(result.digests)
                objectives = result.objectives
    except (engine.DivergenceError, engine.BodyError, engine.ReplicaMismatchError) as exc:
        failure = ("run", str(exc), None)
    except JobFailed as exc:  # a rank's body failed or it left its schedule
        if exc.status not in (EXIT_FAILED, EXIT_DIVERGED):
            raise
        failure = ("run", str(exc), None)
    seconds = time.perf_counter() - t0
    run = ChaosRun(k, run_id, outcome_digest(digests, objectives), digests, objectives, seconds)
    broken = None if failure is not None else _invariant(check, run)
    if broken is not None:
        failure = (*broken, None)
    if failure is None:
        return run, None
    return run, ChaosFailure(k, chaos_seed, failure[0], failure[1], run_id, trace, failure[2])


def _invariant(check: str | Callable[..., Any] | None, run: ChaosRun) -> tuple[str, str] | None:
    """(check, message) when ``run`` breaks an objective bound or the app's function
    check (``dual`` is checked while the run is made, not here)."""
    if isinstance(check, str) and check.startswith("objective:"):
        why = _objective_check(check, run.objectives)
        return None if why is None else (check, why)
    if callable(check):
        why = check(run)
        return ("function", str(why)) if why else None
    return None


def _fault_run(
    app: App,
    params: dict[str, Any],
    k: int,
    chaos_seed: int,
    shape: tuple[int, int, int],
    check: str | Callable[..., Any] | None,
    trace: str | None,
    recorder: Any,
    controller: ChaosController,
) -> tuple[ChaosRun, ChaosFailure | None]:
    """One run with a node stopped: the recorder is closed as ``crashed`` (what a killed
    rank leaves behind), then the trace is opened and the run replayed up to the crash."""
    import traceback

    nodes, threads, seed = shape
    run_id = recorder.run_id if recorder is not None else uuid.uuid4().hex
    t0 = time.perf_counter()
    result = None
    stop: NodeStopped | None = None
    try:
        result = engine.run(
            app.fn,
            params,
            nodes=nodes,
            threads=threads,
            seed=seed,
            recorder=recorder,
            schedules=controller,
            hooks=controller,
        )
    except NodeStopped as exc:
        stop = exc
        if recorder is not None:
            recorder.close("crashed", str(exc))
    except BaseException:
        if recorder is not None:
            recorder.close("failed", traceback.format_exc())
        raise
    else:
        if recorder is not None:
            recorder.close("finished")
    seconds = time.perf_counter() - t0
    if stop is None:
        assert result is not None
        digests, objectives = _digest_rows(result.digests), result.objectives
        run = ChaosRun(k, run_id, outcome_digest(digests, objectives), digests, objectives)
        run.seconds = seconds
        broken = _invariant(check, run)
        if broken is None:
            return run, None
        return run, ChaosFailure(k, chaos_seed, *broken, run_id, trace)
    crash: dict[str, Any] = {
        "node": stop.node,
        "op": stop.op,
        "invocation": stop.invocation,
        "after": stop.after,
        "status": "not recorded",
    }
    digests, objectives = [], {}
    if trace is not None:
        import tracer

        from ._replay import replay_here

        with tracer.open(trace) as store:
            got = store.run(run_id)
            crash["status"] = got.info.status
            digests = [(d.op, d.invocation, d.dds, d.digest) for d in got.digests()]
            objectives = got.objectives()
        rep = replay_here({"kind": "replay", "mode": "single", "trace": trace, "run_id": run_id})
        crash["identical"] = bool(rep["identical"])
        crash["replay"] = "identical" if rep["identical"] else str(rep.get("first_difference"))
    run = ChaosRun(k, run_id, outcome_digest(digests, objectives), digests, objectives, seconds)
    run.crash = crash
    if trace is not None and (crash["status"] != "crashed" or not crash["identical"]):
        why = (
            f"the crashed run is marked {crash['status']!r}, not 'crashed'"
            if crash["status"] != "crashed"
            else f"replaying it up to the crash diverged: {crash['replay']}"
        )
        return run, ChaosFailure(k, chaos_seed, "fault", why, run_id, trace)
    return run, None


__all__ = [
    "ChaosFailure",
    "ChaosReport",
    "ChaosRun",
    "app_check",
    "explore",
    "outcome_digest",
    "parse_check",
]
