"""Cluster replay and single-node replay of a recorded run.

*Cluster replay* relaunches the app with the recorded ranks, threads, seed and
parameters; every rank enforces its recorded orders.  *Single-node replay* hosts
every node of the recorded run in this process and runs them in one causally
consistent order, one body at a time — so ``pdb`` can stop inside any body.  Both
compare every digest and objective with the trace as soon as it is produced and
stop at the first difference.
"""

from __future__ import annotations

import bdb
import inspect
import os
import pdb
import sys
import sysconfig
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

import engine
import tracer
from engine.lowlevel import ScheduleExhausted, inspecting

from . import _environment, _traceio
from ._apps import BUILTIN_APPS, App, recorded_params, resolve
from ._controller import ReplayChecker, ReplayFinished, TraceController
from ._errors import UsageError
from ._job import app_source, code_digest, recorded_modes, rounded_times
from ._progress import phases_to, tick_line
from ._target import CodeChangedError, check_digest, check_params, file_digest, own_source
from ._timetravel import FastForward, Start, first_step, program_order, start_before, step_of


def parse_break(text: str) -> tuple[str, int, int, int | None]:
    """``OP:INVOCATION:INDEX[@NODE]`` → (op, invocation, index, node or None)."""
    node = None
    spec = text
    if "@" in spec:
        spec, node_s = spec.rsplit("@", 1)
        node = _int(node_s, "NODE", text)
    parts = spec.rsplit(":", 2)
    if len(parts) != 3 or not parts[0]:
        raise UsageError(f"--break expects OP:INVOCATION:INDEX[@NODE], got {text!r}")
    return parts[0], _int(parts[1], "INVOCATION", text), _int(parts[2], "INDEX", text), node


def parse_until(text: str) -> tuple[str, int]:
    """``OP:INVOCATION`` → (op, invocation)."""
    parts = text.rsplit(":", 1)
    if len(parts) != 2 or not parts[0]:
        raise UsageError(f"--until expects OP:INVOCATION, got {text!r}")
    return parts[0], _int(parts[1], "INVOCATION", text)


def _int(s: str, what: str, whole: str) -> int:
    try:
        return int(s)
    except ValueError:
        raise UsageError(f"{what} in {whole!r} must be an integer, got {s!r}") from None


#: Where frames that are not the user's driver live: our packages (the engine calls the
#: ``--until`` hook) and the standard library (context managers between them).
_NOT_DRIVER = tuple(
    str(p.resolve()) + os.sep
    for p in [
        *(Path(str(m.__file__)).parent for m in (engine, tracer, sys.modules[str(__package__)])),
        Path(sysconfig.get_paths()["stdlib"]),
    ]
)


def _driver_frame() -> Any:
    """The innermost frame of the program's driver (``--until`` stops there, where the
    user's variables are, not in the engine code that called the hook)."""
    frame = sys._getframe(1)
    while frame.f_back is not None and (
        os.path.realpath(frame.f_code.co_filename).startswith(_NOT_DRIVER)
        or frame.f_code.co_filename.startswith("<")
    ):
        frame = frame.f_back
    return frame


class _Pdb(pdb.Pdb):
    """pdb that remembers whether the user quit (``q``, EOF), and whose accesses to DDS
    are the debugger's, not the stopped body's: ``p W[0]`` (a command, a ``display``
    shown at each stop, a breakpoint's condition) of a row the body does not read says
    so instead of counting against the body's plan, which would re-plan the replayed
    invocation and stop a second time."""

    user_quit = False

    def interaction(self, frame: Any, traceback: Any) -> None:
        with inspecting():  # the body runs again only after the prompt returns
            super().interaction(frame, traceback)

    def break_here(self, frame: Any) -> bool:
        with inspecting():  # a condition (``b LINE, W[0] > 0``) is the debugger's
            return bool(super().break_here(frame))

    def set_quit(self) -> None:
        self.user_quit = True
        super().set_quit()


