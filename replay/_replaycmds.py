"""``replay cluster`` and ``replay single``: replay a trace on its ranks or in one process,
and report the verdict."""

from __future__ import annotations

import shlex
import sys
import uuid
from collections.abc import Callable
from typing import Any

import click

import tracer
from engine import DivergenceError

from . import _environment, _procs
from ._cliutil import (
    POSITIVE_SECONDS,
    echo_json,
    host_options,
    limit_options,
    printer,
    run_option,
    trace_arg,
    trace_path,
    under_launcher,
)
from ._cliutil import (
    allow_changed as allow_changed_option,
)
from ._errors import UsageError
from ._job import EXIT_DIVERGED, launch
from ._progress import Printer
from ._replay import (
    check_replayable,
    open_run,
    parse_break,
    parse_until,
    recorded_app,
    replay_here,
    start_at,
    store_verdict,
)
from ._timetravel import completed, parse_point, program_order, step_of

from_option = click.option(
    "--from",
    "start",
    default=None,
    metavar="OP:INVOCATION",
    help="Start at the latest checkpoint before that invocation (time travel): the "
    "driver re-runs, earlier loop invocations are skipped.",
)


def _replay_report(
    res: dict[str, Any], as_json: bool, path: str, run_id: str, allow_changed: bool
) -> None:
    """Print a replay result, store its verdict in the trace, exit 3 on divergence.

    A replay the user stopped in pdb has no verdict: it is neither identical nor not.
    A divergence names its first differing element where the trace keeps its values, and
    the ``replay single`` command that stops just before it (``next``).
    """
    stopped = bool(res.get("stopped"))
    diverged = not stopped and not res["identical"] and res.get("first_difference")
    extra = ("--allow-changed-code",) if allow_changed else ()
    nxt = next_command(res["first_difference"], path, run_id, extra) if diverged else None
    if nxt is not None:  # the stop, for the browser: it may need the trace to work it out
        words = shlex.split(nxt)
        stops = [f"{w} {v}" for w, v in zip(words, words[1:], strict=False) if w in STOPS]
        res["stop"] = stops[0] if stops else None
    if not stopped:
        try:
            store_verdict(res)
        except Exception as exc:  # noqa: BLE001 - the verdict is a convenience, not the result
            click.echo(
                f"replay: warning: could not store the verdict in the trace: {exc}", err=True
            )
    if as_json:
        keys = (
            "identical",
            "first_difference",
            "wall_s",
            "complete",
            "stopped",
            "replayed_up_to",
            "recorded_status",
            "checked",
            "run_id",
            "mode",
            "out_trace",
            "objective_times",
        )
        doc = {k: res.get(k) for k in keys}
        doc["next"] = nxt
        if "from" in res and res.get("from_asked"):
            doc["from"] = res["from"]
        if res.get("from") is not None:  # what a replay from a checkpoint did not compute
            doc["skipped"] = res.get("skipped", 0)
            doc["served_objectives"] = res.get("served_objectives", 0)
        if doc["out_trace"]:
            doc["out_trace"] = tracer.describe(doc["out_trace"])  # never the password
        echo_json(doc)
    else:
        say = printer(False)
        c = res["checked"]
        if stopped:
            say("stopped by the user (no verdict stored)")
        elif res["identical"] and res.get("from") is not None:
            cp = res["from"]
            say(
                f"{_identical_head(res)} after the checkpoint at {cp['op']}#{cp['invocation']}: "
                f"{c['digests']} digest(s) and {c['objectives']} objective value(s) match the "
                f"trace; the {res.get('skipped', 0)} loop invocation(s) up to it were skipped "
                f"(the {res.get('served_objectives', 0)} objective value(s) logged there were "
                f"computed from values the trace served) ({res['wall_s']:.2f} s)"
            )
        elif res["identical"]:
            say(
                f"{_identical_head(res)}: {c['digests']} digest(s) and {c['objectives']} "
                f"objective value(s) match the trace ({res['wall_s']:.2f} s)"
            )
        else:
            for line in divergence_lines(res["first_difference"], nxt):
                say(line)
    if not stopped and not res["identical"]:
        sys.exit(EXIT_DIVERGED)


#: The options of ``replay single`` that stop somewhere.
STOPS = ("--break", "--until")


