"""The ``replay`` command line (one click application).

User errors print one line on stderr and exit 2 (DESIGN §10); a failed loop body
exits 1; ``--json`` prints exactly one JSON object on stdout.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

import tracer
from engine import DriverDivergenceError
from tui import register as register_browse

from . import _environment, _procs
from ._errors import UsageError
from ._job import EXIT_DIVERGED, EXIT_FAILED, EXIT_USAGE, JobFailed, describe, launch, run_here
from ._progress import DOWNLOAD_PROGRESS_ENV, Printer, bars_wanted, reporting
from ._replay import (
    check_replayable,
    open_run,
    parse_break,
    parse_until,
    recorded_app,
    replay_here,
    store_verdict,
)
from ._tracecmds import register as register_trace_commands


class _Group(click.Group):
    """Turns every expected failure into one line on stderr and an exit status."""

    def invoke(self, ctx: click.Context) -> Any:
        as_json = "--json" in ctx.args  # the subcommand's arguments, not yet parsed
        if bars_wanted(as_json):  # downloads in this process (and its ranks) may show bars
            os.environ.setdefault(DOWNLOAD_PROGRESS_ENV, "1")
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort):
            raise
        except click.ClickException as exc:  # click prints it; --json also gets the object
            if as_json:
                _json_error(exc.format_message(), exc.exit_code)
            raise
        except JobFailed as exc:
            _fail(str(exc), exc.status, as_json)
        except KeyboardInterrupt:
            _fail("interrupted", 130, as_json)
        except _procs.Interrupted as exc:
            _fail(str(exc), exc.status, as_json)
        except Exception as exc:  # noqa: BLE001 - the CLI never shows a raw traceback
            if os.environ.get("REPLAY_DEBUG"):
                traceback.print_exc()
            message, status = describe(exc)
            _fail(message, status, as_json)


#: ``kind`` of a ``--json`` error object, by exit status (128 + N: stopped by signal N).
_ERROR_KINDS = {
    EXIT_FAILED: "failed",
    EXIT_USAGE: "usage",
    EXIT_DIVERGED: "diverged",
    70: "internal",
}


def _json_error(message: str, status: int) -> None:
    kind = _ERROR_KINDS.get(status, "interrupted" if status > 128 else "failed")
    click.echo(json.dumps({"error": {"kind": kind, "message": message}}))


def _fail(message: str, status: int, as_json: bool = False) -> None:
    click.echo(f"replay: error: {message}", err=True)
    if as_json:
        _json_error(message, status)
    sys.exit(status)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="strads-replay", prog_name="replay")
def cli() -> None:
    """Record, replay and dual-test distributed ML training runs."""


#: ``--timeout``: seconds, strictly positive (0 would kill every job at once).
POSITIVE_SECONDS = click.FloatRange(min=0, min_open=True)

_allow_changed = click.option(
    "--allow-changed-code",
    "allow_changed",
    is_flag=True,
    help="Replay even if the app's source differs from the recorded digest (then exit 3 "
    "at the first divergence).",
)


def _printer(as_json: bool) -> Callable[[str], None]:
    def say(line: str) -> None:
        click.echo(line, err=as_json)

    return say


def _under_launcher() -> bool:
    from engine.lowlevel import under_mpi_launcher

    return under_mpi_launcher()


def _summary(res: dict[str, Any], say: Callable[[str], None]) -> None:
    for op, times in res.get("op_times", {}).items():
        if times:
            say(f"{op}: {len(times)} invocation(s), {sum(times) / len(times):.3f} s each")
    for name, vals in res["objectives"].items():
        if vals:
            say(f"final {name} = {vals[-1]:.6g}")
    say(f"finished in {res['wall_s']:.2f} s")
    if res.get("trace"):
        say(f"trace: {_shown(res['trace'])}")


def _shown(path: str) -> str:
    if tracer.is_url(path):
        return tracer.describe(path)  # never the password
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path


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
) -> dict[str, Any]:
    """Run an app the way ``replay run`` does and return its JSON result.

    ``trace`` is the trace store path (``None``: do not record).
    """
    say = _printer(as_json)
    spec = {
        "app": app,
        "params": list(params),
        "threads": threads,
        "seed": seed,
        "checked": checked,
        "json": as_json,
        "trace": trace,
    }
    if threads < 1:
        raise UsageError(f"--threads must be >= 1, got {threads}")
    _check_seed(seed)
    hash_seed = _environment.choose_hash_seed()
    if _under_launcher():
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
            if isinstance(exc, DriverDivergenceError) and comm.Get_rank() != 0:
                comm.Barrier()  # every rank raised it alike: rank 0 reports it once, aborts
            try:
                click.echo(f"replay: error (rank {comm.Get_rank()}): {message}", err=True)
                sys.stderr.flush()
            finally:
                comm.Abort(status)
                # MPICH's Abort can return before mpiexec kills this rank: no second report
                os._exit(status)
    ranks = 1 if ranks is None else ranks
    if ranks < 1:
        raise UsageError(f"--ranks must be >= 1, got {ranks}")
    spec["run_id"] = uuid.uuid4().hex
    if ranks == 1:
        _environment.ensure(hash_seed)
        return run_here(spec, progress=say)
    spec["hash_seed"] = hash_seed
    _prefetch(app, params)  # a first download shows its progress here, not in a rank
    return launch(spec, ranks, timeout=timeout, out=say)


def _prefetch(app: str, params: tuple[str, ...]) -> None:
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


def _check_seed(seed: int) -> None:
    if not 0 <= seed < 2**63:
        raise UsageError(f"--seed must be an integer in [0, 2**63), got {seed}")


_common = [
    click.option(
        "-p",
        "--param",
        "params",
        multiple=True,
        metavar="NAME=VALUE",
        help="App parameter (repeatable).",
    ),
    click.option(
        "--threads", type=int, default=1, show_default=True, help="Worker threads per node."
    ),
    click.option("--seed", type=int, default=0, show_default=True, help="Run seed."),
]


def _with(options: list[Callable[..., Any]]) -> Callable[..., Any]:
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        for opt in reversed(options):
            fn = opt(fn)
        return fn

    return deco


def _trace_options(what: str) -> Callable[..., Any]:
    """--trace/--no-trace/--json, shared by the commands that record."""
    return _with(
        [
            click.option(
                "--trace",
                "trace",
                type=click.Path(dir_okay=False),
                metavar="PATH|URL",
                default=None,
                help=f"{what} A file path (SQLite) or an SQLAlchemy URL such as "
                "postgresql+psycopg://USER:PASSWORD@HOST/DB "
                "[default: traces/<app>-<timestamp>.sqlite]",
            ),
            click.option("--no-trace", is_flag=True, help="Do not record a trace."),
            click.option(
                "--json", "as_json", is_flag=True, help="Print one JSON object on stdout."
            ),
        ]
    )


@cli.command("run")
@click.argument("app")
@_with(_common)
@click.option(
    "--ranks", type=int, default=None, help="MPI ranks (starts mpiexec when > 1). [default: 1]"
)
@click.option("--checked", is_flag=True, help="Fail on any access outside the reconnaissance sets.")
@click.option(
    "--timeout",
    type=POSITIVE_SECONDS,
    default=None,
    help="Kill the MPI job after this many seconds.",
)
@_trace_options("Trace store to record into.")
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
) -> None:
    """Run APP (a built-in name such as sgdmf, or path/to/train.py:function)."""
    if trace is not None and no_trace:
        raise UsageError("--trace and --no-trace exclude each other")
    res = execute(
        app,
        params,
        ranks=ranks,
        threads=threads,
        seed=seed,
        checked=checked,
        as_json=as_json,
        timeout=timeout,
        trace=None if no_trace else trace_path(app, trace),
    )
    if _under_launcher() and _rank() != 0:
        return
    if as_json:
        click.echo(json.dumps(dict(res, trace=res["trace"] and tracer.describe(res["trace"]))))
    else:
        _summary(res, _printer(False))


def trace_path(app: str, given: str | None) -> str:
    """The trace store to write: ``given``, or a new ``traces/<app>-<timestamp>.sqlite``.

    A URL is kept as given (a database holds many runs) once its driver, server and
    contents are checked, so a bad URL fails before anything runs.
    """
    if given is not None and tracer.is_url(given):
        tracer.probe_store(given)
        return given
    if given is not None:
        p = Path(given)
        if p.exists():
            raise UsageError(
                f"trace {given!r} already exists; pass a new path (a trace is never overwritten)"
            )
        return str(p.resolve())
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path("traces") / f"{_trace_stem(app)}-{stamp}"
    p = base.with_suffix(".sqlite")
    k = 1
    while p.exists():
        p = base.parent / f"{base.name}-{k}.sqlite"
        k += 1
    if not _under_launcher() or _rank() == 0:  # the other ranks use rank 0's path
        _point_latest(p)
    return str(p.resolve())


def _trace_stem(app: str) -> str:
    """A built-in app's name, else the user's module (``path/train.py:fit`` -> ``train``,
    ``pkg.models:fit`` -> ``models``)."""
    if ":" not in app:
        return app
    module = app.rsplit(":", 1)[0]
    if module.endswith(".py"):
        return Path(module).stem
    return module.rsplit(".", 1)[-1] or "run"


#: The symlink in ``traces/`` naming the newest default-named trace.
LATEST = "latest"


def _point_latest(trace: Path) -> None:
    """Make ``traces/latest`` name ``trace`` (atomically; a relative link, so the folder
    can move).  Only a symlink is ever replaced: a user's own file of that name stays."""
    link = trace.parent / LATEST
    if link.exists() and not link.is_symlink():
        return
    trace.parent.mkdir(parents=True, exist_ok=True)
    tmp = trace.parent / f".{LATEST}-{os.getpid()}"
    try:
        tmp.unlink(missing_ok=True)
        os.symlink(trace.name, tmp)
        os.replace(tmp, link)
    except OSError:
        tmp.unlink(missing_ok=True)  # an alias is a convenience; the run still records