def _breakpoint(
    target: tuple[str, int, int, int | None], hits: list[int]
) -> Callable[[str, int, int, Any], Any]:
    op_t, inv_t, idx_t, node_t = target

    def wrap(op: str, invocation: int, node: int, body: Any) -> Any:
        if op != op_t or invocation != inv_t or (node_t is not None and node != node_t):
            return body

        def stop_at(j: Any) -> Any:
            if getattr(j, "number", j) != idx_t:  # a sync_for body gets a Batch
                return body(j)
            hits.append(node)
            print(
                f"replay: stopped in {op}#{invocation} index {idx_t} on node {node} "
                "(the DDS hold what this body saw; 'c' continues)",
                flush=True,
            )
            dbg = _Pdb()
            res = dbg.runcall(body, j)
            if dbg.user_quit:  # runcall swallows BdbQuit: end the replay, not the body
                raise bdb.BdbQuit()
            return res

        return stop_at

    return wrap


def _user_quit(exc: BaseException | None) -> bool:
    """Whether ``exc`` is (or wraps) the user quitting pdb (``q`` raises BdbQuit)."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, bdb.BdbQuit):
            return True
        exc = getattr(exc, "cause", None) or exc.__cause__ or exc.__context__
        seen += 1
    return False


def open_run(path: str, run_id: str | None, *, check: bool = False) -> Any:
    """The recorded run to replay (read-only); ``check``: refuse it if damaged.

    The store stays open while the run is read (lazily); under a command it is closed
    when the command ends (a process that lives on, such as in-process commands, kept a
    database connection per call, which a PostgreSQL server counts), elsewhere when the
    process ends."""
    trace = tracer.open(path, assume_finished=True)
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.call_on_close(trace.close)
    try:
        run = trace.run(run_id)
        if check:
            trace.ensure_intact(run.info.run_id)
    except BaseException:
        trace.close()
        raise
    return run


def recorded_app(
    info: Any, *, allow_changed: bool = False, announce: Callable[[str], None] | None = None
) -> App:
    """The app a trace names, checked before any of its code runs (see ``_target``).

    A built-in app is ours and imported as usual; a user target must be the user's own
    source file (outside every library path) whose source has the recorded digest.
    ``announce`` is told which file will run, before anything of it is imported.
    """
    builtin = info.app in BUILTIN_APPS
    target = info.app if builtin else (info.target or info.app)
    try:
        if not builtin:
            path = own_source(target)
            check_digest(
                info.code_digest, file_digest(path), str(path), allow_changed=allow_changed
            )
            if announce is not None:
                fn = target.rsplit(":", 1)[-1]
                same = "unchanged since recording" if not allow_changed else "digest not checked"
                announce(f"replay: the trace names your function {fn} in {path} ({same})")
        app = resolve(target)
    except CodeChangedError:
        raise
    except UsageError as exc:
        raise UsageError(f"the trace's app cannot be found or is refused: {exc}") from None
    where = inspect.getsourcefile(app.fn) or app.target
    check_digest(info.code_digest, code_digest(app.fn), where, allow_changed=allow_changed)
    check_params(app.fn, info.params, app.target)
    return app


def check_replayable(run: Any) -> None:
    """Refuse a run whose message sources cannot be replayed (its parameters are checked
    by :func:`recorded_app`).

    Run before launching ranks, so a damaged trace is one line and exit 2 rather than
    a failure inside MPI.
    """
    info = run.info
    for node in range(info.ranks):
        sources = run.messages(node).source  # decoding checks the blobs themselves
        bad = sources[(sources < 0) | (sources >= info.ranks)]
        if len(bad):
            raise tracer.TraceFormatError(
                f"the trace's run {info.run_id[:12]} is damaged: node {node} received a "
                f"message from rank {int(bad[0])}, but the run had {info.ranks} rank(s) "
                "(table message_block column sources); re-record the run"
            )


def start_at(run: Any, point: tuple[str, int], option: str = "--from") -> Start:
    """Where a replay ``--from`` ``point`` starts: after the latest checkpoint taken
    before ``point`` runs (a bad point, or a run without checkpoints, is a UsageError)."""
    return start_before(run, first_step(run) + step_of(program_order(run), point, option))


def resumed_start(run: Any) -> Start:
    """Where any replay of a resumed run (``continues`` set) starts: the checkpoint it was
    resumed from, its first (its earlier loop invocations are the crashed run's and are
    not in it)."""
    cps = run.checkpoints()
    if not cps:
        raise UsageError(
            f"run {run.info.run_id[:12]} resumed run {run.info.continues[:12]} but holds no "
            "checkpoint to start a replay from; the trace is damaged"
        )
    return Start(cps[0].op, cps[0].invocation, cps[0].step)


def replay_here(
    spec: dict[str, Any], comm: Any = None, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Replay ``spec['trace']`` here: ``mode`` 'cluster' (one rank of MPI) or 'single'."""
    mode = spec["mode"]
    # on another host than rank 0 the trace file is not there: rank 0 sends it
    where = _traceio.readable(spec["trace"], comm if mode == "cluster" else None)
    run = open_run(where, spec.get("run_id"))
    info = run.info
    app = recorded_app(info, allow_changed=bool(spec.get("allow_changed_code")))
    if mode == "cluster":
        size = comm.Get_size() if comm is not None else 1
        if size != info.ranks:
            raise UsageError(
                f"the trace was recorded on {info.ranks} rank(s) but this replay has {size}; "
                f"replay it with 'replay cluster TRACE' (it starts {info.ranks} ranks itself)"
            )
    rank = comm.Get_rank() if comm is not None else 0
    if mode == "cluster" and comm is not None:
        _environment.check_ranks_agree(comm, app_source(app.fn))
    if rank == 0:  # the CLI re-executed itself to match; a library caller gets warned
        _environment.warn_replay_environment(info.environment, info.versions)
    say = progress if rank == 0 else None
    if say is not None:
        say(
            f"replaying run {info.run_id[:12]} ({info.app}, {info.ranks} rank(s) x "
            f"{info.threads} thread(s), seed {info.seed}) {mode}"
        )
    hits: list[int] = []
    brk = spec.get("break")
    travel = None
    if spec.get("from"):
        travel = FastForward(run, start_at(run, tuple(spec["from"])))
    elif run.info.continues is not None:
        travel = FastForward(run, resumed_start(run))
    if travel is not None and say is not None:
        if travel.start.note is not None:
            say(travel.start.note)
        if travel.start.op is not None:
            say(f"starting after the checkpoint at {travel.start.op}#{travel.start.invocation}")
    controller = TraceController(
        run,
        single=mode == "single",
        breakpoint_hook=_breakpoint(tuple(brk), hits) if brk else None,
        travel=travel,
    )
    until = spec.get("until")
    if until:

        def stop_after(op: str, invocation: int) -> None:
            if (op, invocation) == tuple(until):
                print(f"replay: stopped after {op}#{invocation} ('c' continues)", flush=True)
                pdb.Pdb().set_trace(_driver_frame())

        controller.set_until(stop_after)
    tee = None
    if spec.get("out_trace"):
        from ._job import _recorder  # the same recorder a normal run uses

        tee = _recorder(
            dict(
                spec,
                trace=spec["out_trace"],
                run_id=spec.get("run_id_out") or uuid.uuid4().hex,
                threads=info.threads,
                seed=info.seed,
                nodes=info.ranks,
                **recorded_modes(info),
            ),
            app,
            recorded_params(app.fn, info.params),
            comm,
        )
    t0 = time.perf_counter()  # before the checker's clock: its times stay within wall_s
    checker = ReplayChecker(
        run,
        tee,
        None if say is None else lambda done, total: say(tick_line(done, total, "invocations")),
        skipped=None if travel is None else travel.skipped,
        travel=travel,
    )
    first_difference = None
    complete = True
    stopped = False
    reproduced: str | None = None
    phases = phases_to(say)
    if phases is not None and travel is not None and travel.start.op is not None:
        # the driver re-runs to the checkpoint, skipping loop invocations: one phase
        phases(f"fast-forward to the checkpoint after {travel.start.op}#{travel.start.invocation}")
    try:
        engine.run(
            app.fn,
            recorded_params(app.fn, info.params),
            nodes=info.ranks if mode == "single" else 1,
            threads=info.threads,
            seed=info.seed,
            comm=comm if mode == "cluster" else None,
            recorder=checker,
            schedules=controller,
            hooks=controller,
            phases=phases,
            **recorded_modes(info),
        )
        checker.finish()
    except (ReplayFinished, ScheduleExhausted):
        complete = False
    except engine.DivergenceError as exc:
        first_difference = exc.as_dict()
    except Exception as exc:
        if _user_quit(exc):
            stopped = True
        elif _same_end(info, exc, checker):
            complete = False  # the recorded run stopped here too, and so does its replay
            reproduced = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        else:
            raise
    finally:
        if tee is not None:
            tee.close("finished" if first_difference is None and not stopped else "failed")
    wall = time.perf_counter() - t0
    return {
        "trace": spec["trace"],
        "run_id": info.run_id,
        "mode": mode,
        "identical": first_difference is None and not stopped,
        "complete": complete and not stopped,
        "stopped": stopped,
        "replayed_up_to": (
            None if checker.last_completed is None else "{}#{}".format(*checker.last_completed)
        ),
        "first_difference": first_difference,
        "checked": {"digests": checker.checked_digests, "objectives": checker.checked_objectives},
        "served_objectives": checker.served_objectives,
        "skipped": 0 if travel is None else len(travel.skipped),
        "recorded_status": info.status,
        "reproduced_failure": reproduced,
        "breakpoint_hits": len(hits),
        "from": None if travel is None else travel.start.as_json(),
        "out_trace": spec.get("out_trace"),
        "wall_s": round(wall, 6),
        "objective_times": rounded_times(checker.objective_times),
    }


