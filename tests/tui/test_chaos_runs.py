"""Chaos runs in the browser: grouped by outcome in the runs list, diffable."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tui_helpers import screen_text, wait_text, write_synthetic

from replay import chaos
from tests.replay.dual_apps import hot_rows
from tui import BrowserApp
from tui.screens import DiffScreen, RunsScreen


def drive(
    app: BrowserApp, script: Callable[[Any], Awaitable[None]], size: tuple[int, int] = (100, 30)
) -> None:
    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await script(pilot)

    asyncio.run(main())


#: A chaos seed whose 5 runs of ``hot_rows`` (1 node x 2 threads, 6 bodies on 4 hot rows)
#: give several outcomes, one of them shared by two runs that are not neighbours, so the
#: browser's grouping reorders the list (any seed with that shape will do: the draws are
#: the chaos machine's, and a change of what it draws may need another seed).
SEED = 25


def _runs(group: list[int]) -> str:
    return ", ".join(map(str, group))


def _explore(path: Path, runs: int):
    """``runs`` chaos runs of the hot-rows app (1 node x 2 threads), recorded into ``path``."""
    return chaos.explore(
        hot_rows,
        {"n": 6, "epochs": 1},
        runs=runs,
        chaos_seed=SEED,
        nodes=1,
        threads=2,
        trace=str(path),
    )


def test_chaos_runs_are_grouped_by_outcome_and_two_groups_diff(tmp_path: Path) -> None:
    path = tmp_path / "chaos.sqlite"
    report = _explore(path, 5)
    groups = list(report.groups.values())
    gapped = [g for g in groups if g != list(range(g[0], g[0] + len(g)))]
    assert len(groups) >= 3 and gapped, f"seed {SEED} no longer gives the shape: {groups}"
    order = [k for g in groups for k in g]  # group by group, in order of first run
    assert order != sorted(order)
    member = gapped[0][1]  # the second run of a group whose runs are not neighbours
    at = order.index(member)
    assert at + 1 < len(order), "the member must have a next row of another group"
    n = len(groups)

    def line(run: int) -> str:
        k = next(i for i, g in enumerate(groups) if run in g)
        return (
            f"chaos seed {SEED} run {run}: outcome group {k + 1} of {n} (runs {_runs(groups[k])})"
        )

    async def script(pilot: Any) -> None:
        await wait_text(pilot, "1 trace file(s), 5 run(s)")
        screen = pilot.app.screen
        assert isinstance(screen, RunsScreen)
        shown = [r.info.labels["chaos_run"] for r in screen.rows]
        assert shown == order
        await wait_text(pilot, line(order[0]))
        await pilot.press(*["down"] * at)
        await wait_text(pilot, line(member))
        await pilot.press("space", "down", "space")  # two runs of different outcomes
        await wait_text(pilot, "marked for diff: 2")
        await pilot.press("d")
        text = await wait_text(pilot, "first difference:")
        assert isinstance(pilot.app.screen, DiffScreen)
        assert "differs at event" in text, screen_text(pilot)

    drive(BrowserApp([path]), script)


def test_each_chaos_run_shows_its_run_number_in_the_list(tmp_path: Path) -> None:
    """Runs of one exploration share their file, app, shape and status: the list tells
    them apart by the number ``replay chaos`` gave them (0, 1, ...)."""
    path = tmp_path / "chaos.sqlite"
    _explore(path, 3)
    write_synthetic(tmp_path / "plain.sqlite", "run-plain")  # not a chaos run: no number

    async def script(pilot: Any) -> None:
        text = await wait_text(pilot, "2 trace file(s), 4 run(s)")
        head = next(line for line in text.splitlines() if " started " in line)
        assert head.split()[:3] == ["file", "chaos", "app"]
        rows = [line for line in text.splitlines() if "finished" in line]
        assert len(rows) == 4
        numbers = sorted(line.split()[1:3] for line in rows if line.split()[0].startswith("chaos"))
        assert numbers == [["run", "0"], ["run", "1"], ["run", "2"]]
        plain = next(line for line in rows if line.split()[0].startswith("plain"))
        assert plain.split()[1] == "synth"  # an empty chaos cell

    drive(BrowserApp([tmp_path]), script, size=(120, 30))
