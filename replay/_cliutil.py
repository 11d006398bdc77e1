"""Pieces every ``replay`` subcommand shares: the error-to-exit-status group, the common
options, how results are printed, and where a new trace goes."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import secrets
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

import tracer
from tracer import printable

from . import _hosts, _procs
from ._errors import UsageError
from ._job import EXIT_DIVERGED, EXIT_FAILED, EXIT_USAGE, JobFailed, describe
from ._model import result_line
from ._paths import reserve_trace
from ._progress import DOWNLOAD_PROGRESS_ENV, TICK, bars_wanted, finish_bars, quiet


def usage_line(exc: click.UsageError) -> str:
    """Click's usage error as one line: what is wrong and where the help is.

    Click prints a usage error as four lines (the usage, a "Try --help" hint, a blank
    line, the error); DESIGN section 10 wants one line naming the problem and what to do.
    """
    message = " ".join(exc.format_message().split())
    path = exc.ctx.command_path if exc.ctx is not None else "replay"
    return f"{message.removesuffix('.')} (see '{path} --help')"


class Group(click.Group):
    """Turns every expected failure into one line on stderr and an exit status."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # the group's own options and a missing command (``replay --bogus``), before
        # :meth:`invoke`; no arguments at all still shows the help
        try:
            return super().parse_args(ctx, args)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            fail(usage_line(exc), exc.exit_code, "--json" in args)
            raise  # not reached: fail exits

    def invoke(self, ctx: click.Context) -> Any:
        as_json = "--json" in ctx.args  # the subcommand's arguments, not yet parsed
        if not as_json:
            return self._invoke(ctx, as_json)
        # stdout is the one JSON document (:func:`echo_json`); whatever else would reach
        # it while the command works (pdb at a --break, a program's own prints) goes to
        # stderr with the command's other text
        _JSON_OUT.append(sys.stdout)
        try:
            with contextlib.redirect_stdout(sys.stderr):
                return self._invoke(ctx, as_json)
        finally:
            _JSON_OUT.pop()

    def _invoke(self, ctx: click.Context, as_json: bool) -> Any:
        silent = "--quiet" in ctx.args or "-q" in ctx.args
        _hosts.set_placement(_hosts.Placement())  # a command's --hostfile is its own
        if bars_wanted(as_json) and not silent:  # downloads here (and in ranks) may show bars
            os.environ.setdefault(DOWNLOAD_PROGRESS_ENV, "1")
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort):
            raise
        except click.UsageError as exc:
            fail(usage_line(exc), exc.exit_code, as_json)
        except click.ClickException as exc:  # click prints it; --json also gets the object
            if as_json:
                json_error(exc.format_message(), exc.exit_code)
            raise
        except JobFailed as exc:
            fail(str(exc), exc.status, as_json)
        except KeyboardInterrupt:
            fail("interrupted by SIGINT", 128 + signal.SIGINT, as_json)  # as README says
        except BrokenPipeError:
            # the reader went away (``replay ls | head``): nothing to say, and no one to
            # say it to on stdout; exit as a program killed by SIGPIPE would
            with contextlib.suppress(OSError):
                out = _JSON_OUT[-1] if _JSON_OUT else sys.stdout
                os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
            sys.exit(128 + 13)
        except _procs.Interrupted as exc:
            fail(str(exc), exc.status, as_json)
        except Exception as exc:  # noqa: BLE001 - the CLI never shows a raw traceback
            if os.environ.get("REPLAY_DEBUG"):
                traceback.print_exc()
            message, status = describe(exc)
            fail(message, status, as_json)


#: ``kind`` of a ``--json`` error object, by exit status (128 + N: stopped by signal N).
_ERROR_KINDS = {
    EXIT_FAILED: "failed",
    EXIT_USAGE: "usage",
    EXIT_DIVERGED: "diverged",
    70: "internal",
}


#: The stdout of each ``--json`` command running (innermost last), saved before the
#: command's other output was sent to stderr: where :func:`echo_json` writes.
_JSON_OUT: list[Any] = []