def _trace_arg(trace: str) -> str:
    """A trace argument as the ranks will see it: a URL as is, a path made absolute."""
    return trace if tracer.is_url(trace) else str(Path(trace).resolve())


def _rank() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank()


@cli.command("demo")
@click.option("--ranks", type=int, default=2, show_default=True, help="MPI ranks.")
@click.option("--epochs", type=int, default=5, show_default=True, help="Training epochs.")
def demo_cmd(ranks: int, epochs: int) -> None:
    """The main job: train SGDMF on MovieLens-100K on 2 MPI ranks with recording, replay the
    trace on the cluster and in one process, and summarise."""
    _environment.ensure(_environment.choose_hash_seed())
    say = _printer(False)
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
    _summary(res, say)
    shown = _shown(trace)
    verdicts = {}
    for step, mode in ((2, "cluster"), (3, "single")):
        say("")
        say(f"== {step}. replay {mode} {shown}")
        spec = {"kind": "replay", "mode": mode, "trace": trace, "run_id": res["run_id"]}
        if mode == "cluster" and ranks > 1:
            rep = launch(spec, ranks, out=say)
        else:
            rep = replay_here(spec, progress=say)
        store_verdict(rep)
        verdicts[mode] = rep
        if rep["identical"]:
            c = rep["checked"]
            say(
                f"identical: {c['digests']} digest(s) and {c['objectives']} objective value(s) "
                f"match the recording ({rep['wall_s']:.2f} s)"
            )
        else:
            say(f"DIVERGED: {rep['first_difference']}")
    say("")
    say(f"== 4. replay dual sgdmf --ranks {ranks} (forward and backward, 2 epochs)")
    from . import testing
    from ._apps import parse_params
    from ._apps import resolve as resolve_app

    app = resolve_app("sgdmf")
    dual_params = parse_params(app.fn, [p for p in params if not p.startswith("epochs=")])
    dual_params["epochs"] = min(epochs, 2)
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
    for r in duals.values():
        say(r.report())
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
    say(f"trace: {shown}")
    say(f"browse it: replay browse {shown}")
    if not all(r["identical"] for r in verdicts.values()):
        sys.exit(EXIT_DIVERGED)
    if not all(r.passed for r in duals.values()):
        sys.exit(EXIT_FAILED)


