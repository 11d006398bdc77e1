"""``replay run`` and ``replay demo``: run an app (here, or as an MPI job), record it, and the
main job that records, replays and dual-tests SGDMF."""

from __future__ import annotations

import os
import sys
import time
import uuid
from typing import Any, NoReturn

import click

import tracer
from engine import DriverDivergenceError

from . import _environment
from ._cliutil import (
    POSITIVE_SECONDS,
    check_counts,
    common,
    echo_json,
    host_options,
    printer,
    rank,
    shown,
    summary,
    trace_options,
    trace_path,
    under_launcher,
    with_options,
)
from ._errors import RanksDisagree, UsageError
from ._hosts import check_allocation, default_ranks
from ._job import EXIT_DIVERGED, EXIT_FAILED, describe, launch, run_here
from ._model import check_save, convergence_warning
from ._progress import Printer, reporting
from ._replay import replay_here, store_verdict


def execute(
    app: str,
    params: tuple[str, ...],
    *,
    ranks: int | None,
    threads: int,
    seed: int,
    checked: bool,
    as_json: bool,
    timeout: float | None,
    trace: str | None = None,
    checkpoint_every: int | None = None,
    digest: str | None = None,
    save: str | None = None,
) -> dict[str, Any]:
    """Run an app the way ``replay run`` does and return its JSON result.

    ``trace`` is the trace store path (``None``: do not record); ``checkpoint_every``
    0 (none), N (every N-th loop invocation) or None (automatic, <= 3% of run time);
    ``digest`` the hash of the DDS digests (None: xxh3-chunks); ``save`` the file the
    trained model is written to (``.npz`` or word2vec ``.txt``).
    """
    # text lines as they come; a spinner names each long phase (planning, a first kernel
    # compile, a checkpoint) on a terminal
    say = Printer(as_json, "run")
    try:
        spec = {
            "app": app,
            "params": list(params),
            "threads": threads,
            "seed": seed,
            "checked": checked,
            "json": as_json,
            "trace": trace,
            "checkpoint_every": checkpoint_every,
            "digest": digest,
            "save": save,
        }
        check_counts(ranks=ranks, threads=threads, seed=seed)
        hash_seed = _environment.choose_hash_seed()
        if under_launcher():
            _environment.ensure(hash_seed)  # re-executes this rank: before MPI is initialised
            from mpi4py import MPI

            comm = MPI.COMM_WORLD
            if ranks is not None and ranks != comm.Get_size():
                raise UsageError(
                    f"--ranks {ranks} disagrees with the {comm.Get_size()} ranks mpiexec started; "
                    "drop --ranks when you launch with mpiexec yourself"
                )
            if trace is not None:
                # every rank must agree on the run id and the path
                spec["run_id"] = comm.bcast(uuid.uuid4().hex if comm.Get_rank() == 0 else None)
                spec["trace"] = comm.bcast(trace)
            try:
                return run_here(spec, comm=comm, progress=say)
            except BaseException as exc:  # noqa: BLE001 - one rank failing must stop them all
                message, status = describe(exc)
                if isinstance(exc, (DriverDivergenceError, RanksDisagree)):
                    stop_together(comm, message, status)
                try:
                    click.echo(f"replay: error (rank {comm.Get_rank()}): {message}", err=True)
                    sys.stderr.flush()
                finally:
                    comm.Abort(status)
                    # MPICH's Abort can return before mpiexec kills this rank: no second report
                    os._exit(status)
        ranks = default_ranks(os.environ) if ranks is None else ranks
        check_allocation(ranks, os.environ)
        spec["run_id"] = uuid.uuid4().hex
        if ranks == 1:
            _environment.ensure(hash_seed)
            return run_here(spec, progress=say)
        spec["hash_seed"] = hash_seed
        prefetch(app, params)  # a first download shows its progress here, not in a rank
        return launch(spec, ranks, timeout=timeout, out=say)
    finally:
        say.close()


def duration_text(seconds: float) -> str:
    """``21 s``, ``3 min``: a rough duration a person reads (never ``0 min``)."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def stop_together(comm: Any, message: str, status: int) -> NoReturn:
    """Stop every rank of ``comm`` with ``status`` after an error all of them raised
    alike: rank 0 says it once, and they finish MPI together.  An ``Abort`` there made
    mpiexec kill the ranks before it had passed on what they wrote, so the command
    sometimes ended with status 2 and not a word (3 of 8 runs)."""
    if comm.Get_rank() == 0:
        click.echo(f"replay: error: {message}", err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    comm.Barrier()
    from mpi4py import MPI

    MPI.Finalize()
    os._exit(status)


def prefetch(app: str, params: tuple[str, ...]) -> None:
    """Let a built-in app fetch its data set in this process (``prefetch(**values)`` in
    its module), where a person at the terminal sees the download's progress."""
    from ._apps import BUILTIN_APPS, parse_params
    from ._apps import resolve as resolve_app

    if app not in BUILTIN_APPS:
        return
    fn = resolve_app(app).fn
    prefetch = getattr(sys.modules.get(fn.__module__), "prefetch", None)
    if prefetch is not None:
        prefetch(**parse_params(fn, params))


