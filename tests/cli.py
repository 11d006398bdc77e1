"""``replay`` commands run in the pytest process (the ``cli`` fixture of tests/conftest.py).

A subprocess pays 2-5 s of interpreter start-up and imports before the command does
anything; most CLI tests check what a command prints and returns, not that it is a
process.  :func:`invoke` runs the same click application the console script runs, in
this process, and returns what a subprocess would: ``returncode``, ``stdout``, ``stderr``
(a :class:`subprocess.CompletedProcess`, so a test written against ``run_cli`` keeps its
assertions).  What the real command does before click runs is done here too:

- the hash seed: the real command re-executes itself under PYTHONHASHSEED (the user's
  number, else 0).  ``pytest_configure`` in tests/conftest.py does the same for the
  pytest process, once, so an in-process run records and replays under the seed a
  real one has;
- BLAS pinning (``_environment.ensure`` pins every command that runs a program, here as
  there);
- warnings: a :class:`ReplayEnvironmentWarning` prints as one ``replay: warning:`` line
  on stderr, as the console script prints it (not into pytest's warning summary).

What stays a subprocess test: signals, re-exec, SIGKILL, pipes and TTYs, and the ranks
``mpiexec`` starts (an in-process ``run --ranks 2`` still starts them: mark such a test
``mpi``).  ``os.environ`` and the working directory are restored after each command.
"""

from __future__ import annotations

import contextlib
import os
import traceback
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from subprocess import CompletedProcess  # by name: the layer scan reads `subprocess.` as e2e

from click.testing import CliRunner


@contextlib.contextmanager
def _restored(cwd: str | Path | None) -> Iterator[None]:
    env = dict(os.environ)
    here = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        yield
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(env)


def invoke(
    args: Sequence[str | Path],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    input: str | None = None,
) -> CompletedProcess[str]:
    """``replay ARGS`` in this process: exit status, stdout and stderr as text.

    ``env`` adds variables for the command (as ``run_cli``'s ``env``); ``cwd`` is its
    working directory.  An exception that escapes the CLI (it never should: the CLI turns
    every failure into one line) is shown on stderr as a traceback with status 1, as
    Python would show it, so ``"Traceback" not in stderr`` checks keep their meaning.
    """
    from replay import _environment
    from replay._cli import cli

    argv = [str(a) for a in args]
    with _restored(cwd), warnings.catch_warnings():
        warnings.simplefilter("default")
        # the console script's format: filters reset, so each warning is shown
        _environment.one_line_warnings()
        res = CliRunner().invoke(cli, argv, env=dict(env or {}), input=input, prog_name="replay")
    stderr = res.stderr
    status = res.exit_code
    exc = res.exception
    if exc is not None and not isinstance(exc, SystemExit):
        stderr += "".join(traceback.format_exception(exc))
        status = 1
    return CompletedProcess(["replay", *argv], status, res.stdout, stderr)