def divergence_lines(d: dict[str, Any], nxt: str | None = None) -> list[str]:
    """A replay divergence said plainly: where and what, the first differing element with
    both values (or why none is named), and the command that stops before it."""
    where = DivergenceError.where(d.get("node"), d["op"], d["invocation"], d["what"], d["event"])
    lines = [f"DIVERGED {where}: {DivergenceError.contrast(str(d['expected']), str(d['actual']))}"]
    if "element" in d:
        lines.append(
            f"  first differing element: {d['dds']}[{d['element']!r}]: the trace has "
            f"{d['trace_value']}, the program has {d['program_value']} "
            f"({d['elements_differ']} of {d['elements_compared']} element(s) differ)"
        )
    elif "values" in d:
        lines.append(f"  values of {d['dds']}: {d['values']}")
    if nxt is not None:
        lines.append(f"  stop there with: {nxt}")
    return lines


def _identical_head(res: dict[str, Any]) -> str:
    """``identical``, qualified when the recorded run ended early (crashed, failed or
    interrupted)."""
    if res["complete"]:
        return "identical"
    how = {"crashed": "crashed", "failed": "failed", "interrupted": "was interrupted"}.get(
        str(res.get("recorded_status")), "ended"
    )
    up_to = res.get("replayed_up_to")
    if up_to is None:
        return f"identical (nothing was completed before the run {how})"
    return f"identical (up to {up_to}, the run {how} after it)"


@click.command("cluster")
@click.argument("trace", metavar="TRACE", type=click.Path(dir_okay=False))
@run_option
@click.option(
    "--trace-out",
    "out_trace",
    type=click.Path(),  # a directory is refused by trace_path, in one line
    metavar="PATH|URL",
    default=None,
    help="Also record the replay into this new trace (a path or an SQLAlchemy URL).",
)
@click.option(
    "--timeout",
    type=POSITIVE_SECONDS,
    default=None,
    help="Kill the MPI job after this many seconds.",
)
@from_option
@allow_changed_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@limit_options()
@host_options
def cluster_cmd(
    trace: str,
    run_id: str | None,
    out_trace: str | None,
    timeout: float | None,
    start: str | None,
    allow_changed: bool,
    as_json: bool,
    max_ranks: int,
    max_threads: int,
) -> None:
    """Replay TRACE on the recorded number of MPI ranks, enforcing its recorded orders."""
    with Printer(as_json, "cluster replay") as say:
        _cluster(
            trace,
            run_id,
            out_trace,
            timeout,
            allow_changed,
            as_json,
            max_ranks,
            max_threads,
            say,
            start,
        )


def _check_from(path: str, run_id: str, start: str | None) -> list[Any] | None:
    """``--from`` as [op, invocation], checked against the trace before anything runs."""
    if start is None:
        return None
    point = parse_point(start, "--from")
    start_at(open_run(path, run_id), point)
    return list(point)


def next_command(
    detail: dict[str, Any], path: str, run_id: str, extra: tuple[str, ...] = ()
) -> str | None:
    """The ``replay single`` command that stops in pdb at (or just before) the divergence
    ``detail`` names in run ``run_id`` of ``path`` (the browser shows the same), checked
    as ``replay single`` checks it: None when no stop the trace can reach names it."""

    import tracer
    from tui._verdict import explain

    with tracer.open(path) as store:
        runs = [r.run_id for r in store.runs()]
    if run_id not in runs:
        return None  # the run stopped before it recorded anything
    said = explain(detail, path, run_id if len(runs) > 1 else None)
    if said is None:
        return None
    command = said.command or _stop_before_first(detail, path, run_id, len(runs) > 1)
    if command is None:
        return None
    words = shlex.split(command)
    stop = {w: words[k + 1] for k, w in enumerate(words[:-1]) if w in ("--break", "--until")}
    try:  # a stop the trace cannot reach is no advice
        check_stops(path, run_id, stop.get("--break"), stop.get("--until"), None)
    except UsageError:
        return None
    return " ".join([command, *extra])


def _stop_before_first(
    detail: dict[str, Any], path: str, run_id: str, name_run: bool
) -> str | None:
    """For a replay divergence at an operator's first invocation, where there is no earlier
    one of it to stop after: stop after the loop invocation the program ran before it, or,
    when it is the run's very first, for an outcome, in a body of it on the node that
    reported it (its digests are taken after every body).  A changed program usually
    diverges right there, and used to get no command at all."""
    from tui._verdict import divergence_of, trace_argument

    d = divergence_of(detail) or {}
    if "expected" not in d or "actual" not in d:
        return None  # not a replay divergence: a dual test stops after its invocation
    try:
        op, inv = str(d["op"]), int(d["invocation"])
        node = int(d.get("node", -1))
    except (KeyError, TypeError, ValueError):
        return None
    run = open_run(path, run_id)
    order = program_order(run)
    if (op, inv) not in order:
        return None
    head = f"replay single {shlex.quote(trace_argument(path))}"
    if name_run:
        head += f" --run {shlex.quote(run_id)}"
    at = order.index((op, inv))
    if at > 0:
        before = ":".join(str(x) for x in order[at - 1])
        return f"{head} --until {shlex.quote(before)}"
    if d.get("what") != "outcome":
        return None
    try:
        plan = run.plan(op, inv)
    except KeyError:
        return None  # a sync_for: no plan to take a body from
    for rnd in plan.rounds:
        for k, tasks in enumerate(rnd):
            first = [int(t.indices[0]) for t in tasks if len(t.indices)]
            if first and node in (k, -1):
                return f"{head} --break {shlex.quote(f'{op}:{inv}:{first[0]}@{k}')}"
    return None


