"""Running an app: here (in-process or as one rank of an MPI job) or under ``mpiexec``.

``replay run APP --ranks N`` starts ``mpiexec -n N python -m replay._worker`` and
sends the job spec to rank 0 on mpiexec's stdin.  Every rank runs :func:`run_here`;
rank 0 reports the result as framed lines on its stdout, and a rank that fails reports
its error the same way and aborts the job so that no other rank waits forever
(``_wire``).  The parent turns those reports into one line of output and an exit
status.  ``mpiexec -n N replay run APP`` started by a user runs
:func:`run_here` directly on every rank.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from . import _environment, _procs, _traceio, _wire
from ._apps import all_params, parse_params, resolve
from ._chaosctl import ChaosController
from ._errors import LaunchError, ReplayError, UsageError
from ._hosts import (
    check_allocation,
    current_placement,
    launcher_cannot_run,
    launcher_env,
    mpiexec_command,
    unreachable_host,
)
from ._model import converged, result_json, saving
from ._progress import phases_to

if TYPE_CHECKING:
    import engine

#: Exit statuses (DESIGN §10).
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_DIVERGED = 3
#: Seconds the parent waits for rank 0 to ask for a piece of the spec before it sends
#: it anyway (``_wire``: a request that another rank's output cut).
ACK_WAIT_S = 30.0
#: Seconds the other ranks of an abandoned job wait for rank 0 to mark the run and
#: remove the job directory before they exit.
ABANDON_WAIT_S = 10.0


def user_error_types() -> tuple[type[BaseException], ...]:
    """Exceptions that are the user's input, not our bug: one line, exit 2."""
    import engine
    import tracer
    from apps._errors import AppError

    return (
        ReplayError,
        engine.EngineError,
        tracer.TracerError,
        AppError,
        FileNotFoundError,
        PermissionError,
    )


def describe(exc: BaseException) -> tuple[str, int]:
    """One line for an exception, and the exit status it deserves (never raises)."""
    try:
        message, status = _describe(exc)
    except Exception:  # noqa: BLE001 - describing must not fail
        message, status = f"internal error: {type(exc).__name__}: {exc}", 70
    # a user's parser or body may raise a message of several lines: the CLI says one
    return " ".join(ln.strip() for ln in message.splitlines() if ln.strip()), status


def _describe(exc: BaseException) -> tuple[str, int]:
    import engine

    if isinstance(exc, engine.DivergenceError):
        return str(exc), EXIT_DIVERGED
    if isinstance(
        exc, (engine.AccessOutsideReconError, engine.DriverDivergenceError, engine.PeerRankFailed)
    ):
        # the program broke what its plan relied on, or its ranks disagree: a failed run
        return str(exc), EXIT_FAILED
    if isinstance(exc, engine.BodyError):
        frame = _program_frame(exc.cause, through_ours=True) or _innermost(exc.cause)
        where = f" at {frame.filename}:{frame.lineno}" if frame else ""
        return f"loop body failed: {exc}{where}", EXIT_FAILED
    if isinstance(exc, user_error_types()):
        return str(exc), EXIT_USAGE
    frame = _program_frame(exc)
    if frame is not None:  # the program's own code raised it, in the driver
        return (
            f"the program failed: {type(exc).__name__}: {exc} at {frame.filename}:{frame.lineno}",
            EXIT_FAILED,
        )
    return f"internal error: {type(exc).__name__}: {exc} (set REPLAY_DEBUG=1 for a traceback)", 70


def _innermost(exc: BaseException) -> traceback.FrameSummary | None:
    tb = traceback.extract_tb(exc.__traceback__)
    return tb[-1] if tb else None


def _program_frame(
    exc: BaseException, *, through_ours: bool = False
) -> traceback.FrameSummary | None:
    """The innermost frame of ``exc``'s traceback in the program's own code: frames in the
    standard library and installed packages (numpy, a lambda's callee) are passed over.
    None when the first other frame is ours (engine, tracer, replay, tui: then it is our
    error, or one of our checks, not the program's), unless ``through_ours`` (a loop
    body's error: the body's line that called into us)."""
    import sysconfig

    libs = {
        str(Path(p).resolve())
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (p := sysconfig.get_paths().get(key))
    }
    ours = {str(Path(__file__).resolve().parents[1] / pkg) for pkg in _OWN_PACKAGES}
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = str(Path(frame.filename).resolve())
        if any(path.startswith(d + os.sep) for d in ours):
            if through_ours:
                continue
            return None
        if frame.filename.startswith("<") or any(path.startswith(d + os.sep) for d in libs):
            continue
        return frame
    return None


