"""The ``replay`` command line (one click application).

User errors print one line on stderr and exit 2 (DESIGN §10); a failed loop body
exits 1; ``--json`` prints exactly one JSON object on stdout.  The commands live in
``_runcmds`` (run, demo), ``_replaycmds`` (cluster, single), ``_dualcmd`` (dual),
``_chaoscmd`` (chaos), ``_tracecmds`` (ls, show, verify, export), ``_ttcmds`` (history,
watch), ``_resumecmd`` (resume) and ``tui`` (browse); ``_cliutil`` holds what
they share.
"""

from __future__ import annotations

import sys

import click

from tui import register as register_browse

from . import _environment, _procs
from ._chaoscmd import register as register_chaos
from ._cliutil import Group, attach_quiet
from ._dualcmd import register as register_dual
from ._examples import attach as attach_examples
from ._replaycmds import register as register_replay
from ._resumecmd import register as register_resume
from ._runcmds import execute
from ._runcmds import register as register_run
from ._tracecmds import register as register_trace_commands
from ._ttcmds import register as register_time_travel


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="strads-replay", prog_name="replay")
def cli() -> None:
    """Record, replay and dual-test distributed ML training runs."""


register_run(cli)
register_replay(cli)
register_dual(cli)
register_chaos(cli)
register_trace_commands(cli)
register_time_travel(cli)
register_resume(cli)
register_browse(cli)
attach_examples(cli)
attach_quiet(cli)


def main() -> None:
    """Console-script entry point."""
    # only the real command line may re-execute itself (not click's test runner)
    _environment.allow_reexec(sys.argv[1:])
    _environment.one_line_warnings()
    _procs.install_signal_handlers()
    cli(prog_name="replay")


__all__ = ["cli", "execute", "main"]
