"""``replay ls``, ``show``, ``export`` and ``verify``: look at trace stores.

Bad input raises the tracer's errors (one line each); the CLI group turns them into
``replay: error: ...`` and exit status 2.  :func:`register` adds the commands to a
click group.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

import engine
import tracer

from . import _environment
from ._cliutil import echo_json, printable
from ._errors import UsageError
from ._model import export_model
from ._paths import check_output, refuse_special
from ._untested import phrase
from ._untested import untested_of as _untested_of

#: File name patterns ``replay ls`` treats as trace stores.
TRACE_GLOBS = ("*.sqlite", "*.db")


def _echo(text: str, err: bool = False) -> None:
    """Print a line of these commands: its text comes from a trace, so no control
    character reaches the terminal (:func:`printable`)."""
    click.echo(printable(text), err=err)


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return str(n)


#: The widest app cell of ``replay ls``: the column is as wide as its longest cell, so
#: one trace whose app is named with 100,000 characters padded every line to that.
APP_WIDTH = 48


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _run_dict(run: tracer.RunTrace) -> dict[str, Any]:
    info = run.info
    ops = run.operators()
    cps = run.checkpoints()
    return {
        "run_id": info.run_id,
        "app": info.app,
        "target": info.target,
        "params": info.params,
        "code_digest": info.code_digest,
        "ranks": info.ranks,
        "threads": info.threads,
        "seed": info.seed,
        "versions": info.versions,
        "environment": info.environment,
        "started_at": info.started_at,
        "ended_at": info.ended_at,
        "status": info.status,
        "error": info.error,
        "continues": info.continues,
        "labels": info.labels,
        "duration_s": round(info.duration, 6),
        "objectives": run.objectives(),
        "verdicts": [
            {"kind": v.kind, "passed": v.passed, "created_at": v.created_at, "detail": v.detail}
            if v.error is None
            else {"kind": v.kind, "error": v.error}
            for v in run.verdicts(strict=False)
        ],
        "store_bytes": run.store_bytes(),
        # time travel, reported apart from store_bytes (not in the bytes-per-body budget)
        "checkpoint_bytes": run.checkpoint_bytes(),
        "checkpoints": [f"{c.op}#{c.invocation}" for c in cps],
        "checkpoint_seconds": round(sum(c.seconds for c in cps), 6),
        "operators": {
            op: {
                "strategy": s.strategy,
                "imbalance": round(s.imbalance, 4),
                "invocations": s.invocations,
                "bodies": s.bodies,
                "rounds": s.rounds,
                "lock_grants": s.lock_grants,
                "messages": s.messages,
                "deviations": s.deviations,
                "store_bytes": s.store_bytes,
            }
            for op, s in ops.items()
        },
    }


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    """Rows as aligned columns; columns in ``right`` (numbers) are right-aligned."""
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    return [
        "  ".join(
            c.rjust(w) if k in right else c.ljust(w)
            for k, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in rows
    ]


@click.command("ls")
@click.argument(
    "directory", default="traces", required=False, metavar="[DIR|TRACE|URL]", type=click.Path()
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def ls_cmd(directory: str, as_json: bool) -> None:
    """List the trace files in DIRECTORY (default: traces/) and the runs they hold.

    DIRECTORY may also be one trace file or a database URL: then its runs are listed.
    """
    if tracer.is_url(directory):
        tracer.open(directory).close()  # one store named: its failure is the command's
        _ls([directory], tracer.describe(directory), as_json)
        return
    root = Path(directory)
    if not root.exists():
        raise tracer.TraceNotFoundError(
            f"{directory} does not exist: record a run with 'replay run APP --trace PATH' "
            "or pass the directory that holds your traces"
        )
    if not root.is_dir():
        refuse_special(root)  # a FIFO given by name: one line, exit 2
    files = [root] if not root.is_dir() else sorted({p for g in TRACE_GLOBS for p in root.glob(g)})
    _ls(files, directory, as_json)


def _ls(stores: list[Any], directory: str, as_json: bool) -> None:
    listed: list[dict[str, Any]] = []
    errors: list[dict[str, str]] = []
    for path in stores:
        try:
            with tracer.open(path) as trace:
                size = trace.store_bytes()
                for info in trace.runs():
                    listed.append(
                        {
                            "path": tracer.describe(path),
                            "run_id": info.run_id,
                            "app": info.app,
                            "started_at": info.started_at,
                            "ranks": info.ranks,
                            "threads": info.threads,
                            "status": info.status,
                            "duration_s": round(info.duration, 6),
                            "store_bytes": size,
                        }
                    )
        except tracer.TracerError as exc:
            errors.append({"path": tracer.describe(path), "error": str(exc)})
    if as_json:
        echo_json({"traces": listed, "errors": errors})
        return
    if not listed and not errors:
        _echo(f"no traces in {directory}")
        return
    rows = [["path", "app", "started", "ranks x threads", "status", "duration", "size"]]
    for r in listed:
        rows.append(
            [
                r["path"],
                _cut(r["app"] or "?", APP_WIDTH),
                _when(r["started_at"]),
                f"{r['ranks']}x{r['threads']}",
                r["status"],
                f"{r['duration_s']:.2f} s",
                _size(r["store_bytes"]),
            ]
        )
    if errors:  # an unreadable file is a row too, with why in the last column
        rows = [r + [""] for r in rows]
        rows[0][-1] = "problem"
        rows += [[e["path"], "-", "-", "-", "skipped", "-", "-", e["error"]] for e in errors]
    for line in _table(rows, {3, 5, 6}):
        _echo(line)
    if errors:
        _echo(f"replay: note: skipped {len(errors)} unreadable file(s)", err=True)


@click.command("show")
@click.argument("trace_path", metavar="TRACE", type=click.Path())
@click.option("--run", "run_id", default=None, help="Only this run (default: every run).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def show_cmd(trace_path: str, run_id: str | None, as_json: bool) -> None:
    """Show the runs of TRACE and a per-operator summary."""
    with tracer.open(trace_path) as trace:
        runs = [trace.run(run_id)] if run_id else [trace.run(r.run_id) for r in trace.runs()]
        for r in runs:
            trace.ensure_intact(r.info.run_id)
        doc: dict[str, Any] = {
            "trace": tracer.describe(trace_path),
            "store_bytes": trace.store_bytes(),
            "runs": [_run_dict(r) for r in runs],
        }
    if as_json:
        echo_json(doc)
        return
    _echo(f"{doc['trace']}: {len(doc['runs'])} run(s), {_size(doc['store_bytes'])}")
    for r in doc["runs"]:
        _echo("")
        _echo(
            f"run {r['run_id']}  app {r['app'] or '?'}  {r['status']}  "
            f"{r['ranks']} rank(s) x {r['threads']} thread(s)  seed {r['seed']}"
        )
        _echo(f"  started {_when(r['started_at'])}, took {r['duration_s']:.2f} s")
        if r["continues"]:
            start = r["checkpoints"][0] if r["checkpoints"] else "?"
            _echo(f"  continues run {r['continues']} (resumed after the checkpoint at {start})")
        env = r["environment"]
        if env:
            paths = _environment.paths_text(env, None)  # from the trace: shown cut short
            _echo(
                f"  environment: PYTHONHASHSEED={env.get('PYTHONHASHSEED', '?')}, "
                f"BLAS threads {env.get('blas_threads') or '?'}, "
                f"python {r['versions'].get('python', '?')}, "
                f"numpy {r['versions'].get('numpy', '?')}" + (f", {paths}" if paths else "")
            )
        if r["params"]:
            _echo("  params: " + " ".join(f"{k}={v}" for k, v in sorted(r["params"].items())))
        for name, vals in r["objectives"].items():
            if vals:
                _echo(f"  {name}: {len(vals)} value(s), final {vals[-1]:.6g}")
        said = [ln.strip() for ln in (r["error"] or "").splitlines() if ln.strip()]
        if said:  # a recorded error of blank lines had no last line: IndexError, exit 70
            _echo("  error: " + said[-1])
        for v in r["verdicts"]:
            if "error" in v:
                _echo(f"  verdict {v['kind']}: unreadable ({v['error']})")
            else:
                verdict = "PASS" if v["passed"] else "FAIL"
                untested = phrase(_untested_of(v.get("detail")))
                _echo(
                    f"  verdict {v['kind']}: {verdict} at {_when(v['created_at'])}"
                    + (f" ({untested})" if untested else "")
                )
        rows = [
            [
                "operator",
                "strategy",
                "invocations",
                "bodies",
                "rounds",
                "lock grants",
                "messages",
                "bytes",
            ]
        ]
        for op, s in r["operators"].items():
            rows.append(
                [
                    op,
                    s["strategy"] or "-",
                    str(s["invocations"]),
                    str(s["bodies"]),
                    str(s["rounds"]),
                    str(s["lock_grants"]),
                    str(s["messages"]),
                    _size(s["store_bytes"]),
                ]
            )
        for line in _table(rows, {2, 3, 4, 5, 6, 7}):
            _echo("  " + line)
        if r.get("checkpoints"):
            _echo(
                f"  checkpoints: {len(r['checkpoints'])} ({_size(r['checkpoint_bytes'])}, "
                f"not counted above), the last after {r['checkpoints'][-1]}"
            )


@click.command("export")
@click.argument("trace_path", metavar="TRACE", type=click.Path())
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["chrome"]),
    default="chrome",
    show_default=True,
    help="Timeline format, with -o (Chrome trace-event JSON, opens in Perfetto).",
)
@click.option(
    "-o",
    "--output",
    default=None,
    type=click.Path(),  # a directory is refused by check_output, in one line
    help="File to write the timeline to.",
)
@click.option(
    "--model",
    default=None,
    metavar="PATH",
    help="Write the trained model of a recorded checkpoint instead: PATH.npz (numpy "
    "arrays) or, for embeddings, PATH.txt (word2vec text format).",
)
@click.option(
    "--checkpoint",
    type=int,
    default=None,
    metavar="N",
    help="With --model: the checkpoint, numbered from 0 in the order 'replay show' "
    "lists them. [default: the last]",
)
@click.option("--run", "run_id", default=None, help="Run to export (default: the latest).")
@click.option("--force", is_flag=True, help="Overwrite OUTPUT if it exists (never a trace).")
@click.option(
    "--damaged",
    "allow_damaged",
    is_flag=True,
    help="Export a run that 'replay verify' finds damaged, with a warning (to look at the "
    "damage; its orders are not the recorded ones).",
)
def export_cmd(
    trace_path: str,
    fmt: str,
    output: str | None,
    model: str | None,
    checkpoint: int | None,
    run_id: str | None,
    force: bool,
    allow_damaged: bool,
) -> None:
    """Export a run of TRACE for a timeline viewer (-o FILE), or the trained model of one
    of its checkpoints (--model PATH).  A run 'replay verify' refuses is refused here
    too (a timeline: unless --damaged)."""
    if (output is None) == (model is None):
        raise UsageError("pass -o FILE (a timeline) or --model PATH (the trained model)")
    if checkpoint is not None and model is None:
        raise UsageError("--checkpoint goes with --model")
    fmt_given = click.get_current_context().get_parameter_source("fmt")
    if model is not None and fmt_given is click.core.ParameterSource.COMMANDLINE:
        raise UsageError(
            "--format goes with -o (a timeline); --model writes the format its extension "
            "names (.npz, or .txt for embeddings)"
        )
    if model is not None:
        if allow_damaged:
            raise UsageError("--damaged goes with -o: a damaged run's model is never exported")
        what, notes = export_model(trace_path, run_id, model, checkpoint, force=force)
        for note in notes:
            _echo(f"replay: note: {note}", err=True)
        _echo(f"wrote the model at {what} to {model}")
        return
    assert output is not None
    if output == "-":  # the usual name of stdout: it wrote a file called "-" instead
        raise UsageError("-o -: the timeline is written to a file, not stdout; give a file name")
    check_output(output, force=force, reading=[] if tracer.is_url(trace_path) else [trace_path])
    with tracer.open(trace_path) as trace:
        rid = trace.run(run_id).info.run_id
        problem = trace.verify(rid, full=True).problem
        damaged = None
        if problem is not None:
            damaged = f"{tracer.describe(trace_path)} run {rid} is damaged: {problem.line()}"
            if not allow_damaged:
                raise UsageError(
                    f"{damaged}; run 'replay verify' for details, or pass --damaged to "
                    "export it anyway"
                )
        # schema 7 keeps routed write-backs as counts: say what the timeline lacks
        routed = trace.run(rid).info.schema >= 7 and bool(trace.run(rid).routed())
        try:
            n = tracer.export_chrome(
                trace, rid, output, force=force, label=f"-o {output}", damaged=damaged
            )
        except engine.OutputPathError as exc:  # the path changed since check_output
            raise UsageError(str(exc)) from None
    if damaged is not None:  # after the export: a run it cannot decode is one error line
        _echo(
            f"replay: warning: {damaged}; exported anyway (--damaged): its events may be "
            "forged or missing",
            err=True,
        )
    if routed:
        _echo(f"replay: note: {tracer.ROUTED_NOTE}", err=True)
    _echo(f"wrote {n} events to {output} (open it in https://ui.perfetto.dev)")


@click.command("verify")
@click.argument("trace_path", metavar="TRACE", type=click.Path())
@click.option("--run", "run_id", default=None, help="Only this run (default: every run).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def verify_cmd(trace_path: str, run_id: str | None, as_json: bool) -> None:
    """Check the hash chains and cross-references of TRACE (exit 2 on damage)."""
    with tracer.open(trace_path, assume_finished=True) as trace:
        ids = [trace.run(run_id).info.run_id] if run_id else [r.run_id for r in trace.runs()]
        if not ids:
            raise tracer.RunNotFoundError(f"{tracer.describe(trace_path)} holds no runs yet")
        reports = []
        for rid in ids:
            reports.append(trace.verify(rid, full=True))
            if not reports[-1].ok:
                break
    bad = next((r for r in reports if not r.ok), None)
    blocks = sum(r.blocks for r in reports)
    nodes = max(r.nodes for r in reports)
    if as_json:
        doc: dict[str, Any] = {
            "ok": bad is None,
            "blocks": blocks,
            "nodes": nodes,
            "runs": [r.to_json() for r in reports],
            "problem": None if bad is None else dict(bad.to_json()["problem"], run_id=bad.run_id),
        }
        echo_json(doc)
    elif bad is None:
        tail = sum(r.tail for r in reports)
        more = f" ({tail} row(s) of unfinished invocations not covered)" if tail else ""
        legacy = [r.run_id[:12] for r in reports if r.legacy]
        if legacy:
            more += (
                f"; not verified: the run row (target, parameters, seed, shape) of run(s) "
                f"{', '.join(legacy)}, recorded before the chain covered it"
            )
        _echo(f"ok: {blocks} blocks on {nodes} nodes verified{more}")
    else:
        assert bad.problem is not None
        _echo(f"replay: error: run {bad.run_id}: {bad.problem.line()}", err=True)
    if bad is not None:
        raise SystemExit(2)


def register(group: click.Group) -> None:
    """Add ``ls``, ``show``, ``export`` and ``verify`` to the ``replay`` command group."""
    for cmd in (ls_cmd, show_cmd, export_cmd, verify_cmd):
        group.add_command(cmd)


__all__ = ["export_cmd", "ls_cmd", "register", "show_cmd", "verify_cmd"]