def _limit_options() -> Callable[..., Any]:
    """--max-ranks/--max-threads: how much of the machine a trace may ask for."""
    limit = _procs.default_limit()
    return _with(
        [
            click.option(
                "--max-ranks",
                type=click.IntRange(min=1),
                default=limit,
                show_default="4 x CPUs",
                help="Refuse a trace that records more ranks (nodes) than this.",
            ),
            click.option(
                "--max-threads",
                type=click.IntRange(min=1),
                default=limit,
                show_default="4 x CPUs",
                help="Refuse a trace that records more threads per node than this.",
            ),
        ]
    )


def _replay_report(res: dict[str, Any], as_json: bool) -> None:
    """Print a replay result, store its verdict in the trace, exit 3 on divergence.

    A replay the user stopped in pdb has no verdict: it is neither identical nor not.
    """
    stopped = bool(res.get("stopped"))
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
        )
        doc = {k: res.get(k) for k in keys}
        if doc["out_trace"]:
            doc["out_trace"] = tracer.describe(doc["out_trace"])  # never the password
        click.echo(json.dumps(doc))
    else:
        say = _printer(False)
        c = res["checked"]
        if stopped:
            say("stopped by the user (no verdict stored)")
        elif res["identical"]:
            say(
                f"{_identical_head(res)}: {c['digests']} digest(s) and {c['objectives']} "
                f"objective value(s) match the trace ({res['wall_s']:.2f} s)"
            )
        else:
            d = res["first_difference"]
            event = str(d["event"])
            what = event if event.startswith(str(d["what"])) else f"{d['what']} {event}"
            say(
                f"DIVERGED on node {d['node']} at {d['op']}#{d['invocation']}, {what}: "
                f"the trace expected {d['expected']}, the program did {d['actual']}"
            )
    if not stopped and not res["identical"]:
        sys.exit(EXIT_DIVERGED)


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


