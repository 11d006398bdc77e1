"""The browser on a trace stored in PostgreSQL (``pg_trace`` in tests/conftest.py)."""

from __future__ import annotations

import asyncio

from tui_helpers import screen_text, wait_text

import tracer
from tests.pg import PASSWORD
from tui import BrowserApp
from tui._repo import Repository
from tui.screens import OverviewScreen, TimelineScreen


def test_the_repository_reads_a_postgres_trace_without_showing_the_password(
    pg_trace: dict,
) -> None:
    url = pg_trace["url"]
    repo = Repository([url])
    try:
        (entry,) = repo.entries()
        assert entry.error is None and entry.path == tracer.describe(url)
        assert PASSWORD not in repr(entry)
        (row,) = repo.rows()
        assert row.ref.run_id == pg_trace["run_id"] and PASSWORD not in row.ref.path
        assert repo.latest(url) == row.ref
        view = repo.run(row.ref)
        assert view.operators()["sgd"].invocations == 2
        assert view.nodes() == [0, 1]
        assert view.objectives()["rmse"] == pg_trace["objectives"]["rmse"]
        assert view.message_table("sgd", 0) is not None
        assert view.timeline("sgd", 0) is not None
    finally:
        repo.close()


def test_the_browser_opens_a_postgres_trace(pg_trace: dict) -> None:
    async def main() -> None:
        app = BrowserApp([pg_trace["url"]])
        async with app.run_test(size=(100, 30)) as pilot:
            text = await wait_text(pilot, "1 trace file(s), 1 run(s)", "sgdmf", "finished")
            assert PASSWORD not in text
            await pilot.press("enter")
            text = await wait_text(pilot, "operator", "rotation")
            assert isinstance(pilot.app.screen, OverviewScreen) and PASSWORD not in text
            await pilot.press("t")
            await wait_text(pilot, "sgd invocation 0 of 2")
            assert isinstance(pilot.app.screen, TimelineScreen)
            assert PASSWORD not in screen_text(pilot.app)

    asyncio.run(main())