#: Our packages: an exception raised in them is an internal error or one of our checks.
_OWN_PACKAGES = ("engine", "tracer", "replay", "tui")


def app_source(fn: Callable[..., Any]) -> tuple[str, str]:
    """The source file that defines ``fn`` and its :func:`code_digest` (for the ranks to
    compare: a host with another copy of the file would run another program)."""
    import inspect

    try:
        path = inspect.getsourcefile(fn) or ""
    except TypeError:
        path = ""
    return path or getattr(fn, "__qualname__", "the app"), code_digest(fn)


def code_digest(fn: Callable[..., Any]) -> str:
    """blake2b of the source file that defines ``fn`` (empty if it has none)."""
    import hashlib
    import inspect

    try:
        path = inspect.getsourcefile(fn)
    except TypeError:
        path = None
    if not path or not os.path.exists(path):
        return ""
    return hashlib.blake2b(Path(path).read_bytes(), digest_size=16).hexdigest()


#: The run label of a run recorded in test mode (the parallel side of a dual test, a chaos
#: run with ``--check dual``): a replay of it runs in test mode too, or the plans of a
#: program with relaxed DDS or SSP staleness would differ from the recorded ones.
TEST_MODE_LABEL = "test_mode"


#: The run label of a run recorded with ``--checked``: checked mode turns relaxation off
#: (``engine._data.dds.relaxing``), so a replay of it runs checked too, or a program with
#: a relaxed DDS plans otherwise and diverges at its first plan.
CHECKED_LABEL = "checked"


#: The run label of a run whose ``ap.reduce`` folded sums, max and min exactly per node
#: (``engine._data.exact``): every run recorded since 2026-12-06.  A trace without it was
#: recorded when every reduce folded in index order, and a replay of it folds so too, or
#: a sum's last bits (an objective, a collective value) would differ from the recorded.
EXACT_REDUCE_LABEL = "exact_reduce"


#: The run label of a run whose ``async_for`` routes coalesced each pair of nodes' rows
#: into as few messages as their deadlines allow (``engine._machines.routing.coalesce``):
#: every run recorded since 2026-12-06.  A trace without it sent one message per round
#: and pair, and a replay of it does so too, so that its recorded arrivals (sources,
#: exchange numbers, sizes) keep their shape; the digests are the same bits either way.
COALESCE_LABEL = "coalesced_sends"


#: The run label of a run whose ``async_for`` rotations move the space with the fewest
#: elements, cut in id order, and whose routed rows ride the chain of each node's most
#: used destination where that saves a message (``Session.ring``): every run recorded
#: since 2026-12-07.  A trace without it planned and routed as before, and a replay of
#: it does so too, or its plans (and bits) would differ from the recorded ones.
RING_LABEL = "ring_routes"


#: The run label of a run whose random streams give every seed keys of its own
#: (``engine._runtime.session.philox_key``): every run recorded since 2026-12-07.  A
#: trace without it keyed seeds from 2**53 as numpy rounded them, and a replay of it
#: does so too; below 2**53 the keys are the same either way.
EXACT_SEEDS_LABEL = "exact_seed_keys"


#: The run label of a run recorded with ``--checkpoint-every N``: a resume of it keeps
#: checkpointing every N invocations (without it, the measured default), so that a second
#: crash redoes no more than the first run would have.
CHECKPOINT_EVERY_LABEL = "checkpoint_every"


def recorded_checkpoint_every(info: Any) -> int | None:
    """The ``--checkpoint-every`` the run ``info`` describes was recorded with (None: the
    measured default).  A value read from the trace that is not a whole number from 1 to
    10**9 is ignored: it only chooses how often the resumed run writes checkpoints."""
    every = (info.labels or {}).get(CHECKPOINT_EVERY_LABEL)
    if isinstance(every, int) and not isinstance(every, bool) and 1 <= every <= 10**9:
        return every
    return None


