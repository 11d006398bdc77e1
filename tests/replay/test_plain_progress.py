"""Off a terminal, long work prints a plain progress line now and then (issue 36).

A 20-minute ``replay dual`` in a CI log printed nothing until it ended: progress was a
bar on a terminal and nothing anywhere else.  Now a :class:`Printer` whose stderr is not
a terminal prints ``replay: LABEL DONE/TOTAL WHAT, N s`` on stderr, at most every
``STRADS_REPLAY_PROGRESS_EVERY`` seconds (10 by default, 0: never), none under ``--json``,
and never the protocol's own tick lines.  (The suite runs with 0: tests/conftest.py.)
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replay._progress import PLAIN_EVERY_ENV, PLAIN_EVERY_S, Printer, tick_line
from tests.traces import SGDMF_1

ticks = st.lists(
    st.tuples(st.floats(0, 25, allow_nan=False), st.integers(0, 50), st.booleans()),
    max_size=30,
)


@given(ticks=ticks, as_json=st.booleans())
def test_plain_lines_are_at_least_the_interval_apart(
    ticks: list[tuple[float, int, bool]], as_json: bool
) -> None:
    now = [0.0]
    printed: list[tuple[float, str]] = []
    import click

    original = click.echo

    def echo(message: str, err: bool = False) -> None:
        assert err, message  # progress goes to stderr, never stdout
        printed.append((now[0], message))

    click.echo = echo  # type: ignore[assignment]
    saved = os.environ.pop(PLAIN_EVERY_ENV, None)  # the default interval (the suite sets 0)
    try:
        with Printer(as_json, "cluster replay", clock=lambda: now[0]) as say:
            last = 0.0
            for dt, done, known in ticks:
                now[0] += dt
                say(tick_line(done, 50 if known else None, "invocations"))
                due = now[0] - last >= PLAIN_EVERY_S
                if due and not as_json:
                    last = now[0]
                    total = "/50" if known else ""
                    want = f"replay: cluster replay {done}{total} invocations, {now[0]:.0f} s"
                    assert printed[-1] == (now[0], want)
    finally:
        click.echo = original
        if saved is not None:
            os.environ[PLAIN_EVERY_ENV] = saved
    assert not as_json or not printed
    times = [t for t, _ in printed]
    assert all(b - a >= PLAIN_EVERY_S for a, b in zip([0.0, *times], times, strict=False))


def test_a_piped_replay_shows_life_and_json_does_not(trace_library, cli, tmp_path) -> None:
    path = trace_library.copy(tmp_path / "t.sqlite", *SGDMF_1)  # cluster adds verdicts
    res = cli("show", path, "--json")
    invocations = sum(
        op["invocations"] for op in json.loads(res.stdout)["runs"][0]["operators"].values()
    )
    res = cli("cluster", path, env={PLAIN_EVERY_ENV: "0.000001"})
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("replay: cluster replay ")]
    assert res.returncode == 0 and len(lines) == invocations > 1, res.stderr
    assert lines[-1].startswith(f"replay: cluster replay {invocations}/{invocations} invocations")
    assert "replay-progress" not in res.stdout + res.stderr
    quiet = cli("cluster", path, "--json", env={PLAIN_EVERY_ENV: "0.000001"})
    assert quiet.returncode == 0 and "replay: cluster replay" not in quiet.stderr


@pytest.mark.parametrize("value", ["0", "-3", "never"])
def test_zero_turns_plain_lines_off_and_nonsense_is_the_default(value: str, monkeypatch) -> None:
    from replay._progress import plain_every

    monkeypatch.setenv(PLAIN_EVERY_ENV, value)
    assert plain_every() == (PLAIN_EVERY_S if value == "never" else None)


def test_quiet_prints_no_progress_and_the_same_result(trace_library, cli, tmp_path) -> None:
    """``--quiet`` (``-q``) on a command that shows progress: no progress line even when
    one is due after every invocation, and the result as without it."""
    path = trace_library.copy(tmp_path / "t.sqlite", *SGDMF_1)
    env = {PLAIN_EVERY_ENV: "0.000001"}
    for mode, flag in (("cluster", "--quiet"), ("single", "-q")):
        loud = cli(mode, path, env=env)
        hushed = cli(mode, path, flag, env=env)
        assert loud.returncode == hushed.returncode == 0, hushed.stderr
        assert f"replay: {mode} replay " in loud.stderr, loud.stderr
        assert f"replay: {mode} replay" not in hushed.stderr, hushed.stderr
        result = [out.splitlines()[-1].split(" (")[0] for out in (loud.stdout, hushed.stdout)]
        assert result[0] == result[1] and "identical: " in result[1], result


def test_quiet_shows_no_bar_or_spinner_on_a_terminal() -> None:
    import io

    from rich.console import Console

    from replay._progress import phase_line, quiet

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=100, color_system=None)
    with quiet(), Printer(False, "run", console=console) as say:
        say(phase_line("planning sgd"))
        say(tick_line(1, 3, "invocations"))
        say(phase_line("checkpoint after sgd#0"))
        assert say._progress is None
    assert buf.getvalue() == ""
    with Printer(False, "run", console=console) as say:  # the block ended: bars again
        say(tick_line(1, 3, "invocations"))
        assert say._progress is not None
