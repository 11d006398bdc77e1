"""``replay browse`` / ``python -m tui``: the click command, its errors, the public API."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import tui
from tui import _cli, app


def test_public_api_is_exactly_the_app_and_register() -> None:
    assert tui.__all__ == ["BrowserApp", "register"]
    assert tui.BrowserApp is app.BrowserApp
    assert {n for n in dir(tui) if not n.startswith("_")} >= set(tui.__all__)


def test_register_adds_browse_to_a_group() -> None:
    group = click.Group("replay")
    tui.register(group)
    assert group.commands["browse"] is _cli.browse_cmd
    help_text = CliRunner().invoke(group, ["browse", "--help"]).output
    assert "[TRACE ...|DIR]" in help_text and "traces/" in help_text


def test_missing_path_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        _cli.main([str(tmp_path / "nope.sqlite")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("replay: error: ") and "nope.sqlite does not exist" in err
    assert len(err.splitlines()) == 1


def test_default_directory_is_traces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        _cli.main([])
    assert "traces does not exist" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("names", "flags", "diff"),
    [
        (["a.sqlite", "b.sqlite"], [], True),
        (["a.sqlite", "b.sqlite"], ["--list"], False),
        (["a.sqlite"], [], False),
        (["."], [], False),
    ],
)
def test_two_files_open_on_the_diff(
    synth_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    names: list[str],
    flags: list[str],
    diff: bool,
) -> None:
    started: list[app.BrowserApp] = []
    monkeypatch.setattr(app.BrowserApp, "run", lambda self, **_: started.append(self))
    monkeypatch.chdir(synth_dir)
    _cli.main([*flags, *names])
    assert len(started) == 1
    assert started[0].start_with_diff is diff
    assert started[0].given == names
