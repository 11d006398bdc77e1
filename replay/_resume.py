"""``replay resume``: continue a crashed or interrupted run from its last checkpoint.

The resumed run is a *new* run in the same trace store whose ``continues`` field names
the run it continues.  Up to the checkpoint it fast-forwards exactly as a replay
``--from`` does (``_timetravel``): the driver re-runs from the start, loop invocations
are skipped, the values collective operators returned are served from the crashed run,
and at the checkpoint the DDS are restored.  After it, the run is free: a normal run on
the recorded ranks, threads, seed and parameters, recording as ``replay run`` does.

What the new run records for the part it skipped, so that it stands on its own: the
checkpoint it started from (rewritten by the engine after the restore, each node its
own rows) and the collective values it was served (below).  A replay of the resumed run
therefore starts at that checkpoint by itself (``_replay``); the loop invocations
before it are the crashed run's, replayed from that run.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from typing import Any

import engine
import tracer

from . import _environment, _traceio
from ._apps import recorded_params
from ._controller import TraceController
from ._dualctl import same_value
from ._errors import UsageError
from ._job import (
    _recorder,
    app_source,
    recorded_checkpoint_every,
    recorded_modes,
    recording,
    run_json,
)
from ._model import saving
from ._progress import phases_to
from ._replay import open_run, recorded_app
from ._timetravel import (
    FastForward,
    Start,
    first_step,
    left_out,
    passed_over,
    program_order,
    restartable,
)

#: Statuses of a run that ``replay resume`` continues.
RESUMABLE = ("crashed", "interrupted")


class RedoneOrders(engine.ScheduleSource):
    """The crashed run's orders for the loop invocations it completed after the checkpoint.

    A resume runs those again, and the run they were part of may have left choices to
    timing: the lock grants of split task groups, SSP visibility, Hybrid's node mutex,
    message arrivals.  Run free, a legal but other choice made a digest differ and the
    resume stopped as DIVERGED, blaming the program (an SSP or multi-threaded hot-row
    program on 2 ranks failed so every time).  Those invocations follow the recorded
    choices, as ``replay cluster`` does; every invocation after them runs free.
    """

    def __init__(self, crashed: Any, after_step: int) -> None:
        self._orders = TraceController(crashed, single=False)
        self.digest_kind = crashed.digest_kind()
        done: dict[tuple[str, int], int] = {}
        for i in crashed.invocations():
            done[(i.op, i.invocation)] = done.get((i.op, i.invocation), 0) + 1
        base = first_step(crashed)
        order = program_order(crashed)
        #: the invocations every node of the crashed run completed after the checkpoint
        self.redone = {
            point
            for k, point in enumerate(order)
            if base + k > after_step and done.get(point, 0) >= crashed.info.ranks
        }

    def schedule(
        self,
        op: str,
        invocation: int,
        kind: str,
        nodes: int,
        span: tuple[int, int] | None = None,
    ) -> Any:
        if (op, invocation) not in self.redone:
            return None
        return self._orders.schedule(op, invocation, kind, nodes, span)


class ResumeHooks(engine.DebugHooks):
    """A free run that first fast-forwards to a checkpoint of another run.

    Nothing is enforced beyond :class:`RedoneOrders`; the time-travel hooks are answered from
    the crashed run, and every collective value served is recorded into the new run as
    if it had been computed there (the primary recorder writes it once).
    """

    def __init__(self, travel: FastForward, recorder: engine.Recorder | None) -> None:
        self.travel = travel
        self.recorder = recorder
        #: the resumed run goes on with the crashed run's digest hash
        self.digest_kind = travel.run.digest_kind()
        #: the fast-forward reached the checkpoint and restored it
        self.restored = False
        crashed = travel.run
        digs = crashed.digests()
        low = min((d.node for d in digs), default=0)
        #: what the crashed run recorded: every invocation it completed after the
        #: checkpoint must come out the same again, bit for bit (checked as it happens)
        self._want_digests = {(d.op, d.invocation, d.dds): d.digest for d in digs if d.node == low}
        self._want_objectives = crashed.objectives()
        self._seen_digests = 0

    def _compare(self) -> None:
        """Every digest and objective the resumed run produced that the crashed run also
        recorded must be equal: a resumed run never quietly starts a new history."""
        sess = engine.current()
        for d in sess.digests[self._seen_digests :]:
            exp = self._want_digests.get((d["op"], d["invocation"], d["dds"]))
            if exp is not None and exp != d["digest"]:
                raise engine.DivergenceError(
                    node=-1,
                    op=d["op"],
                    invocation=d["invocation"],
                    event=f"digest of {d['dds']}",
                    what="resume",
                    expected=f"{exp} (the crashed run's)",
                    actual=f"{d['digest']} when resumed (the driver or a body depends on "
                    "something the checkpoint does not hold)",
                )
        self._seen_digests = len(sess.digests)
        for name, values in sess.objectives.items():
            want = self._want_objectives.get(name, [])
            for i, v in enumerate(values[: len(want)]):
                if not same_value(want[i], v, signed_zero=False):
                    op, inv = self.travel.start.op, self.travel.start.invocation
                    raise engine.DivergenceError(
                        node=-1,
                        op=str(op),
                        invocation=int(inv),
                        event=f"objective {name}[{i}]",
                        what="resume",
                        expected=f"{want[i]!r} (the crashed run's)",
                        actual=f"{v!r} when resumed",
                    )

    def after_invocation(self, op: str, invocation: int) -> None:
        if self.restored:
            self._compare()

    def fast_forward(self) -> tuple[str, int] | None:
        return self.travel.fast_forward()

    def restore(self, op: str, invocation: int) -> Any:
        return self.travel.restore(op, invocation)

    def check_restored(self, op: str, invocation: int, digests: list[tuple[str, str]]) -> None:
        self.travel.check_restored(op, invocation, digests)
        self.restored = True
        # the objectives logged while fast-forwarding must be the crashed run's: one
        # computed from the DDS outside a collective operator would have seen them stale
        recorded = self.travel.run.objectives()
        for name, values in engine.current().objectives.items():
            for i, v in enumerate(values):
                want = recorded.get(name, [])
                exp = want[i] if i < len(want) else None
                # compared as replay compares a trace's objectives (SQLite keeps -0.0 as 0)
                if exp is None or not same_value(exp, v, signed_zero=False):
                    raise UsageError(
                        f"this run cannot be resumed: fast-forwarding to the checkpoint at "
                        f"{op}#{invocation} logged {name}[{i}] = {v!r}, the crashed run "
                        f"logged {'nothing' if exp is None else repr(exp)}; the driver "
                        "computes it from the DDS outside a collective operator (build it "
                        "with reduce or gather), so re-run it with 'replay run'"
                    )

    def served_value(self, k: int, kind: str) -> Any:
        value = self.travel.served_value(k, kind)
        if self.recorder is not None:
            self.recorder.collective_value(k, kind, value)
        return value

    def skipped(self, op: str, invocation: int) -> None:
        self.travel.note_skipped(op, invocation)


def resumable(path: str, run_id: str | None) -> tuple[Any, Start]:
    """The run to resume and the checkpoint to start from, once every check that needs
    no code to run has passed (one :class:`UsageError` line otherwise)."""
    # a run still marked running counts as crashed only once its recorder has been silent
    # for tracer.CRASH_AFTER_S: resuming a run whose ranks are alive would fork it
    trace = tracer.open(path)
    run = trace.run(run_id)
    info = run.info
    short = info.run_id[:12]
    if info.status == "finished":
        raise UsageError(
            f"run {short} finished; there is nothing to resume (only a crashed or "
            "interrupted run can be resumed)"
        )
    if info.status == "running":
        raise UsageError(
            f"run {short} is still running (its last commit was less than "
            f"{tracer.CRASH_AFTER_S:g} s ago); if its processes are dead, resume it once it "
            "has been silent that long"
        )
    if info.status not in RESUMABLE and trace_not_written(info) is None:
        raise UsageError(
            f"run {short} {info.status} (the program raised: {_last_line(info.error)}); "
            "only a crashed or interrupted run can be resumed: fix the program and re-run it"
        )
    for other in trace.runs():
        # a resume that failed (the program could not be resumed) leaves no branch
        if other.continues == info.run_id and other.status != "failed":
            raise UsageError(
                f"run {short} was already resumed as run {other.run_id[:12]} "
                f"({other.status}); resume that one with --run {other.run_id} if it crashed too"
            )
    trace.ensure_intact(info.run_id)
    cps = run.checkpoints()
    if not cps:
        raise UsageError(
            f"run {short} has no complete checkpoint to resume from (recorded with "
            "--no-checkpoints, or it crashed before its first checkpoint was written on "
            "every node); re-run it with 'replay run'"
        )
    usable = [c for c in cps if restartable(c)]
    if not usable:
        raise UsageError(
            f"run {short} cannot be resumed: its checkpoints leave out {left_out(cps[-1])}, "
            "which its loop bodies write, so a resume could not continue it; keep that DDS "
            "to plain data (numbers, strings, tuples and lists) or re-run it with 'replay run'"
        )
    last = usable[-1]
    note = passed_over(cps[-1], last) if last is not cps[-1] else None
    return run, Start(last.op, last.invocation, last.step, note)


def trace_not_written(info: Any) -> str | None:
    """Why run ``info`` stopped, if it stopped because its trace could not be written
    (the recorder's ``disk full: ...``, or a run that a write error failed); else None.

    Such a run did not fail in the program: like a crashed run, it can be resumed (once
    there is room for its trace again).
    """
    error = (info.error or "").strip()
    if info.status == "crashed" and error.startswith("disk full:"):
        return error.splitlines()[0]
    last = _last_line(error)
    if info.status == "failed" and ("TraceWriteError: " in last or "cannot write trace" in last):
        return last.split("TraceWriteError: ", 1)[-1]
    return None


def _last_line(text: str | None) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else "no error recorded"


def digests_up_to(run: Any, step: int) -> list[dict[str, Any]]:
    """The digests the lowest node recorded for loop invocations 0..``step`` of the
    whole run, following ``continues`` back through earlier resumed runs."""
    out: list[dict[str, Any]] = []
    begin = first_step(run)
    if run.info.continues is not None and begin > 0:
        out = digests_up_to(run.trace.run(run.info.continues), begin - 1)
    order = program_order(run)
    wanted = {p for k, p in enumerate(order) if begin + k <= step}
    digs = run.digests()
    if digs:
        node = min(d.node for d in digs)
        out += [
            {"op": d.op, "invocation": d.invocation, "dds": d.dds, "digest": d.digest}
            for d in digs
            if d.node == node and (d.op, d.invocation) in wanted
        ]
    return out


def resume_here(
    spec: dict[str, Any], comm: Any = None, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Resume ``spec['continues']`` here (in-process, or as one rank of the MPI job);
    record into ``spec['trace']`` as run ``spec['run_id']``; return the JSON result."""
    # on another host than rank 0 the trace file is not there: rank 0 sends it
    crashed = open_run(_traceio.readable(spec["trace"], comm), spec["continues"])
    info = crashed.info
    # the new run names its app as the crashed run does (not the resolved file path)
    app = dataclasses.replace(recorded_app(info), spec=info.app)
    params = recorded_params(app.fn, info.params)
    rank = comm.Get_rank() if comm is not None else 0
    size = comm.Get_size() if comm is not None else 1
    if size != info.ranks:
        raise UsageError(
            f"run {info.run_id[:12]} was recorded on {info.ranks} rank(s) but this job has "
            f"{size}; run 'replay resume TRACE' (it starts the recorded ranks itself)"
        )
    if comm is not None:
        _environment.check_ranks_agree(comm, app_source(app.fn))
    say = progress if rank == 0 else None
    op, inv = spec["from"]
    start = next(
        (
            Start(c.op, c.invocation, c.step)
            for c in crashed.checkpoints()
            if (c.op, c.invocation) == (op, inv)
        ),
        None,
    )
    if start is None:
        raise tracer.TraceFormatError(
            f"the checkpoint at {op}#{inv} is missing from run {info.run_id[:12]}"
        )
    if say is not None:
        # checkpoints can be sparse (the automatic policy bounds their bytes): say how
        # much of what the crashed run did is done again
        again = first_step(crashed) + len(program_order(crashed)) - 1 - start.step
        say(
            f"resuming run {info.run_id[:12]} ({info.app}, {info.ranks} rank(s) x "
            f"{info.threads} thread(s), seed {info.seed}) after the checkpoint at {op}#{inv}"
            + (
                f"; the {again} loop invocation(s) the crashed run completed after it run again"
                if again > 0
                else ""
            )
        )
    travel = FastForward(crashed, start)
    modes = recorded_modes(info)  # the resumed run is recorded in them too
    rec_spec = dict(
        spec,
        nodes=info.ranks,
        threads=info.threads,
        seed=info.seed,
        checkpoint_every=recorded_checkpoint_every(info),  # the crashed run's cadence
        **modes,
    )
    recorder = _recorder(rec_spec, app, params, comm)
    hooks = ResumeHooks(travel, recorder)
    phases = phases_to(say)
    if phases is not None:
        # the driver re-runs to the checkpoint, skipping loop invocations: one phase
        phases(f"fast-forward to the checkpoint after {op}#{inv}")
    with recording(recorder):
        res = engine.run(
            app.fn if not spec.get("save") else saving(app.fn, spec["save"], app.name),
            params,
            nodes=1,
            threads=info.threads,
            seed=info.seed,
            comm=comm,
            recorder=recorder,
            progress=say,
            phases=phases,
            hooks=hooks,
            schedules=RedoneOrders(crashed, start.step),
            **modes,
        )
        if hooks.restored:
            hooks._compare()  # the objectives logged after the last invocation too
        if not hooks.restored:
            # the program ended before the point the crashed run had reached: it is not
            # the program that crashed (a forged or changed parameter), never a success
            raise engine.DivergenceError(
                node=-1,
                op=str(start.op),
                invocation=start.invocation,
                event="fast-forward",
                what="resume",
                expected=f"the program to reach the checkpoint at {start.op}#{start.invocation}",
                actual="not reach it: it ended first (its parameters or code differ from the "
                "crashed run's)",
            )
    before = digests_up_to(crashed, start.step)
    out = run_json(spec["run_id"], spec["trace"], app.spec, params, res, spec.get("save"))
    out["digests"] = before + res.digests
    return out | {"continues": info.run_id, "resumed_from": start.as_json()}


def new_spec(path: str, run: Any, start: Start) -> dict[str, Any]:
    """The job description of resuming ``run`` after ``start`` into ``path``."""
    return {
        "kind": "resume",
        "trace": path,
        "continues": run.info.run_id,
        "run_id": uuid.uuid4().hex,
        "from": [start.op, start.invocation],
        "hash_seed": _environment.recorded_hash_seed(run.info.environment),
    }


__all__ = [
    "RESUMABLE",
    "ResumeHooks",
    "digests_up_to",
    "new_spec",
    "resumable",
    "resume_here",
    "trace_not_written",
]