def recorded_in_test_mode(info: Any) -> bool:
    """Whether the run ``info`` describes was recorded in test mode."""
    return bool((info.labels or {}).get(TEST_MODE_LABEL))


class Modes(TypedDict):
    """The ``engine.run`` keywords of a run's modes."""

    checked: bool
    test_mode: bool
    exact_reduce: bool
    coalesce: bool
    ring: bool
    exact_seeds: bool


def recorded_modes(info: Any) -> Modes:
    """The modes the run ``info`` describes was recorded in, as ``engine.run`` keywords.

    They are what changes execution beyond the run row's own fields (ranks, threads,
    seed, parameters): checked and test mode, which also decide whether relaxed DDS are
    relaxed and SSP is stale, whether ``ap.reduce`` folds exactly, and whether
    ``async_for`` coalesces and relays its routed messages (and how a rotation cuts its
    blocks), and how a large seed keys the random streams.  All are run
    labels, so the run row's hash chain covers them; a trace recorded before a label
    existed has it off, as its run had.
    """
    labels = info.labels or {}
    return Modes(
        checked=bool(labels.get(CHECKED_LABEL)),
        test_mode=bool(labels.get(TEST_MODE_LABEL)),
        exact_reduce=bool(labels.get(EXACT_REDUCE_LABEL)),
        coalesce=bool(labels.get(COALESCE_LABEL)),
        ring=bool(labels.get(RING_LABEL)),
        exact_seeds=bool(labels.get(EXACT_SEEDS_LABEL)),
    )


def _recorder(spec: dict[str, Any], app: Any, params: dict[str, Any], comm: Any) -> Any:
    """Create the run row (lowest rank) and this process's trace recorder."""
    import tracer

    path = spec["trace"]
    run_id = spec["run_id"]
    rank = comm.Get_rank() if comm is not None else 0
    ranks = comm.Get_size() if comm is not None else spec.get("nodes", 1)
    if rank == 0:
        if not tracer.is_url(path):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "app": app.spec,
            "target": app.target,
            "params": _jsonable(all_params(app.fn, params)),
            "code_digest": code_digest(app.fn),
            "ranks": ranks,
            "threads": spec.get("threads", 1),
            "seed": spec.get("seed", 0),
            "versions": _environment.versions(),
            "environment": _environment.record(),
            "continues": spec.get("continues"),
        }
        labels = dict(spec.get("labels") or {})
        if spec.get("test_mode") or spec.get("kind") == "dual":
            labels[TEST_MODE_LABEL] = True
        if spec.get("checked"):
            labels[CHECKED_LABEL] = True
        if spec.get("exact_reduce", True):
            labels[EXACT_REDUCE_LABEL] = True
        if spec.get("coalesce", True):
            labels[COALESCE_LABEL] = True
        if spec.get("ring", True):
            labels[RING_LABEL] = True
        if spec.get("exact_seeds", True):
            labels[EXACT_SEEDS_LABEL] = True
        if spec.get("checkpoint_every"):  # None: the measured default; 0: none at all
            labels[CHECKPOINT_EVERY_LABEL] = int(spec["checkpoint_every"])
        if labels:
            meta["labels"] = labels
        tracer.start_run(path, run_id, meta)
    if comm is not None:
        comm.Barrier()
    nodes = [rank] if comm is not None else list(range(ranks))
    every = spec.get("checkpoint_every", None)
    # under MPI the primary writes every rank's commit (tracer._recorder: the funnel), on
    # a communicator of its own so that its gathers never meet the engine's messages; a
    # rank on another host than rank 0 may not see the store at all: it records without
    funnel = comm.Dup() if comm is not None and comm.Get_size() > 1 else None
    store = path if funnel is None or _traceio.same_store(path, comm) else None
    return tracer.TraceRecorder(
        store, run_id, nodes, is_primary=rank == 0, checkpoint_every=every, funnel=funnel
    )