@cli.command("cluster")
@click.argument("trace", metavar="TRACE", type=click.Path(dir_okay=False))
@click.option("--run", "run_id", default=None, help="Run id in the trace. [default: the latest]")
@click.option(
    "--trace-out",
    "out_trace",
    type=click.Path(dir_okay=False),
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
@_allow_changed
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@_limit_options()
def cluster_cmd(
    trace: str,
    run_id: str | None,
    out_trace: str | None,
    timeout: float | None,
    allow_changed: bool,
    as_json: bool,
    max_ranks: int,
    max_threads: int,
) -> None:
    """Replay TRACE on the recorded number of MPI ranks, enforcing its recorded orders."""
    with Printer(as_json, "cluster replay") as say:
        _cluster(
            trace, run_id, out_trace, timeout, allow_changed, as_json, max_ranks, max_threads, say
        )


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
) -> None:
    path = _trace_arg(trace)
    run = open_run(path, run_id, check=True)
    info = run.info
    _procs.check_shape(info.ranks, info.threads, max_ranks=max_ranks, max_threads=max_threads)
    recorded_app(info, allow_changed=allow_changed)  # before anything runs or launches
    check_replayable(run)  # before any rank starts: damage is one line here, not an MPI error
    hash_seed = _environment.recorded_hash_seed(info.environment)
    if _under_launcher() or info.ranks == 1:
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
    }
    if out_trace is not None:
        spec["out_trace"] = trace_path("replay", out_trace)
        spec["run_id_out"] = uuid.uuid4().hex
    if _under_launcher():
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        res = replay_here(spec, comm=comm, progress=say)
        if comm.Get_rank() != 0:
            return
    elif info.ranks == 1:
        res = replay_here(spec, progress=say)
    else:
        res = launch(spec, info.ranks, timeout=timeout, out=say)
    _replay_report(res, as_json)


