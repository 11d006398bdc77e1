"""``replay browse [TRACE ...|DIR]``: the click command and ``python -m tui``."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import click

import tracer


@click.command("browse")
@click.argument("traces", nargs=-1, metavar="[TRACE ...|DIR]", type=click.Path())
@click.option(
    "--list", "list_only", is_flag=True, help="With two traces, list them instead of diffing."
)
def browse_cmd(traces: tuple[str, ...], list_only: bool) -> None:
    """Browse runs, timelines, orders, verdicts and diffs of traces (default: traces/).

    A TRACE may also be an SQLAlchemy URL (postgresql+psycopg://USER:PASSWORD@HOST/DB).
    Given exactly two trace files, opens on the diff of their latest runs.
    """
    from .app import DEFAULT_DIR, run_browser  # Textual loads only for the browser (~0.4 s)

    paths = list(traces) or [DEFAULT_DIR]
    for p in paths:
        if not tracer.is_url(p) and not Path(p).exists():
            raise tracer.TraceNotFoundError(
                f"{p} does not exist: pass a trace file or a directory of traces "
                "(record one with 'replay run APP --trace PATH')"
            )
    run_browser(paths, diff=False if list_only else None)


def register(group: click.Group) -> None:
    """Add ``browse`` to the ``replay`` command group."""
    group.add_command(browse_cmd)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m tui``: errors are one line on stderr and exit 2."""
    try:
        browse_cmd.main(
            args=list(argv) if argv is not None else None,
            prog_name="python -m tui",
            standalone_mode=False,
        )
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        sys.exit(130)
    except tracer.TracerError as exc:
        click.echo(f"replay: error: {exc}", err=True)
        sys.exit(2)


__all__ = ["browse_cmd", "main", "register"]
