"""The browser stays responsive on a trace with a million loop bodies per invocation.

The bounds are generous (this is no benchmark): they catch a view that reads or
formats every row, which takes minutes at this size, not a slow machine.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from tui_helpers import wait_text, write_synthetic

from tui import BrowserApp
from tui.widgets import ArrayTable

#: Loop bodies per invocation of the synthetic trace.
BODIES = 1_000_000
#: Seconds one step may take before the view counts as unresponsive.
BOUND_S = 15.0


@pytest.fixture(scope="module")
def big_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two invocations of 1M bodies on 2 nodes × 4 threads; node 0 hands its locks over
    after every one of its 500k locked bodies (but the last of each round)."""
    path = tmp_path_factory.mktemp("big") / "big.sqlite"
    write_synthetic(path, "big", n=BODIES, nodes=2, threads=4, rounds=2, invocations=2, app="big")
    return path


def test_open_run_and_orders_of_a_million_bodies(big_trace: Path) -> None:
    timings: dict[str, float] = {}

    async def step(pilot: Any, name: str, keys: tuple[str, ...], *needles: str) -> None:
        t0 = time.perf_counter()
        await pilot.press(*keys)
        await wait_text(pilot, *needles, timeout=BOUND_S * 2)
        timings[name] = time.perf_counter() - t0

    async def main() -> None:
        async with BrowserApp([big_trace]).run_test(size=(80, 24)) as pilot:
            await wait_text(pilot, "big")
            await step(pilot, "overview", ("enter",), "operator", "2,000,000")
            await step(pilot, "locks", ("o",), "499,992 row(s)")  # hand-overs: all but 4 per round
            await step(pilot, "index", ("3",), "1,000,000 row(s)")
            await step(pilot, "search", ("slash", *"777777", "enter"), "1 match(es)")
            table = pilot.app.screen.query_one("#t-index", ArrayTable)
            assert table.row_text(table.cursor).split()[5] == "777777"
            await step(pilot, "end", ("end",), "row 1,000,000")
            await step(pilot, "deviated", ("right_square_bracket",), "invocation 1 of")
            await step(pilot, "timeline", ("escape", "t"), "n1 t3")

    asyncio.run(main())
    print("seconds per step:", {k: round(v, 2) for k, v in timings.items()})
    slow = {k: round(v, 2) for k, v in timings.items() if v > BOUND_S}
    assert not slow, f"steps slower than {BOUND_S} s: {slow} (all: {timings})"
