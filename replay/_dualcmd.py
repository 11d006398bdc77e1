"""``replay dual``: the forward and backward dual tests of an app, from the command line."""

from __future__ import annotations

import os
import sys
import uuid
from typing import Any

import click

from . import _environment
from ._cliutil import (
    POSITIVE_SECONDS,
    check_counts,
    common,
    echo_json,
    host_options,
    printer,
    shown,
    trace_options,
    trace_path,
    under_launcher,
    with_options,
)
from ._errors import UsageError
from ._hosts import check_allocation
from ._job import EXIT_FAILED
from ._progress import Printer, reporting
from ._untested import advice, not_tested


@click.command("dual")
@click.argument("app")
@with_options(common)
@click.option(
    "--ranks",
    type=int,
    default=2,
    show_default=True,
    help="Nodes of the parallel side (MPI ranks under mpiexec when > 1).",
)
@click.option(
    "--in-process",
    "in_process",
    is_flag=True,
    help="Host the parallel side's nodes in this process instead of under mpiexec.",
)
@click.option(
    "--direction",
    type=click.Choice(["forward", "backward", "both"]),
    default="both",
    show_default=True,
    help="forward: the parallel run must reproduce a serial run's order and outcome; "
    "backward: a serial run in the parallel run's serialization order must reproduce its "
    "outcome.",
)
@click.option(
    "--order",
    type=click.Choice(["identity", "random"]),
    default="identity",
    show_default=True,
    help="Serial order of the forward test.",
)
@click.option(
    "--order-seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed of the serial order's permutation under --order random.",
)
@click.option(
    "--timeout",
    type=POSITIVE_SECONDS,
    default=None,
    help="Kill each MPI job after this many seconds.",
)
@trace_options("Trace store for the parallel run and the verdicts.")
@host_options
def dual_cmd(
    app: str,
    params: tuple[str, ...],
    threads: int,
    seed: int,
    ranks: int,
    in_process: bool,
    direction: str,
    order: str,
    order_seed: int,
    timeout: float | None,
    trace: str | None,
    no_trace: bool,
    as_json: bool,
) -> None:
    """Dual-test APP: its parallel runs must equal its serial version exactly."""
    check_counts(ranks=ranks, threads=threads, seed=seed)
    if not in_process and ranks > 1:
        check_allocation(ranks, os.environ)
    _environment.ensure(_environment.choose_hash_seed())
    from . import testing
    from ._apps import parse_params
    from ._apps import resolve as resolve_app
    from ._job import _recorder, recording

    if under_launcher():
        raise UsageError(
            "replay dual starts its own MPI job for the parallel side; run it without mpiexec"
        )
    resolved = resolve_app(app)
    values = parse_params(resolved.fn, params)
    parallel = "in-process" if in_process or ranks == 1 else "mpi"
    say = printer(as_json)
    path = None if no_trace else trace_path(app, trace)
    recorder = None
    run_id = uuid.uuid4().hex
    if path is not None and parallel == "in-process":
        spec = {
            "trace": path,
            "run_id": run_id,
            "nodes": ranks,
            "threads": threads,
            "seed": seed,
            "test_mode": True,
        }
        recorder = _recorder(spec, resolved, values, None)
    where = f"{ranks} MPI rank(s)" if parallel == "mpi" else f"{ranks} in-process node(s)"
    say(f"dual test of {resolved.name}: {where} x {threads} thread(s), seed {seed}")
    with recording(recorder), Printer(as_json, "dual test") as bar, reporting(bar):
        results = testing.dual(
            app if parallel == "mpi" else resolved.fn,
            values,
            nodes=ranks,
            threads=threads,
            seed=seed,
            order=order,
            order_seed=order_seed,
            direction=direction,
            recorder=recorder,
            parallel=parallel,
            timeout=timeout,
            mpi_trace=(path, run_id) if path is not None and parallel == "mpi" else None,
        )
    if path is not None:
        import tracer

        with tracer.open_writable(path) as store:
            for d, r in results.items():
                store.add_verdict(run_id, f"dual-{d}", r.passed, r.as_dict())
    untested = not_tested(*(r.not_tested for r in results.values()))
    note = None
    if untested:
        objectives = dict.fromkeys(k for r in results.values() for k in r.objectives)
        note = advice(untested, app, objectives)
    nexts = _next_commands(results, path, run_id)
    if as_json:
        out: dict[str, Any] = {d: dict(r.as_dict(), next=nexts.get(d)) for d, r in results.items()}
        out["trace"] = None if path is None else tracer.describe(path)
        out["parallel"] = parallel
        out["not_tested"] = untested
        out["note"] = note
        echo_json(out)
    else:
        for d, r in results.items():
            say(r.report())
            if d in nexts:
                say(f"  stop there with: {nexts[d]}")
        if note is not None:
            say(f"note: {note}")
        if path is not None:
            say(f"trace: {shown(path)}")
    if not all(r.passed for r in results.values()):
        sys.exit(EXIT_FAILED)


def _next_commands(results: dict[str, Any], path: str | None, run_id: str) -> dict[str, str]:
    """Per failed direction, the ``replay single`` command that stops in pdb at (or just
    before) the divergence in the recorded parallel run; none without a trace, or when
    the divergence names no operator invocation (the browser shows the same command)."""
    from ._replaycmds import next_command

    if path is None:
        return {}
    out = {}
    for d, r in results.items():
        if not r.passed and (cmd := next_command(r.as_dict(), path, run_id)) is not None:
            out[d] = cmd
    return out


def register(cli: click.Group) -> None:
    """Add ``dual`` to the command group."""
    cli.add_command(dual_cmd)


__all__ = ["register"]