@contextlib.contextmanager
def recording(recorder: Any) -> Iterator[None]:
    """Close ``recorder`` (if any) as finished, or as failed with the traceback
    (``interrupted``, "interrupted by SIGINT/SIGTERM/SIGHUP", when the user stopped it)."""
    try:
        yield
    except (KeyboardInterrupt, _procs.Interrupted) as exc:
        if recorder is not None:
            recorder.close("interrupted", _procs.interrupt_reason(exc))
        raise
    except BaseException:
        if recorder is not None:
            recorder.close("failed", traceback.format_exc())
        raise
    if recorder is not None:
        recorder.close("finished")


def run_here(
    spec: dict[str, Any], comm: Any = None, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Run the app described by ``spec`` in this process; return the JSON result."""
    import engine

    app = resolve(spec["app"])
    params = parse_params(app.fn, spec.get("params", []))
    rank = comm.Get_rank() if comm is not None else 0
    say = progress if rank == 0 else None
    ranks = comm.Get_size() if comm is not None else spec.get("nodes", 1)
    threads = spec.get("threads", 1)
    if comm is not None:
        _environment.check_ranks_agree(comm, app_source(app.fn))
    if say is not None:
        say(
            f"{app.name}: {ranks} rank{'s' if ranks != 1 else ''} x {threads} "
            f"thread{'s' if threads != 1 else ''}, seed {spec.get('seed', 0)}"
        )
    run_id = spec.get("run_id") or uuid.uuid4().hex
    spec = dict(spec, run_id=run_id)
    recorder = _recorder(spec, app, params, comm) if spec.get("trace") else None
    controller = None
    if spec.get("chaos") is not None:  # replay chaos --ranks N: every rank draws alike
        controller = ChaosController(*spec["chaos"])
    fn = app.fn if not spec.get("save") else saving(app.fn, spec["save"], app.name)
    with recording(recorder):
        res = engine.run(
            fn,
            params,
            nodes=spec.get("nodes", 1),
            threads=threads,
            seed=spec.get("seed", 0),
            checked=spec.get("checked", False),
            exact_reduce=spec.get("exact_reduce", True),
            coalesce=spec.get("coalesce", True),
            ring=spec.get("ring", True),
            exact_seeds=spec.get("exact_seeds", True),
            comm=comm,
            recorder=recorder,
            progress=say,
            phases=phases_to(say),
            schedules=controller,
            hooks=controller,
            digest=spec.get("digest"),
        )
    return run_json(
        run_id, spec.get("trace"), app.spec, all_params(app.fn, params), res, spec.get("save")
    )


def rounded_times(times: dict[str, list[float]]) -> dict[str, list[float]]:
    """Seconds per name, to the microsecond, as the JSON outputs give them."""
    return {k: [round(x, 6) for x in v] for k, v in times.items()}


def run_json(
    run_id: str,
    trace: str | None,
    app: str,
    params: dict[str, Any],
    res: engine.RunResult,
    save: str | None = None,
) -> dict[str, Any]:
    """The object ``replay run --json`` prints for the run ``res`` (``replay resume``
    prints the same, its digests extended by the crashed run's); ``save`` is the file
    ``--save`` wrote."""
    return {
        "run_id": run_id,
        "trace": trace,
        "app": app,
        "params": _jsonable(params),
        "ranks": res.ranks,
        "threads": res.threads,
        "seed": res.seed,
        "objectives": res.objectives,
        "digests": res.digests,
        "planner": res.planner,
        "wall_s": round(res.wall_s, 6),
        "op_times": rounded_times(res.op_times),
        "digest_times": [round(x, 6) for x in res.digest_times],
        "objective_times": rounded_times(res.objective_times),
        "result": result_json(res.value),
        "converged": converged(res.value),
        "saved": save,
    }


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)
        for k, v in d.items()
    }


# ====================================================================== parent side
def find_mpiexec() -> str:
    """The ``mpiexec`` to use: ``$REPLAY_MPIEXEC``, the one next to python (the mpich
    wheel puts it there), or the first on PATH."""
    chosen = os.environ.get("REPLAY_MPIEXEC")
    if chosen:
        path = shutil.which(chosen)
        if path is None:
            raise LaunchError(
                f"mpiexec not found: REPLAY_MPIEXEC={chosen!r} is not an executable; "
                "fix it or unset it to use the mpich wheel's mpiexec"
            )
        return path
    here = Path(sys.executable).parent / "mpiexec"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which("mpiexec")
    if found is None:
        raise LaunchError(
            "mpiexec not found: install the MPI runtime with 'pip install mpich' "
            "(or add your cluster's mpiexec to PATH), or run with --ranks 1"
        )
    return found


def launch(
    spec: dict[str, Any],
    ranks: int,
    *,
    timeout: float | None = None,
    out: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run ``spec`` on ``ranks`` MPI ranks under mpiexec; return rank 0's result.

    Nothing goes through files: the spec reaches rank 0 on mpiexec's stdin and the
    reports come back as frames on its stdout (``_wire``), so the ranks may run on other
    hosts (``--hostfile``, Slurm).  The job directory only names this process as the
    owner of the job (for :func:`_procs.sweep_stale` and the ranks on this host).
    """
    check_allocation(ranks, os.environ, recorded=spec.get("kind") in ("replay", "resume"))
    mpiexec = find_mpiexec()
    _procs.sweep_stale()
    with _procs.job_directory() as tmp:
        # rank 0 watches this process (its stdin; and ranks on this host its pid), and
        # cleans up after it if it is SIGKILLed
        spec = dict(spec, tmp_dir=tmp, parent=_procs.identity())
        cmd = mpiexec_command(
            mpiexec, ranks, [sys.executable, "-m", "replay._worker"], current_placement()
        )
        env = dict(
            os.environ,
            PYTHONUNBUFFERED="1",
            **_environment.worker_env(spec.get("hash_seed")),
            **launcher_env(current_placement(), os.environ),
        )
        # mpiexec keeps the read ends of its own output pipes open: if this process is
        # SIGKILLed, its writes then never fail with EPIPE (which made it tear the job
        # down before rank 0's watchdog could mark the run crashed); they only block
        # once a pipe's buffer is full, long after the watchdog has acted
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=out_w,
                stderr=err_w,
                env=env,
                start_new_session=True,
                pass_fds=(out_r, err_r),
            )
        except OSError as exc:
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            raise LaunchError(f"cannot start {mpiexec}: {exc.strerror}") from None
        os.close(out_w)
        os.close(err_w)
        job_out = os.fdopen(out_r, encoding="utf-8", errors="replace")
        job_err = os.fdopen(err_r, encoding="utf-8", errors="replace")
        err_lines: list[str] = []
        reader = _wire.FrameReader()
        deaths = _procs.DeathOrder()  # which rank on this host died first, if one does
        watched: list[Any] = []
        assert proc.stdin is not None
        job_in = proc.stdin

        acks: queue.Queue[int] = queue.Queue()

        def send_spec() -> None:
            # in a thread: mpiexec reads its stdin only once it runs, and never if it
            # fails to start the job (an unreachable host) - this call must not block.
            # The pipe stays open until the job ends: its EOF tells rank 0 we are gone.
            with contextlib.suppress(OSError, ValueError):
                for k, piece in enumerate(_wire.spec_pieces(spec)):
                    with contextlib.suppress(queue.Empty):  # (a lost ack: go on anyway)
                        while acks.get(timeout=ACK_WAIT_S) < k:  # rank 0 is ready for it
                            pass
                    job_in.write(piece)
                    job_in.flush()

        def pump_out() -> None:
            for line in job_out:
                line = line.rstrip("\n")
                k = _wire.parse_ack(line)
                if k is not None:
                    acks.put(k)
                    continue
                if reader.feed(line):
                    for r in reader.arrived()[len(watched) :]:
                        watched.append(r)
                        if r.kind == "hello":
                            deaths.watch(r.rank, r.data)
                    continue
                if _is_launcher_noise(line):
                    err_lines.append(line)  # hydra reports dead ranks on stdout
                else:
                    out(line)

        def pump_err() -> None:
            for line in job_err:
                line = line.rstrip("\n")
                if line.startswith("note: "):  # the engine's one-line notices (plan guard)
                    print(line, file=sys.stderr, flush=True)
                else:
                    err_lines.append(line)
                    if launcher_cannot_run(line):  # hydra would wait for ever
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.killpg(proc.pid, signal.SIGKILL)

        threads = [
            threading.Thread(target=pump_out, daemon=True),
            threading.Thread(target=pump_err, daemon=True),
        ]
        for t in threads:
            t.start()
        threading.Thread(target=send_spec, daemon=True).start()
        t0 = time.monotonic()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)
            message = (
                f"the {ranks}-rank job did not finish within {timeout:g} s and was killed; "
                "a rank may be deadlocked or the run needs a longer --timeout"
            )
            # no rank is left to close the run: it would stay "running" (and refused by
            # resume until its recorder had been silent long enough)
            _mark_crashed(spec, message)
            raise LaunchError(message) from None
        except (KeyboardInterrupt, _procs.Interrupted) as exc:
            _kill(proc)
            _mark_crashed(spec, _procs.interrupt_reason(exc), "interrupted")
            raise
        except BaseException as exc:
            _kill(proc)  # whatever went wrong here, no rank outlives this call
            _mark_crashed(spec, f"the replay process failed: {type(exc).__name__}: {exc}")
            raise
        finally:
            with contextlib.suppress(OSError, ValueError):
                job_in.close()
            for t in threads:
                t.join(timeout=5)
            for f, t in zip((job_out, job_err), threads, strict=True):
                if not t.is_alive():  # a reader still blocked keeps its file (daemon)
                    f.close()
            _procs.remove_segments(reader.hellos())  # what MPICH leaves after an abort
            deaths.close()
        reports = reader.reports()
        diverged = [r.data for r in reports if r.kind == "diverged"]
        if diverged:
            # the report of the rank that could name the differing element, if one did
            named = [r for r in diverged if "element" in (r.get("first_difference") or {})]
            return (named or diverged)[0]
        errors = [r.data for r in reports if r.kind == "error"]
        if errors:
            first = errors[0]
            _mark_crashed(spec, first["message"])
            raise JobFailed(first["message"], first["status"])
        results = [r.data for r in reports if r.kind == "result" and r.rank == 0]
        if proc.returncode == 0 and results:
            return results[0]
        missing = reader.incomplete()
        if missing is not None:
            _mark_crashed(spec, str(missing))
            raise missing
        hellos = [(r.rank, r.data) for r in reports if r.kind == "hello"]
        message = _death_message(
            ranks,
            proc.returncode,
            err_lines,
            time.monotonic() - t0,
            _rank_of(err_lines, hellos),
            _first_dead(deaths.first(), hellos),
            _UNFINISHED.get(str(spec.get("kind")), "the run did not finish"),
        )
        message = unreachable_host(err_lines, current_placement().hostfile) or message
        _mark_crashed(spec, message)
        raise LaunchError(message)


