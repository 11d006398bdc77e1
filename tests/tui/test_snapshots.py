"""Plain-text snapshots of the main screens at 80×24.

Each test drives the app to a view and compares the screen text with
``snapshots/<name>.txt``.  After an intended change of a view, regenerate them with
``TUI_SNAPSHOT_UPDATE=1 python -m pytest tests/tui/test_snapshots.py`` and review the
diff.  The traces are synthetic with a fixed clock, shown in UTC, from a relative
path, so the only thing masked is the store size (it depends on SQLite and zlib).
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest
from tui_helpers import screen_text, wait_text

from tui import BrowserApp

SNAPSHOTS = Path(__file__).parent / "snapshots"
#: Set to 1 to rewrite the stored snapshots instead of comparing with them.
UPDATE = os.environ.get("TUI_SNAPSHOT_UPDATE") == "1"
_SIZE = re.compile(r"\b\d+(?:\.\d+)? (?:B|kB|MB|GB)\b")


def _normalise(text: str) -> str:
    return "\n".join(_SIZE.sub("<size>", line).rstrip() for line in text.splitlines()) + "\n"


def check_snapshot(name: str, text: str) -> None:
    """Compare ``text`` with the stored snapshot ``name`` (or store it when updating)."""
    path = SNAPSHOTS / f"{name}.txt"
    got = _normalise(text)
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(got, encoding="utf-8")
        return
    if not path.exists():
        pytest.fail(f"no snapshot {path}; create it with TUI_SNAPSHOT_UPDATE=1")
    want = path.read_text(encoding="utf-8")
    assert got == want, f"screen differs from {path}:\n{got}"


@pytest.fixture
def traces(synth_dir: Path, monkeypatch: pytest.MonkeyPatch, in_utc: None) -> str:
    """The synthetic traces, named by a path relative to the working directory."""
    monkeypatch.chdir(synth_dir.parent)
    return "traces"


def snap(app: BrowserApp, keys: tuple[str, ...], ready: tuple[str, ...]) -> str:
    """Press ``keys``, wait until every string of ``ready`` shows, return the screen."""

    async def main() -> str:
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            for key in keys:
                await pilot.press(key)
                await pilot.pause()
            await wait_text(pilot, *ready)
            await pilot.pause(0.1)
            return screen_text(pilot.app)

    return asyncio.run(main())


CASES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "runs": ((), ("unreadable",)),
    "help": (("question_mark",), ("Keys: runs",)),
    "overview": (("enter",), ("operator", "loss:")),
    "timeline": (("enter", "t"), ("n1 t1", "zoom")),
    "orders_locks": (("enter", "o"), ("20 row(s)",)),
    "orders_index": (
        ("enter", "o", "3", "right_square_bracket", "greater_than_sign", "greater_than_sign"),
        ("deviated", "node 1"),
    ),
    "verdicts": (("v", "down"), ("FAILED",)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_screen_snapshot(name: str, traces: str) -> None:
    keys, ready = CASES[name]
    check_snapshot(name, snap(BrowserApp([traces]), keys, ready))


def test_diff_snapshot(traces: str) -> None:
    app = BrowserApp([f"{traces}/a.sqlite", f"{traces}/b.sqlite"], diff=True)
    check_snapshot("diff", snap(app, (), ("first difference:",)))


def test_snapshot_normalises_store_sizes() -> None:
    assert _normalise("store 110.6 kB  x 12 B\n") == "store <size>  x <size>\n"
