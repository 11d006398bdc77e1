"""Click's usage errors (a bad option value, an unknown option or command, a missing
argument) are one line on stderr and exit 2, like every other bad input (DESIGN §10).

Click printed them as four lines: the usage, a "Try --help" hint, a blank line and the
error.  The cases are found from the click application itself, so an option added later
is covered without editing this test.
"""

from __future__ import annotations

import json

import click
import pytest

from replay._cli import cli as app
from tests import cli as tcli

#: Option types that refuse the value ``x!`` (a path or free text takes anything).
TYPED = (
    click.types.IntParamType,
    click.types.FloatParamType,
    click.Choice,
    click.types.BoolParamType,
)


def _positional(cmd: click.Command) -> list[str]:
    return [
        "x" for p in cmd.params if isinstance(p, click.Argument) for _ in range(max(p.nargs, 1))
    ]


CASES = sorted(
    (name, opt.opts[0], opt.nargs)
    for name, cmd in app.commands.items()
    for opt in cmd.params
    if isinstance(opt, click.Option) and not opt.is_flag and isinstance(opt.type, TYPED)
)


def one_usage_line(args: list[str], *needles: str) -> str:
    res = tcli.invoke(args)
    err = res.stderr.strip()
    assert res.returncode == 2, (args, res.returncode, err)
    assert len(err.splitlines()) == 1 and err.startswith("replay: error: "), (args, err)
    assert "--help" in err, err  # where to look
    for needle in needles:
        assert needle in err, err
    return err


def test_the_typed_options_are_found() -> None:
    assert ("run", "--threads", 1) in CASES and ("cluster", "--timeout", 1) in CASES
    assert len({name for name, _, _ in CASES}) >= 8


@pytest.mark.parametrize("name,opt,nargs", CASES)
def test_a_bad_option_value_is_one_line(name: str, opt: str, nargs: int) -> None:
    cmd = app.commands[name]
    one_usage_line([name, *_positional(cmd), opt, *["x!"] * nargs], opt, f"replay {name} --help")


@pytest.mark.parametrize("name", sorted(app.commands))
def test_an_unknown_option_or_a_missing_argument_is_one_line(name: str) -> None:
    cmd = app.commands[name]
    one_usage_line([name, *_positional(cmd), "--no-such-option"], "--no-such-option")
    if any(isinstance(p, click.Argument) and p.required for p in cmd.params):
        one_usage_line([name], "Missing argument")


@pytest.mark.parametrize("args", [["--no-such-option"], ["no-such-command"]])
def test_the_groups_own_usage_errors_are_one_line(args: list[str]) -> None:
    one_usage_line(args, args[0], "replay --help")


@pytest.mark.parametrize("value", ["nan", "-nan", "NaN", "0", "-1"])
def test_a_timeout_that_is_not_a_positive_number_is_refused(value: str) -> None:
    one_usage_line(["cluster", "t.sqlite", "--timeout", value], "--timeout")


def test_json_gets_the_usage_error_as_its_one_object() -> None:
    res = tcli.invoke(["run", "sgdmf", "--threads", "many", "--json"])
    assert res.returncode == 2
    doc = json.loads(res.stdout)
    assert doc["error"]["kind"] == "usage" and "--threads" in doc["error"]["message"]
