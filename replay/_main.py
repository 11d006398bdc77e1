"""The ``replay`` console script and ``python -m replay``.

A command that runs a program in this process needs the run's hash seed, and a running
interpreter cannot change its own: the CLI re-executes itself (``_environment.ensure``).
Doing that after loading the whole CLI would import everything twice, so this entry
re-executes first, under the seed a new run takes (the user's ``PYTHONHASHSEED`` if it
is a number, else 0; a replay's recorded seed is almost always that one too), and only
then loads the CLI.  ``ensure`` still checks the exact seed each command needs.  The
floating-point paths (``_environment.pin_float``) are set first of all, as numpy reads
them when it loads.
"""

from __future__ import annotations

import os
import sys

from . import _environment

#: Commands that may call ``_environment.ensure`` in this process.
RUNS_HERE = frozenset(
    {"run", "demo", "dual", "chaos", "cluster", "single", "resume", "history", "watch"}
)


def command_of(args: list[str]) -> str | None:
    """The command name in ``replay ARGS`` (None: no command, e.g. ``--help``)."""
    return next((a for a in args if not a.startswith("-")), None)


def main() -> None:
    """Console-script entry point."""
    args = sys.argv[1:]
    _environment.pin_float()  # before numpy loads: it and the BLAS read them then
    if command_of(args) in RUNS_HERE:
        _environment.reexec_for(_environment.choose_hash_seed(), args)
    with _environment.quiet_imports():
        numpy_loads()
        from ._cli import main as cli_main
    cli_main()


def numpy_loads() -> None:
    """Load numpy first, so that a setting that stops it (``NPY_ENABLE_CPU_FEATURES``
    naming a target this CPU lacks, or set with ``NPY_DISABLE_CPU_FEATURES``) or a broken
    install is one line and exit 2, not numpy's traceback from the middle of an import."""
    try:
        import numpy  # noqa: F401
    except (ImportError, RuntimeError) as exc:
        said = " ".join(str(exc).split())
        said = said.rsplit("Original error was: ", 1)[-1][:300]  # numpy's own cause
        chosen = [f"{v}={os.environ[v]!r}" for v in _environment.FLOAT_VARS if v in os.environ]
        where = f" (this process has {', '.join(chosen)})" if chosen else ""
        print(f"replay: error: numpy cannot load: {said}{where}", file=sys.stderr)
        sys.exit(2)