def check_stops(
    path: str, run_id: str, brk: str | None, until: str | None, point: list[Any] | None
) -> None:
    """``--break`` and ``--until`` checked against the trace before anything runs: a stop
    at an operator, invocation or node the replay cannot reach is one line (exit 2), not
    a whole replay followed by a note.  A run that did not finish may also stop in the
    invocation it was in when it stopped (each operator's next one)."""
    if not (brk or until):
        return
    run = open_run(path, run_id)
    info = run.info
    order = program_order(run)
    # each operator's next invocation: the one a run that did not finish stopped in (a
    # resumed run's invocations start after its checkpoint, not at 0)
    following = {o: hi + 1 for o, (_, hi) in completed(order).items()}
    begin = None if point is None else step_of(order, (point[0], point[1]), "--from")
    stops: list[tuple[str, str, int]] = []
    if brk:
        op, inv, _index, node = parse_break(brk)
        if node is not None and not 0 <= node < info.ranks:
            raise UsageError(
                f"--break {brk}: node {node} does not exist; the run has nodes 0..{info.ranks - 1}"
            )
        stops.append(("--break", op, inv))
    if until:
        stops.append(("--until", *parse_until(until)))
    for option, op, inv in stops:
        if info.status != "finished" and inv == following.get(op, 0):
            if option == "--break":
                continue  # the invocation the run stopped in: a replay runs up to there
            # its end is not in the trace: the replay ends where the run did, before it
            how = {"interrupted": "was interrupted", "running": "is still running"}
            last = ""
            if order:
                o, k = order[-1]
                last = f", or after {o}#{k}, its last complete one, with --until {o}:{k}"
            raise UsageError(
                f"--until {op}:{inv}: the run {how.get(info.status, info.status)} in "
                f"{op}#{inv} and never completed it, so a replay cannot stop after it; stop "
                f"in one of its bodies with --break {op}:{inv}:INDEX{last}"
            )
        step = step_of(order, (op, inv), option)
        if point is not None and begin is not None and step < begin:
            raise UsageError(
                f"{option}: {op}#{inv} comes before --from {point[0]}:{point[1]}, where the "
                "replay starts: it would never stop there"
            )
    if brk:
        op, inv, index, node = parse_break(brk)
        if (op, inv) in order:  # a completed invocation: its plan is in the trace
            _check_break_index(run, brk, op, inv, index, node)


def _check_break_index(run: Any, brk: str, op: str, inv: int, index: int, node: int | None) -> None:
    """``--break``'s loop index checked against the plan the run followed at that
    invocation: an index outside the loop's range, or on a node that never ran it, would
    be noticed only after a whole replay (``breakpoint ... was never reached``)."""
    try:
        plan = run.plan(op, inv)
    except KeyError:
        return  # no plan (a sync_for's minibatches): nothing to check the index against
    lo, hi = int(plan.start), int(plan.start) + int(plan.n)
    if not lo <= index < hi:
        raise UsageError(
            f"--break {brk}: {op}#{inv} ran loop indices {lo}..{hi - 1}; {index} is not one of them"
        )
    if node is None:
        return
    ran = sorted(
        {
            k
            for rnd in plan.rounds
            for k, tasks in enumerate(rnd)
            for t in tasks
            if index in t.indices
        }
    )
    if ran and node not in ran:
        on = ", ".join(str(k) for k in ran)
        raise UsageError(
            f"--break {brk}: index {index} of {op}#{inv} ran on node {on}, never on node "
            f"{node}; stop there with --break {op}:{inv}:{index}@{ran[0]}"
        )


