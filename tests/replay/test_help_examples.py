"""Every command's ``--help`` ends with examples that work as typed (issue 36).

The examples live in ``replay/_examples.py``.  Each one must parse (its options and
arguments exist), and those that read a trace are run for real, in a scratch directory
after the ``run`` example has made ``traces/latest``, and must succeed.  Not run here:
``demo`` (MovieLens, minutes), ``dual`` and ``chaos`` (their own tests run the same
shapes), pdb stops (``--break``/``--until``: pdb needs a terminal), ``resume`` (of a
finished run it refuses, as it should), ``browse`` (a full-screen UI) and the user's
own ``train.py``.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import click
import pytest

from replay._cli import cli as app
from replay._examples import EXAMPLES

#: Examples run for real (see the module docstring for the others).
RUN = ("show", "verify", "cluster", "single", "history", "watch", "export", "ls")


def test_every_command_ends_its_help_with_two_or_three_examples(cli) -> None:
    assert set(EXAMPLES) == set(app.commands)
    for name, examples in EXAMPLES.items():
        assert 2 <= len(examples) <= 3, name
        res = cli(name, "--help")
        assert res.returncode == 0, res.stderr
        tail = [ln.strip() for ln in res.stdout.rstrip().splitlines()[-len(examples) - 1 :]]
        assert tail == ["Examples:", *examples], (name, tail)


@pytest.mark.parametrize(
    "line", [ln for ex in EXAMPLES.values() for ln in ex], ids=lambda ln: ln[:60]
)
def test_every_example_parses(line: str) -> None:
    words = shlex.split(line)
    assert words[0] == "replay" and words[1] in app.commands
    cmd = app.commands[words[1]]
    with click.Context(app) as parent:
        cmd.make_context(words[1], words[2:], parent=parent)  # raises on a usage error


@pytest.mark.mpi  # the run example starts two ranks under mpiexec
def test_examples_that_read_the_trace_run_as_typed(tmp_path: Path, cli) -> None:
    made = cli(*shlex.split(EXAMPLES["run"][0])[1:], cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "traces" / "latest").exists()
    for name in RUN:
        for line in EXAMPLES[name]:
            words = shlex.split(line)[1:]
            if "--break" in words or "--until" in words:
                continue
            res = cli(*words, cwd=tmp_path)
            assert res.returncode == 0, (line, res.stderr)
            assert "Traceback" not in res.stderr, line


def test_every_option_of_every_command_says_what_it_does() -> None:
    """``dual --direction`` and ``--order-seed`` had no help text (issue 36)."""
    silent = [
        (name, p.opts)
        for name, cmd in app.commands.items()
        for p in cmd.params
        if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip()
    ]
    assert silent == []
