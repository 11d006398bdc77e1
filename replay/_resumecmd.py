"""``replay resume TRACE``: the command (the job itself is in ``_resume``)."""

from __future__ import annotations

import click

import tracer

from . import _environment, _procs
from ._cliutil import (
    POSITIVE_SECONDS,
    echo_json,
    host_options,
    limit_options,
    printer,
    run_option,
    summary,
    trace_arg,
    under_launcher,
)
from ._errors import UsageError
from ._job import launch
from ._model import check_save, convergence_warning
from ._progress import Printer
from ._replay import recorded_app
from ._resume import new_spec, resumable, resume_here, trace_not_written


@click.command("resume")
@click.argument("trace", metavar="TRACE", type=click.Path(dir_okay=False))
@run_option
@click.option(
    "--timeout",
    type=POSITIVE_SECONDS,
    default=None,
    help="Kill the MPI job after this many seconds.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@click.option(
    "--save",
    "save",
    default=None,
    metavar="PATH",
    help="Write the model the resumed run ends with: PATH.npz (numpy arrays named after "
    "the model's parts) or, for embeddings, PATH.txt (word2vec text format).",
)
@limit_options()
@host_options
def resume_cmd(
    trace: str,
    run_id: str | None,
    timeout: float | None,
    as_json: bool,
    save: str | None,
    max_ranks: int,
    max_threads: int,
) -> None:
    """Continue a crashed or interrupted run of TRACE from its last complete checkpoint,
    on its recorded ranks, threads, seed and parameters, as a new run of the same trace
    (its 'continues' names the crashed run)."""
    if under_launcher():
        raise UsageError(
            "replay resume starts the recorded number of MPI ranks itself; run it without mpiexec"
        )
    with Printer(as_json, "resume") as say:
        path = trace_arg(trace)
        run, start = resumable(path, run_id)
        info = run.info
        if start.note is not None:
            say(start.note)
        _procs.check_shape(info.ranks, info.threads, max_ranks=max_ranks, max_threads=max_threads)
        if save is not None:  # before anything runs: a bad path is one line
            save = check_save(save, info.app, path, params=info.params)
        # a missing or changed app is one line here, before any rank starts
        recorded_app(info, announce=say)
        spec = new_spec(path, run, start)
        paths = _environment.float_change(info.environment, "a resume here")
        if paths is not None:  # its continuation would not be the run's, bit for bit
            raise UsageError(f"run {info.run_id[:12]} cannot be resumed here: {paths}")
        if save is not None:
            spec["save"] = save
        if info.ranks == 1:
            _environment.ensure(spec["hash_seed"])  # may re-execute this process
        why = trace_not_written(info)
        if why is not None:  # not a crash, and not a loop body: say what stopped it
            say(f"run {info.run_id[:12]} stopped because its trace could not be written: {why}")
        if info.ranks == 1:
            res = resume_here(spec, progress=say)
        else:
            res = launch(spec, info.ranks, timeout=timeout, out=say)
    if as_json:
        echo_json(dict(res, trace=tracer.describe(res["trace"])))
    else:
        out = printer(False)
        summary(res, out)
        out(
            f"resumed run {res['continues'][:12]} after the checkpoint at "
            f"{res['resumed_from']['op']}#{res['resumed_from']['invocation']} as run "
            f"{res['run_id'][:12]}"
        )
    # the run's own warning: a resumed solver that stops short says so as a run does
    warning = convergence_warning(str(info.app).rsplit(":", 1)[-1], res.get("result"))
    if warning is not None:
        click.echo(warning, err=True)


def register(cli: click.Group) -> None:
    """Add ``resume`` to the command group."""
    cli.add_command(resume_cmd)


__all__ = ["register"]