def _replayable(
    trace: str,
    run_id: str | None,
    allow_changed: bool,
    max_ranks: int,
    max_threads: int,
    say: Callable[[str], None] | None = None,
) -> tuple[str, Any]:
    """(the trace as the ranks will see it, the run's info), once every check that needs
    no code to run has passed: the machine can host its shape, the recorded app is found
    (and unchanged unless allowed), and the trace is replayable.  Done before anything runs
    or launches, so damage is one line here, not an MPI error."""
    path = trace_arg(trace)
    run = open_run(path, run_id, check=True)
    info = run.info
    _procs.check_shape(info.ranks, info.threads, max_ranks=max_ranks, max_threads=max_threads)
    recorded_app(info, allow_changed=allow_changed, announce=say)
    check_replayable(run)
    return path, info


def _cluster(
    trace: str,
    run_id: str | None,
    out_trace: str | None,
    timeout: float | None,
    allow_changed: bool,
    as_json: bool,
    max_ranks: int,
    max_threads: int,
    say: Callable[[str], None],
    start: str | None = None,
) -> None:
    path, info = _replayable(trace, run_id, allow_changed, max_ranks, max_threads, say)
    point = _check_from(path, info.run_id, start)
    hash_seed = _environment.recorded_hash_seed(info.environment)
    if under_launcher() or info.ranks == 1:
        _environment.ensure(hash_seed)  # replay_here warns about what still differs
    else:
        _environment.warn_replay_environment(info.environment, info.versions, here=False)
    spec: dict[str, Any] = {
        "kind": "replay",
        "mode": "cluster",
        "trace": path,
        "run_id": info.run_id,
        "json": as_json,
        "hash_seed": hash_seed,
        "allow_changed_code": allow_changed,
        "from": point,
    }
    if out_trace is not None:
        spec["out_trace"] = trace_path("replay", out_trace)
        spec["run_id_out"] = uuid.uuid4().hex
    if under_launcher():
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        res = replay_here(spec, comm=comm, progress=say)
        if comm.Get_rank() != 0:
            return
    elif info.ranks == 1:
        res = replay_here(spec, progress=say)
    else:
        res = launch(spec, info.ranks, timeout=timeout, out=say)
    res["from_asked"] = point is not None
    _replay_report(res, as_json, path, info.run_id, allow_changed)


@click.command("single")
@click.argument("trace", metavar="TRACE", type=click.Path(dir_okay=False))
@run_option
@click.option(
    "--break",
    "brk",
    default=None,
    metavar="OP:INVOCATION:INDEX[@NODE]",
    help="Stop in pdb inside that loop body.",
)
@click.option(
    "--until",
    default=None,
    metavar="OP:INVOCATION",
    help="Stop in pdb in the driver after that invocation.",
)
@from_option
@allow_changed_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@limit_options()
def single_cmd(
    trace: str,
    run_id: str | None,
    brk: str | None,
    until: str | None,
    start: str | None,
    allow_changed: bool,
    as_json: bool,
    max_ranks: int,
    max_threads: int,
) -> None:
    """Replay every node of TRACE inside this process (pdb can stop in any body)."""
    # no bar where pdb may take the terminal
    with Printer(as_json, "single replay", bars=not (brk or until)) as say:
        _single(
            trace, run_id, brk, until, allow_changed, as_json, max_ranks, max_threads, say, start
        )


def _single(
    trace: str,
    run_id: str | None,
    brk: str | None,
    until: str | None,
    allow_changed: bool,
    as_json: bool,
    max_ranks: int,
    max_threads: int,
    say: Callable[[str], None],
    start: str | None = None,
) -> None:
    # every recorded node becomes threads of this one process
    path, info = _replayable(trace, run_id, allow_changed, max_ranks, max_threads, say)
    point = _check_from(path, info.run_id, start)
    check_stops(path, info.run_id, brk, until, point)
    _environment.ensure(_environment.recorded_hash_seed(info.environment))
    spec: dict[str, Any] = {
        "kind": "replay",
        "mode": "single",
        "trace": path,
        "run_id": info.run_id,
        "json": as_json,
        "break": list(parse_break(brk)) if brk else None,
        "until": list(parse_until(until)) if until else None,
        "allow_changed_code": allow_changed,
        "from": point,
    }
    res = replay_here(spec, progress=say)
    res["from_asked"] = point is not None
    if brk and not res["breakpoint_hits"] and res["identical"]:
        click.echo(f"replay: note: breakpoint {brk} was never reached", err=True)
    _replay_report(res, as_json, path, info.run_id, allow_changed)


def register(cli: click.Group) -> None:
    """Add ``cluster`` and ``single`` to the command group."""
    cli.add_command(cluster_cmd)
    cli.add_command(single_cmd)


__all__ = ["check_stops", "register"]
