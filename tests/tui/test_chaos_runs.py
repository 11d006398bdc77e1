"""Chaos runs in the browser: grouped by outcome in the runs list, diffable."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tui_helpers import screen_text, wait_text

from replay import chaos
from tests.replay.dual_apps import hot_rows
from tui import BrowserApp
from tui.screens import DiffScreen, RunsScreen


def drive(app: BrowserApp, script: Callable[[Any], Awaitable[None]]) -> None:
    async def main() -> None:
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.pause()
            await script(pilot)

    asyncio.run(main())


def test_chaos_runs_are_grouped_by_outcome_and_two_groups_diff(tmp_path: Path) -> None:
    path = tmp_path / "chaos.sqlite"
    # 1 node x 2 threads, 6 bodies on 4 hot rows: 5 runs give 4 outcomes, runs 1 and 3 alike
    report = chaos.explore(
        hot_rows, {"n": 6, "epochs": 1}, runs=5, chaos_seed=26, nodes=1, threads=2, trace=str(path)
    )
    groups = list(report.groups.values())
    assert groups == [[0], [1, 3], [2], [4]]

    async def script(pilot: Any) -> None:
        await wait_text(pilot, "1 trace file(s), 5 run(s)")
        screen = pilot.app.screen
        assert isinstance(screen, RunsScreen)
        shown = [r.info.labels["chaos_run"] for r in screen.rows]
        assert shown == [0, 1, 3, 2, 4]  # group by group, in order of first run
        await wait_text(pilot, "chaos seed 26 run 0: outcome group 1 of 4 (runs 0)")
        await pilot.press("down", "down")
        await wait_text(pilot, "chaos seed 26 run 3: outcome group 2 of 4 (runs 1, 3)")
        await pilot.press("space", "down", "space")  # run 3 and run 2: different outcomes
        await wait_text(pilot, "marked for diff: 2")
        await pilot.press("d")
        text = await wait_text(pilot, "first difference:")
        assert isinstance(pilot.app.screen, DiffScreen)
        assert "differs at event" in text, screen_text(pilot)

    drive(BrowserApp([path]), script)