def abandon(spec: dict[str, Any], rank: int) -> None:
    """A rank found the parent CLI dead: clean up after it (rank 0 marks the run crashed
    and removes the job directory, if it runs on the parent's host; the others wait
    until it has, for mpiexec ends the job as soon as one rank exits)."""
    if rank != 0:
        # an early exit would make mpiexec kill rank 0 mid-cleanup: wait for its last step
        # (on another host than the parent's the directory is not there: wait it out)
        done = Path(str(spec.get("tmp_dir")))
        seen = done.exists()
        deadline = time.monotonic() + ABANDON_WAIT_S
        while time.monotonic() < deadline and (done.exists() or not seen):
            time.sleep(0.05)
        return
    who = spec.get("parent", {}).get("pid", "?")
    _mark_crashed(spec, f"the replay process (pid {who}) died; the run was abandoned")
    d = spec.get("tmp_dir")
    if d:
        try:  # only the directory the dead process created for this job
            owner = json.loads((Path(d) / _procs.OWNER_FILE).read_text())
        except (OSError, ValueError):
            return
        if owner.get("pid") == spec["parent"]["pid"] and _procs.on_this_host(owner):
            shutil.rmtree(d, ignore_errors=True)


def _mark_crashed(spec: dict[str, Any], message: str, status: str = "crashed") -> None:
    """A rank died or aborted: a still-running traced run becomes ``crashed`` (or
    ``interrupted``, when the user stopped the job)."""
    import tracer

    trace = spec.get("trace")
    if not trace or not (tracer.is_url(trace) or Path(trace).is_file()):
        return
    try:
        tracer.mark_crashed(spec["trace"], spec["run_id"], message, status)
    except Exception:  # noqa: BLE001 - the run already failed; report that, not this
        pass


