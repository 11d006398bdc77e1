"""``replay history`` and ``replay watch``: questions about a DDS over a whole run,
answered by replaying from the trace's checkpoints (see ``_inspect``)."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Any

import click

import tracer

from . import _environment
from ._cliutil import allow_changed as allow_changed_option
from ._cliutil import echo_json, limit_options, printer, run_option
from ._inspect import dds_names, history, parse_element, steps_between
from ._progress import Printer
from ._replay import open_run, recorded_app
from ._replaycmds import _replayable
from ._timetravel import parse_point
from ._watch import compile_watch, names_in, watch, watchable


def _prepare(
    trace: str,
    run_id: str | None,
    allow_changed: bool,
    max_ranks: int,
    max_threads: int,
    say: Callable[[str], None] | None = None,
) -> tuple[str, Any, Any]:
    """(the trace's absolute path, the run, its app) once every check that needs no code
    to run has passed."""
    path, info = _replayable(trace, run_id, allow_changed, max_ranks, max_threads, say)
    _environment.ensure(_environment.recorded_hash_seed(info.environment))
    run = open_run(path, info.run_id)
    return path, run, recorded_app(run.info, allow_changed=allow_changed)


def _break_command(path: str, run_id: str, doc: dict[str, Any]) -> str:
    """The ``replay single`` command that stops in the body ``doc`` names: the trace as
    resolved now (``traces/latest`` moves with the next run), quoted for the shell, and
    ``--run`` when the trace holds several runs (without it a replay takes the latest,
    which may be a run that resumed this one and never ran that body)."""
    from tui._verdict import trace_argument

    with tracer.open(path) as store:
        several = len(store.runs()) > 1
    cmd = f"replay single {shlex.quote(trace_argument(path))}"
    if several:
        cmd += f" --run {run_id}"
    point = f"{doc['op']}:{doc['invocation']}"
    body = f"{point}:{doc['index']}@{doc['node']}"
    cmd += f" --break {shlex.quote(body)}"
    if doc["from"]:
        cmd += f" --from {shlex.quote(point)}"
    return cmd


def _short(v: Any) -> str:
    if isinstance(v, list):
        head = ", ".join(f"{x:.6g}" if isinstance(x, float) else repr(x) for x in v[:4])
        return f"[{head}{', ...' if len(v) > 4 else ''}]"
    return f"{v:.6g}" if isinstance(v, float) else repr(v)


@click.command("history")
@click.argument("trace", metavar="TRACE", type=click.Path(dir_okay=False))
@click.argument("element", metavar="'DDS[INDEX]'")
@run_option
@click.option(
    "--between",
    nargs=2,
    default=None,
    metavar="OP:A OP:B",
    help="Only the invocations from OP:A to OP:B (both included).",
)
@allow_changed_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@limit_options()
def history_cmd(
    trace: str,
    element: str,
    run_id: str | None,
    between: tuple[str, str] | None,
    allow_changed: bool,
    as_json: bool,
    max_ranks: int,
    max_threads: int,
) -> None:
    """The value of ELEMENT (such as W[17]) after every invocation, and the loop body
    (index, node, thread, round) that last wrote it there, by replaying from checkpoints."""
    rng = None
    if between:
        rng = (parse_point(between[0], "--between"), parse_point(between[1], "--between"))
    with Printer(as_json, "history") as say:
        _, run, app = _prepare(trace, run_id, allow_changed, max_ranks, max_threads, say)
        el = parse_element(element, dds_names(run))
        steps_between(run, rng)  # a range the run does not have: refused before any output
        say(f"replaying run {run.info.run_id[:12]} for {el.text}")
        doc = history(run, app, el, rng, progress=say)
    if as_json:
        echo_json({"element": doc["element"], "history": doc["history"]})
        return
    out = printer(False)
    out(f"{doc['element']} after each invocation:")
    for e, how in zip(doc["history"], doc["changes"], strict=True):
        w = e["writer"]
        who = NO_WRITER[how] if w is None else _writer(w)
        out(f"  {e['op']}#{e['invocation']:<4} {_short(e['value'])}  {who}")


def _writer(w: dict[str, Any]) -> str:
    """``last written by index J on node N, thread T, round R``; a thread and round the
    recorded plan does not place the index in (-1) are left out, not printed as -1."""
    where = "".join(f", {k} {w[k]}" for k in ("thread", "round") if w.get(k, -1) >= 0)
    return f"last written by index {w['index']} on node {w['node']}{where}"


#: What ``history`` says of an invocation in which no single body wrote the element, by
#: how its value changed there (``replay._inspect.history``'s ``changes``).
NO_WRITER = {
    None: "not written",
    "relaxed": "changed by the round-end merge of relaxed deltas, not by one body",
    "aggregated": "changed by the aggregation of the minibatches' deltas, not by one body",
    "unattributed": "changed, by no single loop body",
    "driver": "changed by the driver before the invocation, not by a loop body",
    "serial": "changed in a serial fallback (every node ran every body), whose bodies "
    "history does not trace",
    "serial_unknown": "ran as a serial fallback (every node ran every body), whose bodies "
    "history does not trace",
}


@click.command("watch")
@click.argument("trace", metavar="TRACE", type=click.Path(dir_okay=False))
@click.argument("expression", metavar="'EXPR'")
@run_option
@click.option(
    "--monotone",
    is_flag=True,
    help="EXPR stays true once it holds: bisect over the checkpoints instead of checking "
    "every invocation (faster with few checkpoints; wrong answers if EXPR is not monotone).",
)
@allow_changed_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@limit_options()
def watch_cmd(
    trace: str,
    expression: str,
    run_id: str | None,
    monotone: bool,
    allow_changed: bool,
    as_json: bool,
    max_ranks: int,
    max_threads: int,
) -> None:
    """The first invocation, then the first loop body, after which EXPR holds.

    EXPR is your own Python expression (it is never read from the trace), evaluated
    with numpy as np and the run's numeric DDS as arrays, such as 'np.isnan(W).any()' or
    'abs(H[3]).max() > 10'. Every invocation is checked, in order, unless --monotone.
    """
    with Printer(as_json, "watch") as say:
        path, run, app = _prepare(trace, run_id, allow_changed, max_ranks, max_threads, say)
        w = compile_watch(expression, watchable(run, names_in(expression)))
        say(f"replaying run {run.info.run_id[:12]} until {expression} holds")
        doc = watch(run, app, w, monotone=monotone, progress=say)
    if doc["found"] and doc["index"] is not None:
        doc["break"] = _break_command(path, run.info.run_id, doc)
    if as_json:
        echo_json(doc)
        return
    out = printer(False)
    for line in watch_lines(expression, doc):
        out(line)


#: How a run that did not finish ended, for "the run ... there".
_ENDED = {
    "failed": "failed",
    "crashed": "crashed",
    "interrupted": "was interrupted",
    "running": "is still running; its trace ends",
}


def watch_lines(expression: str, doc: dict[str, Any]) -> list[str]:
    """What ``watch`` prints for its result ``doc``: no claim about an invocation that
    was not evaluated (``unchecked``), and where EXPR could not be evaluated."""
    lines = []
    n, skipped = doc["invocations"], doc["unchecked"]
    status = doc.get("run_status", "finished")
    resumed = doc.get("resumed_after")
    if resumed is not None:
        point = f"{resumed['op']}#{resumed['invocation']}"
        ran = (
            f"the {n} invocation(s) this run ran after resuming run {doc['continues'][:12]} "
            f"at {point} (checked after each, and at {point})"
        )
    else:
        ran = f"the {n} invocation(s) this run recorded (checked after each)"
    if not doc["found"] and not skipped and status == "finished" and resumed is None:
        lines.append(
            f"{expression} never holds in this run (checked after each of its {n} invocations)"
        )
    elif not doc["found"] and not skipped and status == "finished":
        lines.append(f"{expression} never holds in {ran}")
    elif not doc["found"] and not skipped:
        lines.append(
            f"{expression} never holds in {ran}; the run {_ENDED.get(status, status)} there, "
            "so what it would have done next was not checked"
        )
    elif not doc["found"]:
        lines.append(
            f"{expression} was not found, but {skipped} of the run's {n} invocations were not "
            "checked: --monotone bisects over the checkpoints and assumes EXPR stays true "
            "once it holds; without --monotone every invocation is checked"
        )
    else:
        verb = "first holds" if not skipped else "first found"
        line = f"{expression} {verb} after {doc['op']}#{doc['invocation']}"
        if doc["held_before"]:
            line += " (it held before the first body: no loop body made it true)"
        elif doc["index"] is None and doc.get("serial_fallback"):
            line += (
                " (it ran as a serial fallback, every node running every body, whose bodies "
                "watch does not step through: no body is named)"
            )
        elif doc["index"] is None:
            line += " (no single loop body made it true)"
        else:
            line += f", index {doc['index']} on node {doc['node']}"
        lines.append(line)
        if skipped:
            lines.append(
                f"  not every invocation was checked ({skipped} before it were not): "
                "--monotone assumes EXPR stays true once it holds; without --monotone "
                "every invocation is checked"
            )
        for k, v in doc["values"].items():
            lines.append(f"  {k} = {_short(v)}")
        if doc["break"]:
            lines.append(f"stop there with: {doc['break']}")
    if resumed is not None:
        lines.append(
            f"note: the invocations up to {resumed['op']}#{resumed['invocation']} are run "
            f"{doc['continues'][:12]}'s, which this run resumed, and were not checked: watch "
            f"that run with --run {doc['continues']}"
        )
    for where, why in (("replay", "did not exist"), ("checkpoint", "was not in the checkpoint")):
        gone = [e for e in doc["not_evaluable"] if e["in"] == where]
        if not gone:
            continue
        at = [f"{e['op']}#{e['invocation']}" for e in gone]
        shown = ", ".join(at[:4]) + (f" and {len(at) - 4} more" if len(at) > 4 else "")
        names = ", ".join(sorted({d for e in gone for d in e["dds"]}))
        lines.append(
            f"note: {expression} could not be evaluated after {shown} ({names} {why} "
            "there): counted as not holding"
        )
    return lines


def register(cli: click.Group) -> None:
    """Add ``history`` and ``watch`` to the command group."""
    cli.add_command(history_cmd)
    cli.add_command(watch_cmd)


__all__ = ["register"]