def strict_json(doc: Any) -> Any:
    """``doc`` with every NaN or infinite float as ``None`` (dicts, lists and tuples are
    walked).  JSON (RFC 8259) has no NaN or Infinity: Python's bare ``NaN`` token made
    a diverged loss's document unreadable to jq and to JavaScript's ``JSON.parse``.
    ``null`` is what ``JSON.stringify`` writes, and what the program's ``result`` already
    held for such a value (:func:`replay._model.jsonable`)."""
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if isinstance(doc, dict):
        return {k: strict_json(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [strict_json(v) for v in doc]
    return doc


def echo_json(doc: Any) -> None:
    """Print ``--json``'s one document on the command's stdout (strict JSON: a float that
    is not finite is null)."""
    text = json.dumps(strict_json(doc), allow_nan=False)
    click.echo(text, file=_JSON_OUT[-1] if _JSON_OUT else None)


def json_error(message: str, status: int) -> None:
    kind = _ERROR_KINDS.get(status, "interrupted" if status > 128 else "failed")
    echo_json({"error": {"kind": kind, "message": message}})


def fail(message: str, status: int, as_json: bool = False) -> None:
    click.echo(f"replay: error: {printable(message)}", err=True)
    if as_json:
        json_error(message, status)
    sys.exit(status)


class _PositiveSeconds(click.FloatRange):
    """Seconds, strictly positive; ``inf`` is no limit, ``nan`` is refused (it passed
    the range check, every comparison with NaN being false, and meant nothing)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if math.isnan(seconds):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return seconds


#: ``--timeout``: seconds, strictly positive (0 would kill every job at once).
POSITIVE_SECONDS = _PositiveSeconds(min=0, min_open=True)

allow_changed = click.option(
    "--allow-changed-code",
    "allow_changed",
    is_flag=True,
    help="Replay even if the app's source differs from the recorded digest (then exit 3 "
    "at the first divergence).",
)

#: ``--run``: one run of a trace holding several (``Trace.run`` resolves a prefix).
run_option = click.option(
    "--run",
    "run_id",
    default=None,
    help="Run id in the trace, or its first 6+ characters. [default: the latest]",
)


def printer(as_json: bool) -> Callable[[str], None]:
    """Prints a command's result lines (on stderr under ``--json``), after erasing any
    progress bar, so a result never follows a bar's last frame on the same line."""

    def say(line: str) -> None:
        if line.startswith(TICK):  # progress protocol (a phase, a tick): never text
            return
        finish_bars()
        # a result names what the trace holds (its app, operators, DDS): hostile text
        click.echo(printable(line, lines=True), err=as_json)

    return say


def under_launcher() -> bool:
    from engine.lowlevel import under_mpi_launcher

    return under_mpi_launcher()


def summary(res: dict[str, Any], say: Callable[[str], None]) -> None:
    for op, times in res.get("op_times", {}).items():
        if times:
            say(f"{op}: {len(times)} invocation(s), {sum(times) / len(times):.3f} s each")
    for name, vals in res["objectives"].items():
        if vals:
            say(f"final {name} = {vals[-1]:.6g}")
    say(f"finished in {res['wall_s']:.2f} s")
    line = result_line(res.get("result"))
    if line is not None:
        say(line)
    if res.get("saved"):
        say(f"model: {shown(res['saved'])}")
    if res.get("trace"):
        say(f"trace: {shown(res['trace'])}")


def shown(path: str) -> str:
    if tracer.is_url(path):
        return tracer.describe(path)  # never the password
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path


def check_counts(**values: int | None) -> None:
    """Refuse ``--ranks``/``--threads``/``--seed`` values (keyword: the option's name; None:
    not given) that a run row cannot hold, before anything starts: the bounds are the
    readers' own (``tracer.RUN_LIMITS``), so a run that records is one they can read."""
    for name, value in values.items():
        lo, hi = tracer.RUN_LIMITS[name]
        if value is not None and not lo <= value <= hi:
            raise UsageError(
                f"--{name} must be an integer in [{lo}, {hi}] (what a trace can hold), got {value}"
            )


common = [
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


def with_options(options: list[Callable[..., Any]]) -> Callable[..., Any]:
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        for opt in reversed(options):
            fn = opt(fn)
        return fn

    return deco


#: hydra's launchers (``mpiexec -launcher NAME``): how it starts its proxy on each host.
LAUNCHERS = ("ssh", "rsh", "fork", "slurm", "ll", "lsf", "sge", "pbs", "cobalt", "manual")


def _set_hostfile(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:  # checked here: a bad file is one line before anything starts
        placement = _hosts.current_placement()
        _hosts.set_placement(_hosts.Placement(_hosts.check_hostfile(value), placement.launcher))


def _set_launcher(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        _hosts.set_placement(_hosts.Placement(_hosts.current_placement().hostfile, value))


#: ``--hostfile`` and ``--launcher``, shared by every command that starts ``mpiexec``:
#: they set the placement its launches use (``_hosts``), so no launch takes them apart.
host_options = with_options(
    [
        click.option(
            "--hostfile",
            type=click.Path(dir_okay=True),  # checked by _hosts.check_hostfile, in one line
            default=None,
            metavar="FILE",
            expose_value=False,
            callback=_set_hostfile,
            help="Hosts to run the MPI ranks on, one per line (host or host:slots), "
            "passed to mpiexec -f. Rank 0, which writes the trace, runs on the first.",
        ),
        click.option(
            "--launcher",
            type=click.Choice(LAUNCHERS),
            default=None,
            expose_value=False,
            callback=_set_launcher,
            help="How mpiexec starts processes on the hosts (mpiexec -launcher). "
            "[default: ssh; slurm inside a Slurm allocation]",
        ),
    ]
)


def trace_options(what: str) -> Callable[..., Any]:
    """--trace/--no-trace/--json, shared by the commands that record."""
    return with_options(
        [
            click.option(
                "--trace",
                "trace",
                type=click.Path(),  # a directory is refused by trace_path, in one line
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


#: The commands that show progress, and so take ``--quiet``.
QUIET_COMMANDS = ("run", "demo", "cluster", "single", "dual", "chaos", "resume", "history", "watch")


def attach_quiet(group: click.Group) -> None:
    """Give each command of ``group`` that shows progress a ``--quiet`` (``-q``) option."""
    for name in QUIET_COMMANDS:
        cmd = group.commands[name]
        cmd.params.append(
            click.Option(
                ["--quiet", "-q", "quiet_progress"],
                is_flag=True,
                help="Show no progress: no bars or spinners on a terminal, no progress "
                "lines off it (the result is printed as usual).",
            )
        )
        if cmd.callback is not None:
            cmd.callback = _quietly(cmd.callback)


def _quietly(callback: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(callback)
    def run(*args: Any, quiet_progress: bool = False, **kwargs: Any) -> Any:
        with quiet(quiet_progress):
            return callback(*args, **kwargs)

    return run


def trace_path(app: str, given: str | None) -> str:
    """The trace store to write: ``given``, or a new ``traces/<app>-<timestamp>.sqlite``.

    A URL is kept as given (a database holds many runs) once its driver, server and
    contents are checked, so a bad URL fails before anything runs.
    """
    if given is not None and not given.strip():
        # it named the working directory: "trace '' already exists", which it did not
        raise UsageError("the trace path is empty; give a file path such as traces/run.sqlite")
    if given is not None and tracer.is_url(given):
        scheme = given.split(":", 1)[0].split("+", 1)[0].lower()
        if scheme == "sqlite" and tracer.sqlite_path(given) is None:
            # the run recorded into it, printed "trace: sqlite://" and the trace was gone
            raise UsageError(
                f"trace {given!r} is an in-memory SQLite database, gone (with the trace) "
                "when the command ends; give a file path or sqlite:///PATH"
            )
        tracer.probe_store(given)
        return given
    first = not under_launcher() or rank() == 0  # the other ranks use rank 0's path
    if given is not None:
        p = Path(given)
        resolved = absolute(given, "pass a new path for the trace")
        if first:
            _reserve(p, given)
        return resolved
    folder = Path(DEFAULT_DIR)
    if os.path.lexists(folder) and not folder.is_dir():
        raise UsageError(
            f"{DEFAULT_DIR} is not a directory, but new traces go there by default: "
            f"move it away, or pass --trace PATH"
        )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = folder / f"{trace_stem(app)}-{stamp}"
    p = base.with_suffix(".sqlite")
    k = 1
    if first:
        _unpoint_if_removed(p.parent)  # registered first, so it runs after the removal
    while first:
        try:
            _reserve(p, str(p))
            break
        except UsageError:
            if not os.path.lexists(p):
                raise  # not taken by another run: something else is wrong
        p = base.parent / f"{base.name}-{k}.sqlite"
        k += 1
    if first:
        _latest_moves[p.parent] = (p, point_latest(p))
    return str(p.resolve())


#: Per traces folder: the trace ``latest`` was moved to by this command, and what it named
#: before (``_unpoint_if_removed`` puts that back if the command ends without a trace).
_latest_moves: dict[Path, tuple[Path, str | None]] = {}


def _unpoint_if_removed(folder: Path) -> None:
    """When the command ends: if the trace ``latest`` was moved to is gone (the command
    failed before recording, and its empty file was removed), ``latest`` names what it
    named before, or nothing; a link that another command has moved since is left."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return

    def restore() -> None:
        moved = _latest_moves.pop(folder, None)
        if moved is None or os.path.lexists(moved[0]):
            return
        trace, previous = moved
        link = folder / LATEST
        with contextlib.suppress(OSError):
            if not link.is_symlink() or os.readlink(link) != trace.name:
                return
            if previous is not None and (folder / previous).exists():
                _swap_link(folder, previous)
            else:
                link.unlink()

    ctx.call_on_close(restore)


def _reserve(p: Path, shown: str) -> None:
    forget = reserve_trace(p, shown)
    ctx = click.get_current_context(silent=True)
    if ctx is not None:  # a command that fails before recording leaves no empty trace
        ctx.call_on_close(forget)


def absolute(path: str, what: str) -> str:
    """``path`` made absolute; a symbolic link loop on the way is a user error saying
    ``what`` to do instead (Python 3.11 raises RuntimeError for one, 3.13 OSError)."""
    try:
        return str(Path(path).resolve())
    except (RuntimeError, OSError):
        raise UsageError(
            f"{path} is a symbolic link loop (following it never reaches a file): {what}"
        ) from None


def trace_stem(app: str) -> str:
    """A built-in app's name, else the user's module (``path/train.py:fit`` -> ``train``,
    ``pkg.models:fit`` -> ``models``)."""
    if ":" not in app:
        return app
    module = app.rsplit(":", 1)[0]
    if module.endswith(".py"):
        return Path(module).stem
    return module.rsplit(".", 1)[-1] or "run"


#: Where a run without ``--trace`` writes its trace, and what ``ls`` and ``browse`` read.
DEFAULT_DIR = "traces"
#: The symlink in ``traces/`` naming the newest default-named trace.
LATEST = "latest"


def point_latest(trace: Path) -> str | None:
    """Make ``traces/latest`` name ``trace`` (atomically; a relative link, so the folder
    can move), which exists: the reserved empty file at least.  Only a symlink is ever
    replaced: a user's own file of that name stays.  Returns what the link named before
    (None if there was no link)."""
    link = trace.parent / LATEST
    if link.exists() and not link.is_symlink():
        return None
    previous = None
    with contextlib.suppress(OSError):
        previous = os.readlink(link)
    trace.parent.mkdir(parents=True, exist_ok=True)
    _swap_link(trace.parent, trace.name)
    return previous


def _swap_link(folder: Path, target: str) -> None:
    # a random name, made by symlink() (which never follows or replaces): nothing that was
    # already there is ever removed or written through
    tmp = folder / f".{LATEST}.{secrets.token_hex(8)}"
    try:
        os.symlink(target, tmp)
        os.replace(tmp, folder / LATEST)
    except OSError:
        tmp.unlink(missing_ok=True)  # an alias is a convenience; the run still records


def trace_arg(trace: str) -> str:
    """A trace argument as the ranks will see it: a URL as is, a path made absolute."""
    if tracer.is_url(trace):
        return trace
    return absolute(trace, "pass a trace file written by 'replay run --trace' (see 'replay ls')")


def rank() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank()


def limit_options() -> Callable[..., Any]:
    """--max-ranks/--max-threads: how much of the machine a trace may ask for."""
    limit = _procs.default_limit()
    return with_options(
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


__all__ = [
    "DEFAULT_DIR",
    "LATEST",
    "POSITIVE_SECONDS",
    "Group",
    "QUIET_COMMANDS",
    "absolute",
    "allow_changed",
    "attach_quiet",
    "check_counts",
    "common",
    "fail",
    "echo_json",
    "json_error",
    "limit_options",
    "point_latest",
    "printer",
    "rank",
    "run_option",
    "shown",
    "summary",
    "trace_arg",
    "trace_options",
    "trace_path",
    "trace_stem",
    "under_launcher",
    "with_options",
]
