"""Traces as a run recorded before one of its app's parameters existed: the parameter is
left out of what the trace records, as ``all_params`` of that day did."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


def record_without(
    cli: Any, monkeypatch: pytest.MonkeyPatch, param: str, app: str, args: list[str], trace: Path
) -> None:
    """``replay run APP ARGS --trace TRACE`` with ``param`` missing from the recorded
    parameters (the run itself gets every parameter ``args`` and the defaults give)."""
    import replay._job

    every = replay._job.all_params
    with monkeypatch.context() as m:
        m.setattr(
            replay._job,
            "all_params",
            lambda fn, given: {k: v for k, v in every(fn, given).items() if k != param},
        )
        old = cli("run", app, *args, "--trace", trace, "--json")
    assert old.returncode == 0, old.stderr
    assert param not in json.loads(old.stdout)["params"]


def assert_replays(cli: Any, trace: Path, *, identical: bool) -> None:
    """Both replays of ``trace`` are identical (exit 0), or both diverge (exit 3)."""
    for mode in ("cluster", "single"):
        rep = cli(mode, trace, "--json")
        if identical:
            assert rep.returncode == 0 and json.loads(rep.stdout)["identical"], rep.stderr
        else:
            assert rep.returncode == 3, rep.stderr