@click.command("run")
@click.argument("app")
@with_options(common)
@click.option(
    "--ranks",
    type=int,
    default=None,
    help="MPI ranks (starts mpiexec when > 1). [default: 1; in a Slurm allocation its tasks]",
)
@host_options
@click.option("--checked", is_flag=True, help="Fail on any access outside the reconnaissance sets.")
@click.option(
    "--timeout",
    type=POSITIVE_SECONDS,
    default=None,
    help="Kill the MPI job after this many seconds.",
)
@trace_options("Trace store to record into.")
@click.option(
    "--checkpoint-every",
    type=int,
    default=None,
    metavar="N",
    help="Checkpoint the DDS after every N-th loop invocation (time travel). "
    "[default: chosen so that checkpoints cost <= 3% of run time and "
    "<= 0.25 trace bytes per loop body]",
)
@click.option("--no-checkpoints", is_flag=True, help="Record no checkpoints.")
@click.option(
    "--save",
    "save",
    default=None,
    metavar="PATH",
    help="Write the trained model when the run ends: PATH.npz (numpy arrays named after "
    "the model's parts) or, for embeddings, PATH.txt (word2vec text format).",
)
@click.option(
    "--require-convergence",
    is_flag=True,
    help="Exit 1 when the app's solver stopped before its tolerance.",
)
@click.option(
    "--digest",
    type=click.Choice(["xxh3-chunks", "xxh3", "blake2b"]),
    default="xxh3-chunks",
    show_default=True,
    help="Hash of the per-invocation DDS digests: xxh3-chunks (xxh3-128 of 8 KiB chunks, "
    "hashed on the rank that holds them), xxh3 (xxh3-128 of all rows in one stream) or "
    "blake2b (blake2b-128, cryptographic, 30x slower).",
)
def run_cmd(
    app: str,
    params: tuple[str, ...],
    threads: int,
    seed: int,
    ranks: int | None,
    checked: bool,
    timeout: float | None,
    trace: str | None,
    no_trace: bool,
    as_json: bool,
    checkpoint_every: int | None,
    no_checkpoints: bool,
    digest: str,
    save: str | None,
    require_convergence: bool,
) -> None:
    """Run APP (a built-in name such as sgdmf, or path/to/train.py:function)."""
    check_counts(ranks=ranks, threads=threads, seed=seed)  # before a default path is made
    if trace is not None and no_trace:
        raise UsageError("--trace and --no-trace exclude each other")
    if checkpoint_every is not None and no_checkpoints:
        raise UsageError("--checkpoint-every and --no-checkpoints exclude each other")
    if checkpoint_every is not None and checkpoint_every < 1:
        raise UsageError(f"--checkpoint-every must be >= 1, got {checkpoint_every}")
    if save is not None:  # before the trace file is made: a bad path leaves nothing behind
        given = {k.strip(): v for k, _, v in (p.partition("=") for p in params)}
        save = check_save(
            save, app, trace, params=given, writer=not under_launcher() or rank() == 0
        )
    where = None if no_trace else trace_path(app, trace)
    res = execute(
        app,
        params,
        ranks=ranks,
        threads=threads,
        seed=seed,
        checked=checked,
        as_json=as_json,
        timeout=timeout,
        trace=where,
        checkpoint_every=0 if no_checkpoints else checkpoint_every,
        digest=digest,
        save=save,
    )
    if under_launcher() and rank() != 0:
        return
    if as_json:
        echo_json(dict(res, trace=res["trace"] and tracer.describe(res["trace"])))
    else:
        summary(res, printer(False))
    name = app.rsplit(":", 1)[-1]
    warning = convergence_warning(name, res.get("result"))
    if warning is not None:
        click.echo(warning, err=True)
        if require_convergence:
            sys.exit(EXIT_FAILED)
    elif require_convergence and res.get("converged") is None:
        # a check that could not look must not read as a pass
        click.echo(
            f"replay: warning: --require-convergence checked nothing: {name}'s result has no "
            "'converged' (only a solver with a tolerance, such as lasso, says)",
            err=True,
        )