def _same_end(info: Any, exc: BaseException, checker: ReplayChecker) -> bool:
    """Whether ``exc`` is the recorded run's own end reproduced: the run did not finish,
    the error is the program's (an engine error such as a failed body or the driver's
    cross-rank check, not a divergence), it is the error the run recorded, and everything
    the trace holds was replayed.
    Then every replay mode gives the same verdict, whether or not it can reproduce the
    error itself (one process cannot see ranks disagree)."""
    first = (str(exc).splitlines() or [""])[0]
    return (
        info.status != "finished"
        and isinstance(exc, engine.EngineError)
        and not isinstance(exc, engine.DivergenceError)
        and checker.produced_everything()
        and first in (info.error or "")  # the recorded run's own error, not another
    )


def store_verdict(result: dict[str, Any]) -> None:
    """Write the replay verdict into the original trace (the TUI shows it), with the
    ``stop`` the CLI advised (``--break inc:0:0@0``) when it gave one."""
    detail = {
        "first_difference": result["first_difference"],
        "complete": result["complete"],
        "checked": result["checked"],
        "wall_s": result["wall_s"],
    }
    if result.get("stop"):
        detail["stop"] = result["stop"]
    if result.get("from") is not None:  # what it did not compute: the browser says so
        detail["from"] = result["from"]
        detail["skipped"] = result.get("skipped", 0)
        detail["served_objectives"] = result.get("served_objectives", 0)
    with tracer.open_writable(result["trace"]) as trace:
        trace.add_verdict(result["run_id"], result["mode"], result["identical"], detail)


__all__ = [
    "check_replayable",
    "parse_break",
    "parse_until",
    "replay_here",
    "resumed_start",
    "start_at",
    "store_verdict",
]
