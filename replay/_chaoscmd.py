"""``replay chaos``: run an app under many seeded legal schedules, record and check each."""

from __future__ import annotations

import os
import sys
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


@click.command("chaos")
@click.argument("app")
@with_options(common)
@click.option(
    "--ranks",
    type=int,
    default=None,
    help="Nodes: MPI ranks under mpiexec when > 1, unless --in-process. "
    "[default: 2 nodes in this process]",
)
@click.option(
    "--in-process",
    "in_process",
    is_flag=True,
    help="Host the nodes in this process (the fast in-process simulation).",
)
@click.option("--runs", type=int, required=True, help="How many schedules to explore.")
@click.option(
    "--chaos-seed", "chaos_seed", type=int, required=True, help="Seed the schedules are drawn from."
)
@click.option("--only", type=int, default=None, metavar="K", help="Re-run only schedule K.")
@click.option(
    "--check",
    default=None,
    metavar="dual|app|objective:NAME<=VALUE",
    help="Check every run: the backward dual test, the app module's check(run) function, "
    "or an objective bound (<=, <, >=, >).",
)
@click.option("--keep-going", is_flag=True, help="Explore every run even after a check failed.")
@click.option(
    "--faults",
    is_flag=True,
    help="Stop one node of each run at a drawn point (in-process); check that the trace is "
    "marked crashed and replays up to the crash.",
)
@click.option(
    "--timeout", type=POSITIVE_SECONDS, default=None, help="Kill each MPI job after this long."
)
@trace_options("Trace store every explored run is recorded into.")
@host_options
def chaos_cmd(
    app: str,
    params: tuple[str, ...],
    threads: int,
    seed: int,
    ranks: int | None,
    in_process: bool,
    runs: int,
    chaos_seed: int,
    only: int | None,
    check: str | None,
    keep_going: bool,
    faults: bool,
    timeout: float | None,
    trace: str | None,
    no_trace: bool,
    as_json: bool,
) -> None:
    """Run APP under --runs schedules drawn from --chaos-seed; group the outcomes."""
    check_counts(ranks=ranks, threads=threads, seed=seed)
    _environment.ensure(_environment.choose_hash_seed())
    from . import chaos
    from ._apps import parse_params
    from ._apps import resolve as resolve_app

    if ranks is None:  # exploring runs in process unless ranks are asked for
        ranks, in_process = 2, True
    if not in_process and ranks > 1:
        check_allocation(ranks, os.environ)
    if trace is not None and no_trace:
        raise UsageError("--trace and --no-trace exclude each other")
    if under_launcher():
        raise UsageError("replay chaos starts its own MPI jobs; run it without mpiexec")
    chaos.parse_check(None if check == "app" else check)
    resolved = resolve_app(app)
    checker: Any = chaos.app_check(resolved) if check == "app" else check
    values = parse_params(resolved.fn, params)
    parallel = "in-process" if in_process or ranks == 1 else "mpi"
    say = printer(as_json)
    path = None if no_trace else trace_path(app, trace)
    where = f"{ranks} MPI rank(s)" if parallel == "mpi" else f"{ranks} in-process node(s)"
    say(
        f"chaos: {resolved.name} on {where} x {threads} thread(s), seed {seed}, "
        f"chaos seed {chaos_seed}, {runs} run(s)"
        + (f", only run {only}" if only is not None else "")
    )
    report = chaos.explore(
        app,  # the name, not the function: a built-in app is recorded as one, so it replays
        values,
        runs=runs,
        chaos_seed=chaos_seed,
        nodes=ranks,
        threads=threads,
        seed=seed,
        only=only,
        check=checker,
        keep_going=keep_going,
        trace=path,
        parallel=parallel,
        timeout=timeout,
        faults=faults,
        progress=say,
    )
    if report.trace is not None:
        report.trace = shown(report.trace)
        if report.failed is not None:
            report.failed.trace = report.trace
    if as_json:
        echo_json(report.as_dict())
    else:
        for line in report.lines():
            say(line)
        if path is not None:
            say(f"trace: {shown(path)}")
    if report.failed is not None:
        if as_json:  # the failure's one line still reaches a person watching stderr
            f = report.failed
            click.echo(
                f"replay: chaos run {f.run} (chaos seed {f.seed}) failed check {f.check}: "
                f"{f.message}",
                err=True,
            )
        sys.exit(EXIT_FAILED)


def register(cli: click.Group) -> None:
    """Add ``chaos`` to the command group."""
    cli.add_command(chaos_cmd)


__all__ = ["register"]