@cli.command("single")
@click.argument("trace", metavar="TRACE", type=click.Path(dir_okay=False))
@click.option("--run", "run_id", default=None, help="Run id in the trace. [default: the latest]")
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
@_allow_changed
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@_limit_options()
def single_cmd(
    trace: str,
    run_id: str | None,
    brk: str | None,
    until: str | None,
    allow_changed: bool,
    as_json: bool,
    max_ranks: int,
    max_threads: int,
) -> None:
    """Replay every node of TRACE inside this process (pdb can stop in any body)."""
    # no bar where pdb may take the terminal
    with Printer(as_json, "single replay", bars=not (brk or until)) as say:
        _single(trace, run_id, brk, until, allow_changed, as_json, max_ranks, max_threads, say)


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
) -> None:
    path = _trace_arg(trace)
    run = open_run(path, run_id, check=True)
    info = run.info
    # every recorded node becomes threads of this one process
    _procs.check_shape(info.ranks, info.threads, max_ranks=max_ranks, max_threads=max_threads)
    recorded_app(info, allow_changed=allow_changed)  # before anything runs
    check_replayable(run)
    _environment.ensure(_environment.recorded_hash_seed(info.environment))
    spec: dict[str, Any] = {
        "kind": "replay",
        "mode": "single",
        "trace": path,
        "run_id": run_id,
        "json": as_json,
        "break": list(parse_break(brk)) if brk else None,
        "until": list(parse_until(until)) if until else None,
        "allow_changed_code": allow_changed,
    }
    res = replay_here(spec, progress=say)
    if brk and not res["breakpoint_hits"] and res["identical"]:
        click.echo(f"replay: note: breakpoint {brk} was never reached", err=True)
    _replay_report(res, as_json)


@cli.command("dual")
@click.argument("app")
@_with(_common)
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
)
@click.option(
    "--order",
    type=click.Choice(["identity", "random"]),
    default="identity",
    show_default=True,
    help="Serial order of the forward test.",
)
@click.option("--order-seed", type=int, default=0, show_default=True)
@click.option(
    "--timeout",
    type=POSITIVE_SECONDS,
    default=None,
    help="Kill each MPI job after this many seconds.",
)
@_trace_options("Trace store for the parallel run and the verdicts.")
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
    _environment.ensure(_environment.choose_hash_seed())
    from . import testing
    from ._apps import parse_params
    from ._apps import resolve as resolve_app
    from ._job import _recorder, recording

    if ranks < 1 or threads < 1:
        raise UsageError("--ranks and --threads must be >= 1")
    _check_seed(seed)
    if _under_launcher():
        raise UsageError(
            "replay dual starts its own MPI job for the parallel side; run it without mpiexec"
        )
    resolved = resolve_app(app)
    values = parse_params(resolved.fn, params)
    parallel = "in-process" if in_process or ranks == 1 else "mpi"
    say = _printer(as_json)
    path = None if no_trace else trace_path(app, trace)
    recorder = None
    run_id = uuid.uuid4().hex
    if path is not None and parallel == "in-process":
        spec = {"trace": path, "run_id": run_id, "nodes": ranks, "threads": threads, "seed": seed}
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
    if as_json:
        out: dict[str, Any] = {d: r.as_dict() for d, r in results.items()}
        out["trace"] = None if path is None else tracer.describe(path)
        out["parallel"] = parallel
        click.echo(json.dumps(out))
    else:
        for r in results.values():
            say(r.report() if not r.passed else f"{r.direction}: PASS ({r.bodies} bodies)")
        if path is not None:
            say(f"trace: {_shown(path)}")
    if not all(r.passed for r in results.values()):
        sys.exit(EXIT_FAILED)


register_trace_commands(cli)
register_browse(cli)


def main() -> None:
    """Console-script entry point."""
    # only the real command line may re-execute itself (not click's test runner)
    _environment.allow_reexec(sys.argv[1:])
    _environment.one_line_warnings()
    _procs.install_signal_handlers()
    cli(prog_name="replay")


__all__ = ["cli", "execute", "main"]