class JobFailed(ReplayError):
    """A rank reported an error; carries its one-line message and exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


_NOISE = (
    "BAD TERMINATION",
    "YOUR APPLICATION TERMINATED",
    "This typically refers to a problem",
    "Please see the FAQ",
    "application called MPI_Abort",
)


def _is_launcher_noise(line: str) -> bool:
    return line.startswith("=") or any(n in line for n in _NOISE)


def _kill(proc: subprocess.Popen[Any]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


#: The line of hydra's report that names the process that died.
_DEAD_PROCESS = re.compile(r"\bPID (\d+) RUNNING AT (\S+)")


def _rank_of(err: list[str], hellos: list[tuple[int, Any]]) -> str | None:
    """``rank R (pid P on HOST)`` for the process hydra reports dead, from the hello
    report each rank sent at its start (``_worker``); None when no report matches."""
    for line in err:
        m = _DEAD_PROCESS.search(line)
        if m is None:
            continue
        pid, host = int(m.group(1)), m.group(2)
        ok = [(r, h) for r, h in hellos if isinstance(h, dict) and h.get("pid") == pid]
        same_host = [r for r, h in ok if h.get("host") == host]
        found = same_host or ([r for r, _ in ok] if len(ok) == 1 else [])
        if len(found) == 1:
            return f"rank {found[0]} (pid {pid} on {host})"
    return None


def _first_dead(rank: int | None, hellos: list[tuple[int, Any]]) -> str | None:
    """``rank R (pid P on HOST)`` for the rank this host saw die first (None: none)."""
    for r, h in hellos:
        if r == rank and isinstance(h, dict):
            return f"rank {r} (pid {h.get('pid')} on {h.get('host')})"
    return None


#: What a job of each kind left undone when a rank died (a run, by default, records one).
_UNFINISHED = {
    "replay": "the replay did not finish (the trace is unchanged)",
    "dual": "the dual test did not finish (no verdict)",
}


def _death_message(
    ranks: int,
    code: int,
    err: list[str],
    elapsed: float,
    who: str | None = None,
    first: str | None = None,
    unfinished: str = "the run did not finish",
) -> str:
    """What hydra reports about a dead rank; ``first``, the rank this host saw die first,
    overrides ``who``, the process hydra names (after its clean-up killed the others it
    may name any of them, and then its exit status is that of the clean-up's kill)."""
    same = who is not None and first is not None and who.split(" on ")[0] == first.split(" on ")[0]
    if first is not None and not same:  # (hydra may name the host otherwise: same pid)
        return (
            f"{first} of the {ranks}-rank job died after {elapsed:.1f} s (the first rank "
            f"to end; mpiexec then killed the others); {unfinished}"
        )
    detail = ""
    for line in err:
        if "EXIT STRING" in line:
            detail = line.split(":", 1)[1].strip()
        elif "EXIT CODE" in line and not detail:
            detail = "exit code " + line.split(":", 1)[1].strip()
    if not detail:
        tail = [ln for ln in err if ln.strip() and not ln.startswith("=")]
        detail = tail[-1].strip() if tail else f"mpiexec exit status {code}"
    return (
        f"{who or 'a rank'} of the {ranks}-rank job died after {elapsed:.1f} s ({detail}); "
        f"{unfinished}"
    )


def ensure_usage(cond: bool, message: str) -> None:
    """Raise :class:`UsageError` with ``message`` unless ``cond``."""
    if not cond:
        raise UsageError(message)


__all__ = [
    "EXIT_FAILED",
    "EXIT_USAGE",
    "JobFailed",
    "describe",
    "find_mpiexec",
    "launch",
    "run_here",
    "run_json",
]