@click.command("demo")
@click.option("--ranks", type=int, default=2, show_default=True, help="MPI ranks.")
@click.option(
    "--epochs",
    # 0 epochs runs no loop body: every replay and dual test below would pass on nothing
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Training epochs (at least 1).",
)
@host_options
def demo_cmd(ranks: int, epochs: int) -> None:
    """The main job: train SGDMF on MovieLens-100K on 2 MPI ranks with recording, replay the
    trace on the cluster and in one process, dual-test one epoch, and summarise."""
    check_counts(ranks=ranks)
    _environment.ensure(_environment.choose_hash_seed())
    say = printer(False)
    params: tuple[str, ...] = (f"epochs={epochs}",)
    try:
        from apps._datasets import movielens_100k

        movielens_100k()
        say("data: MovieLens-100K (from the recbole wheel, cached)")
    except Exception as exc:  # noqa: BLE001 - fall back to generated data offline
        say(f"data: MovieLens-100K unavailable ({exc}); using synthetic ratings")
        params += ("synthetic=true",)
    say("")
    say(f"== 1. record: replay run sgdmf --ranks {ranks}")
    trace = trace_path("sgdmf", None)
    res = execute(
        "sgdmf",
        params,
        ranks=ranks,
        threads=1,
        seed=0,
        checked=False,
        as_json=False,
        timeout=None,
        trace=trace,
    )
    summary(res, say)
    where = shown(trace)
    verdicts = {}
    for step, mode in ((2, "cluster"), (3, "single")):
        say("")
        say(f"== {step}. replay {mode} {where}")
        spec = {"kind": "replay", "mode": mode, "trace": trace, "run_id": res["run_id"]}
        # the ranks' progress ticks become a bar on a terminal, never text
        with Printer(False, f"{mode} replay") as bar:
            if mode == "cluster" and ranks > 1:
                rep = launch(spec, ranks, out=bar)
            else:
                rep = replay_here(spec, progress=bar)
        store_verdict(rep)
        verdicts[mode] = rep
        if rep["identical"]:
            c = rep["checked"]
            say(
                f"identical: {c['digests']} digest(s) and {c['objectives']} objective value(s) "
                f"match the recording ({rep['wall_s']:.2f} s)"
            )
        else:
            from ._replaycmds import divergence_lines, next_command

            d = rep["first_difference"]
            for line in divergence_lines(d, next_command(d, trace, res["run_id"])):
                say(line)
    say("")
    # one epoch: the dual test compares every body of both sides in both directions, so
    # it costs several times a recorded epoch; the demo says what the full test costs
    dual_epochs = min(epochs, 1)
    say(f"== 4. replay dual sgdmf --ranks {ranks} -p epochs={dual_epochs} (forward and backward)")
    from . import testing
    from ._apps import parse_params
    from ._apps import resolve as resolve_app

    app = resolve_app("sgdmf")
    dual_params = parse_params(app.fn, [p for p in params if not p.startswith("epochs=")])
    dual_params["epochs"] = dual_epochs
    began = time.monotonic()
    with Printer(False, "dual test") as bar, reporting(bar):
        duals = testing.dual(
            "sgdmf",
            dual_params,
            nodes=ranks,
            threads=1,
            order="random",
            parallel="mpi" if ranks > 1 else "in-process",
        )
    import tracer

    with tracer.open_writable(trace) as store:
        for d, r in duals.items():
            store.add_verdict(res["run_id"], f"dual-{d}", r.passed, r.as_dict())
    took = time.monotonic() - began
    for r in duals.values():
        say(r.report())
    if dual_epochs and epochs > dual_epochs:
        say(
            f"({dual_epochs} epoch took {took:.0f} s; 'replay dual sgdmf --ranks {ranks} "
            f"-p epochs={epochs}' tests all {epochs}: about "
            f"{duration_text(took * epochs / dual_epochs)} here)"
        )
    say("")
    say("== summary")
    rmse = res["objectives"].get("rmse", [])
    if rmse:
        say(
            f"train RMSE {rmse[0]:.4f} -> {rmse[-1]:.4f} over {len(rmse)} epoch(s) on {ranks} ranks"
        )
    for mode, rep in verdicts.items():
        say(f"{mode} replay: {'identical' if rep['identical'] else 'DIVERGED'}")
    for d, r in duals.items():
        say(f"{d} dual test: {'PASS' if r.passed else 'FAIL'}")
    say(f"trace: {where}")
    say(f"browse it: replay browse {where}")
    if not all(r["identical"] for r in verdicts.values()):
        sys.exit(EXIT_DIVERGED)
    if not all(r.passed for r in duals.values()):
        sys.exit(EXIT_FAILED)


def register(cli: click.Group) -> None:
    """Add ``run`` and ``demo`` to the command group."""
    cli.add_command(run_cmd)
    cli.add_command(demo_cmd)


__all__ = ["execute", "register"]
