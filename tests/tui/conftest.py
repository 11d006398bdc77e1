"""Fixtures of the browser tests: real and synthetic traces (builders in tui_helpers)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tui_helpers import add_verdicts, record_engine, record_sync, write_synthetic


@pytest.fixture(scope="session")
def engine_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real trace: 2 nodes × 3 threads, three invocations of a hot loop."""
    path = tmp_path_factory.mktemp("engine") / "hot.sqlite"
    record_engine(path)
    return path


@pytest.fixture(scope="session")
def sync_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real trace of an SSP ``sync_for``: no plan, aggregation and visibility orders."""
    path = tmp_path_factory.mktemp("sync") / "mean.sqlite"
    record_sync(path)
    return path


@pytest.fixture(scope="session")
def synth_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``synth_dir``'s files, written once per session: the builders run with a fixed
    clock and store no path, so every build gives the same rows (~0.4 s each, and some
    60 tests ask for one)."""
    root = tmp_path_factory.mktemp("synth") / "traces"
    root.mkdir()
    write_synthetic(root / "a.sqlite", "run-a")
    add_verdicts(root / "a.sqlite", "run-a")
    write_synthetic(root / "b.sqlite", "run-b", message_order=(1, 0))
    (root / "broken.sqlite").write_bytes(b"this is not a trace store\n" * 40)
    return root


@pytest.fixture
def synth_dir(tmp_path: Path, synth_template: Path) -> Path:
    """A ``traces/`` directory with two synthetic runs (B receives messages out of order)
    and one damaged file; run A carries verdicts.  The test's own copy: it may change
    or add files."""
    return Path(shutil.copytree(synth_template, tmp_path / "traces"))


@pytest.fixture
def in_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Local time is UTC while the test runs (screens show local wall-clock times)."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()
